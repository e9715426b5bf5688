# SPDX-License-Identifier: MIT
"""bam from Python: NVMe storage read by GPU kernels through a page cache.

Every call takes the storage first, then what moves, then ``offset`` and
``nbytes``; each is also a method of :class:`Storage`. Host side (no GPU
needed)::

    import bam
    with bam.open("emu:file=/tmp/disk.img,size=64M") as s:
        bam.load(s, features)                        # numpy array, torch tensor or a path
        back = bam.read(s, 0, features.nbytes)       # numpy uint8, through the controller
        bam.read(s, 0, out=buf)                      # into a caller's buffer
        f = bam.read_async(s, 0, 4096)               # a concurrent.futures.Future

GPU side (torch tensors cross by DLPack, on the current CUDA stream)::

    cache = bam.PageCache(page_size=4096, capacity=256 << 20)
    x = bam.Array(cache, s, shape=(nodes, dim), dtype="float32")
    rows = x[idx]                                # idx: ids (CUDA tensor, numpy, list, slice)
    x[idx] = rows * 2                            # written through the cache
    x.flush()
"""

from __future__ import annotations

import concurrent.futures
import errno
import operator
import os
import threading
import warnings
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type, TypeVar, Union, overload

import numpy as np
import numpy.typing as npt

from . import _core
from ._core import Error, RowIndexError

__version__ = "0.1.0"

# `open` is left out: `from bam import *` must not hide the built-in open.
# It stays bam.open.
__all__ = [
    "Array",
    "Error",
    "CacheGroup",
    "PageCache",
    "RowIndexError",
    "Storage",
    "StorageLike",
    "TransferResult",
    "dump",
    "gpu_available",
    "io_threads",
    "load",
    "parse_device",
    "read",
    "read_async",
    "write",
    "write_async",
]

#: Element sizes an Array moves (its dtype's bytes, whatever type they hold).
_ELEMENT_SIZES = (1, 2, 4, 8)

#: Threads that run the ``*_async`` calls (``BAM_PYTHON_IO_THREADS``).
_DEFAULT_IO_THREADS = 4

_Buffer = TypeVar("_Buffer")


def io_threads() -> int:
    """Threads of the pool that runs :func:`read_async` and :func:`write_async`:
    ``BAM_PYTHON_IO_THREADS`` when set (read once, at the first asynchronous
    call), else 4."""
    text = os.environ.get("BAM_PYTHON_IO_THREADS", "")
    if not text:
        return _DEFAULT_IO_THREADS
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"BAM_PYTHON_IO_THREADS={text!r}: expected a positive number of threads")
    return n


_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=io_threads(), thread_name_prefix="bam-io")
        return _pool


@dataclass(frozen=True)
class TransferResult:
    """What a load or dump moved: bytes, XXH3-128 (as ``xxhsum -H2`` prints it),
    seconds, and for a resumed load the chunks an interrupted one had written."""

    bytes: int
    checksum: str
    seconds: float
    resumed_chunks: int = 0


# ---- argument checks: TypeError and ValueError naming the public call --------


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


def _count(call: str, name: str, value: Any) -> int:
    """``value`` as a non-negative int (a Python or numpy integer), or raise."""
    if isinstance(value, bool):
        raise TypeError(f"{call}: {name} must be an int, got bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{call}: {name} must be an int, got {_type_name(value)}") from None
    if n < 0:
        raise ValueError(f"{call}: {name} {n} is negative")
    if n >= 1 << 64:
        raise ValueError(f"{call}: {name} {n} is past 2^64 - 1")
    return n


def _load_state_path(call: str, source: str, state_path: Any) -> str:
    """Where a load of the file ``source`` records its progress: ``state_path``;
    beside the source where its directory can be written; else a file of the
    user's state directory named after the source's real path."""
    if state_path is not None:
        if not isinstance(state_path, (str, os.PathLike)):
            raise TypeError(f"{call}: state_path must be a str or os.PathLike, got {_type_name(state_path)}")
        p = os.fspath(state_path)
        return p if isinstance(p, str) else os.fsdecode(p)
    here = os.path.dirname(os.path.abspath(source)) or "."
    if not os.path.isdir(here) or os.access(here, os.W_OK):
        return ""  # bam's default: the source's path + ".bam-load" (a missing source fails there)
    import hashlib

    real = os.path.realpath(source)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    directory = os.path.join(base, "bam")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return ""  # no state directory either: bam's own error says where it tried
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(directory, f"{os.path.basename(real)}-{digest}.bam-load")


def _is_cuda(x: Any) -> bool:
    """True for a CUDA array: ``__cuda_array_interface__``, or a DLPack device that is CUDA."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        kind = dev()[0]
    except Exception:
        return False
    # DLPack's device types: 2 CUDA, 3 CUDA host memory, 13 CUDA managed.
    return int(kind) in (2, 13)


def _host_bytes(call: str, name: str, source: Any) -> np.ndarray:
    """The bytes of a numpy array, a torch tensor or any buffer-protocol object,
    as a flat uint8 numpy view (or copy)."""
    if isinstance(source, np.ndarray):
        if source.dtype.hasobject:
            raise TypeError(f"{call}: a numpy array of Python objects has no bytes to move")
        return np.ascontiguousarray(source).reshape(-1).view(np.uint8)
    if type(source).__module__.startswith("torch"):
        t = source.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        import torch

        flat: np.ndarray = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        return flat
    if _is_cuda(source):
        return _host_bytes(call, name, _cuda_tensor(call, source))
    try:
        view = memoryview(source)
    except TypeError:
        pass
    else:
        if not view.c_contiguous:
            view = memoryview(view.tobytes())  # in C order
        return np.frombuffer(view.cast("B"), dtype=np.uint8) if view.nbytes else np.zeros(0, np.uint8)
    raise TypeError(
        f"{call}: {name} must be a numpy array, a torch tensor or a buffer (bytes, bytearray, memoryview), "
        f"got {_type_name(source)}"
    )


def _writable_bytes(call: str, out: Any) -> np.ndarray:
    """A caller's host buffer as a flat, writable uint8 numpy view of its memory."""
    if isinstance(out, np.ndarray):
        if not out.flags.c_contiguous:
            raise ValueError(f"{call}: out must be C-contiguous")
        if not out.flags.writeable:
            raise ValueError(f"{call}: out is read-only")
        return out.reshape(-1).view(np.uint8)
    if type(out).__module__.startswith("torch"):
        if out.device.type != "cpu":
            raise TypeError(f"{call}: out is on {out.device}; host buffers and CUDA buffers are supported")
        if not out.is_contiguous():
            raise ValueError(f"{call}: out must be contiguous")
        import torch

        # As bytes first: numpy has no bfloat16 or float8.
        return _writable_bytes(call, out.detach().reshape(-1).view(torch.uint8).numpy())
    try:
        view = memoryview(out)
    except TypeError:
        raise TypeError(
            f"{call}: out must be a writable buffer (bytearray, numpy array, memoryview) or a CUDA array, "
            f"got {_type_name(out)}"
        ) from None
    if view.readonly:
        raise ValueError(f"{call}: out ({_type_name(out)}) is read-only")
    if not view.c_contiguous:
        raise ValueError(f"{call}: out must be C-contiguous")
    if view.nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def _cuda_tensor(call: str, x: Any) -> Any:
    """A CUDA array (``__cuda_array_interface__`` or DLPack) as a torch tensor sharing its memory."""
    torch = _torch_for(call)
    if type(x).__module__.startswith("torch"):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return torch.as_tensor(x, device="cuda")
    return torch.from_dlpack(x)


def _torch_for(call: str) -> Any:
    try:
        import torch
    except ImportError:
        raise TypeError(f"{call}: CUDA buffers move through torch, which is not installed") from None
    return torch


# ---- storage ------------------------------------------------------------------


class Storage:
    """What a device string names (``bam::storage``): one or more controllers,
    driven by host threads (``emu:``, ``/dev/bam-nvme*``) until a
    :class:`bam.Array` brings them to GPU threads, or GPU-side from the start
    (``emu-gpu:``). Made by :func:`bam.open`.

    A context manager: ``with bam.open(...) as s:`` closes it at the end.
    :meth:`close` waits for the transfers in flight and the storage's pending
    futures, then lets the controllers go; any use after it raises :class:`bam.Error` ("... is closed"). Every
    transfer is also a module function taking the storage first
    (``s.read(0, 8)`` is ``bam.read(s, 0, 8)``)."""

    def __init__(self, device_string: str) -> None:
        if not isinstance(device_string, str):
            raise TypeError(f"bam.Storage: device_string must be a str, got {_type_name(device_string)}")
        self._device_string = device_string
        self._handle: Optional[_core._Storage] = None
        self._pending: "set[concurrent.futures.Future[Any]]" = set()
        self._pending_lock = threading.Lock()
        self._handle = _core._Storage(device_string)

    def _h(self) -> _core._Storage:
        h = self._handle
        if h is None:
            raise Error(f"bam: storage '{self._device_string}' is closed")
        return h

    @property
    def device_string(self) -> str:
        """The device string it was opened with."""
        return self._device_string

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._handle is None or self._handle.closed

    @property
    def name(self) -> str:
        """The controllers' names, joined by ``+`` (``emu0``)."""
        return self._h().name

    @property
    def transport(self) -> str:
        """How the controllers are reached and by whom (host threads or GPU threads)."""
        return self._h().transport

    @property
    def gpu_side(self) -> bool:
        """True once the controllers serve GPU threads (``emu-gpu:``, or an Array was made)."""
        return self._h().gpu_side

    @property
    def controller_count(self) -> int:
        """Controllers the device string names (``ssds=``)."""
        return self._h().controller_count

    @property
    def lba_size(self) -> int:
        """Bytes per logical block; load, write and Array offsets are multiples of it."""
        return self._h().lba_size

    @property
    def blocks(self) -> int:
        """Blocks per controller (the smallest namespace)."""
        return self._h().blocks

    @property
    def bytes(self) -> int:
        """``lba_size * blocks * controller_count``."""
        return self._h().bytes

    def close(self) -> None:
        """Wait for the transfers in flight and the futures of
        :meth:`read_async` and :meth:`write_async` still pending, then let the
        controllers go (an ``emu:file`` medium keeps its bytes; an ``emu:ram``
        one loses them). Arrays made over the storage keep its GPU side until
        they go. Closing twice is closing once."""
        h = self._handle
        if h is None:
            return
        with self._pending_lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending)
        h.close()
        self._handle = None

    def _submit(self, fn: Callable[[], Any]) -> "concurrent.futures.Future[Any]":
        f = _executor().submit(fn)
        with self._pending_lock:
            self._pending.add(f)
        f.add_done_callback(self._done)
        return f

    def _done(self, f: "concurrent.futures.Future[Any]") -> None:
        with self._pending_lock:
            self._pending.discard(f)

    def __enter__(self) -> Storage:
        self._h()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        h = self._handle
        if h is None:
            return f"bam.Storage('{self._device_string}', closed)"
        return repr(h)

    # -- transfers (the module functions of the same names call these) --

    @overload
    def read(self, offset: int = 0, nbytes: Optional[int] = None, *, out: None = None) -> npt.NDArray[np.uint8]: ...
    @overload
    def read(self, offset: int = 0, nbytes: Optional[int] = None, *, out: _Buffer) -> _Buffer: ...

    def read(self, offset: int = 0, nbytes: Optional[int] = None, *, out: Any = None) -> Any:
        """``nbytes`` bytes at byte ``offset`` of the device, through the host
        controller (or the software controller's media once GPU-side).

        Without ``out``: a new numpy ``uint8`` array. With ``out`` (a writable
        bytearray, numpy array, memoryview, CPU tensor, or a CUDA array such as
        a CUDA torch tensor, copied by torch): the bytes go into it and ``out``
        is returned; ``nbytes`` defaults to its size."""
        call = "bam.read"
        offset = _count(call, "offset", offset)
        if nbytes is not None:
            nbytes = _count(call, "nbytes", nbytes)
        if out is None:
            if nbytes is None:
                raise TypeError(f"{call}: give nbytes, or out= (a buffer to read into)")
            self._h()._check_read(offset, nbytes)  # before a buffer of that size is made
            buf = np.empty(nbytes, np.uint8)
            self._h()._read(offset, buf)
            return buf
        if _is_cuda(out):
            return self._read_cuda(call, offset, nbytes, out)
        view = _writable_bytes(call, out)
        if nbytes is None:
            nbytes = view.size
        if nbytes > view.size:
            raise ValueError(f"{call}: nbytes {nbytes} do not fit in out's {view.size} bytes")
        self._h()._read(offset, view[:nbytes])
        return out

    def _read_cuda(self, call: str, offset: int, nbytes: Optional[int], out: Any) -> Any:
        torch = _torch_for(call)
        t = _cuda_tensor(call, out)
        if not t.is_contiguous():
            raise ValueError(f"{call}: out must be contiguous")
        flat = t.view(-1).view(torch.uint8)
        if nbytes is None:
            nbytes = flat.numel()
        if nbytes > flat.numel():
            raise ValueError(f"{call}: nbytes {nbytes} do not fit in out's {flat.numel()} bytes")
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self._h()._read(offset, host.numpy())
        flat[:nbytes].copy_(host)
        torch.cuda.current_stream(flat.device).synchronize()
        return out

    def write(self, data: Any, offset: int = 0) -> int:
        """The bytes of ``data`` (any buffer: bytes, bytearray, memoryview, a numpy
        array, a torch tensor) onto the device at byte ``offset`` (a multiple of
        the LBA size); returns the bytes written. As with :meth:`load`, the rest
        of a last block that ``data`` does not fill is written as zeroes."""
        call = "bam.write"
        offset = _count(call, "offset", offset)
        src = _host_bytes(call, "data", data)
        r = self._h()._load_bytes(src, offset, None)
        return int(r["bytes"])

    def load(
        self,
        source: Union[str, "os.PathLike[str]", np.ndarray, Any],
        offset: int = 0,
        *,
        progress: bool = True,
        resume: bool = True,
        state_path: Union[str, "os.PathLike[str]", None] = None,
    ) -> TransferResult:
        """Write ``source`` (a file path, a numpy array, a torch tensor, any
        buffer) onto the device at byte ``offset`` (a multiple of the LBA size),
        through the host controller (``bam::load_dataset``). A load from a file
        is resumable (``resume``): what reached the device is recorded in
        ``state_path``, by default the source's path + ``.bam-load``, or, where
        the source's directory cannot be written (a read-only mount), a file
        under ``$XDG_STATE_HOME/bam`` (``~/.local/state/bam``) named after the
        source. A progress bar is drawn when tqdm is installed and
        ``progress``."""
        call = "bam.load"
        offset = _count(call, "offset", offset)
        update, close = _progress("load", progress)
        try:
            if isinstance(source, (str, os.PathLike)):
                path = os.fspath(source)
                if not isinstance(path, str):
                    path = os.fsdecode(path)
                if os.path.isdir(path):
                    raise IsADirectoryError(
                        errno.EISDIR, f"{call}: the source is a directory; load a file, an array or bytes", path
                    )
                state = _load_state_path(call, path, state_path)
                r = self._h()._load_file(path, offset, bool(resume), update, state)
            else:
                r = self._h()._load_bytes(_host_bytes(call, "source", source), offset, update)
        finally:
            close()
        return TransferResult(**r)

    def dump(
        self,
        path: Union[str, "os.PathLike[str]"],
        offset: int = 0,
        nbytes: Optional[int] = None,
        *,
        progress: bool = True,
    ) -> TransferResult:
        """Write ``nbytes`` bytes at byte ``offset`` of the device into the file
        ``path`` (``bam::dump_dataset``); its checksum equals the load's for the
        same bytes. ``nbytes`` is required (by keyword:
        ``dump(path, nbytes=n)``)."""
        call = "bam.dump"
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{call}: path must be a str or os.PathLike, got {_type_name(path)}")
        offset = _count(call, "offset", offset)
        if nbytes is None:
            raise TypeError(f"{call}: nbytes is required (dump(storage, path, offset=0, nbytes=n))")
        nbytes = _count(call, "nbytes", nbytes)
        p = os.fspath(path)
        if not isinstance(p, str):
            p = os.fsdecode(p)
        if os.path.isdir(p):
            raise IsADirectoryError(errno.EISDIR, f"{call}: the destination is a directory; name a file", p)
        update, close = _progress("dump", progress)
        try:
            r = self._h()._dump(p, offset, nbytes, update)
        finally:
            close()
        return TransferResult(**r)

    @overload
    def read_async(
        self, offset: int = 0, nbytes: Optional[int] = None, *, out: None = None
    ) -> "concurrent.futures.Future[npt.NDArray[np.uint8]]": ...
    @overload
    def read_async(
        self, offset: int = 0, nbytes: Optional[int] = None, *, out: _Buffer
    ) -> "concurrent.futures.Future[_Buffer]": ...

    def read_async(self, offset: int = 0, nbytes: Optional[int] = None, *, out: Any = None) -> Any:
        """:meth:`read` on bam's I/O thread pool (:func:`bam.io_threads`): returns a
        ``concurrent.futures.Future`` of what :meth:`read` returns. The arguments
        are checked now; ``out`` must stay untouched until the future is done."""
        call = "bam.read_async"
        self._h()
        _count(call, "offset", offset)
        if nbytes is not None:
            nbytes = _count(call, "nbytes", nbytes)
        elif out is None:
            raise TypeError(f"{call}: give nbytes, or out= (a buffer to read into)")
        if out is not None:
            # The buffer's kind, place and size, now.
            if _is_cuda(out):
                t = _cuda_tensor(call, out)
                if not t.is_contiguous():
                    raise ValueError(f"{call}: out must be contiguous")
                size = t.numel() * t.element_size()
            else:
                size = _writable_bytes(call, out).size
            if nbytes is not None and nbytes > size:
                raise ValueError(f"{call}: nbytes {nbytes} do not fit in out's {size} bytes")
        return self._submit(lambda: self.read(offset, nbytes, out=out))

    def write_async(self, data: Any, offset: int = 0) -> "concurrent.futures.Future[int]":
        """:meth:`write` on bam's I/O thread pool: returns a ``concurrent.futures.Future``
        of the bytes written. ``data`` must stay unchanged until the future is done."""
        self._h()
        _count("bam.write_async", "offset", offset)
        _host_bytes("bam.write_async", "data", data)
        return self._submit(lambda: self.write(data, offset))


StorageLike = Union[Storage, str]


def open(device_string: str) -> Storage:  # noqa: A001 - bam.open mirrors bam::storage's constructor
    """Open what a device string names (``emu:ram=64M``, ``emu:file=/path,size=8G``,
    ``emu-gpu:ram=1G``, ``/dev/bam-nvme0``) as a :class:`bam.Storage`.
    ``emu-gpu:`` devices need a CUDA GPU. A bad string raises :class:`bam.Error`
    with bam's one-line text.

    GPU reads over an ``emu:`` device are served by host threads that make no
    CUDA call: the GPU threads that wait move the data, so any CUDA module
    loading mode and any stream work."""
    if not isinstance(device_string, str):
        raise TypeError(f"bam.open: device_string must be a str, got {_type_name(device_string)}")
    return Storage(device_string)


def parse_device(device_string: str) -> Dict[str, Any]:
    """Parse a device string without opening anything (raises :class:`bam.Error`)."""
    if not isinstance(device_string, str):
        raise TypeError(f"bam.parse_device: device_string must be a str, got {_type_name(device_string)}")
    return _core.parse_device(device_string)


def gpu_available() -> bool:
    """True when the GPU classes can be used here (built with CUDA, a CUDA GPU present)."""
    return _core.gpu_unavailable_reason() == ""


def _storage(s: Any, call: str = "bam") -> Storage:
    if isinstance(s, Storage):
        return s
    if isinstance(s, str):
        return Storage(s)
    raise TypeError(f"{call}: storage must be a bam.Storage or a device string, got {_type_name(s)}")


class _opened:
    """A storage for one call: a bam.Storage as it is, a device string opened
    for the call and closed after it."""

    def __init__(self, s: Any, call: str) -> None:
        self._own = not isinstance(s, Storage)
        self._s = _storage(s, call)

    def __enter__(self) -> Storage:
        return self._s

    def __exit__(self, *exc: Any) -> None:
        if self._own:
            self._s.close()


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


@overload
def read(
    storage: StorageLike, offset: int = 0, nbytes: Optional[int] = None, *, out: None = None
) -> npt.NDArray[np.uint8]: ...
@overload
def read(storage: StorageLike, offset: int = 0, nbytes: Optional[int] = None, *, out: _Buffer) -> _Buffer: ...


def read(storage: StorageLike, offset: int = 0, nbytes: Optional[int] = None, *, out: Any = None) -> Any:
    """``nbytes`` bytes at byte ``offset`` of ``storage`` (a :class:`bam.Storage`
    or a device string), as a new numpy ``uint8`` array, or into ``out`` (a
    writable host buffer, or a CUDA array) which is returned; see
    :meth:`Storage.read`."""
    with _opened(storage, "bam.read") as s:
        return s.read(offset, nbytes, out=out)


def write(storage: StorageLike, data: Any, offset: int = 0) -> int:
    """The bytes of ``data`` (any buffer, numpy array or torch tensor) onto
    ``storage`` at byte ``offset``; returns the bytes written. See :meth:`Storage.write`."""
    with _opened(storage, "bam.write") as s:
        return s.write(data, offset)


def _legacy_load_order(first: Any, second: Any) -> bool:
    """True for the old ``load(source, storage)`` order: the storage second and
    the source first (data, or a path that names a file or directory)."""
    if isinstance(first, Storage):
        return False
    if not isinstance(second, (Storage, str)):
        return False
    if isinstance(second, Storage) or not isinstance(first, str):
        return True
    return os.path.isfile(first) or os.path.isdir(first)


def load(
    storage: StorageLike,
    source: Union[str, "os.PathLike[str]", np.ndarray, Any],
    offset: int = 0,
    *,
    progress: bool = True,
    resume: bool = True,
    state_path: Union[str, "os.PathLike[str]", None] = None,
) -> TransferResult:
    """Write ``source`` (a file path, a numpy array, a torch tensor, any buffer)
    onto ``storage`` at byte ``offset`` (a multiple of the LBA size); see
    :meth:`Storage.load`. The older order ``load(source, storage)`` still works
    and warns (DeprecationWarning)."""
    if _legacy_load_order(storage, source):
        warnings.warn(
            "bam.load(source, storage) is the old argument order; call bam.load(storage, source)",
            DeprecationWarning,
            stacklevel=2,
        )
        storage, source = source, storage  # type: ignore[assignment]
    with _opened(storage, "bam.load") as s:
        return s.load(source, offset, progress=progress, resume=resume, state_path=state_path)


def dump(
    storage: StorageLike,
    path: Union[str, "os.PathLike[str]"],
    offset: int = 0,
    nbytes: Optional[int] = None,
    *,
    progress: bool = True,
) -> TransferResult:
    """Write ``nbytes`` bytes at byte ``offset`` of ``storage`` into the file
    ``path``; see :meth:`Storage.dump`. ``nbytes`` is required."""
    with _opened(storage, "bam.dump") as s:
        return s.dump(path, offset, nbytes, progress=progress)


def read_async(storage: Storage, offset: int = 0, nbytes: Optional[int] = None, *, out: Any = None) -> Any:
    """:func:`read` on bam's I/O thread pool: a ``concurrent.futures.Future`` of
    what it returns. ``storage`` is a :class:`bam.Storage` (open while the
    future runs); see :meth:`Storage.read_async`."""
    if not isinstance(storage, Storage):
        raise TypeError(f"bam.read_async: storage must be a bam.Storage, got {_type_name(storage)}")
    return storage.read_async(offset, nbytes, out=out)


def write_async(storage: Storage, data: Any, offset: int = 0) -> "concurrent.futures.Future[int]":
    """:func:`write` on bam's I/O thread pool: a ``concurrent.futures.Future`` of
    the bytes written; see :meth:`Storage.write_async`."""
    if not isinstance(storage, Storage):
        raise TypeError(f"bam.write_async: storage must be a bam.Storage, got {_type_name(storage)}")
    return storage.write_async(data, offset)


def _current_stream(device: Any = None) -> int:
    """The caller's CUDA stream (torch's current stream), as an integer."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.current_stream(device).cuda_stream)


def _current_device() -> Any:
    """The current CUDA device, as a torch.device (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.device("cuda", torch.cuda.current_device())


def _require_gpu() -> None:
    why = _core.gpu_unavailable_reason()
    if why:
        raise Error("bam: " + why)


@dataclass(frozen=True)
class CacheGroup:
    """The processes of one host that share one page cache, one process per GPU
    (``torchrun``'s layout): ``name`` is the same in all of them and unique on the
    host while the job runs, ``rank`` is this process's place (0 to ``size`` - 1).
    Building the cache waits up to ``timeout`` seconds for the others.

    Under ``torch.distributed``, :meth:`from_torch` makes one from the job itself."""

    name: str
    rank: int
    size: int
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("bam.CacheGroup: name must be a non-empty string")
        rank = _count("bam.CacheGroup", "rank", self.rank)
        size = _count("bam.CacheGroup", "size", self.size)
        if size == 0 or rank >= size:
            raise ValueError(f"bam.CacheGroup: rank {rank} is not one of 0..{size - 1} (size {size})")
        if not self.timeout > 0:
            raise ValueError(f"bam.CacheGroup: timeout {self.timeout} must be positive (seconds)")

    @staticmethod
    def from_torch(timeout: float = 120.0) -> "CacheGroup":
        """The processes of this host in the running ``torch.distributed`` job: rank and
        size from ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (set by ``torchrun``), a name
        drawn by global rank 0 and broadcast to every process (a collective: every
        process of the job calls it)."""
        try:
            import torch.distributed as dist
        except ImportError:
            raise Error("bam.CacheGroup.from_torch needs torch (pip install torch)") from None
        if not dist.is_available() or not dist.is_initialized():
            raise Error("bam.CacheGroup.from_torch: call torch.distributed.init_process_group first")
        missing = [v for v in ("LOCAL_RANK", "LOCAL_WORLD_SIZE") if v not in os.environ]
        if missing:
            raise Error(
                "bam.CacheGroup.from_torch: " + " and ".join(missing) + " not set (start the job with torchrun, "
                "or build bam.CacheGroup(name, rank, size) yourself)"
            )
        import secrets

        token = [secrets.token_hex(8) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(token, src=0)
        return CacheGroup(
            "torch-" + str(token[0]), int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]), timeout
        )


class PageCache:
    """A page cache in GPU memory (``bam::page_cache``): ``capacity`` bytes of pages of
    ``page_size`` bytes (a power of two, 512 to 65536), ``ways`` slots per set.
    Without a CUDA GPU it raises :class:`bam.Error` ("no CUDA GPU").

    With ``group`` (a :class:`CacheGroup`), the processes of the group build one cache
    together: each brings ``capacity`` bytes of its own GPU's memory, a page is held once
    for all of them, and arrays over a shared medium (``emu-gpu:shm=NAME``, a file,
    SSDs) share their pages. Every process of the group must build it, with the same
    arguments."""

    def __init__(
        self, page_size: int = 4096, capacity: int = 256 << 20, ways: int = 8, group: Optional[CacheGroup] = None
    ) -> None:
        page_size = _count("bam.PageCache", "page_size", page_size)
        capacity = _count("bam.PageCache", "capacity", capacity)
        ways = _count("bam.PageCache", "ways", ways)
        if ways == 0:
            raise ValueError("bam.PageCache: ways must be at least 1")
        if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
            raise ValueError(f"bam.PageCache: page_size {page_size} must be a power of two in [512, 65536]")
        if capacity < page_size * ways:
            raise ValueError(
                f"bam.PageCache: capacity {capacity} holds no set of {ways} pages of {page_size} bytes"
            )
        if group is not None and not isinstance(group, CacheGroup):
            raise TypeError(f"bam.PageCache: group must be a bam.CacheGroup, got {_type_name(group)}")
        _require_gpu()
        if group is None:
            self._cache = _core._PageCache(page_size, capacity, ways)
        else:
            self._cache = _core._PageCache(
                page_size, capacity * group.size, ways, group.name, group.rank, group.size, int(group.timeout * 1000)
            )
        self._group = group
        self._page_size = page_size
        self._capacity = capacity
        self._ways = ways
        self._device = _current_device()

    @property
    def page_size(self) -> int:
        """Bytes per page."""
        return self._page_size

    @property
    def capacity(self) -> int:
        """Bytes of GPU memory the pages take (in a group: on this process's GPU)."""
        return self._capacity

    @property
    def group(self) -> Optional[CacheGroup]:
        """The processes sharing the cache, or None."""
        return self._group

    @property
    def ways(self) -> int:
        """Slots per set."""
        return self._ways

    @property
    def slots(self) -> int:
        """Pages the cache holds (in a group: the whole group's)."""
        return int(self._cache.slot_count)

    @property
    def device(self) -> Any:
        """The CUDA device the cache is on (a ``torch.device`` where torch is installed)."""
        return self._device

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
            raise TypeError(f"bam.Array: dtype {dtype!r} is not a numpy or torch dtype") from e
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


_INDEX_KINDS = "an int, a slice, a list of ints, or a 1-D int32/int64 numpy array or torch tensor"


def _host_row_ids(idx: Any, rows: int) -> Optional[np.ndarray]:
    """Row ids known on the host (an int, a slice, a list, a numpy array, a CPU
    tensor) as a 1-D int64 numpy array, negative ids counted from the end and
    every id checked against ``rows``; None for a CUDA tensor (its ids are
    checked by the GPU). Raises TypeError, ValueError or RowIndexError."""
    if isinstance(idx, bool):
        raise TypeError(f"bam.Array: the index must be {_INDEX_KINDS}, got bool")
    if isinstance(idx, (int, np.integer)):
        i = int(idx)
        if not -rows <= i < rows:
            raise RowIndexError(f"bam.Array: row {i} is outside [0, {rows})")
        return np.array([i % rows], dtype=np.int64)
    if isinstance(idx, slice):
        return np.arange(*idx.indices(rows), dtype=np.int64)
    if type(idx).__module__.startswith("torch"):
        import torch

        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"bam.Array: the index must be int32 or int64, got {idx.dtype}")
        if idx.dim() != 1:
            raise ValueError(f"bam.Array: the index must be 1-D, got shape {tuple(idx.shape)}")
        if idx.device.type == "cuda":
            return None
        if idx.device.type != "cpu":
            raise TypeError(f"bam.Array: the index must be on the CPU or a CUDA device, got one on {idx.device}")
        idx = idx.numpy()
    if isinstance(idx, (list, tuple)):
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in idx):
            raise TypeError(f"bam.Array: the index must be {_INDEX_KINDS}; a list holds ints only")
        ids = np.array(idx, dtype=np.int64).reshape(-1)
    elif isinstance(idx, np.ndarray):
        if idx.dtype not in (np.int32, np.int64):
            raise TypeError(f"bam.Array: the index must be int32 or int64, got a numpy array of {idx.dtype}")
        if idx.ndim != 1:
            raise ValueError(f"bam.Array: the index must be 1-D, got shape {idx.shape}")
        ids = idx.astype(np.int64)
    else:
        raise TypeError(f"bam.Array: the index must be {_INDEX_KINDS}, got {_type_name(idx)}")
    bad = (ids < -rows) | (ids >= rows)
    if bad.any():
        raise RowIndexError(f"bam.Array: row {int(ids[bad][0])} is outside [0, {rows})")
    return np.where(ids < 0, ids + rows, ids)


def _check_index(idx: Any, rows: int, device: Any = None) -> Any:
    """``idx`` as a 1-D contiguous CUDA int64 tensor on ``device`` (a CUDA
    tensor stays where it is), or raise before any GPU work."""
    ids = _host_row_ids(idx, rows)
    import torch

    if ids is None:
        return idx.to(torch.int64).contiguous()
    return torch.from_numpy(ids).to(device if device is not None else "cuda")


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

    ``arr[idx]`` gathers rows into a new CUDA tensor (``bam::gather_rows``);
    ``idx`` is an int (one row), a slice, a list of ints, or a 1-D int32/int64
    numpy array or torch tensor (CPU or CUDA). Negative ids count from the end
    except in a CUDA tensor, whose ids the GPU checks. ``arr[idx] = values``
    (a CUDA tensor of the array's dtype) writes rows through the cache,
    ``flush()`` writes dirty pages back. Both run on torch's current CUDA
    stream and wait for it; a row id outside [0, rows) raises
    :class:`bam.RowIndexError`. Argument checks (dtype, shape, device, offset,
    size, index) happen before any GPU work."""

    def __init__(
        self,
        cache: PageCache,
        storage: StorageLike,
        shape: Union[int, Sequence[int]],
        dtype: Any = "float32",
        offset: int = 0,
    ) -> None:
        s = _storage(storage, "bam.Array")
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape_t: Tuple[Any, ...] = (shape,)
        elif isinstance(shape, (tuple, list)) or type(shape).__name__ == "Size":
            shape_t = tuple(shape)  # type: ignore[arg-type]
        else:
            raise TypeError(f"bam.Array: shape must be an int or a tuple of ints, got {_type_name(shape)}")
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise TypeError(f"bam.Array: offset must be an int, got {_type_name(offset)}")
        offset = int(offset)
        self.dtype_name, self.element_size, torch_dtype = _dtype_of(dtype)
        elements, self.row_width, start_lba = _check_layout(s, shape_t, self.element_size, offset)
        if not isinstance(cache, PageCache):
            raise TypeError(f"bam.Array: cache must be a bam.PageCache, got {_type_name(cache)}")
        self._shape = tuple(int(d) for d in shape_t)
        self.offset = offset
        self.storage = s
        self.cache = cache
        self._torch_dtype = torch_dtype if torch_dtype is not None else _torch_dtype(self.dtype_name)
        self._array = _core._Array(cache._cache, s._h(), elements, self.element_size, start_lba, _current_stream())

    @property
    def shape(self) -> Tuple[int, ...]:
        """Rows first, then the shape of a row."""
        return self._shape

    @property
    def dtype(self) -> Any:
        """The element type: the torch dtype that gathers return (the numpy
        dtype where torch is not installed)."""
        return self._torch_dtype if self._torch_dtype is not None else np.dtype(self.dtype_name)

    @property
    def device(self) -> Any:
        """The CUDA device of the page cache, where gathered rows land (a ``torch.device``)."""
        return self.cache.device

    @property
    def nbytes(self) -> int:
        """Bytes the array spans on the storage."""
        return self.rows * self.row_width * self.element_size

    @property
    def rows(self) -> int:
        """``shape[0]``; also ``len(arr)``."""
        return self._shape[0]

    def __len__(self) -> int:
        return self.rows

    def _ids(self, idx: Any) -> Any:
        return _check_index(idx, self.rows, self.device)

    def __getitem__(self, idx: Any) -> Any:
        """Rows ``idx`` (see the class) as a new CUDA tensor of shape
        ``(len(ids),) + shape[1:]``; an int gives one row of shape ``shape[1:]``."""
        import torch

        scalar = isinstance(idx, (int, np.integer))
        ids = self._ids(idx)
        out = torch.empty((ids.shape[0],) + self.shape[1:], dtype=self._torch_dtype, device=ids.device)
        if ids.shape[0]:
            self._array.gather(ids, out, self.row_width, self.element_size, _current_stream(ids.device))
        return out[0] if scalar else out

    def __setitem__(self, idx: Any, values: Any) -> None:
        """Write ``values`` (a CUDA tensor of shape ``(len(ids),) + shape[1:]``) to rows ``idx``."""
        ids = self._ids(idx)
        if isinstance(idx, (int, np.integer)) and type(values).__module__.startswith("torch"):
            values = values.reshape((1,) + self.shape[1:])
        rows = _check_values(values, self._torch_dtype, self.shape[1:], ids.shape[0], ids.device)
        if ids.shape[0]:
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
