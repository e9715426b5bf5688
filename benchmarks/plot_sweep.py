#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plots a scripts/bench-sweep result folder: one PNG per sweep, plus a
summary table (summary.json) of every run as a ratio to its same-run ceiling."""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(folder):
    runs = {}
    for f in sorted(folder.glob("*.json")):
        if f.name == "summary.json":
            continue
        runs[f.stem] = json.loads(f.read_text())
    return runs


def first(run):
    return run["results"][0]


def ceiling(run, prefix):
    for c in run.get("ceilings", []):
        if c["what"].startswith(prefix) and "GB_per_s" in c:
            return c["GB_per_s"]
    return None


def sweep(runs, prefix):
    return [(name[len(prefix):], first(r)) for name, r in runs.items() if name.startswith(prefix)]


def plot_line(ax, xs, ys, label, **kw):
    ax.plot(xs, ys, marker="o", label=label, **kw)
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.0f}" if y >= 100 else f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)


def finish(fig, ax, xlabel, ylabel, heading, title, path):
    """Log-2 x axis, labels, legend; writes the figure to `path`."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{heading}\n{title}", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    runs = load(folder)
    if not runs:
        sys.exit(f"plot_sweep: no result JSON in {folder}")
    meta = next(iter(runs.values()))
    drv = meta["driver"]
    title = f"{meta['gpu']}, CUDA driver {drv // 1000}.{drv % 1000 // 10}, {meta['date'][:10]}\ncommit {meta['commit']}"

    # Threads sweep.
    pts = sorted(sweep(runs, "threads-"), key=lambda p: int(p[0]))
    if pts:
        fig, ax = plt.subplots(figsize=(6.5, 4.4))
        plot_line(ax, [int(p[0]) for p in pts], [p[1]["ops_per_s"] / 1e6 for p in pts], "raw 512 B reads, null media")
        finish(fig, ax, "GPU threads", "M commands/s", "Commands per second vs threads", title, folder / "threads.png")

    # I/O size sweep against the zero-copy gather of the same run.
    pts = sorted(sweep(runs, "iosize-"), key=lambda p: int(p[0]))
    if pts:
        fig, ax = plt.subplots(figsize=(6.5, 4.4))
        xs = [int(p[0]) for p in pts]
        plot_line(ax, xs, [p[1]["GB_per_s"] for p in pts], "bam raw reads (host RAM media)")
        ceil = [ceiling(runs["iosize-" + p[0]], "GPU zero-copy") for p in pts]
        if all(c is not None for c in ceil):
            plot_line(ax, xs, ceil, "zero-copy gather (ceiling, same run)", linestyle="--")
        finish(fig, ax, "bytes per command", "GB/s", "Host-RAM path vs I/O size", title, folder / "iosize.png")

    # Queues x depth.
    pts = sweep(runs, "queues-")
    if pts:
        fig, ax = plt.subplots(figsize=(6.5, 4.4))
        by_q = {}
        for name, r in pts:
            q, _, d = name.split("-")
            by_q.setdefault(int(q), []).append((int(d), r["ops_per_s"] / 1e6))
        for q in sorted(by_q):
            v = sorted(by_q[q])
            plot_line(ax, [x for x, _ in v], [y for _, y in v], f"{q} queues")
        finish(fig, ax, "queue depth", "M commands/s", "Raw 512 B reads, null media: queues x depth", title,
               folder / "queues.png")

    # Cache size.
    pts = sorted(sweep(runs, "cache-"), key=lambda p: int(p[0]))
    if pts:
        fig, ax1 = plt.subplots(figsize=(6.5, 4.4))
        xs = [int(p[0]) for p in pts]
        plot_line(ax1, xs, [p[1]["GB_per_s"] for p in pts], "range reads, GB/s")
        ax2 = ax1.twinx()
        ax2.plot(xs, [100 * p[1].get("hit_rate", 0) for p in pts], color="gray", linestyle=":", marker="x",
                 label="hit rate %")
        ax2.set_ylabel("hit rate %")
        ax2.legend(loc="lower right", fontsize=8)
        finish(fig, ax1, "cache MiB (working set 2048 MiB)", "GB/s", "Page cache size, 4 KiB pages, host RAM media",
               title, folder / "cache.png")

    # Summary: every run, with its ratio to a ceiling where the run measured one.
    summary = []
    for name, r in runs.items():
        for x in r["results"]:
            row = {"run": name if len(r["results"]) == 1 else f"{name} {x['device']}", "device": x["device"],
                   "mode": x["mode"], "io_bytes": x["io_bytes"], "threads": x["threads"],
                   "Mops_per_s": x["ops_per_s"] / 1e6, "GB_per_s": x["GB_per_s"]}
            if "hit_rate" in x:
                row["hit_rate"] = x["hit_rate"]
            for prefix, key in (("GPU zero-copy", "zero_copy"), ("random gather inside GPU", "hbm_gather")):
                c = ceiling(r, prefix)
                if c:
                    row[f"{key}_GB_per_s"] = c
                    row[f"ratio_to_{key}"] = x["GB_per_s"] / c
            summary.append(row)
    (folder / "summary.json").write_text(json.dumps({"title": title, "runs": summary}, indent=2) + "\n")
    for row in summary:
        ratios = " ".join(f"{k}={v:.2f}" for k, v in row.items() if k.startswith("ratio"))
        print(f"{row['run']:<24} {row['Mops_per_s']:9.2f} Mops/s {row['GB_per_s']:8.2f} GB/s {ratios}")


if __name__ == "__main__":
    main()
