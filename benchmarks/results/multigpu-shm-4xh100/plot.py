"""Draws summary.json: N GPUs against N x one GPU, and the host ceiling's own scaling, per run."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
s = json.loads((here / "summary.json").read_text())
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
for ax, n in zip(axes, (2, 4)):
    runs = [r for r in s["runs"] if r["gpus"] == n]
    names = [r["name"] for r in runs]
    x = range(len(runs))
    ax.bar([i - 0.2 for i in x], [r["scaling"] for r in runs], width=0.4, label="bam: N GPUs / (N x one)")
    ax.bar([i + 0.2 for i in x], [r.get("ceiling_scaling", 0) for r in runs], width=0.4,
           label="host zero-copy ceiling, same run", color="tab:grey")
    ax.axhline(0.9, color="black", ls=":", lw=1)
    ax.set_xticks(list(x), names, rotation=20, fontsize=7)
    ax.set_title(f"{n} x H100, one shm medium", fontsize=9)
    ax.set_ylim(0, 1.15)
axes[0].set_ylabel("scaling vs N x one GPU")
axes[0].legend(fontsize=7, loc="lower left")
fig.tight_layout()
fig.savefig(here / "multigpu-shm.png", dpi=120)
