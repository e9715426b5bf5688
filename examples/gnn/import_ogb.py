#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Turn an OGB node-property dataset as OGB downloads it (ogbn-papers100M,
ogbn-products, ogbn-arxiv: the binary layout with raw/data.npz) into a bam-gnn
dataset directory, without holding the feature table in memory.

    python3 examples/gnn/import_ogb.py ~/ogb/papers100M-bin ~/data/papers100M
    bam-gnn load ~/data/papers100M /dev/bam-nvme0        # or emu:file=..., emu-gpu:shm=...
    python3 examples/gnn/train_sage.py ~/data/papers100M --features bam

What it writes into DATASET:
  node_feat.npy         the features, streamed out of raw/data.npz (float16 or
                        float32, one row per node); bam-gnn reads them in place
  manifest.json, indptr.npy, indices.npy
                        from `bam-gnn import` (the CSR; both directions of every
                        edge unless --directed)
  labels.npy            one int64 class per node, -1 where OGB has none (NaN)
  split/train.npy, split/valid.npy, split/test.npy
                        OGB's split (int64 node ids); train_sage.py uses these
                        and labels.npy when they are there

Needs numpy, and the bam-gnn program (--bam-gnn, $BAM_GNN, or on PATH).
"""

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np

CHUNK = 64 << 20


def fail(msg: str, code: int = 1) -> None:
    print(f"import_ogb: {msg}", file=sys.stderr)
    sys.exit(code)


def find_raw(root: str) -> str:
    """The folder holding data.npz: ROOT/raw, or ROOT itself."""
    for d in (os.path.join(root, "raw"), root):
        if os.path.isfile(os.path.join(d, "data.npz")):
            return d
    fail(f"{root}: no raw/data.npz (expected OGB's binary layout, e.g. papers100M-bin/raw/data.npz)", 2)
    return ""


def member(z: zipfile.ZipFile, name: str, where: str) -> zipfile.ZipInfo:
    try:
        return z.getinfo(name + ".npy")
    except KeyError:
        have = ", ".join(n[:-4] for n in z.namelist() if n.endswith(".npy"))
        fail(f"{where}: no array {name!r} (it holds: {have or 'no arrays'})", 2)
        raise


def extract(z: zipfile.ZipFile, info: zipfile.ZipInfo, dst: str, quiet: bool) -> None:
    """Stream one member of a (compressed or stored) .npz into a .npy file."""
    bar = None
    if not quiet:
        try:
            from tqdm import tqdm

            bar = tqdm(total=info.file_size, unit="B", unit_scale=True, desc=os.path.basename(dst))
        except ImportError:
            print(f"extracting {info.filename} ({info.file_size / 2**30:.2f} GiB) to {dst}")
    tmp = dst + ".part"
    with z.open(info) as src, open(tmp, "wb") as out:
        while True:
            buf = src.read(CHUNK)
            if not buf:
                break
            out.write(buf)
            if bar is not None:
                bar.update(len(buf))
    if bar is not None:
        bar.close()
    os.replace(tmp, dst)


def npy_shape(path: str):
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        return np.lib.format.read_array_header_2_0(f)


def c_order_edges(path: str) -> None:
    """bam-gnn reads C-order arrays: a Fortran-order (2, E) edge array is
    rewritten as (E, 2), in pieces."""
    shape, fortran, dtype = npy_shape(path)
    if not fortran:
        return
    if len(shape) != 2:
        fail(f"{path}: edge_index is {shape}, expected (2, E) or (E, 2)", 2)
    a = np.load(path, mmap_mode="r")
    tmp = path + ".c"
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(shape[1], shape[0]))
    step = max(1, CHUNK // (a.itemsize * shape[0]))
    for lo in range(0, shape[1], step):
        out[lo:lo + step] = a[:, lo:lo + step].T
    out.flush()
    del out, a
    os.replace(tmp, path)


def read_split(raw: str) -> dict:
    """OGB's split: ROOT/split/<name>/{train,valid,test}.csv.gz (one node id a line)."""
    root = os.path.dirname(os.path.abspath(raw)) if os.path.basename(os.path.abspath(raw)) == "raw" else raw
    split_dir = os.path.join(root, "split")
    if not os.path.isdir(split_dir):
        return {}
    names = sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d)))
    if len(names) != 1:
        fail(f"{split_dir}: expected one split folder, found {names or 'none'}", 2)
    out = {}
    for part in ("train", "valid", "test"):
        p = os.path.join(split_dir, names[0], part + ".csv.gz")
        if not os.path.isfile(p):
            fail(f"{p}: missing (OGB's split has train, valid and test)", 2)
        with gzip.open(p, "rt") as f:
            try:
                out[part] = np.loadtxt(f, dtype=np.int64, ndmin=1)
            except ValueError as e:
                fail(f"{p}: not one node id a line ({e})", 2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ogb_dir", help="the downloaded dataset (the folder with raw/data.npz)")
    p.add_argument("dataset", help="the bam-gnn dataset directory to write")
    p.add_argument("--bam-gnn", default=os.environ.get("BAM_GNN") or shutil.which("bam-gnn"),
                   help="the bam-gnn program (default: $BAM_GNN, else bam-gnn on PATH)")
    p.add_argument("--directed", action="store_true", help="store each edge once (default: both directions)")
    p.add_argument("--threads", type=int, help="bam-gnn's CPU threads (default: all cores)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    if not args.bam_gnn or not os.access(args.bam_gnn, os.X_OK):
        fail("the bam-gnn program was not found: pass --bam-gnn PATH or set BAM_GNN", 2)
    raw = find_raw(args.ogb_dir)
    os.makedirs(args.dataset, exist_ok=True)
    feat = os.path.join(args.dataset, "node_feat.npy")
    edges = os.path.join(args.dataset, "edge_index.npy")

    data_npz = os.path.join(raw, "data.npz")
    try:
        z = zipfile.ZipFile(data_npz)
    except zipfile.BadZipFile as e:
        fail(f"{data_npz}: not an .npz archive ({e})", 2)
    with z:
        fi, ei = member(z, "node_feat", data_npz), member(z, "edge_index", data_npz)
        extract(z, fi, feat, args.quiet)
        extract(z, ei, edges, args.quiet)
    c_order_edges(edges)
    fshape, ffortran, fdtype = npy_shape(feat)
    if len(fshape) != 2 or ffortran or fdtype not in (np.dtype("<f4"), np.dtype("<f2")):
        fail(f"{data_npz}: node_feat is {fdtype} {fshape}{' (Fortran order)' if ffortran else ''}; "
             "bam-gnn reads 2-D float32 or float16 in C order", 2)
    nodes = int(fshape[0])

    labels_npz = os.path.join(raw, "node-label.npz")
    if os.path.isfile(labels_npz):
        with np.load(labels_npz) as lz:
            if "node_label" not in lz:
                fail(f"{labels_npz}: no array 'node_label' (it holds: {', '.join(lz.files)})", 2)
            y = np.asarray(lz["node_label"]).reshape(-1)
        if y.shape[0] != nodes:
            fail(f"{labels_npz}: {y.shape[0]} labels for {nodes} nodes", 2)
        if np.issubdtype(y.dtype, np.floating):
            missing = np.isnan(y)
            y = np.where(missing, -1, y)
        np.save(os.path.join(args.dataset, "labels.npy"), y.astype(np.int64))

    split = read_split(raw)
    if split:
        os.makedirs(os.path.join(args.dataset, "split"), exist_ok=True)
        for part, ids in split.items():
            if ids.size and (ids.min() < 0 or ids.max() >= nodes):
                fail(f"split {part}: node ids must lie in [0, {nodes}), found {ids.min()}..{ids.max()}", 2)
            np.save(os.path.join(args.dataset, "split", part + ".npy"), ids)

    cmd = [args.bam_gnn, "import", args.dataset, "--features", feat, "--edges", edges]
    if not args.directed:
        cmd.append("--undirected")
    if args.threads:
        cmd = [args.bam_gnn, "--threads", str(args.threads), *cmd[1:]]
    if args.quiet:
        cmd = [args.bam_gnn, "-q", *cmd[1:]]
    r = subprocess.run(cmd)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} failed (exit status {r.returncode})", r.returncode)
    os.remove(edges)  # the CSR holds the graph now
    if not args.quiet:
        print(f"{args.dataset}: {nodes} nodes, {fshape[1]} x {fdtype} features"
              f"{', labels' if os.path.isfile(labels_npz) else ''}"
              f"{', split ' + '/'.join(f'{len(v)}' for v in split.values()) if split else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
