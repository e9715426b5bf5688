# SPDX-License-Identifier: MIT
"""The feature rows `bam-gnn make` generates, computed in Python: feature
`col` of node `node` is a function of (seed, node, col) alone (splitmix64's
finaliser twice, 24 random bits, a float in [-1, 1)), the same function as
examples/gnn/gnn_features.hpp. A dataset made with `--no-features-file` has
no file to read its rows from; these give them to a program that needs the
rows themselves (to check what it read, or to hold the table in memory).

    rows_numpy(seed, ids, dim)          # NumPy, for a few rows
    rows_torch(seed, lo, hi, dim, dev)  # torch, for the rows lo..hi-1 on any torch device, fast on a GPU
"""

from __future__ import annotations

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_NODE = 0xD1B54A32D192ED03


def _mix64_numpy(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def rows_numpy(seed: int, ids, dim: int) -> np.ndarray:
    """The rows of nodes `ids` (any integer array), float32, shape (len(ids), dim)."""
    with np.errstate(over="ignore"):
        ids = np.asarray(ids, dtype=np.uint64).reshape(-1, 1)
        node = _mix64_numpy(np.uint64(seed) ^ (ids * np.uint64(_NODE)))
        h = _mix64_numpy(node + np.arange(dim, dtype=np.uint64)[None, :])
    return ((h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 8388608.0) - np.float32(1.0))


def _signed(v: int) -> int:
    """A 64-bit constant as torch's int64 holds it (two's complement)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _shr(x, k: int):
    """Logical right shift of int64 values holding unsigned 64-bit words."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix64_torch(x):
    x = x + _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    return x ^ _shr(x, 31)


def rows_torch(seed: int, lo: int, hi: int, dim: int, device):
    """The rows of nodes lo .. hi-1 as a float32 torch tensor on `device`
    (int64 arithmetic wraps modulo 2^64 in torch, as uint64 does in C++)."""
    import torch

    ids = torch.arange(lo, hi, dtype=torch.int64, device=device).reshape(-1, 1)
    node = _mix64_torch(_signed(seed) ^ (ids * _signed(_NODE)))
    h = _mix64_torch(node + torch.arange(dim, dtype=torch.int64, device=device)[None, :])
    return _shr(h, 40).to(torch.float32) * (1.0 / 8388608.0) - 1.0
