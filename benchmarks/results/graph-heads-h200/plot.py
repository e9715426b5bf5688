# SPDX-License-Identifier: MIT
"""summary.json and heads.png from the runs' JSON (python3 plot.py)."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = pathlib.Path(__file__).parent
runs = {
    "k27-bfs-h2": "k27/k27-bfs-h2.json",
    "k27-cc-h2": "k27/k27-cc-h2.json",
    "k27-cc-h2-5-runs": "k27/k27-cc-h2-r5.json",
    "k27-bfs-h0": "k27/sweep/k27-bfs-h0.json",
    "k27-bfs-h1": "k27/sweep/k27-bfs-h1.json",
    "k27-cc-h0": "k27/sweep/k27-cc-h0.json",
    "k27-cc-h1": "k27/sweep/k27-cc-h1.json",
    "k24-cc-h2-profiled": "profile-k24/k24-cc-h2.json",
}
summary = {}
for name, f in runs.items():
    d = json.loads((here / f).read_text())
    s = {
        "benchmark": d["benchmark"],
        "nodes": d["graph"]["nodes"],
        "edges_stored": d["graph"]["edges_stored"],
        "cache_bytes": d["cache_bytes"],
        "heads_per_node": d.get("heads", {}).get("per_node", 0),
        "heads_bytes": d.get("heads", {}).get("bytes", 0),
        "runs": d["runs"],
        "all_checks_passed": d["all_checks_passed"],
        "paths": {},
    }
    for p in d["paths"]:
        if not p["ran"]:
            continue
        e = {"seconds_per_run": p["total_seconds"] / len(p["seconds"]), "ratio_to_zero_copy": p["ratio_to_zero_copy"]}
        if p["path"] == "bam":
            e.update(cache_misses=p["cache_misses"], hit_rate=p["hit_rate"])
        s["paths"][p["path"]] = e
    summary[name] = s
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

fig, axes = plt.subplots(1, 3, figsize=(14, 4))
order = ["bam", "zero-copy", "zero-copy-heads", "gpu-memory"]
for ax, name, title in zip(
    axes[:2], ["k27-bfs-h2", "k27-cc-h2-5-runs"], ["BFS (direction-optimizing), 2 runs", "CC (Afforest), 5 runs"]
):
    paths = summary[name]["paths"]
    xs = [p for p in order if p in paths]
    ys = [paths[p]["seconds_per_run"] for p in xs]
    bars = ax.bar(xs, ys, color=["tab:blue", "tab:gray", "tab:olive", "tab:green"][: len(xs)])
    for b, p in zip(bars, xs):
        ax.annotate(
            f"{paths[p]['ratio_to_zero_copy']:.2f}x",
            (b.get_x() + b.get_width() / 2, b.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_title(f"R-MAT scale 27, {title}", fontsize=10)
    ax.set_ylabel("seconds per run (lower is better)")
    ax.tick_params(axis="x", labelsize=8)

# bam with 0, 1 and 2 heads (the same GPU memory: heads + cache), over zero-copy of the 2-head commands.
ax = axes[2]
for algo, color in [("bfs", "tab:blue"), ("cc", "tab:red")]:
    base = "k27-bfs-h2" if algo == "bfs" else "k27-cc-h2-5-runs"
    zero_copy = summary[base]["paths"]["zero-copy"]["seconds_per_run"]
    heads = [0, 1, 2]
    names = [f"k27-{algo}-h{h}" if h < 2 else base for h in heads]
    ratios = [zero_copy / summary[n]["paths"]["bam"]["seconds_per_run"] for n in names]
    ax.plot(heads, ratios, "o-", color=color, label=algo.upper())
    for h, r in zip(heads, ratios):
        ax.annotate(f"{r:.2f}x", (h, r), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
ax.axhline(1.0, color="gray", lw=0.8, ls="--")
ax.set_xticks([0, 1, 2])
ax.set_xlabel("heads per node (taken out of the 2,013 MiB)")
ax.set_ylabel("bam's rate / zero-copy's")
ax.set_title("bam with 0, 1, 2 heads per node", fontsize=10)
ax.legend(fontsize=8)
fig.suptitle(
    "One H200, emu-gpu:ram; bam: 2,013 MiB of GPU memory for the edges (heads + cache), 1/8 of them; "
    "ratios to zero-copy of the same run",
    fontsize=10,
)
fig.tight_layout()
fig.savefig(here / "heads.png", dpi=120)
