"""Makes summary.json from json/ and draws file-random-read.png: random 4 KiB reads in one 4 GiB
file, through the file's extent map (GPU-side lookup), of the same pages of the raw disk image,
and zero-copy from pinned host memory, with a cache of 256 MiB (mostly misses) and of 8 GiB (hits)."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
names = ["file (extent lookup)", "raw image", "zero-copy"]
summary = {"what": "file_random_read on one H200: 1 Mi random 4 KiB pages of a 4 GiB file in an ext4 image on "
                   "emu-gpu:ram, median of 5 repetitions after a warm-up, every word checked", "runs": {}}
for f in sorted((here / "json").glob("*.json")):
    j = json.loads(f.read_text())
    summary["runs"][f.stem] = {
        "cache_bytes": j["cache_bytes"], "file_runs": j["file_runs"], "file_over_raw": j["file_over_raw"],
        "file_over_zero_copy": j["file_over_zero_copy"],
        "paths": {n: {"GB_per_s": p["GB_per_s"], "hit_rate": p.get("hit_rate"), "bad_words": p["bad_words"]}
                  for n, p in zip(names, j["paths"])}}
(here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
for ax, (run, title) in zip(axes, [("frr-c256", "256 MiB cache (6 % hits)"), ("frr-c8192", "8 GiB cache (99.8 % hits)")]):
    r = summary["runs"][run]["paths"]
    v = [r[n]["GB_per_s"] for n in names]
    ax.bar(names, v, color=["tab:green", "tab:olive", "tab:blue"])
    for i, x in enumerate(v):
        ax.text(i, x, f"{x:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("GB/s")
    ax.tick_params(axis="x", labelsize=8)
fig.suptitle("Random 4 KiB reads in one 4 GiB file, one H200, emu-gpu:ram", fontsize=10)
fig.tight_layout()
fig.savefig(here / "file-random-read.png", dpi=120)
