#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plots a before/after comparison of block_bench runs made in one session:
a folder of block_bench --json files named <tree>-<workload>-<round>.json
(tree: old or new, or the two names given with --trees). Writes
before-after.png (mean operations per second of each workload, one bar per
tree, every round as a dot) and before-after.json (each run, and the ratio of
the second tree's mean to the first's).

    benchmarks/plot_before_after.py benchmarks/results/<folder>
    benchmarks/plot_before_after.py <folder> --trees full,real --labels "full build,real-controller build"
"""
import argparse
import json
import pathlib
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(folder, trees):
    runs = []
    for f in sorted(folder.glob("*.json")):
        if f.name == "before-after.json":
            continue
        tree, _, rest = f.stem.partition("-")
        workload, _, rnd = rest.rpartition("-")
        if tree not in trees or not workload:
            continue
        d = json.loads(f.read_text())
        r = d["results"][0]
        runs.append({"tree": tree, "workload": workload, "round": rnd, "file": f.name, "gpu": d.get("gpu"),
                     "driver": d.get("driver"), "date": d.get("date"), "device": r["device"], "mode": r["mode"],
                     "threads": r["threads"], "Mops_per_s": r["ops_per_s"] / 1e6, "GB_per_s": r["GB_per_s"],
                     "latency_us": r["latency_us"], "hit_rate": r.get("hit_rate")})
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=".")
    ap.add_argument("--trees", default="old,new", help="the two tree names of the file names, first = before")
    ap.add_argument("--labels", default="before,after", help="what the two trees are called in the plot")
    args = ap.parse_args()
    folder = pathlib.Path(args.folder)
    first, second = args.trees.split(",")
    label_first, label_second = args.labels.split(",")
    runs = load(folder, (first, second))
    if not runs:
        sys.exit(f"{folder}: no <tree>-<workload>-<round>.json files")
    workloads = sorted({r["workload"] for r in runs})
    ratios = {}
    fig, ax = plt.subplots(figsize=(1.8 + 1.8 * len(workloads), 4))
    for k, tree in enumerate((first, second)):
        means = []
        for i, w in enumerate(workloads):
            vals = [r["Mops_per_s"] for r in runs if r["workload"] == w and r["tree"] == tree]
            means.append(statistics.mean(vals) if vals else 0.0)
            ax.plot([i + (k - 0.5) * 0.38] * len(vals), vals, "k.", markersize=4)
        ax.bar([i + (k - 0.5) * 0.38 for i in range(len(workloads))], means, width=0.36,
               label=label_first if tree == first else label_second)
    for w in workloads:
        old = [r["Mops_per_s"] for r in runs if r["workload"] == w and r["tree"] == first]
        new = [r["Mops_per_s"] for r in runs if r["workload"] == w and r["tree"] == second]
        if old and new:
            ratios[w] = round(statistics.mean(new) / statistics.mean(old), 4)
    ax.set_xticks(range(len(workloads)),
                  [f"{w}\n({second}/{first} {ratios.get(w, float('nan')):.3f})" for w in workloads], fontsize=8)
    ax.set_ylabel("M operations / s")
    ax.set_title(f"block_bench: {label_first} and {label_second}, {runs[0]['gpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "before-after.png", dpi=120)
    (folder / "before-after.json").write_text(
        json.dumps({"trees": {first: label_first, second: label_second}, "runs": runs,
                    f"{second}_over_{first}": ratios}, indent=1) + "\n")
    for w, q in ratios.items():
        print(f"{w}: {second}/{first} {q:.4f}")


if __name__ == "__main__":
    main()
