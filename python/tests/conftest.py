# SPDX-License-Identifier: MIT
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
