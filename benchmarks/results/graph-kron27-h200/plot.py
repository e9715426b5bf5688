#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""summary.json and graph-kron27.png from this folder's bam-graph and block_bench JSON files."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).resolve().parent
runs = {"PageRank, 20 iterations (8 KiB pages)": "pr27-8k", "BFS, direction-optimizing": "bfs27",
        "CC (Afforest)": "cc27"}
summary = {}
for label, name in runs.items():
    d = json.loads((here / "json" / f"{name}.json").read_text())
    summary[name] = {"label": label, "page_size": d["page_size"], "cache_bytes": d["cache_bytes"],
                     "paths": {p["path"]: {"seconds": statistics.mean(p["seconds"]),
                                           "ratio_to_zero_copy": p["ratio_to_zero_copy"]}
                               for p in d["paths"] if p["ran"]}}
    bam = next(p for p in d["paths"] if p["path"] == "bam")
    summary[name]["paths"]["bam"].update(hit_rate=bam["hit_rate"], misses_per_s=bam["misses_per_s"])
for name in ("pr27-null-8k", "pr27-null-4k"):
    d = json.loads((here / "json" / f"{name}.json").read_text())
    bam = d["paths"][0]
    summary[name] = {"page_size": d["page_size"], "seconds": statistics.mean(bam["seconds"]),
                     "misses_per_s": bam["misses_per_s"], "hit_rate": bam["hit_rate"]}
for k in (4096, 8192):
    r = json.loads((here / "json" / f"raw-null-{k}.json").read_text())["results"][0]
    summary[f"raw-null-{k}"] = {"commands_per_s": r["ops_per_s"], "GB_per_s": r["GB_per_s"]}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(1, 4, figsize=(14, 3.8), gridspec_kw={"width_ratios": [3, 3, 3, 3]})
colors = {"bam": "#d62", "zero-copy": "#38a", "gpu-memory": "#999", "cpu": "#6a3"}
for ax, (label, name) in zip(axes, runs.items()):
    paths = summary[name]["paths"]
    order = [p for p in ("bam", "zero-copy", "gpu-memory", "cpu") if p in paths]
    bars = ax.bar(range(len(order)), [paths[p]["seconds"] for p in order], color=[colors[p] for p in order])
    for b, p in zip(bars, order):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                f"{paths[p]['seconds']:.3g} s\n{paths[p]['ratio_to_zero_copy']:.2f}x", ha="center", va="bottom",
                fontsize=7)
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=max(paths[p]["seconds"] for p in order) * 4)
    ax.set_title(label, fontsize=8)
axes[0].set_ylabel("seconds per run (log)")
ax = axes[3]
vals = [summary["pr27-8k"]["paths"]["bam"]["misses_per_s"] / 1e6, summary["pr27-null-8k"]["misses_per_s"] / 1e6,
        summary["raw-null-8192"]["commands_per_s"] / 1e6]
bars = ax.bar(range(3), vals, color=["#d62", "#e95", "#555"])
for b, v in zip(bars, vals):
    ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{v:.1f} M/s", ha="center", va="bottom", fontsize=7)
ax.set_xticks(range(3))
ax.set_xticklabels(["PageRank misses,\nemu-gpu:ram", "PageRank misses,\nemu-gpu:null", "raw queue path,\nemu-gpu:null"],
                   fontsize=6)
ax.set_title("8 KiB: misses/s against the queues' rate", fontsize=8)
fig.suptitle("bam-graph, R-MAT scale 27 (134 M nodes, 4.22 B stored edges, a 16.7 GiB image), one H200, cache = 1/8 of the "
             "edges, emu-gpu:ram unless named", fontsize=9)
fig.tight_layout()
fig.savefig(here / "graph-kron27.png", dpi=110)
print(here / "graph-kron27.png")
