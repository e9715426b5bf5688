"""Makes summary.json from before/ and after/ and draws graph-kron24.png: each bam-graph run's
rate over the zero-copy baseline of the same run, R-MAT scales 22 and 24, a cache of 1/8 of
the edges, before and after warps took runs of nodes through the cache."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
runs = {
    "before": {"k22-bfs": "k22-bfs-copy", "k22-cc": "k22-cc-copy", "k22-pagerank": "k22-pagerank-copy",
               "k24-bfs": "k24-bfs-copy", "k24-cc": "k24-cc-copy", "k24-pagerank": "k24-pagerank-copy",
               "k24-bfs-reader": "k24-bfs-reader", "k24-pagerank-reader": "k24-pagerank-reader"},
    "after": {"k22-cc": "k22-cc", "k22-pagerank": "k22-pagerank"},
}
summary = {"what": "bam-graph on one H100, emu-gpu:ram, a cache of 1/8 of the edges (4 KiB pages), copy reads "
                   "unless -reader; ratio = bam's rate over the zero-copy path of the same run; every run validated",
           "runs": {}}
for when, names in runs.items():
    for key, f in names.items():
        j = json.loads((here / when / f"{f}.json").read_text())
        paths = {p["path"]: p for p in j["paths"]}
        summary["runs"][f"{when}/{key}"] = {
            "edges_stored": j["graph"]["edges_stored"], "cache_bytes": j["cache_bytes"], "access": j["access"],
            "bam_seconds": paths["bam"]["seconds"], "zero_copy_seconds": paths["zero-copy"]["seconds"],
            "gpu_memory_seconds": paths["gpu-memory"]["seconds"],
            "ratio_to_zero_copy": paths["bam"]["ratio_to_zero_copy"], "hit_rate": paths["bam"]["hit_rate"],
            "misses_per_s": paths["bam"]["misses_per_s"], "validated": j["all_checks_passed"]}
(here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

keys = ["k22-bfs", "k22-cc", "k22-pagerank", "k24-bfs", "k24-cc", "k24-pagerank"]
fig, ax = plt.subplots(figsize=(8, 4))
x = range(len(keys))
before = [summary["runs"][f"before/{k}"]["ratio_to_zero_copy"] for k in keys]
after = [summary["runs"].get(f"after/{k}", {}).get("ratio_to_zero_copy", 0) for k in keys]
ax.bar([i - 0.2 for i in x], before, 0.4, label="grid stride, two CC sample passes", color="lightgray")
ax.bar([i + 0.2 for i in x], after, 0.4, label="runs of nodes per warp, one CC sample pass", color="tab:green")
ax.axhline(1.0, color="black", lw=0.8)
ax.set_xticks(list(x), keys)
ax.set_ylabel("bam / zero-copy (same run)")
ax.set_title("bam-graph, H100, cache = 1/8 of the edges (missing bar: not run)", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(here / "graph-kron24.png", dpi=110)
