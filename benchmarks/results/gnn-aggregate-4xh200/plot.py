#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""summary.json and gnn-aggregate-4xh200.png from this folder's bam-gnn aggregate JSON files."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).resolve().parent
ROWS = [("n1m", "g1", "1 GPU"), ("n1m", "g2-own", "2, a cache each"), ("n1m", "g2-node", "2, one cache"),
        ("n1m", "g4-own", "4, a cache each"), ("n1m", "g4-node", "4, one cache"),
        ("n2m", "g1", "1 GPU"), ("n2m", "g4-own", "4, a cache each"), ("n2m", "g4-node", "4, one cache")]


def runs(prefix):
    """Mini-batches/s, hit rate and gather ms of every round of a run."""
    out = []
    for f in sorted(here.glob(f"{prefix}*.json")):
        rest = f.stem[len(prefix):]
        if rest and not rest.startswith("-r"):
            continue  # -if3, -proc: their own rows
        d = json.loads(f.read_text())
        out.append({"file": f.name, "batches_per_s": d["batches_per_s"], "hit_rate": d["cache"]["hit_rate"],
                    "gather_ms_per_batch": d["ms_per_batch"]["gathering"]})
    return out


summary = {}
for ds, run, label in ROWS + [("n1m", "g4-own-proc", ""), ("n1m", "g4-node-proc", ""), ("n1m", "g4-own-if3", ""),
                              ("n1m", "g4-node-if3", "")]:
    r = runs(f"{ds}-{run}")
    summary[f"{ds}-{run}"] = {"rounds": r, "batches_per_s": statistics.mean(x["batches_per_s"] for x in r)}
for ds in ("n1m", "n2m"):
    one = summary[f"{ds}-g1"]["batches_per_s"]
    for k, v in summary.items():
        if k.startswith(ds):
            v["x_one_gpu"] = v["batches_per_s"] / one
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [5, 3]})
for ax, ds, title in ((axes[0], "n1m", "1 M nodes, 4 KiB rows: table 3.8 x a GPU's 1 GiB cache"),
                      (axes[1], "n2m", "2 M nodes: table 7.6 x a GPU's cache")):
    rows = [(run, label) for d, run, label in ROWS if d == ds]
    vals = [summary[f"{ds}-{run}"]["batches_per_s"] for run, _ in rows]
    bars = ax.bar(range(len(rows)), vals, color=["#999" if "g1" in r else "#38a" if "own" in r else "#d62"
                                                 for r, _ in rows])
    for b, (run, _) in zip(bars, rows):
        s = summary[f"{ds}-{run}"]
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                f"{s['batches_per_s']:.0f}\n{s['x_one_gpu']:.2f}x, {s['rounds'][0]['hit_rate']:.0%} hits",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([lbl for _, lbl in rows], fontsize=8)
    ax.set_ylim(0, max(vals) * 1.25)
    ax.set_title(title, fontsize=9)
axes[0].set_ylabel("mini-batches/s, all GPUs")
fig.suptitle("bam-gnn aggregate, 4 x H200, features in emu-gpu:shm (one copy)", fontsize=9)
fig.tight_layout()
fig.savefig(here / "gnn-aggregate-4xh200.png", dpi=110)
print(here / "gnn-aggregate-4xh200.png")
