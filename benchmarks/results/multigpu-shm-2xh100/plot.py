"""Draws summary.json: two GPUs against twice one GPU, per run."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
s = json.loads((here / "summary.json").read_text())
runs = s["runs"]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.bar([r["name"] for r in runs], [r["scaling"] for r in runs], color="tab:blue")
ax.axhline(0.9, color="grey", ls=":", lw=1, label="target 0.9")
ax.set_ylim(0, 1.1)
ax.set_ylabel("2 GPUs / (2 x one GPU)")
ax.set_title("One shm medium, a storage and cache per GPU, 2 x H100", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(here / "multigpu-shm.png", dpi=120)
