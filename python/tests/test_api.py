# SPDX-License-Identifier: MIT
"""The public calls' conventions, without a GPU: one argument order, buffers
of the caller's, futures, closing, and errors that name public things."""

import array
import concurrent.futures
import errno
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import bam

# ---- a directory is no data set ----------------------------------------------


def test_load_of_a_directory_says_so(image, tmp_path):
    d = tmp_path / "features"
    d.mkdir()
    s = bam.open(image)
    with pytest.raises(IsADirectoryError) as e:
        bam.load(s, str(d), progress=False)
    assert e.value.errno == errno.EISDIR
    assert "directory" in str(e.value) and "do not fit" not in str(e.value)
    with pytest.raises(IsADirectoryError):
        bam.load(s, d, progress=False)  # a pathlib.Path too


def test_extension_refuses_a_directory_too(image, tmp_path):
    """Below the Python check, the extension says what is wrong, not a size."""
    s = bam.open(image)
    with pytest.raises(bam.Error, match="is a directory") as e:
        s._h()._load_file(str(tmp_path), 0, True, None)
    assert "do not fit" not in str(e.value)


def test_dump_into_a_directory_says_so(image, tmp_path):
    s = bam.open(image)
    with pytest.raises(IsADirectoryError):
        bam.dump(s, tmp_path, nbytes=512, progress=False)


# ---- close, context manager, __all__ ------------------------------------------


def test_storage_closes_and_is_a_context_manager(image):
    with bam.open(image) as s:
        assert isinstance(s, bam.Storage) and not s.closed
        bam.write(s, b"kept in the file", 0)
    assert s.closed
    assert "closed" in repr(s)
    s.close()  # twice is once
    for use in (
        lambda: s.read(0, 8),
        lambda: bam.read(s, 0, 8),
        lambda: bam.write(s, b"x"),
        lambda: bam.load(s, np.zeros(8, np.uint8), progress=False),
        lambda: s.lba_size,
        lambda: s.bytes,
        lambda: s.read_async(0, 8),
    ):
        with pytest.raises(bam.Error, match=r"storage '.*' is closed"):
            use()
    with pytest.raises(bam.Error, match="is closed"):
        with s:
            pass
    assert s.device_string == image
    # The file's controller went: a new one over the same file reads the bytes.
    assert bam.read(image, 0, 16).tobytes() == b"kept in the file"


def test_close_releases_the_medium(tmp_path):
    """After close the file is no longer held open by the storage."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    path = tmp_path / "held.img"
    s = bam.open(f"emu:file={path},size=1M,timeout=60s")

    def held():
        return any(os.path.realpath(f"/proc/self/fd/{fd}") == str(path) for fd in os.listdir("/proc/self/fd"))

    assert held()
    s.close()
    assert not held()


def test_close_waits_for_a_transfer_in_flight(tmp_path):
    s = bam.open(f"emu:file={tmp_path / 'd.img'},size=32M,timeout=60s")
    data = np.random.default_rng(3).integers(0, 256, size=24 << 20, dtype=np.uint8)
    f = s.write_async(data, 0)
    s.close()
    assert f.result(timeout=60) == data.size
    np.testing.assert_array_equal(bam.read(f"emu:file={tmp_path / 'd.img'},size=32M", 0, data.size), data)


def test_star_import_keeps_the_builtin_open():
    code = (
        "import builtins\n"
        "from bam import *\n"
        "assert open is builtins.open\n"
        "assert Storage and Array and read and write and load and dump\n"
        "import bam\n"
        "assert bam.open('emu:ram=1M').bytes == 1 << 20\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "open" not in bam.__all__
    assert all(hasattr(bam, n) for n in bam.__all__)


# ---- errors name public types -----------------------------------------------


def _bad_calls(s):
    return [
        lambda: bam.open(12),
        lambda: bam.Storage(None),
        lambda: bam.parse_device(5),
        lambda: bam.read(3, 0, 10),
        lambda: bam.read(s, "0", 10),
        lambda: bam.read(s, 0, 10.5),
        lambda: bam.read(s, 0, out=12),
        lambda: bam.read(s, 0, out="text"),
        lambda: bam.write(s, 12),
        lambda: bam.write(s, b"x", offset="0"),
        lambda: bam.load(s, 12),
        lambda: bam.load(s, b"x", offset=None),
        lambda: bam.dump(s, 12, nbytes=512),
        lambda: bam.dump(s, "/tmp/x", nbytes="512"),
        lambda: bam.read_async("emu:ram=1M", 0, 8),
        lambda: s.read(True, 8),
        lambda: bam.PageCache(page_size="4k"),
        lambda: bam.PageCache(group=("job", 0, 2)),
        lambda: bam.CacheGroup("job", "0", 2),
        lambda: bam.Array(None, 5, (10, 4)),
        lambda: bam.Array(None, s, "10"),
        lambda: bam.Array(None, s, (10, 4), offset="0"),
    ]


def test_bad_arguments_raise_type_errors_naming_public_types(image):
    s = bam.open(image)
    for i, call in enumerate(_bad_calls(s)):
        with pytest.raises(TypeError) as e:
            call()
        msg = str(e.value)
        assert "_core" not in msg and "incompatible function arguments" not in msg, (i, msg)
        assert msg.startswith("bam."), (i, msg)
    with pytest.raises(TypeError, match=r"bam\.read: storage must be a bam\.Storage or a device string, got int"):
        bam.read(3, 0, 10)


def test_cache_groups_check_their_place_and_say_what_is_wrong():
    g = bam.CacheGroup("job-7", 1, 4, timeout=5.0)
    assert (g.name, g.rank, g.size, g.timeout) == ("job-7", 1, 4, 5.0)
    for bad, what in [
        (lambda: bam.CacheGroup("", 0, 2), "non-empty"),
        (lambda: bam.CacheGroup("job", 2, 2), "rank 2 is not one of 0..1"),
        (lambda: bam.CacheGroup("job", 0, 0), "rank 0 is not one of"),
        (lambda: bam.CacheGroup("job", -1, 2), "negative"),
        (lambda: bam.CacheGroup("job", 0, 2, timeout=0), "timeout 0 must be positive"),
    ]:
        with pytest.raises(ValueError, match=what):
            bad()


def test_a_cache_group_from_torch_needs_a_running_job():
    torch = pytest.importorskip("torch")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group is already running here")
    with pytest.raises(bam.Error, match="init_process_group first"):
        bam.CacheGroup.from_torch()


def test_public_classes_are_the_packages_own():
    assert bam.Storage.__module__ == "bam"
    assert type(bam.open("emu:ram=1M")) is bam.Storage
    assert not hasattr(bam._core, "Storage")


# ---- one argument order: storage, what moves, offset, nbytes -------------------


def test_one_argument_order(image, tmp_path):
    s = bam.open(image)
    a = np.arange(3000, dtype=np.int32)
    r = bam.load(s, a, 4096, progress=False)
    assert r.bytes == a.nbytes
    np.testing.assert_array_equal(bam.read(s, 4096, a.nbytes).view(np.int32), a)
    np.testing.assert_array_equal(bam.read(s, offset=4096, nbytes=a.nbytes).view(np.int32), a)
    assert bam.write(s, a[::-1].copy(), 65536) == a.nbytes
    np.testing.assert_array_equal(s.read(65536, a.nbytes).view(np.int32), a[::-1])
    d = bam.dump(s, tmp_path / "out.bin", 4096, a.nbytes, progress=False)
    assert d.checksum == r.checksum
    d = s.dump(tmp_path / "out2.bin", offset=4096, nbytes=a.nbytes, progress=False)
    assert (tmp_path / "out2.bin").read_bytes() == a.tobytes()
    # The methods are the functions with the storage first.
    assert s.load(a, 0, progress=False).checksum == r.checksum


def test_the_old_load_order_still_works_and_warns(image, tmp_path):
    s = bam.open(image)
    a = np.arange(100, dtype=np.int64)
    with pytest.warns(DeprecationWarning, match=r"bam\.load\(storage, source\)"):
        bam.load(a, s, offset=512, progress=False)
    np.testing.assert_array_equal(bam.read(s, 512, a.nbytes).view(np.int64), a)
    s.close()
    src = tmp_path / "f.bin"
    (a + 1).tofile(src)
    with pytest.warns(DeprecationWarning):
        bam.load(str(src), image, progress=False)  # two strings: the file is the source
    np.testing.assert_array_equal(bam.read(image, 0, a.nbytes).view(np.int64), a + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bam.load(image, str(src), progress=False)  # the new order does not warn


def test_dump_needs_nbytes_by_name_or_place(image, tmp_path):
    s = bam.open(image)
    with pytest.raises(TypeError, match="nbytes is required"):
        bam.dump(s, tmp_path / "x.bin", 512)  # the old (path, nbytes) form must not dump from 512 on


# ---- reads into a caller's buffer ---------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda n: bytearray(n),
        lambda n: np.zeros(n // 4, np.float32),
        lambda n: memoryview(bytearray(n)),
        lambda n: array.array("d", bytes(n)),
        lambda n: np.zeros((n // 64, 8), np.int64),
    ],
    ids=["bytearray", "numpy", "memoryview", "array.array", "numpy-2d"],
)
def test_read_into_a_buffer(image, make):
    s = bam.open(image)
    data = np.random.default_rng(4).integers(0, 256, size=8192, dtype=np.uint8)
    bam.write(s, data, 1024)
    out = make(8192)
    got = bam.read(s, 1024, out=out)
    assert got is out
    assert bytes(memoryview(out).cast("B")) == data.tobytes()
    # A shorter read fills the front only.
    out2 = make(8192)
    s.read(1024 + 100, 1000, out=out2)
    assert bytes(memoryview(out2).cast("B"))[:1000] == data[100:1100].tobytes()
    assert bytes(memoryview(out2).cast("B"))[1000:] == bytes(8192 - 1000)


def test_read_into_a_cpu_tensor(image):
    torch = pytest.importorskip("torch")
    s = bam.open(image)
    t = torch.arange(1000, dtype=torch.float64)
    bam.write(s, t)
    out = torch.zeros(1000, dtype=torch.float64)
    assert bam.read(s, 0, out=out) is out
    assert torch.equal(out, t)


def test_read_into_bad_buffers(image):
    s = bam.open(image)
    with pytest.raises(ValueError, match="read-only"):
        bam.read(s, 0, out=b"immutable")
    with pytest.raises(ValueError, match="read-only"):
        a = np.zeros(10, np.uint8)
        a.flags.writeable = False
        bam.read(s, 0, out=a)
    with pytest.raises(ValueError, match="C-contiguous"):
        bam.read(s, 0, out=np.zeros((10, 10), np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="do not fit"):
        bam.read(s, 0, 100, out=bytearray(10))
    with pytest.raises(TypeError, match="give nbytes, or out="):
        bam.read(s, 0)


def test_huge_offsets_and_sizes_are_refused_before_any_buffer(image):
    s = bam.open(image)
    # Past 64 bits: the public call's ValueError, not a binding's TypeError.
    with pytest.raises(ValueError, match=r"bam.read: offset 18446744073709551616 is past 2\^64 - 1"):
        bam.read(s, 2**64, 8)
    with pytest.raises(ValueError, match=r"bam.read: nbytes .* is past 2\^64 - 1"):
        bam.read(s, 0, 2**70)
    # 4 EiB: refused by the range check, before numpy is asked for that much memory.
    with pytest.raises(bam.Error, match="do not fit"):
        bam.read(s, 0, 2**62)


def test_read_into_a_bfloat16_tensor(image):
    torch = pytest.importorskip("torch")
    s = bam.open(image)
    t = torch.arange(1024, dtype=torch.bfloat16)
    bam.write(s, t, 0)
    out = torch.zeros(1024, dtype=torch.bfloat16)
    assert bam.read(s, 0, out=out) is out
    assert torch.equal(out, t)


# ---- futures -----------------------------------------------------------------


def test_async_reads_and_writes_return_futures(image):
    s = bam.open(image)
    chunks = [np.full(4096, i, np.uint8) for i in range(16)]
    writes = [bam.write_async(s, c, i * 4096) for i, c in enumerate(chunks)]
    assert all(isinstance(f, concurrent.futures.Future) for f in writes)
    assert [f.result(timeout=60) for f in writes] == [4096] * 16
    reads = [s.read_async(i * 4096, 4096) for i in range(16)]
    for i, f in enumerate(reads):
        np.testing.assert_array_equal(f.result(timeout=60), chunks[i])
    out = bytearray(4096)
    f = bam.read_async(s, 5 * 4096, out=out)
    assert f.result(timeout=60) is out and out == bytes([5]) * 4096
    assert 1 <= bam.io_threads()


def test_async_errors_arrive_through_the_future(image):
    s = bam.open(image)
    f = s.read_async(s.bytes - 10, 11)
    with pytest.raises(bam.Error, match="do not fit"):
        f.result(timeout=60)
    with pytest.raises(TypeError, match="offset must be an int"):
        s.read_async("0", 8)  # checked when called, not in the future
    # So is out: its kind, whether it can be written, and its size.
    with pytest.raises(ValueError, match="bam.read_async: out .*read-only"):
        s.read_async(0, out=b"immutable")
    with pytest.raises(TypeError, match="bam.read_async: out must be a writable buffer"):
        s.read_async(0, 8, out=object())
    with pytest.raises(ValueError, match="bam.read_async: nbytes 100 do not fit in out's 10 bytes"):
        s.read_async(0, 100, out=bytearray(10))


def test_io_threads_setting(monkeypatch):
    monkeypatch.setenv("BAM_PYTHON_IO_THREADS", "2")
    assert bam.io_threads() == 2
    monkeypatch.setenv("BAM_PYTHON_IO_THREADS", "none")
    with pytest.raises(ValueError, match="BAM_PYTHON_IO_THREADS"):
        bam.io_threads()


# ---- Array row ids, checked on the host ---------------------------------------


def test_row_ids_from_ints_slices_lists_and_numpy():
    ids = bam._host_row_ids
    np.testing.assert_array_equal(ids(3, 10), [3])
    np.testing.assert_array_equal(ids(-1, 10), [9])
    np.testing.assert_array_equal(ids(slice(2, 8, 3), 10), [2, 5])
    np.testing.assert_array_equal(ids(slice(None), 4), [0, 1, 2, 3])
    np.testing.assert_array_equal(ids([1, -2, 0], 10), [1, 8, 0])
    np.testing.assert_array_equal(ids(np.array([7, 0], np.int32), 10), [7, 0])
    np.testing.assert_array_equal(ids(np.array([7, -10], np.int64), 10), [7, 0])
    assert ids([], 10).dtype == np.int64
    with pytest.raises(bam.RowIndexError, match=r"row 10 is outside \[0, 10\)"):
        ids([1, 10], 10)
    with pytest.raises(bam.RowIndexError):
        ids(np.array([-11], np.int32), 10)
    with pytest.raises(TypeError, match="int32 or int64"):
        ids(np.array([1.0, 2.0]), 10)
    with pytest.raises(TypeError, match="int32 or int64"):
        ids(np.array([1, 2], np.uint8), 10)
    with pytest.raises(ValueError, match="1-D"):
        ids(np.zeros((2, 2), np.int64), 10)
    with pytest.raises(TypeError, match="ints only"):
        ids([1, 2.5], 10)
    with pytest.raises(TypeError, match="got bool"):
        ids(True, 10)


def test_row_ids_from_torch_tensors():
    torch = pytest.importorskip("torch")
    ids = bam._host_row_ids
    np.testing.assert_array_equal(ids(torch.tensor([4, -1], dtype=torch.int32), 5), [4, 4])
    np.testing.assert_array_equal(ids(torch.tensor([0, 2]), 5), [0, 2])
    with pytest.raises(TypeError, match="int32 or int64"):
        ids(torch.tensor([0.5]), 5)


# ---- help() shows what each public thing is -----------------------------------


def test_public_names_and_properties_have_docstrings():
    for name in bam.__all__:
        obj = getattr(bam, name)
        if name in ("StorageLike",):
            continue
        assert (obj.__doc__ or "").strip(), name
    for cls in (bam.Storage, bam.Array, bam.PageCache):
        for attr, value in vars(cls).items():
            if attr.startswith("_"):
                continue
            assert (value.__doc__ or "").strip(), f"{cls.__name__}.{attr}"


def test_write_takes_any_buffer(image):
    s = bam.open(image)
    a = np.arange(64, dtype=np.int32).reshape(8, 8)
    for data, want in [
        (memoryview(a), a.tobytes()),  # 2-D, format 'i'
        (memoryview(a)[::2], a[::2].tobytes()),  # not contiguous: its elements in order
        (array.array("h", range(100)), array.array("h", range(100)).tobytes()),
        (bytes(range(256)), bytes(range(256))),
        (np.asfortranarray(a), np.asfortranarray(a).tobytes(order="C")),
    ]:
        assert bam.write(s, data, 512) == len(want)
        assert bam.read(s, 512, len(want)).tobytes() == want
    assert bam.write(s, b"") == 0
