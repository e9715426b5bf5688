# SPDX-License-Identifier: MIT
"""bam's extension module: device strings, host transfers, and the GPU page cache."""

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import numpy.typing as npt

class Error(RuntimeError):
    """A failure in bam, as one line of bam's text."""

class RowIndexError(Error, IndexError):
    """A row id outside [0, rows) of a bam.Array."""

_Progress = Optional[Callable[[int, int], None]]
_Transfer = Dict[str, Any]  # {"bytes", "checksum", "seconds", "resumed_chunks"}

def gpu_compiled() -> bool:
    """True when this extension was built with CUDA."""

def gpu_unavailable_reason() -> str:
    """Empty when a CUDA GPU can be used here; otherwise why not."""

def parse_device(text: str) -> Dict[str, Any]:
    """Parse a device string without opening anything."""

class _Storage:
    """Behind bam.Storage, which checks the arguments first."""

    def __init__(self, device_string: str) -> None: ...
    def close(self) -> None:
        """Wait for a transfer in flight, then let the controllers go."""
    @property
    def closed(self) -> bool: ...
    @property
    def device_string(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def gpu_side(self) -> bool: ...
    @property
    def controller_count(self) -> int: ...
    @property
    def lba_size(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    def _load_file(
        self, path: str, offset: int, resume: bool, progress: _Progress, state_path: str = ""
    ) -> _Transfer: ...
    def _load_bytes(self, data: npt.NDArray[np.uint8], offset: int, progress: _Progress) -> _Transfer: ...
    def _check_read(self, offset: int, nbytes: int) -> None:
        """Raise Error where _read of nbytes at offset would (the device's range)."""
    def _read(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        """len(out) bytes at byte offset into out (a writable, contiguous uint8 array)."""
    def _dump(self, path: str, offset: int, nbytes: int, progress: _Progress) -> _Transfer: ...
    def __repr__(self) -> str: ...

class _PageCache:
    def __init__(
        self,
        page_size: int,
        capacity: int,
        ways: int,
        group_name: str = "",
        group_rank: int = 0,
        group_size: int = 0,
        group_timeout_ms: int = 120000,
    ) -> None: ...
    @property
    def page_size(self) -> int: ...
    @property
    def slot_count(self) -> int: ...
    def counters(self, stream: int) -> Tuple[int, int]:
        """(misses, write-backs) so far."""
    def flush(self, stream: int) -> None: ...

class _Array:
    def __init__(
        self, cache: _PageCache, storage: _Storage, elements: int, element_size: int, start_lba: int, stream: int
    ) -> None: ...
    @property
    def size(self) -> int: ...
    def gather(self, ids: Any, out: Any, row_width: int, element_size: int, stream: int) -> None:
        """ids: 1-D CUDA int64 DLPack tensor; out: contiguous CUDA tensor of len(ids) rows."""
    def write_rows(self, ids: Any, rows: Any, row_width: int, element_size: int, stream: int) -> None: ...
    def check(self, stream: int) -> None: ...
