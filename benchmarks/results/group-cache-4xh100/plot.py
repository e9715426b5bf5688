"""Draws summary.json: one cache shared by one process per GPU, against one process
driving every GPU and against a cache per process, same machine."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
s = json.loads((here / "summary.json").read_text())
runs = s["runs"]
fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
bars = [
    ("processes_own_caches", "a 2 GiB cache per process"),
    ("one_process_one_cache", "one cache, one process (threads)"),
    ("processes_one_cache", "one cache, one process per GPU"),
]
for k, (key, label) in enumerate(bars):
    xs = [i + (k - 1) * 0.27 for i in range(len(runs))]
    ax.bar(xs, [r[key]["GB_per_s"] for r in runs], width=0.27, label=label)
    for x, r in zip(xs, runs):
        ax.text(x, r[key]["GB_per_s"], f"{r[key]['hit_rate']:.0%}", ha="center", va="bottom", fontsize=6)
for i, r in enumerate(runs):
    ax.plot([i - 0.45, i + 0.45], [r["host_ceiling_GB_per_s"]] * 2, color="black", ls=":", lw=1)
ax.set_xticks(range(len(runs)), [f"{r['gpus']} GPUs, working set {r['working_set_mib'] // 1024} GiB" for r in runs],
              fontsize=7)
ax.set_ylabel("GB/s, all GPUs")
ax.set_title("random 4 KiB pages (labels: hits; dotted: host zero-copy ceiling)", fontsize=7)
ax.legend(fontsize=6, loc="upper left")
for run in ("procs-node-misses", "procs-own-misses"):
    pts = [m for m in s["misses"] if m["run"] == run]
    label = "one cache, one process per GPU" if "node" in run else "a cache per process"
    bx.plot([m["gpus"] for m in pts], [m["GB_per_s"] for m in pts], marker="o", label=label)
one = [m for m in s["misses"] if m["gpus"] == 1][0]["GB_per_s"]
bx.plot([1, 2, 4], [one, 2 * one, 4 * one], color="gray", ls="--", lw=1, label="N x one GPU")
bx.set_xticks([1, 2, 4])
bx.set_xlabel("GPUs (processes)")
bx.set_ylabel("GB/s, all GPUs")
bx.set_title("mostly misses: 256 MiB per GPU, 8 GiB working set", fontsize=7)
bx.legend(fontsize=6)
fig.suptitle("4 x H100 (NVLink), emu-gpu:shm medium in host memory, copy_to, every page verified", fontsize=8)
fig.tight_layout()
fig.savefig(here / "group-cache.png", dpi=120)
