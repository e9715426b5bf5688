"""Draws summary.json: CPU engine / GPU engine by CPU engine threads."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
s = json.loads((here / "summary.json").read_text())
rows = s["evict_engines"]["by_threads"]
t = [r["threads"] for r in rows]
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(t, [r["cpu_engine_misses_per_s"] / 1e6 for r in rows], "o-", label="CPU engine (emu:ram)")
ax.plot(t, [r["gpu_engine_misses_per_s"] / 1e6 for r in rows], "s--", label="GPU engine (emu-gpu:ram)")
ax.axhline(rows[0]["gpu_engine_misses_per_s"] / 2e6, color="grey", lw=0.8, ls=":", label="half the GPU engine")
ax.set_xlabel("CPU engine threads")
ax.set_ylabel("misses/s (M), 4 KiB pages")
ax.set_ylim(bottom=0)
ax.set_xticks(t)
ax.legend(fontsize=8)
ax.set_title("Cache misses under eviction, one H100", fontsize=9)
fig.tight_layout()
fig.savefig(here / "cpu-engine-threads.png", dpi=120)
