"""Makes summary.json from json/ and draws gnn-processes.png: bam-gnn aggregate on 1, 2
and 4 GPUs of one machine, a host thread or a process per GPU, a cache per GPU or one
cache for all; and the mean aggregation's kernels before and after their rewrite."""
import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent


def load(tag):
    j = json.loads((here / "json" / f"{tag}.json").read_text())
    return {"gpus": j.get("gpus", 1), "cache_layout": j.get("cache_layout", "one cache on one GPU"),
            "batches_per_s": j["batches_per_s"], "hit_rate": j["cache"]["hit_rate"],
            "ms_per_batch": j["ms_per_batch"], "verified_rows": j["verified_rows"]}


def mean_of(tags):
    runs = [load(t) for t in tags]
    out = dict(runs[0])
    out["batches_per_s"] = statistics.mean(r["batches_per_s"] for r in runs)
    out["runs_batches_per_s"] = [r["batches_per_s"] for r in runs]
    return out


summary = {"what": "bam-gnn aggregate, 2000 batches of 1024 seeds per GPU, fanouts 15,10,5, two batches in "
                   "flight, look-ahead holds, features in host shared memory (emu-gpu:shm, one copy), "
                   "--cache-mib 1024 on each GPU; own = a cache per GPU (per process), node = one cache over "
                   "the GPUs (shared by the processes); thread = one process, a host thread per GPU; "
                   "proc = --processes, one process per GPU",
           "machine": "4 x NVIDIA H100 80GB HBM3, NVLink NV18 between every pair, driver 580.159.04, CUDA 13.0",
           "datasets": {}}
n1 = {
    "g1": mean_of(["new-d1024-n1m-g1-r1", "new-d1024-n1m-g1-r2"]),
    "g2-own-thread": mean_of(["new-d1024-n1m-g2-own-r1", "new-d1024-n1m-g2-own-r2"]),
    "g2-node-thread": mean_of(["new-d1024-n1m-g2-node-r1", "new-d1024-n1m-g2-node-r2"]),
    "g2-own-proc": load("new-d1024-n1m-g2-own-proc"),
    "g2-node-proc": load("new-d1024-n1m-g2-node-proc"),
    "g4-own-thread": load("new-d1024-n1m-g4-own"),
    "g4-node-thread": load("new-d1024-n1m-g4-node"),
    "g4-own-proc": load("new-d1024-n1m-g4-own-proc"),
    "g4-node-proc": load("new-d1024-n1m-g4-node-proc"),
}
n2 = {
    "g1": load("new-d1024-n2m-g1"),
    "g2-own-thread": load("new-d1024-n2m-g2-own"),
    "g2-node-thread": load("new-d1024-n2m-g2-node"),
    "g4-own-thread": load("new-d1024-n2m-g4-own"),
    "g4-node-thread": load("new-d1024-n2m-g4-node"),
}
for tag, rows, what in (("d1024-n1m", n1, "1 M nodes, 4 KiB rows (3.8 GiB): 3.8x a GPU's 1 GiB cache"),
                        ("d1024-n2m", n2, "2 M nodes, 4 KiB rows (7.6 GiB): 7.6x a GPU's 1 GiB cache")):
    one = rows["g1"]["batches_per_s"]
    for k, r in rows.items():
        r["vs_one_gpu"] = r["batches_per_s"] / one
        if "-node-" in k:
            r["node_vs_own"] = r["batches_per_s"] / rows[k.replace("-node-", "-own-")]["batches_per_s"]
    summary["datasets"][tag] = {"what": what, "runs": rows}
before_after = {}
for r in ("g1", "g2-own", "g2-node"):
    old = mean_of([f"old-d1024-n1m-{r}-r1", f"old-d1024-n1m-{r}-r2"])
    new = mean_of([f"new-d1024-n1m-{r}-r1", f"new-d1024-n1m-{r}-r2"])
    before_after[r] = {"old_batches_per_s": old["runs_batches_per_s"], "new_batches_per_s": new["runs_batches_per_s"],
                       "old_aggregation_ms": old["ms_per_batch"]["aggregation"],
                       "new_aggregation_ms": new["ms_per_batch"]["aggregation"],
                       "speedup": new["batches_per_s"] / old["batches_per_s"]}
summary["mean_kernels_before_after"] = {
    "what": "the same binary built with the old mean kernel (a lane per column, one row at a time) and the new "
            "one (four columns a lane, four rows at once), run alternately, two rounds each, d1024-n1m",
    "runs": before_after,
    "ncu_us_per_batch": {"old": [255.42, 154.30, 203.46], "new": [148.38, 44.10, 28.86],
                         "hops": "the kernels of hops 2, 1 and 0 of one batch (ncu-mean-*.txt)"}}
(here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
ax = axes[0]
keys = ["g1", "g2-own-thread", "g2-node-thread", "g2-own-proc", "g2-node-proc",
        "g4-own-thread", "g4-node-thread", "g4-own-proc", "g4-node-proc"]
colors = ["gray"] + ["tab:blue", "tab:orange"] * 4
bars = ax.bar(range(len(keys)), [n1[k]["batches_per_s"] for k in keys], color=colors)
for b, k in zip(bars, keys):
    ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{n1[k]['hit_rate'] * 100:.0f}%", ha="center",
            va="bottom", fontsize=8)
ax.set_xticks(range(len(keys)), keys, rotation=45, ha="right", fontsize=8)
ax.set_ylabel("mini-batches/s, all GPUs")
ax.set_title("3.8 GiB table, 1 GiB cache per GPU\n(blue: a cache each, orange: one cache; label: hit rate)",
             fontsize=9)
ax = axes[1]
keys2 = ["g1", "g2-own-thread", "g2-node-thread", "g4-own-thread", "g4-node-thread"]
bars = ax.bar(range(len(keys2)), [n2[k]["batches_per_s"] for k in keys2],
              color=["gray", "tab:blue", "tab:orange", "tab:blue", "tab:orange"])
for b, k in zip(bars, keys2):
    ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{n2[k]['hit_rate'] * 100:.0f}%", ha="center",
            va="bottom", fontsize=8)
ax.set_xticks(range(len(keys2)), keys2, rotation=45, ha="right", fontsize=8)
ax.set_title("7.6 GiB table, 1 GiB cache per GPU", fontsize=9)
ax = axes[2]
x = range(3)
ax.bar([i - 0.2 for i in x], [statistics.mean(before_after[r]["old_batches_per_s"]) for r in before_after], 0.4,
       label="old mean kernel", color="lightgray")
ax.bar([i + 0.2 for i in x], [statistics.mean(before_after[r]["new_batches_per_s"]) for r in before_after], 0.4,
       label="new mean kernel", color="tab:green")
ax.set_xticks(list(x), list(before_after), fontsize=8)
ax.set_title("3.8 GiB table: the aggregation's kernels, same run", fontsize=9)
ax.legend(fontsize=8)
fig.suptitle("bam-gnn aggregate on 4 x H100 (emu-gpu:shm, features read through bam's page cache)", fontsize=10)
fig.tight_layout()
fig.savefig(here / "gnn-processes.png", dpi=110)
