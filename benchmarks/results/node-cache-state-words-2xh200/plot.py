#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""summary.json and state-words.png from this folder's bam-gnn aggregate JSON files."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).resolve().parent
RUNS = [("g1", "1 GPU, 1 GiB cache"), ("own", "2 GPUs, a cache each"), ("node", "2 GPUs, one cache"),
        ("hot64", "one cache + 64 MiB hot copy")]
# folder, prefix, the layout's name
SETS = [("head", "", "words in runs of their own (as built)"),
        ("ab-division", "old-", "words in runs of their own (as built)"),
        ("ab-division", "new-", "words beside their pages, index by division"),
        ("ab-multiply", "old-", "words in runs of their own (as built)"),
        ("ab-multiply", "new-", "words beside their pages, index by multiply")]


def rates(folder, prefix, run):
    return [json.loads(f.read_text())["batches_per_s"] for f in sorted((here / folder).glob(f"{prefix}{run}-r*.json"))]


summary = {}
for folder, prefix, label in SETS:
    key = f"{folder}/{prefix or 'head-'}".rstrip("-")
    row = {"layout": label}
    for run, _ in RUNS:
        r = rates(folder, prefix, run)
        if r:
            row[run] = {"batches_per_s": r, "mean": statistics.mean(r)}
    if "own" in row:
        for run in ("node", "hot64"):
            row[f"{run}_over_own"] = row[run]["mean"] / row["own"]["mean"]
    summary[key] = row
# The layout as built, every round of the three calls together.
pooled = {run: [x for folder, prefix, _ in SETS if "runs of their own" in _ for x in rates(folder, prefix, run)]
          for run, _ in RUNS}
summary["as built, all rounds"] = {run: {"batches_per_s": v, "mean": statistics.mean(v)} for run, v in pooled.items() if v}
b = json.loads((here / "block-node2.json").read_text())
summary["block_bench_node_cache_2gpu"] = b
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
for ax, folder, title in ((axes[0], "ab-division", "A/B 1: word index by a division"),
                          (axes[1], "ab-multiply", "A/B 2: by a multiply, power-of-two ways")):
    for k, (prefix, color, name) in enumerate((("old-", "#38a", "as built"), ("new-", "#d62", "words beside pages"))):
        row = summary[f"{folder}/{prefix}".rstrip("-")]
        vals = [row[run]["mean"] if run in row else 0 for run, _ in RUNS]
        bars = ax.bar([i + 0.4 * k for i in range(len(RUNS))], vals, 0.4, color=color, label=name)
        for bar, v in zip(bars, vals):
            ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([i + 0.2 for i in range(len(RUNS))])
    ax.set_xticklabels([label for _, label in RUNS], fontsize=7, rotation=12)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
axes[0].set_ylabel("mini-batches/s, all GPUs (mean of 2 rounds)")
fig.suptitle("Where a spread cache's state words live: bam-gnn aggregate, 2 x H200, same run each", fontsize=10)
fig.tight_layout()
fig.savefig(here / "state-words.png", dpi=110)
print(here / "state-words.png")
