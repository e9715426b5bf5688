# SPDX-License-Identifier: MIT
"""The package without a GPU: device strings, loads and reads through the
host controller, and the argument checks that come before any GPU work."""

import ast
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import bam


def test_version_matches_distribution():
    assert bam.__version__ == importlib.metadata.version("bam-nvme")


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("emu:bogus=1", "unknown option 'bogus'"),
        ("nvme:ram=1G", "unknown transport 'nvme'"),
        ("emu:ram=0", "size is zero"),
        ("emu:hbm=1G", "needs the GPU engine"),
        ("emu:ram=1G,lba=1000", "power of two"),
        ("emu-gpu:ram=1G,ro", "applies to file media"),
    ],
)
def test_bad_device_strings_raise_bam_error(text, why):
    with pytest.raises(bam.Error) as e:
        bam.open(text)
    assert isinstance(e.value, RuntimeError)
    msg = str(e.value)
    assert msg.startswith(f"bam: device string '{text}': ")
    assert why in msg
    assert "\n" not in msg
    with pytest.raises(bam.Error, match=why):
        bam.parse_device(text)


def test_parse_device():
    d = bam.parse_device("emu-gpu:ram=1G,ssds=2,lba=4096")
    assert d["kind"] == "emu-gpu" and d["bytes"] == 1 << 30 and d["ssds"] == 2 and d["lba_size"] == 4096


def test_open_file_storage(image):
    s = bam.open(image)
    assert (s.controller_count, s.lba_size, s.blocks) == (1, 512, 32768)
    assert s.bytes == 16 << 20
    assert not s.gpu_side
    assert "emu:file=" in repr(s)


def test_open_missing_file_raises(tmp_path):
    with pytest.raises(bam.Error, match="errno 2"):
        bam.open(f"emu:file={tmp_path / 'absent' / 'x.img'}")


@pytest.mark.skipif(bam.gpu_available(), reason="a CUDA GPU is present")
def test_gpu_devices_and_caches_need_a_gpu():
    with pytest.raises(bam.Error, match="no CUDA GPU"):
        bam.open("emu-gpu:ram=64M")
    with pytest.raises(bam.Error, match="no CUDA GPU"):
        bam.PageCache(page_size=4096, capacity=1 << 20)


@pytest.mark.parametrize("offset", [0, 512, 1 << 20])
def test_load_numpy_and_read_back(image, offset):
    rng = np.random.default_rng(offset)
    a = rng.standard_normal((1000, 37)).astype(np.float32)
    s = bam.open(image)
    r = bam.load(s, a, offset=offset, progress=False)
    assert r.bytes == a.nbytes and r.checksum.startswith("xxh128:")
    back = bam.read(s, offset, a.nbytes)
    assert back.dtype == np.uint8 and back.shape == (a.nbytes,)
    np.testing.assert_array_equal(back.view(np.float32).reshape(a.shape), a)
    # The bytes are in the file: a new controller over it reads them too.
    del s
    again = bam.read(image, offset, a.nbytes)
    np.testing.assert_array_equal(again.view(np.float32).reshape(a.shape), a)


def test_load_noncontiguous_and_bytes(image):
    s = bam.open(image)
    a = np.arange(4096, dtype=np.int64).reshape(64, 64)[:, ::2]
    bam.load(s, a, progress=False)
    np.testing.assert_array_equal(bam.read(s, 0, a.nbytes).view(np.int64).reshape(a.shape), a)
    bam.load(s, b"hello bam", offset=4096, progress=False)
    assert bam.read(s, 4096, 9).tobytes() == b"hello bam"


def test_load_file_then_dump(image, tmp_path):
    src = tmp_path / "features.bin"
    data = np.random.default_rng(1).integers(0, 256, size=3 * 1024 * 1024 + 123, dtype=np.uint8)
    data.tofile(src)
    s = bam.open(image)
    r = bam.load(s, src, offset=8192, progress=True)
    assert r.bytes == data.size
    assert not os.path.exists(str(src) + ".bam-load"), "the resume state is removed after a complete load"
    np.testing.assert_array_equal(bam.read(s, 8192, data.size), data)
    out = tmp_path / "copy.bin"
    d = bam.dump(s, out, 8192, data.size, progress=False)
    assert d.checksum == r.checksum
    assert out.read_bytes() == data.tobytes()
    # The same bytes from memory give the same checksum.
    assert bam.load(s, data, offset=8192, progress=False).checksum == r.checksum


def test_load_with_a_device_string(image):
    a = np.arange(10000, dtype=np.uint16)
    bam.load(image, a, progress=False)
    np.testing.assert_array_equal(bam.read(image, 0, a.nbytes).view(np.uint16), a)


def test_ram_storage_keeps_its_bytes():
    s = bam.open("emu:ram=4M")
    a = np.linspace(0, 1, 5000)
    bam.load(s, a, offset=2048, progress=False)
    np.testing.assert_array_equal(bam.read(s, 2048, a.nbytes).view(np.float64), a)


def test_unaligned_read(image):
    s = bam.open(image)
    a = np.arange(100000, dtype=np.uint8)
    bam.load(s, a, progress=False)
    np.testing.assert_array_equal(bam.read(s, 777, 50000), a[777:50777])


def test_load_errors(image):
    s = bam.open(image)
    with pytest.raises(bam.Error, match="LBA size"):
        bam.load(s, np.zeros(10, np.uint8), offset=100, progress=False)
    with pytest.raises(bam.Error, match="do not fit"):
        bam.load(s, np.zeros(4096, np.uint8), offset=s.bytes - 512, progress=False)
    with pytest.raises(bam.Error, match="do not fit"):
        bam.read(s, s.bytes - 10, 11)
    with pytest.raises(TypeError, match="source must be"):
        bam.load(s, 12)
    with pytest.raises(TypeError, match="Python objects"):
        bam.load(s, np.array([object()]))
    with pytest.raises(bam.Error, match="errno 2"):
        bam.load(s, "/nonexistent/features.bin")


def test_striped_storage_refuses_host_transfers(tmp_path):
    s = bam.open(f"emu:file={tmp_path / 'd.img'},size=1M,ssds=2,timeout=60s")
    assert s.controller_count == 2
    with pytest.raises(bam.Error, match="one controller"):
        bam.load(s, np.zeros(512, np.uint8), progress=False)


def test_load_torch_cpu_tensor(image):
    torch = pytest.importorskip("torch")
    t = torch.arange(3000, dtype=torch.bfloat16)
    s = bam.open(image)
    bam.load(s, t, progress=False)
    back = torch.from_numpy(bam.read(s, 0, t.numel() * 2).copy()).view(torch.bfloat16)
    assert torch.equal(back, t)


# ---- checks that fail before any GPU work -----------------------------------


@pytest.mark.parametrize(
    "dtype, exc, match",
    [
        (object, TypeError, "not a plain numeric type"),
        ("U3", TypeError, "not a plain numeric type"),
        (np.complex128, TypeError, "1, 2, 4 or 8-byte"),
        ("not-a-dtype", TypeError, "dtype"),
    ],
)
def test_array_dtype_checks_come_first(image, dtype, exc, match):
    s = bam.open(image)
    with pytest.raises(exc, match=match):
        bam.Array(None, s, (10, 4), dtype)
    assert not s.gpu_side


@pytest.mark.parametrize(
    "shape, offset, match",
    [
        ((0, 4), 0, "positive"),
        ((10, -1), 0, "positive"),
        ((), 0, "at least one dimension"),
        ((10, 4), 100, "multiple of the LBA size"),
        ((10, 4), -512, "multiple of the LBA size"),
        ((4 << 20, 2), 0, "do not fit"),
        ((1024,), (16 << 20) - 512, "do not fit"),
    ],
)
def test_array_shape_checks_come_first(image, shape, offset, match):
    s = bam.open(image)
    with pytest.raises(ValueError, match=match):
        bam.Array(None, s, shape, "float32", offset)
    assert not s.gpu_side


def test_array_needs_a_page_cache(image):
    s = bam.open(image)
    with pytest.raises(TypeError, match="bam.PageCache"):
        bam.Array(object(), s, (10, 4), "float32")
    assert not s.gpu_side


@pytest.mark.parametrize("page_size, capacity", [(1000, 1 << 20), (256, 1 << 20), (1 << 17, 1 << 30), (4096, 4096)])
def test_page_cache_checks_come_first(page_size, capacity):
    with pytest.raises(ValueError):
        bam.PageCache(page_size=page_size, capacity=capacity)


def test_index_checks_come_first():
    with pytest.raises(TypeError, match="the index must be an int, a slice"):
        bam._host_row_ids({1, 2}, 10)
    with pytest.raises(bam.RowIndexError, match=r"row 10 is outside \[0, 10\)"):
        bam._host_row_ids(10, 10)
    with pytest.raises(IndexError):
        bam._host_row_ids(-11, 10)
    with pytest.raises(TypeError, match="CUDA torch tensor"):
        bam._check_values(np.zeros((2, 4), np.float32), None, (4,), 2, None)


def test_index_checks_on_cpu_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="int32 or int64"):
        bam._host_row_ids(torch.arange(3, dtype=torch.int16), 10)
    with pytest.raises(ValueError, match="1-D"):
        bam._host_row_ids(torch.zeros((2, 2), dtype=torch.int64), 10)


# ---- the package as installed ----------------------------------------------


def test_stub_names_the_extension():
    """Every public name of the extension is in _core.pyi, and nothing else."""
    stub = pathlib.Path(bam.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(bam._core) if not n.startswith("__")}
    assert public == stubbed
    assert (pathlib.Path(bam.__file__).with_name("py.typed")).exists()


def test_import_without_torch_or_tqdm():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['tqdm'] = None\n"
        "import bam, numpy as np\n"
        "s = bam.open('emu:ram=1M'); bam.load(s, np.arange(10))\n"
        "assert (bam.read(s, 0, 80).view(np.int64) == np.arange(10)).all()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_geometric_feature_store_api():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import FeatureStore as PygFeatureStore

    from bam.torch_geometric import FeatureStore

    store = FeatureStore()
    assert isinstance(store, PygFeatureStore)
    assert store.get_all_tensor_attrs() == []
    assert store.get_tensor_size("paper", "x") is None


def test_interrupted_file_load_resumes(tmp_path):
    """An exception from the progress callback (Ctrl-C's KeyboardInterrupt, say)
    stops the load; the next load of the same file skips what reached the device."""
    src = tmp_path / "big.bin"
    # More 1 MiB chunks than a load keeps in flight (16).
    data = np.random.default_rng(2).integers(0, 256, size=20 << 20, dtype=np.uint8)
    data.tofile(src)
    s = bam.open(f"emu:file={tmp_path / 'disk.img'},size=24M,timeout=60s")
    calls = []

    def stop(done, total):
        calls.append(done)
        if done >= 3 << 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s._h()._load_file(str(src), 0, True, stop)
    assert os.path.exists(str(src) + ".bam-load")
    r = bam.load(s, src, progress=False)
    assert 0 < r.resumed_chunks < 20
    assert not os.path.exists(str(src) + ".bam-load")
    np.testing.assert_array_equal(bam.read(s, 0, data.size), data)


def test_load_state_file_where_asked_or_in_the_state_directory(tmp_path, monkeypatch):
    """A file load records its progress in state_path; from a directory it
    cannot write (a read-only mount), in the user's state directory."""
    src_dir = tmp_path / "dataset"
    src_dir.mkdir()
    src = src_dir / "feats.bin"
    data = np.random.default_rng(3).integers(0, 256, size=20 << 20, dtype=np.uint8)
    data.tofile(src)
    s = bam.open(f"emu:file={tmp_path / 'disk.img'},size=24M,timeout=60s")

    def stop(done, total):
        if done >= 3 << 20:
            raise KeyboardInterrupt

    state = tmp_path / "elsewhere.state"
    with pytest.raises(KeyboardInterrupt):
        s._h()._load_file(str(src), 0, True, stop, str(state))
    assert state.exists() and not os.path.exists(str(src) + ".bam-load")
    r = bam.load(s, src, progress=False, state_path=state)
    assert 0 < r.resumed_chunks < 20 and not state.exists()
    np.testing.assert_array_equal(bam.read(s, 0, data.size), data)
    with pytest.raises(TypeError, match="state_path must be a str or os.PathLike"):
        bam.load(s, src, progress=False, state_path=3)

    # A source directory that cannot be written (os.access says so: as root,
    # a chmod would not stop the write, so the check is what is exercised).
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if str(p) == str(src_dir) else real_access(p, m, **kw))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(bam, "_progress", lambda what, on: (stop, lambda: None))
    with pytest.raises(KeyboardInterrupt):
        bam.load(s, src, offset=4096)
    kept = list((tmp_path / "xdg" / "bam").glob("feats.bin-*.bam-load"))
    assert len(kept) == 1 and not os.path.exists(str(src) + ".bam-load")
    monkeypatch.setattr(bam, "_progress", lambda what, on: (None, lambda: None))
    r = bam.load(s, src, offset=4096)
    assert 0 < r.resumed_chunks < 20 and not kept[0].exists()
    np.testing.assert_array_equal(bam.read(s, 4096, data.size), data)


def test_interrupted_memory_load_leaves_no_state_file(tmp_path):
    import glob
    import tempfile

    s = bam.open(f"emu:file={tmp_path / 'disk.img'},size=24M,timeout=60s")
    data = np.zeros(20 << 20, np.uint8)

    def stop(done, total):
        raise ValueError("stop here")

    with pytest.raises(ValueError, match="stop here"):
        s._h()._load_bytes(data, 0, stop)
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"bam-python-load-{os.getpid()}-*")) == []


def test_read_while_another_thread_loads_does_not_deadlock():
    """A read waits for a load in another thread without holding the GIL,
    which the load's progress needs (it hung before)."""
    script = r"""
import threading, time
import numpy as np
import bam

started = threading.Event()

def slow_progress(label, enabled):
    def update(done, total):
        started.set()
        time.sleep(0.3)  # lets the reader reach the storage meanwhile
    return update, lambda: None

bam._progress = slow_progress
s = bam.open("emu:ram=16M")
t = threading.Thread(target=lambda: bam.load(s, np.ones(8 << 20, np.uint8)))
t.start()
started.wait()
assert bam.read(s, 0, 4096).sum() == 4096  # waits for the load, which ran first
t.join()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
