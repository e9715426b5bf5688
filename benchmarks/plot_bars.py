#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plots the block_bench --json runs of one folder as bars, one per file
(labelled by the file name), of a figure of each run: operations per second
(pages, page visits or commands), misses per second, or GB/s. Writes
<folder>/<folder name>.png; an optional reference line (e.g. the ceiling of
the same run, or N x the SSD model's IOPS) is drawn for each bar whose file
name ends in -N.

    benchmarks/plot_bars.py FOLDER [--metric ops_per_s|misses_per_s|GB_per_s]
                                   [--per-unit VALUE --per-unit-label TEXT]
"""
import argparse
import json
import pathlib
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--metric", default="ops_per_s", choices=["ops_per_s", "misses_per_s", "GB_per_s"])
    ap.add_argument("--per-unit", type=float, default=0.0,
                    help="draw N x this value (in the plotted unit) above a file named ...-N")
    ap.add_argument("--per-unit-label", default="")
    ap.add_argument("--title", default="")
    a = ap.parse_args()

    runs = []
    for f in sorted(a.folder.glob("*.json")):
        d = json.loads(f.read_text())
        if d.get("benchmark") != "block_bench" or not d.get("results"):
            continue
        r = d["results"][0]
        runs.append((f.stem, r, d))
    if not runs:
        raise SystemExit(f"plot_bars: no block_bench JSON in {a.folder}")

    def n_of(name):
        m = re.search(r"-(\d+)$", name)
        return int(m.group(1)) if m else None

    runs.sort(key=lambda x: (re.sub(r"-\d+$", "", x[0]), n_of(x[0]) or 0))
    scale = 1e-6 if a.metric != "GB_per_s" else 1.0
    unit = "M/s" if a.metric != "GB_per_s" else "GB/s"
    names = [n for n, _, _ in runs]
    vals = [r.get(a.metric, 0.0) * scale for _, r, _ in runs]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(runs) + 2), 4.2))
    bars = ax.bar(range(len(runs)), vals, color="#3b75af")
    for b, v in zip(bars, vals):
        ax.annotate(f"{v:.1f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    if a.per_unit > 0:
        xs, ys = [], []
        for i, n in enumerate(names):
            k = n_of(n)
            if k is not None:
                xs.append(i)
                ys.append(k * a.per_unit)
        if xs:
            ax.scatter(xs, ys, marker="_", s=600, color="#d0542c", zorder=3,
                       label=a.per_unit_label or f"N x {a.per_unit:g}")
            ax.legend(fontsize=8)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{a.metric.replace('_per_s', '')} ({unit})")
    _, r0, d0 = runs[0]
    ax.set_title(a.title or a.folder.name, fontsize=10)
    fig.text(0.01, 0.01, f"{d0.get('gpu', '?')}, {r0.get('transport', '?')}, commit {d0.get('commit', '?')}, "
             f"{d0.get('date', '?')}", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out = a.folder / f"{a.folder.name}.png"
    fig.savefig(out, dpi=120)
    print(f"plot_bars: {out}")


if __name__ == "__main__":
    main()
