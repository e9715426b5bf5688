#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""summary.json and register-caps.png from this folder's bam-gnn aggregate JSON files."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).resolve().parent
VARIANTS = [("b", "as built (254 registers)"), ("b2", "capped at 128"), ("b3", "capped at 80")]
summary = {}
for v, label in VARIANTS:
    row = {"label": label}
    for layout in ("own", "node"):
        runs = [json.loads(f.read_text()) for f in sorted((here / "json").glob(f"g2-{layout}-{v}-r*.json"))]
        row[layout] = {"batches_per_s": [r["batches_per_s"] for r in runs],
                       "gather_ms": [r["ms_per_batch"]["gathering"] for r in runs],
                       "hit_rate": runs[0]["cache"]["hit_rate"]}
        row[layout]["mean"] = statistics.mean(row[layout]["batches_per_s"])
    row["node_over_own"] = row["node"]["mean"] / row["own"]["mean"]
    summary[v] = row
for w in (4, 32):
    r = json.loads((here / "json" / f"g2-node-w{w}.json").read_text())
    summary[f"node-rows-per-warp-{w}"] = {"batches_per_s": r["batches_per_s"], "gather_ms": r["ms_per_batch"]["gathering"]}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(7, 4))
x = range(len(VARIANTS))
for k, (layout, color) in enumerate((("own", "#38a"), ("node", "#d62"))):
    vals = [summary[v][layout]["mean"] for v, _ in VARIANTS]
    bars = ax.bar([i + 0.4 * k for i in x], vals, 0.4, color=color,
                  label="a cache each" if layout == "own" else "one cache over both")
    for b, val in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, val, f"{val:.0f}", ha="center", va="bottom", fontsize=8)
ax.set_xticks([i + 0.2 for i in x])
ax.set_xticklabels([label for _, label in VARIANTS], fontsize=8)
ax.set_ylabel("mini-batches/s, both GPUs (mean of 2 rounds)")
ax.set_title("gather_rows_kernel register caps, bam-gnn aggregate --gpus 2, 2 x H200", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(here / "register-caps.png", dpi=110)
print(here / "register-caps.png")
