# SPDX-License-Identifier: MIT
"""bam from Python: NVMe storage read by GPU kernels through a page cache.

Host side (no GPU needed):

    import bam
    s = bam.open("emu:file=/tmp/disk.img,size=64M")
    bam.load(features, s)                        # numpy array, torch tensor or a path
    back = bam.read(s, 0, features.nbytes)       # numpy uint8, through the controller

GPU side (torch tensors cross by DLPack, on the current CUDA stream):

    cache = bam.PageCache(page_size=4096, capacity=256 << 20)
    x = bam.Array(cache, s, shape=(nodes, dim), dtype="float32")
    rows = x[idx]                                # idx: CUDA int64 tensor
    x[idx] = rows * 2                            # written through the cache
    x.flush()
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._core import Error, RowIndexError, Storage

__version__ = "0.1.0"

__all__ = [
    "Array",
    "Error",
    "PageCache",
    "RowIndexError",
    "Storage",
    "TransferResult",
    "dump",
    "gpu_available",
    "load",
    "open",
    "parse_device",
    "read",
]

StorageLike = Union[Storage, str]

#: Element sizes an Array moves (its dtype's bytes, whatever type they hold).
_ELEMENT_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class TransferResult:
    """What a load or dump moved: bytes, XXH3-128 (as ``xxhsum -H2`` prints it),
    seconds, and for a resumed load the chunks an interrupted one had written."""

    bytes: int
    checksum: str
    seconds: float
    resumed_chunks: int = 0


def open(device_string: str) -> Storage:  # noqa: A001 - bam.open mirrors bam::storage's constructor
    """Open what a device string names (``emu:ram=64M``, ``emu:file=/path,size=8G``,
    ``emu-gpu:ram=1G``, ``/dev/bam-nvme0``). ``emu-gpu:`` devices need a CUDA GPU.
    A bad string raises :class:`bam.Error` with bam's one-line text.

    GPU reads over an ``emu:`` device are served by host threads that make no
    CUDA call: the GPU threads that wait move the data, so any CUDA module
    loading mode and any stream work."""
    return Storage(device_string)


def parse_device(device_string: str) -> Dict[str, Any]:
    """Parse a device string without opening anything (raises :class:`bam.Error`)."""
    return _core.parse_device(device_string)


def gpu_available() -> bool:
    """True when the GPU classes can be used here (built with CUDA, a CUDA GPU present)."""
    return _core.gpu_unavailable_reason() == ""


def _storage(s: StorageLike) -> Storage:
    if isinstance(s, Storage):
        return s
    if isinstance(s, str):
        return Storage(s)
    raise TypeError(f"expected a bam.Storage or a device string, got {type(s).__name__}")


def _progress(label: str, enabled: bool) -> Tuple[Optional[Callable[[int, int], None]], Callable[[], None]]:
    """A progress callback drawing a tqdm bar, when tqdm is installed and enabled."""
    if not enabled:
        return None, lambda: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None, lambda: None
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label)
        bar.update(done - bar.n)

    def close() -> None:
        if bar is not None:
            bar.close()

    return update, close


def _host_bytes(source: Any) -> np.ndarray:
    """The bytes of a numpy array or a torch tensor, as a flat uint8 numpy view (or copy)."""
    if isinstance(source, np.ndarray):
        if source.dtype.hasobject:
            raise TypeError("bam.load: a numpy array of Python objects has no bytes to load")
        return np.ascontiguousarray(source).reshape(-1).view(np.uint8)
    if type(source).__module__.startswith("torch"):
        t = source.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        import torch

        return t.contiguous().reshape(-1).view(torch.uint8).numpy()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return np.frombuffer(source, dtype=np.uint8)
    raise TypeError(
        f"bam.load: source must be a path, a numpy array, a torch tensor or bytes, got {type(source).__name__}"
    )


def load(
    source: Union[str, os.PathLike, np.ndarray, Any],
    storage: StorageLike,
    offset: int = 0,
    progress: bool = True,
    resume: bool = True,
) -> TransferResult:
    """Write ``source`` (a file path, a numpy array, a torch tensor, bytes) onto the
    device at byte ``offset`` (a multiple of the LBA size), through the host
    controller (``bam::load_dataset``). A load from a file is resumable
    (``resume``). A progress bar is drawn when tqdm is installed and ``progress``."""
    s = _storage(storage)
    if offset < 0:
        raise ValueError(f"bam.load: offset {offset} is negative")
    update, close = _progress("load", progress)
    try:
        if isinstance(source, (str, os.PathLike)):
            r = s._load_file(os.fspath(source), offset, resume, update)
        else:
            r = s._load_bytes(_host_bytes(source), offset, update)
    finally:
        close()
    return TransferResult(**r)


def read(storage: StorageLike, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes at byte ``offset`` of the device, read back through the host
    controller (or the software controller's media once GPU-side), as numpy uint8."""
    if offset < 0 or nbytes < 0:
        raise ValueError(f"bam.read: offset {offset} and nbytes {nbytes} must not be negative")
    return _storage(storage)._read(offset, nbytes)


def dump(
    storage: StorageLike,
    path: Union[str, os.PathLike],
    nbytes: int,
    offset: int = 0,
    progress: bool = True,
) -> TransferResult:
    """Write ``nbytes`` bytes at byte ``offset`` of the device into the file ``path``
    (``bam::dump_dataset``); its checksum equals the load's for the same bytes."""
    if offset < 0 or nbytes < 0:
        raise ValueError(f"bam.dump: offset {offset} and nbytes {nbytes} must not be negative")
    s = _storage(storage)
    update, close = _progress("dump", progress)
    try:
        r = s._dump(os.fspath(path), offset, nbytes, update)
    finally:
        close()
    return TransferResult(**r)


def _current_stream(device: Any = None) -> int:
    """The caller's CUDA stream (torch's current stream), as an integer."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.current_stream(device).cuda_stream)


def _require_gpu() -> None:
    why = _core.gpu_unavailable_reason()
    if why:
        raise Error("bam: " + why)


class PageCache:
    """A page cache in GPU memory (``bam::page_cache``): ``capacity`` bytes of pages of
    ``page_size`` bytes (a power of two, 512 to 65536), ``ways`` slots per set.
    Without a CUDA GPU it raises :class:`bam.Error` ("no CUDA GPU")."""

    def __init__(self, page_size: int = 4096, capacity: int = 256 << 20, ways: int = 8) -> None:
        if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
            raise ValueError(f"bam.PageCache: page_size {page_size} must be a power of two in [512, 65536]")
        if capacity < page_size * ways:
            raise ValueError(
                f"bam.PageCache: capacity {capacity} holds no set of {ways} pages of {page_size} bytes"
            )
        _require_gpu()
        self._cache = _core._PageCache(page_size, capacity, ways)
        self.page_size = page_size
        self.capacity = capacity

    @property
    def slots(self) -> int:
        return self._cache.slot_count

    def stats(self) -> Dict[str, int]:
        """Misses (pages loaded) and write-backs so far, and the bytes they moved.
        The cache does not count hits."""
        misses, writebacks = self._cache.counters(_current_stream())
        return {
            "misses": misses,
            "writebacks": writebacks,
            "bytes_read": misses * self.page_size,
            "bytes_written": writebacks * self.page_size,
            "page_size": self.page_size,
            "slots": self.slots,
        }

    def flush(self) -> None:
        """Write back every dirty page, then NVMe Flush every controller involved."""
        self._cache.flush(_current_stream())


def _dtype_of(dtype: Any) -> Tuple[str, int, Any]:
    """(name, element size, torch dtype or None) of a numpy or torch dtype, or a name."""
    if type(dtype).__module__.startswith("torch"):
        import torch

        size = torch.empty((), dtype=dtype).element_size()
        name = str(dtype).replace("torch.", "")
        torch_dtype = dtype
    else:
        try:
            np_dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"bam.Array: dtype {dtype!r} is not a dtype") from e
        if np_dtype.hasobject or np_dtype.kind in "USVMm" or np_dtype.fields is not None:
            raise TypeError(f"bam.Array: dtype {np_dtype} is not a plain numeric type")
        size = np_dtype.itemsize
        name = np_dtype.name
        torch_dtype = None
    if size not in _ELEMENT_SIZES:
        raise TypeError(f"bam.Array: dtype {name} has {size}-byte elements; an Array holds 1, 2, 4 or 8-byte elements")
    return name, size, torch_dtype


def _check_layout(storage: Storage, shape: Tuple[int, ...], size: int, offset: int) -> Tuple[int, int, int]:
    """(elements, row width, start LBA) of an array of ``shape`` at byte ``offset``, or raise."""
    if len(shape) == 0:
        raise ValueError("bam.Array: shape needs at least one dimension (rows)")
    if any((not isinstance(d, (int, np.integer))) or d <= 0 for d in shape):
        raise ValueError(f"bam.Array: shape {shape} must be positive integers")
    elements = 1
    for d in shape:
        elements *= int(d)
    row_width = elements // int(shape[0])
    if offset < 0 or offset % storage.lba_size:
        raise ValueError(
            f"bam.Array: offset {offset} must be a non-negative multiple of the LBA size {storage.lba_size}"
        )
    if offset + elements * size > storage.bytes:
        raise ValueError(
            f"bam.Array: {elements * size} bytes at offset {offset} do not fit in the {storage.bytes} bytes of "
            f"{storage.device_string}"
        )
    return elements, row_width, offset // storage.lba_size


def _check_index(idx: Any, rows: int) -> Any:
    """``idx`` as a 1-D contiguous CUDA int64 tensor, or raise (no GPU work)."""
    if isinstance(idx, (int, np.integer)):
        i = int(idx)
        if not -rows <= i < rows:
            raise RowIndexError(f"bam.Array: row {i} is outside [0, {rows})")
        import torch

        return torch.tensor([i % rows], dtype=torch.int64, device="cuda")
    mod = type(idx).__module__
    if not mod.startswith("torch"):
        raise TypeError(f"bam.Array: the index must be a CUDA int64 torch tensor, got {type(idx).__name__}")
    import torch

    if idx.dtype != torch.int64:
        raise TypeError(f"bam.Array: the index must be int64, got {idx.dtype}")
    if idx.device.type != "cuda":
        raise TypeError(f"bam.Array: the index must be a CUDA tensor, got one on {idx.device}")
    if idx.dim() != 1:
        raise ValueError(f"bam.Array: the index must be 1-D, got shape {tuple(idx.shape)}")
    return idx.contiguous()


def _check_values(values: Any, torch_dtype: Any, row_shape: Tuple[int, ...], count: int, device: Any) -> Any:
    """``values`` as a contiguous CUDA tensor of ``count`` rows, or raise (no GPU work)."""
    if not type(values).__module__.startswith("torch"):
        raise TypeError(f"bam.Array: values must be a CUDA torch tensor, got {type(values).__name__}")
    if values.device.type != "cuda":
        raise TypeError(f"bam.Array: values must be a CUDA tensor, got one on {values.device}")
    if values.dtype != torch_dtype:
        raise TypeError(f"bam.Array: values are {values.dtype}, the array holds {torch_dtype}")
    want = (count,) + tuple(row_shape)
    if tuple(values.shape) != want:
        raise ValueError(f"bam.Array: values have shape {tuple(values.shape)}, the rows are {want}")
    if values.device != device:
        raise ValueError(f"bam.Array: values are on {values.device}, the index on {device}")
    return values.contiguous()


class Array:
    """An array on NVMe storage read and written by GPU threads through a
    :class:`PageCache` (``bam::array``): ``shape`` (rows first) of ``dtype``
    (numpy or torch dtype, 1/2/4/8-byte elements) at byte ``offset`` of ``storage``.

    ``arr[idx]`` gathers rows (idx: 1-D CUDA int64 tensor; ``bam::gather_rows``),
    ``arr[idx] = values`` writes rows through the cache, ``flush()`` writes dirty
    pages back. Both run on torch's current CUDA stream and wait for it; a row id
    outside [0, rows) raises :class:`bam.RowIndexError`. Argument checks
    (dtype, shape, device, offset, size) happen before any GPU work."""

    def __init__(
        self,
        cache: PageCache,
        storage: StorageLike,
        shape: Union[int, Sequence[int]],
        dtype: Any = "float32",
        offset: int = 0,
    ) -> None:
        s = _storage(storage)
        shape_t = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        self.dtype_name, self.element_size, torch_dtype = _dtype_of(dtype)
        elements, self.row_width, start_lba = _check_layout(s, shape_t, self.element_size, offset)
        if not isinstance(cache, PageCache):
            raise TypeError(f"bam.Array: cache must be a bam.PageCache, got {type(cache).__name__}")
        self.shape = tuple(int(d) for d in shape_t)
        self.offset = offset
        self.storage = s
        self.cache = cache
        self._torch_dtype = torch_dtype if torch_dtype is not None else _torch_dtype(self.dtype_name)
        self._array = _core._Array(cache._cache, s, elements, self.element_size, start_lba, _current_stream())

    @property
    def rows(self) -> int:
        return self.shape[0]

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, idx: Any) -> Any:
        import torch

        scalar = isinstance(idx, (int, np.integer))
        ids = _check_index(idx, self.rows)
        out = torch.empty((ids.shape[0],) + self.shape[1:], dtype=self._torch_dtype, device=ids.device)
        self._array.gather(ids, out, self.row_width, self.element_size, _current_stream(ids.device))
        return out[0] if scalar else out

    def __setitem__(self, idx: Any, values: Any) -> None:
        ids = _check_index(idx, self.rows)
        if isinstance(idx, (int, np.integer)) and type(values).__module__.startswith("torch"):
            values = values.reshape((1,) + self.shape[1:])
        rows = _check_values(values, self._torch_dtype, self.shape[1:], ids.shape[0], ids.device)
        self._array.write_rows(ids, rows, self.row_width, self.element_size, _current_stream(ids.device))

    def flush(self) -> None:
        """Write back the cache's dirty pages and NVMe Flush (every array on the cache)."""
        self.cache.flush()

    def check(self) -> None:
        """Raise a failure the GPU recorded since the last check (waits for the stream)."""
        self._array.check(_current_stream())

    def stats(self) -> Dict[str, int]:
        """The cache's counters (see :meth:`PageCache.stats`)."""
        return self.cache.stats()

    def __repr__(self) -> str:
        return (
            f"bam.Array(shape={self.shape}, dtype={self.dtype_name}, offset={self.offset}, "
            f"storage='{self.storage.device_string}')"
        )


def _torch_dtype(name: str) -> Any:
    try:
        import torch
    except ImportError:
        return None
    return getattr(torch, name, None)
