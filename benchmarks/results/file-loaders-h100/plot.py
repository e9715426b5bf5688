"""Makes summary.json from json/ and draws file-loaders.png: GB/s of every path of file_bench
(10,000 ImageNet-sized files read whole in random batches) for batches of 512 and 4096 files."""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = pathlib.Path(__file__).parent
short = [("bam::file_array", "bam"), ("zero-copy", "zero-copy (ceiling)"), ("CPU loader: threads open/read/close each "
         "file (OS page cache, hot)", "CPU loader, hot"), ("KvikIO: FileHandle::pread of each file (OS page cache, hot)",
         "KvikIO, hot"), ("CPU loader: threads open/read/close each file (cold", "CPU loader, cold"),
         ("KvikIO: FileHandle::pread of each file (cold", "KvikIO, cold")]


def name(what):
    return next(s for prefix, s in short if what.startswith(prefix))


summary = {"what": "file_bench on one H100: 10,000 files (log-normal sizes, 110 KiB mean) in an ext4 image on "
                   "emu-gpu:ram read by bam through a 256 MiB cache of 64 KiB pages, against the same bytes read "
                   "zero-copy, a 16-thread CPU loader and KvikIO (16 threads, compat mode) from the machine's file "
                   "system, hot and after dropping the OS page cache; every byte checked", "runs": {}}
for f in sorted((here / "json").glob("*.json")):
    j = json.loads(f.read_text())
    summary["runs"][f.stem] = {"batch": j["batch"], "paths": {
        name(p["what"]): {"GB_per_s": p["GB_per_s"], "files_per_s": p["files_per_s"],
                          "bam_over_this": p["bam_over_this"], "bad_bytes": p["bad_bytes"]}
        for p in j["paths"] if "GB_per_s" in p}}
(here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

order = [s for _, s in short]
colors = ["tab:green", "tab:blue", "tab:orange", "tab:purple", "navajowhite", "plum"]
fig, ax = plt.subplots(figsize=(8, 4))
runs = [("files-b512", "batches of 512 files"), ("files-b4096", "batches of 4096 files")]
w = 0.13
for k, (p, c) in enumerate(zip(order, colors)):
    ax.bar([i + (k - 2.5) * w for i in range(len(runs))],
           [summary["runs"][r]["paths"][p]["GB_per_s"] for r, _ in runs], w, label=p, color=c)
ax.set_yscale("log")
ax.set_ylim(0.8, 300)
ax.set_xticks(range(len(runs)), [n for _, n in runs])
ax.set_ylabel("GB/s of file bytes")
ax.set_title("file_bench, H100: whole files by index (ImageNet-sized), one epoch", fontsize=9)
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
fig.savefig(here / "file-loaders.png", dpi=110)
