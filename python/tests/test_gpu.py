# SPDX-License-Identifier: MIT
"""bam.Array on a CUDA GPU: tensors in and out by DLPack on torch's current
stream. Skipped (with the reason) where no CUDA GPU is usable."""

import numpy as np
import pytest

import bam

pytestmark = pytest.mark.gpu

ROWS, DIM = 3000, 96


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def table(torch):
    """(storage, cache, array, host copy): a float32 table on emu-gpu:ram."""
    data = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(7))
    s = bam.open("emu-gpu:ram=64M")
    assert s.gpu_side
    bam.load(s, data, offset=1 << 20, progress=False)
    cache = bam.PageCache(page_size=4096, capacity=8 << 20)
    arr = bam.Array(cache, s, (ROWS, DIM), torch.float32, offset=1 << 20)
    return s, cache, arr, data


def test_gather_round_trip(torch, table):
    _, cache, arr, data = table
    idx = torch.randint(0, ROWS, (5000,), device="cuda")
    rows = arr[idx]
    assert rows.is_cuda and rows.dtype == torch.float32 and rows.shape == (5000, DIM)
    assert torch.equal(rows.cpu(), data[idx.cpu()])
    st = cache.stats()
    assert st["misses"] > 0 and st["bytes_read"] == st["misses"] * 4096
    assert torch.equal(arr[5].cpu(), data[5])


def test_gather_on_a_side_stream(torch, table):
    _, _, arr, data = table
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        idx = torch.arange(ROWS - 1, -1, -1, device="cuda")
        rows = arr[idx]
    s.synchronize()
    assert torch.equal(rows.cpu(), data.flip(0))


def test_writes_flush_and_read_back(torch, table):
    s, cache, arr, data = table
    idx = torch.randperm(ROWS, device="cuda")[:1000]
    values = torch.full((1000, DIM), 3.5, device="cuda") + idx[:, None].float()
    arr[idx] = values
    assert torch.equal(arr[idx], values)
    arr.flush()
    assert cache.stats()["writebacks"] > 0
    expect = data.clone()
    expect[idx.cpu()] = values.cpu()
    back = bam.read(s, 1 << 20, ROWS * DIM * 4).view(np.float32).reshape(ROWS, DIM)
    assert torch.equal(torch.from_numpy(back.copy()), expect)


def test_host_transfers_and_arrays_agree(torch, table):
    """Without a flush, bam.read sees rows written through the array; the
    array reads what bam.write put on the storage next (also over rows it
    held dirty), and no later flush undoes it; writes are in whole blocks."""
    s, _, arr, data = table
    base = 1 << 20
    row = DIM * 4
    arr[torch.arange(0, 100, device="cuda")] = torch.full((100, DIM), 7.0, device="cuda")
    back = bam.read(s, base, 100 * row).view(np.float32)
    assert (back == 7.0).all()

    arr[torch.arange(200, 300, device="cuda")]  # held by the cache
    arr[torch.arange(300, 310, device="cuda")] = torch.ones(10, DIM, device="cuda")  # held dirty
    new = np.full((110, DIM), -2.0, np.float32)
    assert (base + 200 * row) % s.lba_size == 0
    bam.write(s, new, offset=base + 200 * row)
    assert torch.equal(arr[torch.arange(200, 310, device="cuda")].cpu(), torch.from_numpy(new))
    # The rest of the last block is zeroes, as on a host controller.
    zeroed = (-(110 * row) % s.lba_size) // 4
    assert zeroed > 0
    r310 = arr[310].cpu()
    assert (r310[:zeroed] == 0).all() and torch.equal(r310[zeroed:], data[310, zeroed:])
    arr.flush()
    assert (bam.read(s, base + 200 * row, 110 * row).view(np.float32) == -2.0).all()

    with pytest.raises(bam.Error, match="multiple of the LBA size"):
        bam.write(s, b"abc", offset=base + 3)
    with pytest.raises(bam.Error, match="multiple of the LBA size"):
        bam.load(s, np.zeros(8, np.uint8), offset=base + 100, progress=False)


@pytest.mark.parametrize("bad", [ROWS, ROWS + 12345, -1, -(1 << 40)])
def test_bad_row_ids_raise(torch, table, bad):
    _, _, arr, data = table
    idx = torch.tensor([0, bad, 2], device="cuda")
    with pytest.raises(bam.RowIndexError, match=r"outside \[0, 3000\)"):
        arr[idx]
    with pytest.raises(bam.RowIndexError):
        arr[idx] = torch.zeros(3, DIM, device="cuda")
    # The array is fine afterwards.
    assert torch.equal(arr[torch.tensor([1], device="cuda")].cpu(), data[1:2])


def test_argument_checks(torch, table):
    _, _, arr, _ = table
    with pytest.raises(TypeError, match="int32 or int64"):
        arr[torch.arange(3, dtype=torch.int16, device="cuda")]
    with pytest.raises(TypeError, match="int32 or int64"):
        arr[np.arange(3, dtype=np.uint16)]
    with pytest.raises(ValueError, match="1-D"):
        arr[torch.zeros(2, 2, dtype=torch.int64, device="cuda")]
    idx = torch.arange(3, device="cuda")
    with pytest.raises(TypeError, match="float64"):
        arr[idx] = torch.zeros(3, DIM, dtype=torch.float64, device="cuda")
    with pytest.raises(ValueError, match="shape"):
        arr[idx] = torch.zeros(3, DIM + 1, device="cuda")
    with pytest.raises(TypeError, match="CUDA tensor"):
        arr[idx] = torch.zeros(3, DIM)


def test_host_storage_moves_to_the_gpu(torch, tmp_path):
    """An emu:ram storage loaded by host threads keeps its bytes once an Array uses it."""
    data = torch.arange(4096 * 8, dtype=torch.int16).reshape(4096, 8)
    s = bam.open("emu:ram=16M")
    bam.load(s, data, progress=False)
    cache = bam.PageCache(page_size=4096, capacity=4 << 20)
    arr = bam.Array(cache, s, (4096, 8), torch.int16)
    assert s.gpu_side
    idx = torch.randint(0, 4096, (777,), device="cuda")
    assert torch.equal(arr[idx].cpu(), data[idx.cpu()])


def test_file_storage_round_trip(torch, tmp_path):
    data = torch.randn(2048, 32, dtype=torch.float64)
    dev = f"emu:file={tmp_path / 'd.img'},size=8M,timeout=60s"
    bam.load(dev, data, progress=False)
    s = bam.open(dev)
    cache = bam.PageCache(page_size=4096, capacity=2 << 20)
    arr = bam.Array(cache, s, (2048, 32), "float64")
    idx = torch.randint(0, 2048, (4096,), device="cuda")
    assert torch.equal(arr[idx].cpu(), data[idx.cpu()])


def test_feature_store(torch, table):
    pytest.importorskip("torch_geometric")
    from bam.torch_geometric import FeatureStore

    s, cache, arr, data = table
    store = FeatureStore(cache, s, offset=16 << 20)
    store.add(arr, "paper", "x")
    idx = torch.tensor([3, 1, 4, 1, 5], device="cuda")
    assert torch.equal(store["paper", "x", idx].cpu(), data[idx.cpu()])
    y = torch.arange(ROWS, dtype=torch.int64)
    store.put_tensor(y, group_name="paper", attr_name="y", index=None)
    assert store.get_tensor_size("paper", "y") == (ROWS,)
    assert torch.equal(store["paper", "y", idx].cpu(), y[idx.cpu()])
    assert {(a.group_name, a.attr_name) for a in store.get_all_tensor_attrs()} == {("paper", "x"), ("paper", "y")}
    assert store.remove_tensor("paper", "y", None)
    assert store.get_tensor_size("paper", "y") is None


def test_array_properties(torch, table):
    s, cache, arr, _ = table
    assert arr.shape == (ROWS, DIM) and len(arr) == ROWS
    assert arr.dtype == torch.float32
    assert arr.device == torch.device("cuda", torch.cuda.current_device())
    assert arr.nbytes == ROWS * DIM * 4
    assert cache.device == arr.device
    # Past the table, on a page boundary (arrays that share a page must both start on one).
    past = ((1 << 20) + ROWS * DIM * 4 + 4095) // 4096 * 4096 + 4096
    u = bam.Array(cache, s, 1000, np.int16, offset=past)
    assert u.shape == (1000,) and u.dtype == torch.int16 and u.nbytes == 2000


def test_indexing_forms(torch, table):
    _, _, arr, data = table
    ids = [5, 0, ROWS - 1, -1, 7]
    want = data[torch.tensor(ids)]
    assert torch.equal(arr[ids].cpu(), want)
    assert torch.equal(arr[np.array(ids, np.int32)].cpu(), want)
    assert torch.equal(arr[np.array(ids, np.int64)].cpu(), want)
    assert torch.equal(arr[torch.tensor(ids, dtype=torch.int32)].cpu(), want)
    assert torch.equal(arr[torch.tensor([5, 0, 7], dtype=torch.int32, device="cuda")].cpu(), data[[5, 0, 7]])
    assert torch.equal(arr[10:20:3].cpu(), data[10:20:3])
    assert torch.equal(arr[-1].cpu(), data[-1])
    assert arr[[]].shape == (0, DIM)
    with pytest.raises(bam.RowIndexError):
        arr[[0, ROWS]]
    arr[[1, 2]] = torch.zeros(2, DIM, device="cuda")
    assert torch.equal(arr[1:3].cpu(), torch.zeros(2, DIM))


def test_read_into_cuda_buffers(torch, table):
    s, _, _, data = table
    out = torch.empty(ROWS, DIM, device="cuda")
    assert bam.read(s, 1 << 20, out=out) is out
    assert torch.equal(out.cpu(), data)
    f = s.read_async(1 << 20, 4 * DIM, out=torch.zeros(DIM, device="cuda"))
    assert torch.equal(f.result(timeout=60).cpu(), data[0])
