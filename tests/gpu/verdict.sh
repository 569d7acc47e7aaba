# tests/gpu/verdict.sh — sourced by device_check.sh: the verdict of one step.
#
# step_verdict KIND RC LOG prints one word:
#   FAIL          the step's command failed (rc != 0), whether a test or a benchmark;
#   BELOW-TARGET  a benchmark ran but reports a missed target ("misses the ... target");
#   PASS          otherwise.
# A missed target is a finding to report, not a failure of the machine or the code: it
# never makes device_check.sh exit 1 (only a FAIL of a test step does).
step_verdict() {
  local kind=$1 rc=$2 log=$3
  if [ "$rc" -ne 0 ]; then
    echo FAIL
  elif [ "$kind" = bench ] && grep -qE 'misses the .*target' "$log" 2>/dev/null; then
    echo BELOW-TARGET
  else
    echo PASS
  fi
}
