#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws the runs of scripts/gnn-pipeline: for each data set, the mini-batch
rate end to end (sampling, gather, aggregation) and the gather stage's
GB/s as a ratio to the zero-copy gather of the same run, for 1, 2 and 3
batches in flight with look-ahead holds off and on (bars: the mean of the
rounds; ticks: each round). Writes pipeline.png and pipeline.json (the
points) into the folder.

    examples/gnn/plot_pipeline.py benchmarks/results/gnn-pipeline-<gpu>-<date>

Installs matplotlib into a private virtual environment when it is missing."""
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from plot_aggregate import ensure_matplotlib  # noqa: E402

NAME = re.compile(r"^(?P<data>.+)-f(?P<flight>\d+)-la(?P<la>on|off)-r(?P<rep>\d+)$")


def baseline(run, path):
    for b in run.get("baselines", []):
        if b.get("path") == path and b.get("ran"):
            return b
    return None


def points(folder):
    out = {}
    for f in sorted(folder.glob("*.json")):
        m = NAME.match(f.stem)
        if not m:
            continue
        run = json.loads(f.read_text())
        zero = baseline(run, "zero-copy")
        key = (m["data"], int(m["flight"]), m["la"] == "on")
        out.setdefault(key, []).append({
            "round": int(m["rep"]),
            "batches_per_s": run["batches_per_s"],
            "nodes_per_s": run["nodes_per_s"],
            "gather_GB_per_s": run["gather"]["GB_per_s"],
            "zero_copy_GB_per_s": zero["GB_per_s"] if zero else None,
            "gather_vs_zero_copy": run["gather"]["GB_per_s"] / zero["GB_per_s"] if zero else None,
            "hit_rate": run["cache"]["hit_rate"],
            "held_pages_per_batch": run.get("held_pages_per_batch"),
            "ms_per_batch": run["ms_per_batch"],
            "gpu": run["gpu"], "commit": run["commit"], "date": run["date"], "device": run["device"],
        })
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = pathlib.Path(sys.argv[1])
    pts = points(folder)
    if not pts:
        sys.exit(f"plot_pipeline: no runs in {folder}")
    summary = [{"data": d, "in_flight": n, "lookahead": la,
                "mean_batches_per_s": sum(r["batches_per_s"] for r in rs) / len(rs),
                "mean_gather_vs_zero_copy": (sum(r["gather_vs_zero_copy"] for r in rs) / len(rs)
                                             if all(r["gather_vs_zero_copy"] for r in rs) else None),
                "mean_hit_rate": sum(r["hit_rate"] for r in rs) / len(rs), "rounds": rs}
               for (d, n, la), rs in sorted(pts.items())]
    (folder / "pipeline.json").write_text(json.dumps(summary, indent=2) + "\n")
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({d for d, _, _ in pts})
    fig, axes = plt.subplots(2, len(datasets), figsize=(6 * len(datasets), 8), squeeze=False)
    for col, d in enumerate(datasets):
        keys = sorted(k for k in pts if k[0] == d)
        labels = [f"{n} in flight\n{'holds' if la else 'no holds'}" for _, n, la in keys]
        for row, (metric, title) in enumerate([("batches_per_s", "mini-batches/s, end to end"),
                                               ("gather_vs_zero_copy", "gather stage / zero-copy gather, same run")]):
            ax = axes[row][col]
            means = [sum(r[metric] for r in pts[k]) / len(pts[k]) for k in keys]
            ax.bar(range(len(keys)), means, color=["tab:blue" if k[2] else "tab:cyan" for k in keys])
            for i, k in enumerate(keys):
                ax.plot([i] * len(pts[k]), [r[metric] for r in pts[k]], "k_", markersize=14)
            if metric == "gather_vs_zero_copy":
                ax.axhline(1.0, color="tab:orange", linestyle="--", label="zero-copy from pinned host memory")
                ax.legend(loc="lower right", fontsize=8)
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_title(f"{d}: {title}", fontsize=9)
    first = next(iter(pts.values()))[0]
    fig.suptitle(f"bam-gnn aggregate, batches in flight and look-ahead holds: {first['gpu']}, {first['device']}, "
                 f"commit {first['commit']}, {first['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / "pipeline.png", dpi=110)
    print(f"wrote {folder / 'pipeline.png'} and {folder / 'pipeline.json'}")


if __name__ == "__main__":
    main()
