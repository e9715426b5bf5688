"""Collects the emu:file runs of this folder into summary.json and draws file-threads.png."""
import json
import pathlib
import statistics

here = pathlib.Path(__file__).parent
runs = []
for path in sorted(here.glob("file-raw-t*.json")):
    d = json.loads(path.read_text())
    bam = d["results"][0]
    pread = next(c for c in d["ceilings"] if "pread" in c["what"])
    zero_copy = next(c for c in d["ceilings"] if "zero-copy" in c["what"])
    threads = int(bam["device"].split("threads=")[1].split(",")[0])
    runs.append({"file": path.name, "engine_threads": threads, "bam_reads_per_s": bam["ops_per_s"],
                 "bam_GB_per_s": bam["GB_per_s"], "verified": bam["verified"] and bam["bad_words"] == 0,
                 "pread_reads_per_s": pread["ops_per_s"], "pread_GB_per_s": pread["GB_per_s"],
                 "ratio_to_pread": bam["ops_per_s"] / pread["ops_per_s"],
                 "zero_copy_GB_per_s": zero_copy["GB_per_s"], "commit": d["commit"], "date": d["date"],
                 "gpu": d["gpu"]})
by_threads = {}
for r in runs:
    by_threads.setdefault(r["engine_threads"], []).append(r["ratio_to_pread"])
summary = {
    "machine": "nvidia-h100-x2 host (2 x NVIDIA H100 80GB HBM3, VM, 32 cores), GPU 0 only; driver 580.159.04, "
               "CUDA 13.0; Release build for sm_90; CUDA's default (lazy) module loading",
    "disk": "4 GiB file on the root file system: ext4 on /dev/vda, a virtual disk",
    "command": "block_bench --device emu:file=F,queues=16,threads=T --file F --file-mib 4096 --mode raw "
               "--io-size 4096 --threads 65536 --compare --json FILE",
    "ceiling": "POSIX pread, O_DIRECT, 32 threads, + cudaMemcpy: the best host path to this disk, same run",
    "runs": runs,
    "ratio_to_pread_by_engine_threads": {str(t): {"runs": v, "median": statistics.median(v), "min": min(v)}
                                         for t, v in sorted(by_threads.items())},
}
(here / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(5.5, 3.4))
for t, ratios in sorted(by_threads.items()):
    ax.scatter([t] * len(ratios), ratios, color="C0", zorder=3)
ax.plot(sorted(by_threads), [statistics.median(by_threads[t]) for t in sorted(by_threads)], color="C0",
        label="bam emu:file / pread, same run (median)")
ax.axhline(0.9, color="grey", lw=0.8, ls=":", label="target: 90 % of pread")
ax.axhline(1.0, color="black", lw=0.6)
ax.set_xscale("log", base=2)
ax.set_xticks(sorted(by_threads), [str(t) for t in sorted(by_threads)])
ax.set_xlabel("CPU engine threads (reads in flight at the disk)")
ax.set_ylabel("random 4 KiB reads/s, ratio to pread")
ax.set_ylim(0.6, 1.2)
ax.set_title("A file on the GPU machine's virtual disk", fontsize=10)
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(here / "file-threads.png", dpi=120)
