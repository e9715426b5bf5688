"""Collects the runs of this folder into summary.json and draws engines.png."""
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
            "cpu_engine_p999_us": r[1]["latency_us"]["p999"], "gpu_engine_p999_us": r[0]["latency_us"]["p999"],
            "transport": r[1]["transport"], "ratio": r[1]["misses_per_s"] / r[0]["misses_per_s"]}


def gnn(prefix):
    rounds = []
    for k in (1, 2, 3):
        cpu = load(f"{prefix}gnn-emu-{k}.json")
        gpu = load(f"{prefix}gnn-emu-gpu-{k}.json")
        rounds.append({"round": k, "cpu_engine_GB_per_s": cpu["feature_GB_per_s"],
                       "gpu_engine_GB_per_s": gpu["feature_GB_per_s"],
                       "ratio": cpu["feature_GB_per_s"] / gpu["feature_GB_per_s"],
                       "hit_rate": cpu["cache"]["hit_rate"], "verified_rows": cpu["verified_rows"]})
    return {"rounds": rounds, "median_ratio": statistics.median(r["ratio"] for r in rounds)}


evict = {"this_tree": [engines(f"evict-engines-{k}.json") for k in (1, 2)],
         "tree_before": [engines(f"before-evict-engines-{k}.json") for k in (1, 2)]}
summary = {
    "machine": "one NVIDIA H100 80GB HBM3 (VM, 16 cores), driver 580.159.04, CUDA 13.0, Release builds for sm_90 "
               "of this tree and of the tree before it, built and run in the same call, CUDA's default (lazy) "
               "module loading",
    "evict_engines": dict(command="block_bench --mode range --io-size 4096 --device emu-gpu:ram=1G "
                                  "--device emu:ram=1G --working-set-mib 1024 --cache-mib 64", **evict),
    "gnn_aggregate": {
        "command": "bam-gnn aggregate DIR --device emu:ram=1040M | emu-gpu:ram=1040M --page-size 1024 "
                   "--cache-mib 244 (1 M nodes, degree 15, 256 float32 = 1 KiB rows, generated; 100 batches)",
        "this_tree": gnn(""),
        "tree_before": gnn("before-"),
    },
}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
w = 0.38
x = [1, 2]
a.bar([v - w / 2 for v in x], [r["ratio"] for r in evict["tree_before"]], w, label="tree before")
a.bar([v + w / 2 for v in x], [r["ratio"] for r in evict["this_tree"]], w, label="this tree")
a.axhline(0.5, color="grey", lw=0.8, ls=":", label="target: half the GPU engine")
a.set_xticks(x)
a.set_xlabel("round (same machine, same call)")
a.set_ylabel("CPU engine / GPU engine, misses/s")
a.set_ylim(0, 1)
a.set_title("4 KiB cache misses under eviction (block_bench)", fontsize=9)
a.legend(fontsize=7)
g = summary["gnn_aggregate"]
x = [1, 2, 3]
b.bar([v - w / 2 for v in x], [r["ratio"] for r in g["tree_before"]["rounds"]], w, label="tree before")
b.bar([v + w / 2 for v in x], [r["ratio"] for r in g["this_tree"]["rounds"]], w, label="this tree")
b.axhline(0.5, color="grey", lw=0.8, ls=":")
b.set_xticks(x)
b.set_xlabel("round")
b.set_ylabel("CPU engine / GPU engine, feature GB/s")
b.set_ylim(0, 1)
b.set_title("bam-gnn aggregate, 1 KiB rows, emu:ram / emu-gpu:ram", fontsize=9)
b.legend(fontsize=7)
fig.tight_layout()
fig.savefig(here / "engines.png", dpi=120)
