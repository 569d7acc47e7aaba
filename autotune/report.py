"""Tables and plots of a tuning result: what ``ringtune tune``, ``ringtune show`` and
``--report DIR`` print and write.

Use ``rule_table(profile)`` for the rule table of any profile mapping (speed-up over native
per rule, from the ``measured`` records), and ``write_report(dir, result)`` for the PNG plot
(busbw vs size: native, tuned, best of each algorithm) and the Markdown tables.
matplotlib is imported only inside ``write_report`` (Agg backend, no display needed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from collectives.plan import params_text
from collectives.plumbing.atomic import atomic_path, write_text_atomic


def human_bytes(n: int | None) -> str:
    if n is None:
        return "∞"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and (n % (1 << shift) == 0 or (n + 1) % (1 << shift) == 0):
            v = (n + 1) / (1 << shift) if (n + 1) % (1 << shift) == 0 else n / (1 << shift)
            text = f"{v:g} {unit}"
            return text if n % (1 << shift) == 0 else f"{text}-1"
    return f"{n} B"


def _params_text(params: Mapping[str, Any]) -> str:
    """``rings=2 chunk_bytes=65536 dims=2x4 inner=rhd,multiring``, ``-`` without any."""
    return params_text(params) or "-"


def _with_transport(profile: Mapping[str, Any], rule: Mapping[str, Any]) -> dict[str, Any]:
    """A rule's params; on a GPU profile led by the transport the rule runs with (its own or
    the profile's), since that is part of the choice."""
    params = dict(rule.get("params") or {})
    if profile.get("backend") == "cupy":
        return {"transport": rule.get("transport") or profile.get("transport"), **params}
    return params


def rule_rows(profile: Mapping[str, Any]) -> list[list[str]]:
    """One row per rule: range, algorithm, params, busbw, native busbw, speed-up."""
    rows = []
    for r in profile.get("rules", []):
        m = r.get("measured") or {}
        tuned, native = m.get("busbw_gbps"), m.get("native_busbw_gbps")
        if m.get("speedup") is not None:
            speed = f"{m['speedup']:.2f}x"
        elif tuned and native:
            speed = f"{tuned / native:.2f}x"
        else:
            speed = "-"
        if m.get("unstable"):
            speed += f" {UNSTABLE_MARK}"
        rows.append([
            f"{human_bytes(r['min_bytes'])} .. {human_bytes(r.get('max_bytes'))}",
            r["algorithm"],
            _params_text(_with_transport(profile, r)),
            human_bytes(m["bytes"]) if m.get("bytes") is not None else "-",
            f"{tuned:.3f}" if tuned is not None else "-",
            f"{native:.3f}" if native is not None else "-",
            speed,
        ])
    return rows


RULE_HEADER = ["size range", "algorithm", "params", "measured at", "busbw(GB/s)",
               "native(GB/s)", "speed-up"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(x).replace("|", "\\|") for x in row) + " |"
              for row in rows]
    return "\n".join(lines)


#: The mark of a rule whose A/B spread exceeded the difference its choice rests on
#: (``measured.unstable``, ``autotune.choose.ab_stability``), after its speed-up.
UNSTABLE_MARK = "!"


def unstable_note(profile: Mapping[str, Any]) -> str | None:
    """The footnote of the rules marked ``!``, or ``None`` when there are none."""
    spreads = [float((r.get("measured") or {}).get("ab_spread") or 0.0)
               for r in profile.get("rules", []) if (r.get("measured") or {}).get("unstable")]
    if not spreads:
        return None
    return (f"{UNSTABLE_MARK} {len(spreads)} rule(s): the A/B spread (up to "
            f"{100 * max(spreads):.0f}%) exceeded the gain the choice rests on: re-tune on a "
            "quiet machine (ringtune tune --busy wait)")


def rule_table(profile: Mapping[str, Any]) -> str:
    """The rule table, and the footnote of the rules marked unstable if any."""
    table = format_table(RULE_HEADER, rule_rows(profile))
    note = unstable_note(profile)
    return f"{table}\n{note}" if note else table


def profile_heading(profile: Mapping[str, Any], path: str | None = None,
                    added: int | None = None) -> str:
    """One line about a profile: where, for what world, and when its trials ran.
    ``added``: trials the run that printed it measured (``ringtune tune``), since the
    profile's trials may have run in earlier, resumed runs."""
    topo = profile.get("topology") or {}
    tun = profile.get("tuning") or {}
    bits = [f"profile {path}" if path else "profile",
            f"world size {topo.get('world_size')}",
            str(topo.get("summary") or ""),
            f"{profile.get('backend')}/{profile.get('transport')}",
            f"{profile.get('dtype', 'float32')} {profile.get('op', 'sum')}"]
    head = ", ".join(b for b in bits if b)
    if profile.get("created"):
        head += f"; created {profile['created']}"
    if tun and tun.get("mode") == "online":
        # Written by a job tuning its own calls (collectives.online).
        head += (f"; tuned online by job {tun.get('job')} ({tun.get('exploring_calls')} "
                 f"exploring calls of {tun.get('calls')}, "
                 f"{len(tun.get('online_settled') or [])} sizes settled)")
    elif tun:
        ran = str(tun.get("ran") or "")
        if "/" in ran:
            first, last = ran.split("/", 1)
            head += (f"; {tun.get('trials')} trials, run {first} .. {last} "
                     f"({tun.get('seconds')} s measuring, ")
        else:
            head += f"; {tun.get('trials')} trials in {tun.get('seconds')} s ("
        head += f"{tun.get('sampler')}, seed {tun.get('seed')})"
    if added is not None:
        head += f"; this run added {added}"
    return head


def bucket_rows(result: Any) -> list[list[str]]:
    """Per bucket: the A/B figures and how the search ended."""
    rows = []
    for s, c in zip(result.buckets, result.choices):
        rows.append([human_bytes(s.nbytes), str(s.evaluated), s.reason, c.algorithm,
                     _params_text({"transport": c.transport, **c.params} if c.transport
                                  else c.params), f"{c.busbw_gbps:.3f}",
                     f"{c.native_busbw_gbps:.3f}", f"{c.speedup:.2f}x"])
    return rows


BUCKET_HEADER = ["bucket", "trials", "stopped by", "choice", "params", "busbw(GB/s)",
                 "native(GB/s)", "speed-up"]


def write_report(folder: str, result: Any) -> list[str]:
    """``busbw.png`` and ``report.md`` in ``folder`` (created); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from collectives.bench import busbw_factor

    os.makedirs(folder, exist_ok=True)
    n = result.profile["topology"]["world_size"]
    sizes = [c.nbytes for c in result.choices]

    def bw(nbytes: int, t_us: float) -> float:
        return nbytes / (t_us * 1e-6) / 1e9 * busbw_factor(n) if t_us > 0 else 0.0

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(sizes, [c.native_busbw_gbps for c in result.choices], "o-", color="black",
            label="native (A/B)")
    ax.plot(sizes, [c.busbw_gbps for c in result.choices], "s-", color="tab:red", lw=2,
            label="tuned (A/B)")
    algos = sorted({a for s in result.buckets for a in s.best_by_algorithm})
    for a in algos:
        pts = [(s.nbytes, bw(s.nbytes, s.best_by_algorithm[a][1])) for s in result.buckets
               if a in s.best_by_algorithm]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".--", alpha=0.7,
                    label=f"best {a} (search)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    topo = result.profile["topology"]
    ax.set_title(f"allreduce {result.profile['dtype']} {result.profile['op']}, "
                 f"{topo.get('summary', '')}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    png = os.path.join(folder, "busbw.png")
    try:
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)

    md = ["# ringtune tuning report", "", profile_heading(result.profile, result.path), "",
          "## Rules", "", markdown_table(RULE_HEADER, rule_rows(result.profile)), "",
          *([note, ""] if (note := unstable_note(result.profile)) else []),
          "## Buckets (interleaved A/B re-measurement against native)", "",
          markdown_table(BUCKET_HEADER, bucket_rows(result)), "",
          *[f"- {human_bytes(c.nbytes)}: {c.note}" for c in result.choices if c.note],
          "", "![busbw vs size](busbw.png)", ""]
    mdpath = os.path.join(folder, "report.md")
    write_text_atomic(mdpath, "\n".join(md))
    return [png, mdpath]
