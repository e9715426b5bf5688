#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Draws the curves of scripts/gnn-sweep: the feature gather's GB/s (bam and
each baseline of the same run) and bam's cache hit rate against the cache
size as a fraction of the feature table (cache-*.json), and against the
feature width (width-*.json), into curves.png and curves.json (the points).

    examples/gnn/plot_curves.py benchmarks/results/gnn-curves-<gpu>-<date>

Installs matplotlib into a private virtual environment when it is missing."""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from plot_aggregate import ensure_matplotlib  # noqa: E402


def point(run, x):
    table = run["dataset"]["nodes"] * run["dataset"]["row_bytes"]
    p = {"x": x, "cache_fraction": run["cache_bytes"] / table, "row_bytes": run["dataset"]["row_bytes"],
         "page_size": run["page_size"], "hit_rate": run["cache"]["hit_rate"], "bam_GB_per_s": run["gather"]["GB_per_s"]}
    for b in run.get("baselines", []):
        if b.get("ran"):
            p[b["path"] + "_GB_per_s"] = b["GB_per_s"]
    return p


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = pathlib.Path(sys.argv[1])
    runs = {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json")) if f.stem != "curves"}
    cache = [point(r, None) for k, r in runs.items() if k.startswith("cache-")]
    for p in cache:
        p["x"] = p["cache_fraction"]
    width = [point(r, None) for k, r in runs.items() if k.startswith("width-")]
    hot = {}  # cache MiB -> points against the hot set's share of the rows (cache<MiB>-hot<P>.json)
    for k, r in runs.items():
        if k.startswith("cache") and "-hot" in k:
            p = point(r, r.get("hot_set", {}).get("percent", 0.0))
            p["hot_row_visit_fraction"] = r.get("hot_set", {}).get("row_visit_fraction", 0.0)
            hot.setdefault(round(r["cache_bytes"] / 2**20), []).append(p)
    for p in width:
        p["x"] = p["row_bytes"]
    cache.sort(key=lambda p: p["x"])
    width.sort(key=lambda p: p["x"])
    if not cache and not width and not hot:
        sys.exit(f"{folder}: no cache-*.json, width-*.json or cache<MiB>-hot<P>.json files of bam-gnn aggregate")
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [(c, t, xl) for c, t, xl in ((cache, "against cache size (4 KiB rows)", "cache / feature table"),
                                          (width, "against row width (cache = 1/4 of the table, pages = rows)", "row bytes"))
              if c]
    panels = len(curves) + (1 if hot else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8), squeeze=False)
    if hot:
        ax = axes[0][len(curves)]
        for mib, pts in sorted(hot.items()):
            pts.sort(key=lambda p: p["x"])
            frac = pts[0]["cache_fraction"]
            ax.plot([p["x"] for p in pts], [p["bam_GB_per_s"] for p in pts], "o-",
                    label=f"bam, cache {mib} MiB ({frac:.2g} of the table)")
            ax.plot([p["x"] for p in pts], [p.get("zero-copy_GB_per_s") for p in pts], ".--", color="gray",
                    label="zero-copy gather" if mib == min(hot) else None)
        ax.set_xlabel("hot set, % of the rows (highest in-degree), in pinned host memory")
        ax.set_ylabel("feature gather, GB/s")
        ax.set_title("with a hot set (4 KiB rows)", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax, (pts, title, xlabel) in zip(axes[0], curves):
        xs = [p["x"] for p in pts]
        keys = ["bam_GB_per_s"] + sorted({k for p in pts for k in p if k.endswith("_GB_per_s") and k != "bam_GB_per_s"})
        for k in keys:
            ys = [p.get(k) for p in pts]
            if any(y is None for y in ys):
                continue
            ax.plot(xs, ys, "o-" if k == "bam_GB_per_s" else ".--", label=k.replace("_GB_per_s", ""),
                    linewidth=2.5 if k == "bam_GB_per_s" else 1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("feature gather, GB/s (log)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        hit = ax.twinx()
        hit.plot(xs, [float("nan") if p["hit_rate"] is None else p["hit_rate"] * 100 for p in pts], "s:", color="black", label="bam hit rate")
        hit.set_ylabel("bam cache hit rate, % (black squares)")
        hit.set_ylim(0, 100)
        ax.legend(fontsize=7, loc="upper left")
    first = next(iter(runs.values()))
    fig.suptitle(f"bam-gnn aggregate, {first['dataset']['nodes']} nodes, fanouts "
                 f"{','.join(map(str, first['fanouts']))}, {first['device']}\n{first['gpu']}, commit {first['commit']}, "
                 f"{first['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / "curves.png", dpi=110)
    (folder / "curves.json").write_text(json.dumps({"cache": cache, "width": width,
                                                    "hot": {str(k): v for k, v in sorted(hot.items())}}, indent=2) + "\n")
    print(f"wrote {folder / 'curves.png'}")


if __name__ == "__main__":
    main()
