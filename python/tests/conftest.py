# SPDX-License-Identifier: MIT
import os

import pytest

import bam


def _gpu_missing() -> str:
    """Why the GPU tests cannot run here; empty when they can."""
    why = bam._core.gpu_unavailable_reason()
    if why:
        return why
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return ""


def pytest_collection_modifyitems(config, items):
    why = _gpu_missing()
    if not why:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def image(tmp_path):
    """A device string for a 16 MiB software controller over a file (a generous
    command timeout: a busy CI machine's disk may stall for seconds)."""
    return f"emu:file={tmp_path / 'disk.img'},size=16M,timeout=60s"


@pytest.fixture
def bam_gnn():
    """The dataset tool's path: $BAM_GNN, else examples/bam-gnn of the build
    directory the tests run from; the test is skipped without one."""
    for p in (os.environ.get("BAM_GNN"), os.path.join(os.getcwd(), "examples", "bam-gnn")):
        if p and os.access(p, os.X_OK):
            return p
    pytest.skip("the bam-gnn program is not built here (set BAM_GNN, or run from a build directory with examples)")
