#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the dataset of this run in the bam-gnn layout (manifest.json,
indptr.npy, indices.npy, features.bin): NODES nodes, DEGREE * NODES stored
edges (both directions; one end drawn from a Pareto law, so degrees are
skewed), DIM float32 features per node from a normal law.

    python make_dataset.py DIR NODES DIM DEGREE      # this run: /tmp/g 200000 1024 15
"""
import json, os, sys
import numpy as np
root, nodes, dim, degree = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(root, exist_ok=True)
rng = np.random.default_rng(3)
m = nodes * degree // 2
# power-law-ish: skewed endpoints
src = (rng.pareto(1.2, m) * nodes / 50).astype(np.int64) % nodes
dst = rng.integers(0, nodes, m)
u, v = np.concatenate([src, dst]), np.concatenate([dst, src])
order = np.argsort(u, kind="stable")
indices = v[order].astype(np.int32)
indptr = np.zeros(nodes + 1, dtype=np.int64)
np.cumsum(np.bincount(u, minlength=nodes), out=indptr[1:])
np.save(os.path.join(root, "indptr.npy"), indptr)
np.save(os.path.join(root, "indices.npy"), indices)
with open(os.path.join(root, "features.bin"), "wb") as f:
    for s in range(0, nodes, 65536):
        n = min(65536, nodes - s)
        f.write(rng.standard_normal((n, dim), dtype=np.float32).tobytes())
manifest = {"format": "bam-gnn-dataset", "version": 1, "nodes": nodes, "edges": int(indices.shape[0]), "undirected": True,
            "graph": {"source": "test", "seed": 3, "rmat_abc": [0.57, 0.19, 0.19], "requested_degree": degree,
                      "indptr": {"file": "indptr.npy", "dtype": "int64"}, "indices": {"file": "indices.npy", "dtype": "int32"}},
            "features": {"dim": dim, "dtype": "float32", "row_bytes": dim * 4, "source": "test", "seed": 3,
                         "file": "features.bin", "file_offset": 0}}
json.dump(manifest, open(os.path.join(root, "manifest.json"), "w"))
