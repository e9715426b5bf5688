"""Collects the runs of this folder into summary.json and draws in-place.png."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).parent


def load(name):
    return json.loads((here / name).read_text())


def engines(name):
    """misses/s of the GPU engine (first device) and the CPU engine (second) of one block_bench run."""
    r = load(name)["results"]
    return {"gpu_engine_misses_per_s": r[0]["misses_per_s"], "cpu_engine_misses_per_s": r[1]["misses_per_s"],
            "cpu_engine_p999_us": r[1]["latency_us"]["p999"], "device": r[1]["device"],
            "transport": r[1]["transport"], "ratio": r[1]["misses_per_s"] / r[0]["misses_per_s"]}


gnn = []
for k in (1, 2, 3):
    cpu, gpu, before = (load(f"{p}-{k}.json")["feature_GB_per_s"] for p in ("gnn-emu", "gnn-emu-gpu", "before-gnn-emu"))
    gnn.append({"round": k, "cpu_engine_GB_per_s": cpu, "gpu_engine_GB_per_s": gpu, "before_cpu_engine_GB_per_s": before,
                "ratio": cpu / gpu, "gain_over_before": cpu / before})
summary = {
    "machine": "one NVIDIA H100 80GB HBM3 (VM, 16 cores), driver 580.159.04, CUDA 13.0, Release build for sm_90, "
               "CUDA's default (lazy) module loading",
    "gnn_aggregate": {
        "command": "bam-gnn aggregate DIR --device emu:ram=1040M | emu-gpu:ram=1040M --page-size 1024 "
                   "--cache-mib 244 --batches 100 (1 M nodes, degree 15, 256 float32 = 1 KiB rows, generated)",
        "rounds": gnn,
        "median_ratio": statistics.median(r["ratio"] for r in gnn),
        "median_gain_over_before": statistics.median(r["gain_over_before"] for r in gnn),
    },
    "evict_engines": {
        "command": "block_bench --mode range --io-size 4096 --device emu-gpu:ram=1G --device emu:ram=1G "
                   "--working-set-mib 1024 --cache-mib 64",
        "this_tree": engines("evict-engines.json"),
        "tree_before": engines("before-evict-engines.json"),
        "by_threads": [dict(threads=t, **engines(f"evict-t{t}.json")) for t in (4, 8, 12)],
        "by_queues": [dict(queues=q, **engines(f"evict-q{q}.json")) for q in (32, 64, 128, 255)],
    },
}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
x = [r["round"] for r in gnn]
w = 0.27
a.bar([v - w for v in x], [r["before_cpu_engine_GB_per_s"] for r in gnn], w, label="CPU engine, staged reads")
a.bar(x, [r["cpu_engine_GB_per_s"] for r in gnn], w, label="CPU engine, reads in place")
a.bar([v + w for v in x], [r["gpu_engine_GB_per_s"] for r in gnn], w, label="GPU engine")
a.set_xticks(x)
a.set_xlabel("round (same machine, same call)")
a.set_ylabel("feature gather, GB/s")
a.set_title("bam-gnn aggregate, 1 KiB rows, emu:ram / emu-gpu:ram", fontsize=9)
a.legend(fontsize=7)
ev = summary["evict_engines"]
labels = ["staged", "in place"] + [f"{r['threads']} thr" for r in ev["by_threads"]]
vals = [ev["tree_before"]["ratio"], ev["this_tree"]["ratio"]] + [r["ratio"] for r in ev["by_threads"]]
b.bar(range(len(vals)), vals, color=["C0", "C1", "C1", "C1", "C1"])
b.axhline(0.5, color="grey", lw=0.8, ls=":", label="target: half the GPU engine")
b.set_xticks(range(len(vals)))
b.set_xticklabels(labels, fontsize=8)
b.set_ylabel("CPU engine / GPU engine, misses/s")
b.set_ylim(0, 1)
b.set_title("4 KiB cache misses under eviction (block_bench)", fontsize=9)
b.legend(fontsize=7)
fig.tight_layout()
fig.savefig(here / "in-place.png", dpi=120)
