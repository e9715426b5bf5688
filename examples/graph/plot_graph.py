#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws the curves of scripts/graph-sweep: each algorithm's rate through
bam (GTEPS for BFS, G edges/s otherwise), one line per access mode, with
the zero-copy and GPU-memory rates of the same runs, and bam's cache hit
rate, against the cache size as a fraction of the edges
(ALGO-cache-*.json) and against the page size (ALGO-page-*.json), into
graph.png and graph-points.json (the points).

    examples/graph/plot_graph.py benchmarks/results/graph-sweep-<gpu>-<date>

Installs matplotlib into a private virtual environment when it is missing."""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gnn"))
from plot_aggregate import ensure_matplotlib  # noqa: E402


def rate(path):
    return path.get("teps", path.get("edges_per_s", 0.0)) / 1e9


def point(run):
    p = {"algorithm": run["benchmark"].split()[-1], "access": run["access"], "page_size": run["page_size"],
         "cache_fraction": run["cache_to_edges"]}
    for path in run["paths"]:
        if path.get("ran"):
            p[path["path"]] = rate(path)
            if path["path"] == "bam":
                p["hit_rate"] = path.get("hit_rate")
    return p


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = pathlib.Path(sys.argv[1])
    points = []
    for f in sorted(folder.glob("*.json")):
        run = json.loads(f.read_text())
        if str(run.get("benchmark", "")).startswith("bam-graph"):
            p = point(run)
            p["sweep"] = "cache" if "-cache-" in f.stem else "page" if "-page-" in f.stem else "other"
            points.append(p)
    if not points:
        sys.exit(f"{folder}: no bam-graph JSON files")
    (folder / "graph-points.json").write_text(json.dumps(points, indent=2) + "\n")
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = sorted({p["algorithm"] for p in points})
    sweeps = [("cache", "cache_fraction", "cache / edge array"), ("page", "page_size", "page size (bytes)")]
    fig, axes = plt.subplots(len(algos), 2, figsize=(13, 4.5 * len(algos)), squeeze=False)
    for row, algo in enumerate(algos):
        for col, (sweep, key, label) in enumerate(sweeps):
            ax = axes[row][col]
            pts = sorted((p for p in points if p["algorithm"] == algo and p["sweep"] == sweep), key=lambda p: p[key])
            if not pts:
                ax.set_visible(False)
                continue
            for access in sorted({p["access"] for p in pts}):
                mine = [p for p in pts if p["access"] == access]
                ax.plot([p[key] for p in mine], [p.get("bam", 0) for p in mine], "o-", label=f"bam ({access})")
            for base, style in (("zero-copy", "--"), ("gpu-memory", ":")):
                xs = [p[key] for p in pts if base in p]
                if xs:
                    ax.plot(xs, [p[base] for p in pts if base in p], style, label=base)
            ax.set_xscale("log", base=2)
            ax.set_xlabel(label)
            ax.set_ylabel("GTEPS" if algo == "bfs" else "G edges/s")
            ax.set_title(f"{algo}: against {sweep} size")
            hit = ax.twinx()
            copy = [p for p in pts if p["access"] == "copy" and p.get("hit_rate") is not None]
            hit.plot([p[key] for p in copy], [100 * p["hit_rate"] for p in copy], "x", color="grey", label="hit rate")
            hit.set_ylabel("hit rate (%)")
            hit.set_ylim(0, 100)
            ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "graph.png", dpi=120)
    print(f"{folder / 'graph.png'}")


if __name__ == "__main__":
    main()
