"""Makes summary.json from json/ and draws look-ahead.png (seconds per run of each algorithm at R-MAT
scale 24: bam without and with look-ahead, zero-copy, GPU memory) and sweep.png (bam's seconds per run
against page size and cache size, look-ahead from the cache's size)."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent


def per_run(j):
    out = {}
    for p in j["paths"]:
        if p.get("ran"):
            out[p["path"]] = p["total_seconds"] / len(p["seconds"])
            if p["path"] == "bam":
                out["bam_hit_rate"] = p["hit_rate"]
                out["bam_misses_per_s"] = p["misses_per_s"]
                out["look_ahead_pages"] = p["look_ahead_pages"]
                out["bam_over_zero_copy"] = p["ratio_to_zero_copy"]
    out["page_size"] = j["page_size"]
    out["cache_bytes"] = j["cache_bytes"]
    out["commit"] = j["commit"]
    out["all_checks_passed"] = j.get("all_checks_passed")
    return out


summary = {"what": "bam-graph at R-MAT scale 24 (16.8 M nodes, 521 M stored edges, 1.94 GiB of edge ids) on one "
                   "H200, edges on emu-gpu:ram behind a cache of 1/8 of them unless stated; seconds per run",
           "runs": {f.stem: per_run(json.loads(f.read_text())) for f in sorted((here / "json").glob("k24-*.json"))},
           "sweep": {f.stem: per_run(json.loads(f.read_text())) for f in sorted((here / "json/sweep").glob("*.json"))}}
(here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

runs = summary["runs"]
algos = [("pr", "PageRank (20 it.)"), ("bfs", "BFS, dir.-opt."), ("td", "BFS, top-down"), ("cc", "CC (Afforest)")]
fig, axes = plt.subplots(1, 4, figsize=(12, 3.6))
for ax, (a, title) in zip(axes, algos):
    la = runs[f"k24-{a}-auto"]
    bars = [("bam, no look-ahead", runs[f"k24-{a}-la0"]["bam"], "lightgreen"),
            (f"bam, look-ahead {la['look_ahead_pages']}", la["bam"], "tab:green")]
    if f"k24-{a}-p8192" in runs:
        bars.append(("bam, 8 KiB pages", runs[f"k24-{a}-p8192"]["bam"], "darkgreen"))
    bars += [("zero-copy", la["zero-copy"], "tab:blue"), ("GPU memory", la["gpu-memory"], "tab:gray")]
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=35, ha="right", fontsize=7)
    for i, b in enumerate(bars):
        ax.text(i, b[1], f"{b[1]:.3g}", ha="center", va="bottom", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("seconds per run")
fig.suptitle("R-MAT scale 24 on one H200: edges through bam's cache (1/8 of them, 4 KiB pages unless stated)",
             fontsize=10)
fig.tight_layout()
fig.savefig(here / "look-ahead.png", dpi=120)

sw = summary["sweep"]
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
def bam_at(algo, key, base_key):
    """bam's seconds in the sweep point `algo-key`; the 4 KiB, 248 MiB point (`base_key`) is a main run."""
    if key == base_key:
        return runs["k24-bfs-auto"]["bam"] if algo == "bfs" else sw["pr-c248-it5"]["bam"]
    return sw[f"{algo}-{key}"]["bam"]


pages = [512, 1024, 2048, 4096, 8192, 16384]
for name, algo, marker in [("BFS (s per BFS)", "bfs", "o"), ("PageRank (s per 5 iterations)", "pr", "s")]:
    axes[0].plot(pages, [bam_at(algo, f"p{p}", "p4096") for p in pages], marker=marker, label=name)
axes[0].set_xscale("log", base=2)
axes[0].set_xlabel("page size (bytes), cache 248 MiB")
axes[0].set_ylabel("bam seconds")
axes[0].legend(fontsize=8)
caches = [124, 248, 496, 992]
for name, algo, marker in [("BFS", "bfs", "o"), ("PageRank (5 it.)", "pr", "s")]:
    axes[1].plot(caches, [bam_at(algo, f"c{c}", "c248") for c in caches], marker=marker, label=name)
axes[1].set_xscale("log", base=2)
axes[1].set_xlabel("cache MiB (edges: 1,986 MiB), 4 KiB pages")
axes[1].legend(fontsize=8)
fig.suptitle("bam-graph sweeps at R-MAT scale 24, one H200 (look-ahead from the cache's size)", fontsize=10)
fig.tight_layout()
fig.savefig(here / "sweep.png", dpi=120)
