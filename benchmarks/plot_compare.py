#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plots the JSON files of one results folder that the sweep script does not:
block_bench --compare runs (bam's figure next to the ceilings and baselines
of the same run, GB/s on a log scale: <name>.png for each <name>.json) and
extent_lookup runs (lookups per second against the runs in the map).

    benchmarks/plot_compare.py benchmarks/results/<folder>
"""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_block_bench(d, out):
    labels, values, colors = [], [], []
    for r in d["results"]:
        labels.append(f"bam, {r['mode']}: {r['device'].split(',')[0]}")
        values.append(r["GB_per_s"])
        colors.append("tab:blue")
    for c in d.get("ceilings", []):
        if "GB_per_s" not in c:
            continue
        labels.append(c["what"] + (f" ({c['note']})" if c.get("note") else ""))
        values.append(c["GB_per_s"])
        colors.append("tab:gray")
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(labels) + 1.5))
    y = range(len(labels))
    ax.barh(y, values, color=colors)
    for i, v in zip(y, values):
        ax.text(v, i, f" {v:.3g}", va="center", fontsize=8)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("GB/s of payload (log scale)")
    r = d["results"][0]
    fig.suptitle(f"{r['io_bytes']}-byte random reads, {r['threads']} GPU threads\n{d['gpu']}, "
                 f"CUDA driver {d['driver']}, commit {d['commit']}, {d['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_extent_lookup(d, out):
    rs = d["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["runs"] for r in rs], [r["lookups_per_s"] / 1e9 for r in rs], "o-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("runs (extents) in the file's map")
    ax.set_ylabel("lookups per second (G)")
    ax.set_title(f"extent lookups on the GPU, {rs[0]['threads']} threads\n{d['gpu']}, commit {d['commit']}, "
                 f"{d['date'][:10]}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = pathlib.Path(sys.argv[1])
    drawn = 0
    for f in sorted(folder.glob("*.json")):
        d = json.loads(f.read_text())
        if d.get("benchmark") == "block_bench" and d.get("ceilings"):
            plot_block_bench(d, f.with_suffix(".png"))
        elif d.get("benchmark") == "extent_lookup":
            plot_extent_lookup(d, f.with_suffix(".png"))
        else:
            continue
        drawn += 1
        print(f"wrote {f.with_suffix('.png')}")
    if drawn == 0:
        sys.exit(f"{folder}: no block_bench --compare or extent_lookup JSON files")


if __name__ == "__main__":
    main()
