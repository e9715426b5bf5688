"""Draws the three bam-graph reports: each path's rate over the zero-copy baseline's."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
fig, ax = plt.subplots(figsize=(6, 3.2))
algos = ["bfs", "cc", "pagerank"]
paths = ["bam", "gpu-memory", "zero-copy", "cpu"]
for k, p in enumerate(paths):
    vals = []
    for a in algos:
        j = json.loads((here / f"graph18-{a}.json").read_text())
        x = next(q for q in j["paths"] if q["path"] == p)
        vals.append(x.get("ratio_to_zero_copy") or 0)
    ax.bar([i + (k - 1.5) * 0.2 for i in range(len(algos))], vals, width=0.2, label=p)
ax.set_xticks(range(len(algos)), algos)
ax.set_yscale("log")
ax.set_ylabel("rate / zero-copy's")
ax.set_title("bam-graph, R-MAT scale 18, 4 MiB cache (0.14 of the edges), H100", fontsize=9)
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(here / "graph-kron18.png", dpi=120)
