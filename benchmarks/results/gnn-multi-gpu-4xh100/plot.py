"""Makes summary.json from json/ and block_bench/, and draws gnn-multi-gpu.png: bam-gnn
aggregate on 1, 2 and 4 GPUs of one machine, a cache per GPU against one cache spread
over the GPUs, and the block benchmark's hits against the spread-memory ceilings."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
datasets = {
    "d1024-n1m": "1 M nodes, 4 KiB rows (3.8 GiB): 3.8x a GPU's 1 GiB cache",
    "d1024-n2m": "2 M nodes, 4 KiB rows (7.6 GiB): 7.6x a GPU's 1 GiB cache",
    "d128-n8m": "8 M nodes, 512 B rows (3.8 GiB), 512 B pages: 3.8x a GPU's 1 GiB cache",
}
runs = ["g1", "g2-own", "g2-node", "g4-own", "g4-node"]
summary = {"what": "bam-gnn aggregate --gpus N (one process, a host thread per GPU), 2000 batches of 1024 seeds "
                   "per GPU, fanouts 15,10,5, features in host shared memory (emu-gpu:shm, one copy), "
                   "--cache-mib 1024 on each GPU; own = a cache per GPU, node = one cache spread over the GPUs",
           "datasets": []}
for tag, what in datasets.items():
    rows = {}
    for r in runs:
        j = json.loads((here / "json" / f"{tag}-{r}.json").read_text())
        rows[r] = {"gpus": j.get("gpus", 1), "batches_per_s": j["batches_per_s"],
                   "feature_GB_per_s": j["feature_GB_per_s"], "gather_GB_per_s": j["gather"]["GB_per_s"],
                   "hit_rate": j["cache"]["hit_rate"], "verified_rows": j["verified_rows"]}
    one = rows["g1"]["batches_per_s"]
    for r in runs:
        rows[r]["vs_one_gpu"] = rows[r]["batches_per_s"] / one
    for g in ("g2", "g4"):
        rows[f"{g}-node"]["node_vs_own"] = rows[f"{g}-node"]["batches_per_s"] / rows[f"{g}-own"]["batches_per_s"]
        rows[f"{g}-node"]["gather_node_vs_own"] = (rows[f"{g}-node"]["gather_GB_per_s"] /
                                                   rows[f"{g}-own"]["gather_GB_per_s"])
    summary["datasets"].append({"tag": tag, "what": what, "runs": rows})
bb = json.loads((here / "block_bench" / "node-spread.json").read_text())
summary["hits_vs_spread_ceiling"] = [
    {"gpus": r["gpus"], "hit_rate": r["hit_rate"], "GB_per_s": r["GB_per_s"],
     "spread_ceiling_GB_per_s": r["spread_ceiling"]["GB_per_s"], "ratio_to_spread_ceiling": r["ratio_to_spread_ceiling"],
     "peer_ceiling_GB_per_s": r["peer_ceiling"]["GB_per_s"], "ratio_to_peer_ceiling": r["ratio_to_peer_ceiling"]}
    for r in bb["results"]]
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

fig, axes = plt.subplots(1, 4, figsize=(13, 3.3))
labels = {"g1": "1 GPU", "g2-own": "2, cache each", "g2-node": "2, one cache", "g4-own": "4, cache each",
          "g4-node": "4, one cache"}
colors = {"g1": "gray", "g2-own": "tab:blue", "g2-node": "tab:orange", "g4-own": "tab:blue", "g4-node": "tab:orange"}
for ax, d in zip(axes, summary["datasets"]):
    ys = [d["runs"][r]["batches_per_s"] for r in runs]
    ax.bar(range(len(runs)), ys, color=[colors[r] for r in runs])
    for i, r in enumerate(runs):
        ax.text(i, ys[i], f"{d['runs'][r]['vs_one_gpu']:.2f}x\n{d['runs'][r]['hit_rate']:.0%}", ha="center",
                va="bottom", fontsize=6)
    ax.set_xticks(range(len(runs)), [labels[r] for r in runs], fontsize=6, rotation=20)
    ax.set_ylabel("mini-batches/s, all GPUs", fontsize=7)
    ax.set_title(d["what"], fontsize=6)
    ax.set_ylim(0, max(ys) * 1.25)
h = summary["hits_vs_spread_ceiling"]
x = range(len(h))
ax = axes[3]
ax.bar([i - 0.2 for i in x], [r["GB_per_s"] for r in h], width=0.4, label="node cache hits (copy_to, 4 KiB)")
ax.bar([i + 0.2 for i in x], [r["spread_ceiling_GB_per_s"] for r in h], width=0.4, label="gather from spread GPU memory")
for i, r in zip(x, h):
    ax.text(i - 0.2, r["GB_per_s"], f"{r['ratio_to_spread_ceiling']:.2f}", ha="center", va="bottom", fontsize=6)
ax.set_xticks(list(x), [f"{r['gpus']} GPUs" for r in h], fontsize=7)
ax.set_ylabel("GB/s, all GPUs", fontsize=7)
ax.set_title("block_bench: hits against the ceiling of the same run", fontsize=6)
ax.legend(fontsize=5, loc="upper left")
fig.suptitle("4 x H100 (NVLink): bam-gnn aggregate --gpus N (labels: x one GPU, hit rate)", fontsize=8)
fig.tight_layout()
fig.savefig(here / "gnn-multi-gpu.png", dpi=120)
