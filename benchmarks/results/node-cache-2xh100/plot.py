"""Draws summary.json: one cache spread over two GPUs against a cache per GPU, same run."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
s = json.loads((here / "summary.json").read_text())
runs = s["runs"]
names = [f"{r['io_bytes']} B pages\nworking set {r['working_set_mib'] // 1024} GiB" for r in runs]
x = range(len(runs))
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.bar([i - 0.2 for i in x], [r["per_gpu"]["GB_per_s"] for r in runs], width=0.4, label="a 2 GiB cache per GPU")
ax.bar([i + 0.2 for i in x], [r["node"]["GB_per_s"] for r in runs], width=0.4, label="one 4 GiB cache over both GPUs")
for i, r in enumerate(runs):
    ax.text(i - 0.2, r["per_gpu"]["GB_per_s"], f"{r['per_gpu']['hit_rate']:.0%}", ha="center", va="bottom", fontsize=7)
    ax.text(i + 0.2, r["node"]["GB_per_s"], f"{r['node']['hit_rate']:.0%}", ha="center", va="bottom", fontsize=7)
    if "host_ceiling_GB_per_s" in r:
        ax.plot([i - 0.45, i + 0.45], [r["host_ceiling_GB_per_s"]] * 2, color="black", ls=":", lw=1)
        ax.text(i + 0.45, r["host_ceiling_GB_per_s"], " host zero-copy\n ceiling", fontsize=6, va="center")
ax.set_xticks(list(x), names, fontsize=7)
ax.set_yscale("log")
ax.set_ylabel("GB/s, both GPUs (log)")
ax.set_title("2 x H100 (NVLink), emu-gpu:shm medium, copy_to of random pages; labels: hit rate", fontsize=8)
ax.legend(fontsize=7, loc="upper right")
fig.tight_layout()
fig.savefig(here / "node-cache.png", dpi=120)
