#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""summary.json and gnn-hot-replica.png from this folder's bam-gnn aggregate JSON files
(4xh200/json: the 4-GPU machine; 4xh200-even/json: a later session on a 4-GPU
machine, the cache's parts equal; 2xh200/json: the 2-GPU machine)."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).resolve().parent
# (machine, run prefix, label); every round of a run (-r1, -r2, ...) is averaged.
ROWS = [
    ("4xh200", "g1", "1 GPU"),
    ("4xh200", "g4-own", "a cache each"),
    ("4xh200", "g4-node", "one cache"),
    ("4xh200", "g4-hot128", "one cache + 128 MiB hot"),
    ("4xh200", "g4-hot256", "one cache + 256 MiB hot"),
    ("4xh200", "g4-hot384", "one cache + 384 MiB hot"),
    ("4xh200", "g4-hot512", "one cache + 512 MiB hot"),
    ("4xh200", "g4-own-proc", "a cache each, processes"),
    ("4xh200", "g4-node-proc", "one cache, processes"),
    ("4xh200", "g4-hot256-proc", "one cache + 256 MiB hot, processes"),
    ("4xh200", "g4-own-if3", "a cache each, 3 in flight"),
    ("4xh200", "g4-hot256-if3", "one cache + 256 MiB hot, 3 in flight"),
    ("4xh200", "g2-own", "a cache each"),
    ("4xh200", "g2-node", "one cache"),
    ("4xh200", "g2-hot64", "one cache + 64 MiB hot"),
    ("4xh200", "g2-hot128", "one cache + 128 MiB hot"),
    ("4xh200", "g2-hot256", "one cache + 256 MiB hot"),
    ("4xh200", "g2-own-if3", "a cache each, 3 in flight"),
    ("4xh200", "g2-node-if3", "one cache, 3 in flight"),
    ("4xh200-even", "g4-own", "a cache each"),
    ("4xh200-even", "g4-node", "one cache"),
    ("4xh200-even", "g4-hot128", "one cache + 128 MiB hot"),
    ("4xh200-even", "g4-hot256", "one cache + 256 MiB hot"),
    ("4xh200-even", "g4-hot512", "one cache + 512 MiB hot"),
    ("2xh200", "x2-g1", "1 GPU"),
    ("2xh200", "x2-g2-own", "a cache each"),
    ("2xh200", "x2-g2-node", "one cache"),
    ("2xh200", "x2-g2-hot64", "one cache + 64 MiB hot"),
]


def rounds(machine, prefix):
    out = []
    for f in sorted((here / machine / "json").glob(f"{prefix}*.json")):
        rest = f.stem[len(prefix):]
        if rest and not rest.startswith("-r") and rest != "":
            continue  # another run whose name starts alike (-proc, -if3)
        d = json.loads(f.read_text())
        hot = d.get("hot_set", {})
        ms = d["ms_per_batch"]
        out.append({"file": f"{machine}/json/{f.name}", "batches_per_s": d["batches_per_s"],
                    "hit_rate": d["cache"]["hit_rate"], "hot_row_fraction": hot.get("row_visit_fraction", 0.0),
                    "hot_bytes_per_gpu": hot.get("bytes", 0) // d["gpus"] if hot else 0,
                    "cache_bytes_per_gpu": d.get("cache_bytes_per_gpu", d["cache_bytes"]),
                    "cache_bytes_by_gpu": d.get("cache_bytes_by_gpu"),
                    "ms_per_batch": {k: ms[k] for k in ("sampling", "gathering", "aggregation")}})
    return out


summary = {}
for machine, prefix, label in ROWS:
    r = rounds(machine, prefix)
    if not r:
        continue
    summary[f"{machine}/{prefix}"] = {"label": label, "rounds": r,
                                      "batches_per_s": statistics.mean(x["batches_per_s"] for x in r)}
# Ratios: to one GPU of the same machine, and to caches of their own at the same GPU count and layout.
for key, v in summary.items():
    machine, prefix = key.split("/")
    one = summary.get(f"{machine}/{'x2-g1' if machine == '2xh200' else 'g1'}")
    if one:  # one GPU of the same session
        v["x_one_gpu"] = v["batches_per_s"] / one["batches_per_s"]
    gpus = "g4" if "g4" in prefix else "g2" if "g2" in prefix else None
    if gpus:
        base = prefix.split(gpus)[0] + gpus + "-own"
        if prefix.endswith("-proc"):
            base += "-proc"
        elif prefix.endswith("-if3"):
            base += "-if3"
        if f"{machine}/{base}" in summary:
            v["x_caches_each"] = v["batches_per_s"] / summary[f"{machine}/{base}"]["batches_per_s"]
for name in ("block-node4", "block-node2"):
    for machine in ("4xh200", "2xh200"):
        f = here / machine / f"{name}.json"
        if f.exists():
            r = json.loads(f.read_text())["results"][0]
            summary[f"{machine}/{name}"] = {
                "GB_per_s": r["GB_per_s"], "hit_rate": r.get("hit_rate"),
                "spread_ceiling_GB_per_s": r["spread_ceiling"]["GB_per_s"],
                "ratio_to_spread_ceiling": r["ratio_to_spread_ceiling"],
                "peer_ceiling_GB_per_s": r["peer_ceiling"]["GB_per_s"],
                "ratio_to_peer_ceiling": r["ratio_to_peer_ceiling"]}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

panels = [("4 GPUs (4 x H200)", "4xh200", ["g4-own", "g4-node", "g4-hot128", "g4-hot256", "g4-hot384", "g4-hot512"]),
          ("4 GPUs, parts equal (4 x H200)", "4xh200-even", ["g4-own", "g4-node", "g4-hot128", "g4-hot256", "g4-hot512"]),
          ("2 GPUs (4 x H200 machine)", "4xh200", ["g2-own", "g2-node", "g2-hot64", "g2-hot128", "g2-hot256"]),
          ("2 GPUs (2 x H200 machine)", "2xh200", ["x2-g2-own", "x2-g2-node", "x2-g2-hot64"])]
fig, axes = plt.subplots(1, 4, figsize=(17, 4.2), gridspec_kw={"width_ratios": [6, 5, 5, 3]})
for ax, (title, machine, prefixes) in zip(axes, panels):
    rows = [summary[f"{machine}/{p}"] for p in prefixes]
    bars = ax.bar(range(len(rows)), [r["batches_per_s"] for r in rows],
                  color=["#38a" if "own" in p else "#d62" if "node" in p else "#6a3" for p in prefixes])
    for b, r in zip(bars, rows):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                f"{r['batches_per_s']:.0f}\n{r.get('x_caches_each', 1):.2f}x\n{r['rounds'][0]['hit_rate']:.0%} hits",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"].replace("one cache + ", "+").replace(" hot", "\nhot") for r in rows], fontsize=7)
    ax.set_ylim(0, max(r["batches_per_s"] for r in rows) * 1.3)
    ax.set_title(title, fontsize=9)
axes[0].set_ylabel("mini-batches/s, all GPUs")
fig.suptitle("bam-gnn aggregate, 1 M nodes of 4 KiB rows (3.8 x a GPU's 1 GiB), emu-gpu:shm; 1 GiB of GPU memory per "
             "GPU in every run (cache + hot rows); ratios to a cache each", fontsize=9)
fig.tight_layout()
fig.savefig(here / "gnn-hot-replica.png", dpi=110)
print(here / "gnn-hot-replica.png")
