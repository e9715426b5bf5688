#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""summary.json and train-sage-papers100m.png from round1/ and round2/:
epoch time and feature-gather rate per run and mode, both rounds."""
import json
import pathlib

here = pathlib.Path(__file__).resolve().parent
RUNS = [("g1", 1, "1 GPU"), ("g2-own", 2, "2 GPUs, a cache each"), ("g2-node", 2, "2 GPUs, one cache"),
        ("g4-own", 4, "4 GPUs, a cache each"), ("g4-node", 4, "4 GPUs, one cache")]


def load(round_dir, run):
    path = here / round_dir / f"{run}.json"
    if not path.exists():
        return {}
    d = json.loads(path.read_text())
    out = {}
    for r in d["results"]:
        if "skipped" in r:
            continue
        batches = sum(-(-(d["settings"]["train_nodes"] // r["processes"]) // d["settings"]["batch_size"])
                      for _ in range(r["processes"]))
        out[r["mode"]] = {"epoch_s": r["epoch_s"], "minibatches_per_s": batches / r["epoch_s"],
                          "gather_GB_per_s": r["gather_GB_per_s"], "val_accuracy": r["final_val_accuracy"],
                          "gpu_used_GiB": r["memory"].get("gpu_used_bytes_max_per_process", 0) / 2**30,
                          "first_process_misses": r.get("cache_stats", {}).get("misses")}
    return out


summary = {"machine": "4 x NVIDIA H200 (NVLink NV18), driver 580.159.04, CUDA 13.0, PyTorch 2.11",
           "dataset": "bam-gnn make --nodes 111M --degree 29 --dim 128 --no-features-file (emu:shm)",
           "runs": {}}
for run, n, label in RUNS:
    summary["runs"][run] = {"gpus": n, "label": label, "round1": load("round1", run), "round2": load("round2", run)}
g1 = [summary["runs"]["g1"][r]["bam"]["epoch_s"] for r in ("round1", "round2")]
for run, n, _ in RUNS:
    for rnd, base in zip(("round1", "round2"), g1):
        bam = summary["runs"][run][rnd].get("bam")
        if bam:
            bam["x_one_gpu"] = base / bam["epoch_s"]
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

try:
    import matplotlib
except ImportError:
    raise SystemExit("summary.json written; matplotlib is missing, no plot")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
x = range(len(RUNS))
for i, (mode, colour) in enumerate((("bam", "#d62"), ("uva", "#38a"), ("memory", "#999"))):
    for ax, key in ((a, "epoch_s"), (b, "gather_GB_per_s")):
        vals = [summary["runs"][r]["round1"].get(mode, {}).get(key, 0) for r, _, _ in RUNS]
        ax.bar([j + (i - 1) * 0.27 for j in x], vals, 0.27, color=colour, label=mode)
        r2 = [summary["runs"][r]["round2"].get(mode, {}).get(key) for r, _, _ in RUNS]
        ax.plot([j + (i - 1) * 0.27 for j, v in zip(x, r2) if v], [v for v in r2 if v], "k_", ms=12,
                label="round 2" if mode == "bam" else None)
for ax, title in ((a, "epoch time (s), median of epochs 2-3"), (b, "feature gather (GB/s)")):
    ax.set_xticks(list(x))
    ax.set_xticklabels([lbl.replace(", ", "\n") for _, _, lbl in RUNS], fontsize=8)
    ax.set_title(title, fontsize=9)
b.set_yscale("log")
a.legend(fontsize=8)
fig.suptitle("GraphSAGE at ogbn-papers100M's shape (111 M nodes, 3.17 B edges, 512-byte rows), "
             "cache 1/8 of the table in all, 4 x H200", fontsize=9)
fig.tight_layout()
fig.savefig(here / "train-sage-papers100m.png", dpi=110)
print(here / "train-sage-papers100m.png")
