"""Makes summary.json from json/ and draws bfs-direction.png: seconds per BFS (mean of the
runs' roots) on each path, every level top-down against direction-optimizing, R-MAT scales
22 and 24, a cache of 1/8 of the edges."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
paths = ["bam", "zero-copy", "gpu-memory", "cpu"]
summary = {"what": "bam-graph on GPU 0 of 2 x H200, emu-gpu:ram, a cache of 1/8 of the edges (4 KiB pages), "
                   "copy reads, 4 BFS roots per run; ratio = bam's rate over the zero-copy path of the same run; "
                   "every path of every run validated against the CPU",
           "runs": {}}
for f in sorted((here / "json").glob("*.json")):
    j = json.loads(f.read_text())
    by = {p["path"]: p for p in j["paths"]}
    summary["runs"][f.stem] = {
        "edges_stored": j["graph"]["edges_stored"], "cache_bytes": j["cache_bytes"],
        "bfs_direction": j.get("bfs_direction"),
        "mean_seconds": {p: sum(by[p]["seconds"]) / len(by[p]["seconds"]) for p in paths},
        "ratio_to_zero_copy": by["bam"]["ratio_to_zero_copy"], "hit_rate": by["bam"]["hit_rate"],
        "misses_per_s": by["bam"]["misses_per_s"], "validated": j["all_checks_passed"]}
(here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

groups = [("k22-bfs-top-down-r1", "scale 22\ntop-down"), ("k22-bfs-bottom-up-r1", "scale 22\ndirection-opt."),
          ("k24-bfs-top-down", "scale 24\ntop-down"), ("k24-bfs-bottom-up", "scale 24\ndirection-opt.")]
colors = {"bam": "tab:green", "zero-copy": "tab:blue", "gpu-memory": "lightgray", "cpu": "tab:orange"}
fig, ax = plt.subplots(figsize=(8, 4))
w = 0.2
for k, p in enumerate(paths):
    ax.bar([i + (k - 1.5) * w for i in range(len(groups))],
           [summary["runs"][g]["mean_seconds"][p] for g, _ in groups], w, label=p, color=colors[p])
ax.set_yscale("log")
ax.set_xticks(range(len(groups)), [name for _, name in groups])
ax.set_ylabel("seconds per BFS (mean of 4 roots)")
ax.set_title("bam-graph BFS, H200, cache = 1/8 of the edges", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(here / "bfs-direction.png", dpi=110)
