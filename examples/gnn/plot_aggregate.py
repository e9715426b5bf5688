#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws `bam-gnn aggregate --compare --json` results: one bar chart of the
feature gather's GB/s by path (bam and every baseline) per JSON file, side by
side, into aggregate.png in the folder of the first file.

    examples/gnn/plot_aggregate.py benchmarks/results/gnn-aggregate-h100/*.json

Installs matplotlib into a private virtual environment when it is missing."""
import json
import os
import pathlib
import subprocess
import sys


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    venv = pathlib.Path(os.environ.get("BAM_PLOT_VENV", pathlib.Path.home() / ".cache" / "bam-plot-venv"))
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"plot_aggregate: installing matplotlib into {venv}", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
        subprocess.check_call([str(py), "-m", "pip", "install", "--quiet", "matplotlib"])
    os.execv(str(py), [str(py), *sys.argv])


def label(run):
    d = run["dataset"]
    width = d.get("feature_width", d.get("dim", "?"))
    cache_mib = run["cache_bytes"] / 2**20
    return f"{width}-wide rows, {run['page_size']} B pages, cache {cache_mib:.0f} MiB\n{run['device']}"


def main():
    files = [pathlib.Path(a) for a in sys.argv[1:]]
    if not files:
        sys.exit(__doc__)
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(f.read_text()) for f in files]
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4.5), squeeze=False)
    for ax, run in zip(axes[0], runs):
        paths = [run["gather"]] + [b for b in run.get("baselines", []) if b.get("ran")]
        names = [p["path"] for p in paths]
        gbs = [p["GB_per_s"] for p in paths]
        colors = ["tab:blue" if n == "bam" else ("tab:gray" if n == "gpu-memory" else "tab:orange") for n in names]
        ax.bar(names, gbs, color=colors)
        ax.set_yscale("log")
        ax.set_ylabel("feature gather, GB/s (log)")
        ax.set_title(label(run), fontsize=9)
        for i, v in enumerate(gbs):
            ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.tick_params(axis="x", rotation=30)
    first = runs[0]
    fig.suptitle(f"bam-gnn aggregate: {first['gpu']}, commit {first['commit']}, {first['date'][:10]}"
                 " (gray: features resident in GPU memory, the upper bound)", fontsize=10)
    fig.tight_layout()
    out = files[0].parent / "aggregate.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
