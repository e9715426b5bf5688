# SPDX-License-Identifier: MIT
"""examples/gnn/generated_features.py computes the rows `bam-gnn make`
generates: every row of a made table, for several widths and seeds (one above
2^63), with NumPy and, where torch is installed, with torch on the CPU and on
a GPU."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gnn"))
import generated_features  # noqa: E402

NODES = 2000


def make(bam_gnn, root, dim, seed):
    r = subprocess.run([bam_gnn, "-q", "make", str(root), "--nodes", str(NODES), "--degree", "4", "--dim", str(dim),
                        "--feature-seed", str(seed)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(root / "manifest.json") as f:
        feats = json.load(f)["features"]
    assert feats["source"] == "generated" and feats["seed"] == seed
    table = np.fromfile(root / feats["file"], dtype=np.float32, offset=feats["file_offset"])
    return table.reshape(NODES, dim)


@pytest.mark.parametrize("dim,seed", [(128, 7), (3, 2**64 - 59), (1024, 2**63 + 1)])
def test_numpy_rows_equal_the_made_table(tmp_path, bam_gnn, dim, seed):
    table = make(bam_gnn, tmp_path, dim, seed)
    assert np.array_equal(generated_features.rows_numpy(seed, np.arange(NODES), dim), table)
    ids = np.array([NODES - 1, 0, 17, 17])
    assert np.array_equal(generated_features.rows_numpy(seed, ids, dim), table[ids])
    # The rows are not all alike: a wrong seed or column gives other values.
    assert not np.array_equal(generated_features.rows_numpy(seed + 1, ids, dim), table[ids])
    assert np.all((table >= -1) & (table < 1))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_rows_equal_the_made_table(tmp_path, bam_gnn, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    seed = 2**64 - 59
    table = make(bam_gnn, tmp_path, 64, seed)
    got = generated_features.rows_torch(seed, 100, NODES, 64, device)
    assert got.device.type == device and got.dtype == torch.float32
    assert np.array_equal(got.cpu().numpy(), table[100:])
