"""The runtime's plumbing, under every collective call and every file it writes.

- ``abort``: ending every rank, with a line naming the one that failed, when a rank cannot
  go on (``RINGTUNE_ON_ERROR``).
- ``stall``: the progress watchdog that bounds waits on peers (``RINGTUNE_STALL_TIMEOUT``).
- ``lockfile``: an exclusive ``flock`` on a lock file that records its holder.
- ``atomic``: the runtime's names for the one output writer (``safefiles.outfile``).
- ``logs``: ``RINGTUNE_LOG``, what the runtime logs.
"""
