"""Draws summary.json: each path after / before."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
s = json.loads((here / "summary.json").read_text())
names = list(s["paths"])
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.bar(names, [s["paths"][n]["after_over_before"] for n in names], color="tab:green")
ax.axhline(1.0, color="grey", ls=":", lw=1)
ax.set_ylim(0.8, 1.15)
ax.set_ylabel("after / before (ops/s)")
ax.set_title("Hit and miss paths, one H100, same session", fontsize=9)
plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
fig.tight_layout()
fig.savefig(here / "before-after.png", dpi=120)
