# SPDX-License-Identifier: MIT
"""examples/gnn/import_ogb.py on a small dataset in OGB's binary layout
(raw/data.npz, raw/node-label.npz, split/time/*.csv.gz, as ogbn-papers100M
ships): the bam-gnn dataset it writes holds the same features, the graph in
both directions, the labels (-1 where OGB has none) and OGB's split."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gnn", "import_ogb.py")
NODES, DIM, EDGES = 500, 8, 2000


def write_ogb(root, feat_dtype=np.float16, compressed=True, labels=True):
    rng = np.random.default_rng(5)
    raw, split = os.path.join(root, "raw"), os.path.join(root, "split", "time")
    os.makedirs(raw)
    os.makedirs(split)
    edge_index = rng.integers(0, NODES, (2, EDGES)).astype(np.int64)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]  # Fortran order
    if compressed:
        edge_index = np.ascontiguousarray(edge_index)
    feats = rng.standard_normal((NODES, DIM)).astype(feat_dtype)
    save = np.savez_compressed if compressed else np.savez
    save(os.path.join(raw, "data.npz"), edge_index=edge_index, node_feat=feats,
         num_nodes_list=np.array([NODES]), num_edges_list=np.array([edge_index.shape[1]]))
    y = rng.integers(0, 7, NODES).astype(np.float32)
    y[rng.random(NODES) < 0.6] = np.nan  # most papers100M nodes have no label
    if labels:
        save(os.path.join(raw, "node-label.npz"), node_label=y.reshape(-1, 1))
    lab = np.flatnonzero(~np.isnan(y))
    parts = {"train": lab[: len(lab) // 2], "valid": lab[len(lab) // 2: 3 * len(lab) // 4], "test": lab[3 * len(lab) // 4:]}
    for name, ids in parts.items():
        with gzip.open(os.path.join(split, name + ".csv.gz"), "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))
    return feats, edge_index, y, parts


def run(*args, env=None):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.parametrize("dtype,compressed", [(np.float16, True), (np.float32, False)])
def test_import_matches_the_ogb_arrays(tmp_path, dtype, compressed, bam_gnn):
    feats, edge_index, y, parts = write_ogb(tmp_path / "ogb", dtype, compressed)
    out = tmp_path / "ds"
    r = run(tmp_path / "ogb", out, "--bam-gnn", bam_gnn, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr

    m = json.load(open(out / "manifest.json"))
    assert m["nodes"] == NODES and m["features"]["dim"] == DIM
    assert m["features"]["dtype"] == ("float16" if dtype == np.float16 else "float32")
    assert np.array_equal(np.load(out / "node_feat.npy"), feats)
    assert not (out / "edge_index.npy").exists()

    # The CSR holds every edge in both directions.
    indptr, indices = np.load(out / "indptr.npy"), np.load(out / "indices.npy")
    assert indptr.shape == (NODES + 1,) and indptr[-1] == indices.shape[0]
    stored = set()
    for u in range(NODES):
        stored.update((u, int(v)) for v in indices[indptr[u]:indptr[u + 1]])
    for u, v in edge_index.T:
        assert (int(u), int(v)) in stored and (int(v), int(u)) in stored

    labels = np.load(out / "labels.npy")
    assert labels.dtype == np.int64
    assert np.array_equal(labels, np.where(np.isnan(y), -1, y).astype(np.int64))
    for name, ids in parts.items():
        assert np.array_equal(np.load(out / "split" / f"{name}.npy"), ids)

    r = subprocess.run([bam_gnn, "-q", "check", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_directed_stores_each_edge_once(tmp_path, bam_gnn):
    _, edge_index, _, _ = write_ogb(tmp_path / "ogb")
    r = run(tmp_path / "ogb", tmp_path / "ds", "--bam-gnn", bam_gnn, "--quiet", "--directed")
    assert r.returncode == 0, r.stdout + r.stderr
    indices = np.load(tmp_path / "ds" / "indices.npy")
    assert indices.shape[0] == len({(int(u), int(v)) for u, v in edge_index.T})  # duplicates stored once


def test_bad_input_says_what_is_wrong(tmp_path, bam_gnn):
    r = run(tmp_path, tmp_path / "ds", "--bam-gnn", bam_gnn)
    assert r.returncode == 2 and "no raw/data.npz" in r.stderr

    os.makedirs(tmp_path / "x" / "raw")
    np.savez(tmp_path / "x" / "raw" / "data.npz", edge_index=np.zeros((2, 1), np.int64))
    r = run(tmp_path / "x", tmp_path / "ds", "--bam-gnn", bam_gnn)
    assert r.returncode == 2 and "no array 'node_feat'" in r.stderr and "edge_index" in r.stderr

    os.makedirs(tmp_path / "y" / "raw")
    np.savez(tmp_path / "y" / "raw" / "data.npz", edge_index=np.zeros((2, 1), np.int64),
             node_feat=np.zeros((4, 2), np.float64))
    r = run(tmp_path / "y", tmp_path / "ds2", "--bam-gnn", bam_gnn)
    assert r.returncode == 2 and "float32 or float16" in r.stderr

    write_ogb(tmp_path / "z")
    r = run(tmp_path / "z", tmp_path / "ds3", "--bam-gnn", str(tmp_path / "no-such-program"))
    assert r.returncode == 2 and "bam-gnn program was not found" in r.stderr
