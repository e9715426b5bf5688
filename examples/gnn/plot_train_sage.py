#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws `train_sage.py --json` results: the last epoch's time per feature
mode, split into sampling, gathering and training, with each mode's ratio to
`memory`, into train_sage.png next to the JSON file.

    examples/gnn/plot_train_sage.py benchmarks/results/train-sage-h100/sage-emu-gpu-ram.json

Installs matplotlib into a private virtual environment when it is missing."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_aggregate import ensure_matplotlib  # noqa: E402


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: plot_train_sage.py RESULT.json")
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        d = json.load(f)
    ran = [r for r in d["results"] if "skipped" not in r]  # a mode whose table did not fit ran nothing
    if not ran:
        sys.exit(f"{sys.argv[1]}: every mode was skipped: " + "; ".join(r["skipped"] for r in d["results"]))
    modes = [r["mode"] for r in ran]
    last = [r["epochs"][-1] for r in ran]
    ref = next((e["seconds"] for r, e in zip(ran, last) if r["mode"] == "memory"), None)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    bottom = [0.0] * len(modes)
    for part, colour in (("sample_s", "#9ab"), ("gather_s", "#d62"), ("train_s", "#38a")):
        vals = [e[part] for e in last]
        ax.bar(modes, vals, bottom=bottom, color=colour, label=part[:-2])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, e in enumerate(last):
        text = f"{e['seconds']:.2f} s"
        if ref:
            text += f"\n{e['seconds'] / ref:.2f}x memory"
        ax.text(i, bottom[i], text, ha="center", va="bottom", fontsize=8)
    ds = d["dataset"]
    ax.set_ylabel(f"epoch {last[0]['epoch']} time (s)")
    ax.set_ylim(0, max(bottom) * 1.3)
    ax.set_title(f"GraphSAGE, {ds['nodes']:,} nodes x {ds['dim']} {ds['dtype']}, {d['gpu']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "train_sage.png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
