# SPDX-License-Identifier: MIT
"""summary.json and heads.png from the runs' JSON (python3 plot.py)."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = pathlib.Path(__file__).parent
runs = {
    "k27-bfs": "k27/k27-bfs-h2.json",
    "k27-cc": "k27/k27-cc-h2.json",
    "k24-bfs": "k24-first-version/k24-bfs.json",
    "k24-bfs-h1": "k24-first-version/k24-bfs-h1.json",
    "k24-bfs-h2": "k24-first-version/k24-bfs-h2.json",
    "k24-cc": "k24-first-version/k24-cc.json",
    "k24-cc-h1": "k24-first-version/k24-cc-h1.json",
    "k24-cc-h2": "k24-first-version/k24-cc-h2.json",
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

fig, axes = plt.subplots(1, 2, figsize=(10, 4))
order = ["bam", "zero-copy", "zero-copy-heads", "gpu-memory"]
for ax, name, title in zip(axes, ["k27-bfs", "k27-cc"], ["BFS (direction-optimizing)", "CC (Afforest)"]):
    paths = summary[name]["paths"]
    xs = [p for p in order if p in paths]
    ys = [paths[p]["seconds_per_run"] for p in xs]
    bars = ax.bar(xs, ys, color=["tab:blue", "tab:gray", "tab:olive", "tab:green"][: len(xs)])
    for b, p in zip(bars, xs):
        ax.annotate(f"{paths[p]['ratio_to_zero_copy']:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=9)
    ax.set_title(f"R-MAT scale 27, {title}")
    ax.set_ylabel("seconds per run (lower is better)")
    ax.tick_params(axis="x", labelsize=8)
fig.suptitle("One H200, emu-gpu:ram; bam: 2 heads per node (1 GiB) + 989 MiB cache; ratios to zero-copy", fontsize=10)
fig.tight_layout()
fig.savefig(here / "heads.png", dpi=120)
