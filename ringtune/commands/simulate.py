"""ringtune simulate — plan a cluster you do not have, with the α–β cost model.

For each message size from ``-b`` to ``-e`` (factor ``-f``), the predicted time and bus
bandwidth of each algorithm's best configuration on the cluster described by ``--cluster``
(a YAML file; see ``profiles/clusters/``). With ``--workload`` (gradient bytes, compute
seconds per step, overlap fraction), the predicted weak-scaling efficiency from one host up
to the cluster's size. ``--json`` writes the same as JSON, ``--report DIR`` a PNG plot and
the tables as Markdown. Runs in one process; nothing is measured.

Its ``native`` is the cluster file's ``native_model``: ``best`` (every shipped cluster
file) is an idealised allreduce, the better of recursive doubling and halving-doubling at
each size with this cluster's links, what a well-tuned library approaches; it is not
NCCL's or an MPI library's own selection, which ``ringtune bench --algo native`` measures.

  ringtune simulate --cluster profiles/clusters/dgx-h100-128.yaml -b 1K -e 512M -f 2 \\
      --workload profiles/clusters/workloads/resnet50-p100.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..flags import add_algos, add_size_range, add_stepfactor, algo_list

HELP = ("predict allreduce time and scaling on a described cluster (cost model; its "
        "native is an idealised allreduce, not NCCL or MPI)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="FILE", required=True,
                   help="cluster description (YAML, see profiles/clusters/)")
    add_size_range(p, "1K", "256M")
    add_stepfactor(p, 4.0)
    p.add_argument("--workload", metavar="FILE",
                   help="training step (YAML: gradient_bytes, compute_seconds, overlap): "
                   "adds the predicted scaling efficiency from 1 host to the cluster")
    add_algos(p, "only these algorithms of the cost model (native: an idealised "
              "allreduce, see above)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the results as JSON (to FILE, or stdout instead of the tables)")
    p.add_argument("--report", metavar="DIR", help="write simulate.png and simulate.md here")


def host_counts(hosts: int) -> list[int]:
    """1, 2, 4, … up to ``hosts``, and ``hosts`` itself."""
    out, h = [], 1
    while h < hosts:
        out.append(h)
        h *= 2
    out.append(hosts)
    return out


def simulate(cluster: Any, sizes: list[int], workload: Any = None,
             algorithms: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The whole result as plain data (what ``--json`` writes)."""
    from autotune.model import Model, model_algorithms

    algos = algorithms or model_algorithms()
    model = Model(cluster)
    best = model.best(sizes, algos)
    rows = []
    for i, size in enumerate(sizes):
        per: dict[str, dict[str, Any]] = {
            name: {"time_us": _sig(best[name][i].time_us),
                   "busbw_gbps": _sig(best[name][i].busbw_gbps),
                   "params": best[name][i].params,
                   "config": best[name][i].describe()}
            for name in algos if name in best}
        winner = min(per, key=lambda k: per[k]["time_us"])
        rows.append({"bytes": size, "algorithms": per, "best": winner})
    out: dict[str, Any] = {
        "cluster": {"name": cluster.name, "file": cluster.path, "ranks": cluster.ranks,
                    "hosts": cluster.hosts, "ranks_per_host": cluster.ranks_per_host,
                    "levels": [{"name": lv.name, "size": lv.size,
                                "bandwidth_gbs": lv.bandwidth_gbs,
                                "latency_us": lv.latency_us,
                                "links_per_rank": lv.links_per_rank, "shared": lv.shared}
                               for lv in cluster.levels],
                    "native_model": cluster.native_model},
        "sizes": rows,
    }
    if workload is not None:
        scaling = []
        for h in host_counts(cluster.hosts):
            sub = cluster.with_hosts(h)
            sub_best = Model(sub).best([workload.gradient_bytes], algos)
            per = {}
            for name, preds in sub_best.items():
                t = preds[0].time_us * 1e-6
                per[name] = {"allreduce_ms": _sig(t * 1e3),
                             "step_ms": _sig(workload.step_seconds(t) * 1e3),
                             "efficiency": _sig(workload.efficiency(t)),
                             "config": preds[0].describe(), "params": preds[0].params}
            winner = max(per, key=lambda k: per[k]["efficiency"])
            scaling.append({"hosts": h, "ranks": sub.ranks, "algorithms": per,
                            "best": winner})
        out["workload"] = {"name": workload.name, "gradient_bytes": workload.gradient_bytes,
                           "compute_seconds": workload.compute_seconds,
                           "overlap": workload.overlap, "scaling": scaling}
    return out


def _sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (JSON stays readable, tiny values
    keep their meaning)."""
    return float(f"{x:.{digits}g}")


def _fmt_size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def native_note(native_model: str) -> str:
    """What ``native`` is in the tables: the model's, not a library's measured allreduce."""
    if native_model == "best":
        return ("# native = an idealised allreduce (the better of recursive doubling and "
                "halving-doubling per size on these links), not NCCL's or an MPI library's "
                "own; `ringtune bench --algo native` measures a real one.")
    return (f"# native = {native_model}'s own selection as the cost model describes it "
            "(collectives/natives), predicted, not measured.")


def tables(result: dict[str, Any]) -> list[str]:
    c = result["cluster"]
    levels = " x ".join(f"{lv['name']} {lv['size']}" for lv in c["levels"])
    lines = [f"# cluster {c['name']}: {c['ranks']} ranks = {c['hosts']} hosts x "
             f"{c['ranks_per_host']} ({levels})",
             f"# {'size':>8}  {'algorithm':<13}{'time(us)':>12}{'busbw(GB/s)':>13}  "
             f"best configuration"]
    for row in result["sizes"]:
        first = True
        for name, r in row["algorithms"].items():
            mark = " *" if name == row["best"] else ""
            size = _fmt_size(row["bytes"]) if first else ""
            lines.append(f"  {size:>8}  {name:<13}{r['time_us']:>12.1f}{r['busbw_gbps']:>13.2f}"
                         f"  {r['config']}{mark}")
            first = False
    w = result.get("workload")
    if w:
        names = list(w["scaling"][0]["algorithms"])
        lines.append("")
        lines.append(f"# workload {w['name']}: {w['gradient_bytes']} B of gradients per step, "
                     f"compute {w['compute_seconds']} s, overlap {w['overlap']:.2f}; "
                     f"scaling efficiency (weak scaling, 1 GPU = 100%)")
        lines.append(f"# {'hosts':>5}{'ranks':>7}" + "".join(f"{n:>14}" for n in names)
                     + "   best (allreduce ms)")
        for s in w["scaling"]:
            b = s["algorithms"][s["best"]]
            lines.append(f"  {s['hosts']:>5}{s['ranks']:>7}"
                         + "".join(f"{100 * s['algorithms'][n]['efficiency']:>13.1f}%"
                                   for n in names)
                         + f"   {b['config']} ({b['allreduce_ms']:.2f})")
    lines.append("# * = fastest at that size. Predicted by the alpha-beta model "
                 "(autotune/model.py), not measured.")
    lines.append(native_note(c.get("native_model", "best")))
    return lines


#: Per algorithm, in order: marker and line style. Series that coincide (``native`` and
#: ``rhd`` predict the same times where MPI runs recursive halving-doubling) stay visible:
#: earlier series are drawn larger and wider underneath, later ones smaller on top.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def plot_styles(names: list[str]) -> dict[str, dict[str, Any]]:
    """One matplotlib style per algorithm name (the same in every panel): colour, marker,
    line style, and size and depth so that identical series do not hide each other."""
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        out[name] = {"color": f"C{i % 10}", "marker": _MARKERS[i % len(_MARKERS)],
                     "linestyle": _LINESTYLES[i % len(_LINESTYLES)],
                     "markersize": max(3.0, 10.0 - 2.0 * i), "linewidth": max(1.0, 3.0 - 0.6 * i),
                     "zorder": 2 + i, "markerfacecolor": "none" if i % 2 == 0 else None}
    return out


def _algorithm_names(result: dict[str, Any]) -> list[str]:
    """Every algorithm of both panels, in the size table's order, then any others."""
    names = list(result["sizes"][0]["algorithms"])
    w = result.get("workload")
    for s in (w or {}).get("scaling", [])[:1]:
        names += [n for n in s["algorithms"] if n not in names]
    return names


def _panel(ax: Any, xs: list[Any], series: dict[str, list[float]],
           styles: dict[str, dict[str, Any]], xlabel: str, ylabel: str, title: str) -> None:
    """One log-x panel with a line per algorithm, in that algorithm's style."""
    for name, ys in series.items():
        ax.plot(xs, ys, label=name, **styles[name])
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()


def figure(result: dict[str, Any]) -> Any:
    """The matplotlib figure of a simulation: busbw per size, and with a workload the
    scaling efficiency per rank count; one style per algorithm across both panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = _algorithm_names(result)
    styles = plot_styles(names)
    w = result.get("workload")
    fig, axes = plt.subplots(1, 2 if w else 1, figsize=(12 if w else 7, 4.5), squeeze=False)
    rows = result["sizes"]
    _panel(axes[0][0], [r["bytes"] for r in rows],
           {n: [r["algorithms"][n]["busbw_gbps"] for r in rows]
            for n in names if n in rows[0]["algorithms"]},
           styles, "message size (bytes)", "predicted busbw (GB/s)",
           f"{result['cluster']['name']} ({result['cluster']['ranks']} ranks)")
    if w:
        sc = w["scaling"]
        _panel(axes[0][1], [s["ranks"] for s in sc],
               {n: [100 * s["algorithms"][n]["efficiency"] for s in sc]
                for n in names if n in sc[0]["algorithms"]},
               styles, "ranks", "predicted scaling efficiency (%)", f"workload {w['name']}")
    fig.tight_layout()
    return fig


def _plot(result: dict[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    from collectives.plumbing.atomic import atomic_path

    fig = figure(result)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from autotune.cluster import load_cluster, load_workload
    from autotune.model import model_algorithms
    from collectives.bench import parse_size, size_list
    from collectives.plumbing.atomic import write_text_atomic
    from ringtune.errors import UsageError

    cluster = load_cluster(args.cluster)
    workload = load_workload(args.workload) if args.workload else None
    sizes = [s for s in size_list(parse_size(args.minbytes), parse_size(args.maxbytes),
                                  args.stepfactor) if s > 0]
    if not sizes:
        raise UsageError("simulate: no positive sizes between -b and -e")
    known = model_algorithms()
    algos = tuple(algo_list(args.algo) or known)
    unknown = [a for a in algos if a not in known]
    if unknown:
        raise UsageError(f"--algo {unknown[0]}: the cost model knows {', '.join(known)}")
    result = simulate(cluster, sizes, workload, algos)
    lines = tables(result)
    if args.json:
        text = json.dumps(result, indent=1, default=str) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            write_text_atomic(args.json, text)
    if args.json != "-":
        print("\n".join(lines))
    if args.report:
        os.makedirs(args.report, exist_ok=True)
        _plot(result, os.path.join(args.report, "simulate.png"))
        write_text_atomic(os.path.join(args.report, "simulate.md"),
                          "```\n" + "\n".join(lines) + "\n```\n")
    return 0
