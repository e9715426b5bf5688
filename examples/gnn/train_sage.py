#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train GraphSAGE on a bam-gnn dataset, with the node features read several
ways in one run, from the same seed:

  bam      a bam.Array on a device string (default emu-gpu:ram), served to the
           model by bam.torch_geometric.FeatureStore
  memory   the whole table in the torch device's memory (GPU memory: the upper bound)
  memmap   a numpy.memmap of the feature file, rows gathered by the CPU and
           copied over (what users do when the table does not fit)
  uva      (not by default) the table in pinned host memory, rows gathered
           by the GPU zero-copy (what users do when it fits in RAM; needs CuPy)

Each mode trains the same model on the same mini-batches; the script checks
that every mode gathered the same rows (the first batches against the
feature file, or the generator), and reports epoch time split into sampling, gathering and
training, accuracy, and each mode's epoch time relative to `memory`.

    bam-gnn make /data/g --nodes 1000000 --degree 15            # the dataset tool
    python examples/gnn/train_sage.py /data/g --epochs 3 --json sage.json

Several GPUs: one process per GPU with torchrun (torch.distributed, NCCL on
GPUs, gloo on the CPU). Each process opens the storage, trains on its share of
every epoch's mini-batches, and the gradients are averaged
(DistributedDataParallel). Without --device the table is loaded once into
shared memory (emu-gpu:shm) that every process reads. Each process makes a
page cache of its own, or with --node-cache the processes build one cache
together (bam.CacheGroup.from_torch()): each brings --cache-mib of its GPU's
memory and holds one copy of a page for all:

    torchrun --standalone --nproc-per-node 4 examples/gnn/train_sage.py /data/g --node-cache
    torchrun --standalone --nproc-per-node 2 examples/gnn/train_sage.py /data/g --device /dev/bam-nvme0

A dataset made with `bam-gnn make --no-features-file --device D` has its table
on D alone: mode bam reads it there (shared memory written as `emu:shm=NAME`
through `emu-gpu:shm=NAME`), and the rows needed elsewhere (checks, labels,
the memory and uva tables) are generated from the feature seed
(generated_features.py); mode memmap is refused. Each mode reports the memory
it held per process (host and GPU).

A graph larger than a GPU's memory: --graph bam keeps the offsets in GPU
memory and reads the neighbour ids through a bam page cache of their own
(--graph-cache-mib), loaded onto --graph-device (default: shared memory under
torchrun, emu-gpu:ram without it); with --node-cache that cache is one over
the job's GPUs too.

Labels: --labels FILE.npy (one integer class per node, -1 for none), else the
dataset's labels.npy when it has one (examples/gnn/import_ogb.py writes it
for OGB's datasets), else derived from the features (the argmax of a fixed
random projection into --classes classes), so that any dataset the tool makes
can be trained on and the accuracy means something. Training and validation
nodes: the dataset's split/train.npy and split/valid.npy when it has them
(OGB's split; --train-nodes and --val-nodes then take that many of them at
random), else drawn at random from all nodes. Neighbours are sampled uniformly with replacement on the torch
device (fanouts per layer, as PyTorch Geometric's NeighborLoader does),
de-duplicated with torch.unique.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import secrets
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generated_features  # noqa: E402  (beside this script)

try:
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv
except ImportError as e:  # pragma: no cover - depends on what is installed
    sys.exit(f"train_sage.py needs torch and torch_geometric (pip install torch torch_geometric): {e}")

MODES = ("bam", "memory", "memmap", "uva")
DEFAULT_MODES = "bam,memory,memmap"
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


def fail(msg: str) -> None:
    sys.exit(f"train_sage.py: {msg}")


# ---- the dataset -------------------------------------------------------------


@dataclass
class Dataset:
    root: str
    nodes: int
    dim: int
    dtype: np.dtype
    features_file: Optional[str]  # None: generated features kept only on a device (--no-features-file)
    features_offset: int
    indptr: np.ndarray
    indices: np.ndarray
    placement: Optional[dict]
    feature_seed: Optional[int]  # generated features: their seed

    def memmap(self) -> np.memmap:
        if self.features_file is None:
            fail(f"{self.root}: the dataset has no feature file (made with --no-features-file); its table is on "
                 f"{self.placement['device'] if self.placement else 'no device'}")
        return np.memmap(self.features_file, dtype=self.dtype, mode="r", offset=self.features_offset,
                         shape=(self.nodes, self.dim))

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32, from the file or, without one, from the generator."""
        if self.features_file is None:
            return generated_features.rows_numpy(self.feature_seed, ids, self.dim)
        return np.asarray(self.memmap()[ids], dtype=np.float32)

    def chunks(self, device: torch.device, chunk_bytes: int = 256 << 20):
        """The table in pieces: (lo, hi, rows lo .. hi-1 as float32 on `device`),
        read from the file or, without one, generated on `device`."""
        mm = self.memmap() if self.features_file is not None else None
        step = max(1, chunk_bytes // self.row_bytes)
        for lo in range(0, self.nodes, step):
            hi = min(self.nodes, lo + step)
            if mm is None:
                yield lo, hi, generated_features.rows_torch(self.feature_seed, lo, hi, self.dim, device)
            else:
                yield lo, hi, torch.from_numpy(np.array(mm[lo:hi], dtype=np.float32)).to(device)

    def fill(self, table: torch.Tensor) -> None:
        """The whole table into `table` (nodes x dim float32, any torch device)."""
        where = table.device
        if self.features_file is None and where.type == "cpu" and torch.cuda.is_available():
            where = torch.device("cuda")  # generated on the GPU, copied into the host table
        for lo, hi, rows in self.chunks(where):
            table[lo:hi] = rows


def open_dataset(root: str) -> Dataset:
    path = os.path.join(root, "manifest.json")
    try:
        with open(path) as f:
            m = json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror} (make a dataset with `bam-gnn make DIR` or import one with `bam-gnn import`)")
    if m.get("format") != "bam-gnn-dataset":
        fail(f"{path}: not a bam-gnn dataset manifest")
    feats = m["features"]
    if feats["dtype"] not in NUMPY_DTYPES:
        fail(f"{path}: feature dtype {feats['dtype']} is not one of {', '.join(NUMPY_DTYPES)}")
    graph = m["graph"]
    # Mapped, not read: the processes of a job share the pages, and the arrays go
    # to the torch device a piece at a time (to_torch).
    indptr = np.load(os.path.join(root, graph["indptr"]["file"]), mmap_mode="r")
    indices = np.load(os.path.join(root, graph["indices"]["file"]), mmap_mode="r")
    nodes = int(m["nodes"])
    if indptr.shape != (nodes + 1,) or int(indptr[-1]) != indices.shape[0]:
        fail(f"{root}: the CSR arrays do not match the manifest ({nodes} nodes, {indices.shape[0]} edges)")
    ffile = feats.get("file") or None
    generated = feats.get("source") == "generated"
    if ffile is None and not (generated and m.get("device")):
        fail(f"{path}: the features have no file and are not on a device")
    if ffile is not None and not os.path.isabs(ffile):
        ffile = os.path.join(root, ffile)
    ds = Dataset(root, nodes, int(feats["dim"]), np.dtype(NUMPY_DTYPES[feats["dtype"]]), ffile,
                 int(feats.get("file_offset", 0)), indptr.astype(np.int64, copy=False), indices, m.get("device"),
                 int(feats["seed"]) if generated else None)
    if ffile is None and ds.dtype != np.float32:
        fail(f"{path}: generated features are float32")
    need = ds.features_offset + ds.nodes * ds.row_bytes
    if ffile is not None and os.path.getsize(ffile) < need:
        fail(f"{ffile}: {os.path.getsize(ffile)} bytes, the manifest needs {need}")
    return ds


def to_torch(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A (mapped) array on `device`, copied 256 MiB at a time: the process never
    holds all of it in host memory unless `device` is the CPU."""
    out = torch.empty(a.shape, dtype=torch.from_numpy(np.empty(0, dtype=a.dtype)).dtype, device=device)
    step = max(1, (256 << 20) // max(1, a.itemsize))
    for lo in range(0, a.shape[0], step):
        out[lo:lo + step] = torch.from_numpy(np.array(a[lo:lo + step]))
    return out


def make_labels(ds: Dataset, classes: int, seed: int, path: Optional[str], device: torch.device) -> np.ndarray:
    if path:
        y = np.load(path)
        if y.shape != (ds.nodes,) or not np.issubdtype(y.dtype, np.integer):
            fail(f"{path}: labels must be one integer per node ({ds.nodes}), got {y.dtype} {y.shape}")
        return y.astype(np.int64)
    proj = torch.from_numpy(np.random.default_rng(seed).standard_normal((ds.dim, classes)).astype(np.float32))
    proj = proj.to(device)
    y = np.empty(ds.nodes, dtype=np.int64)
    for lo, hi, rows in ds.chunks(device, 64 << 20):
        y[lo:hi] = torch.argmax(rows @ proj, dim=1).cpu().numpy()
    return y


def make_splits(ds: Dataset, labels: np.ndarray, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Training and validation nodes: the dataset's split when it has one, else random."""
    rng = np.random.default_rng(args.seed)
    split = os.path.join(ds.root, "split")
    if os.path.isfile(os.path.join(split, "train.npy")) and os.path.isfile(os.path.join(split, "valid.npy")):
        parts = []
        for name, want in (("train", args.train_nodes), ("valid", args.val_nodes)):
            path = os.path.join(split, name + ".npy")
            ids = np.load(path)
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                fail(f"{path}: node ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
            if ids.size and (ids.min() < 0 or ids.max() >= ds.nodes):
                fail(f"{path}: node ids must lie in [0, {ds.nodes})")
            if ids.size and labels[ids].min() < 0:
                fail(f"{path}: {int((labels[ids] < 0).sum())} of its nodes have no label (-1)")
            ids = ids.astype(np.int64)
            if want is not None and want < ids.size:
                ids = rng.choice(ids, want, replace=False)
            parts.append(ids)
        return parts[0], parts[1]
    labelled = np.flatnonzero(labels >= 0)
    perm = labelled[rng.permutation(labelled.size)]
    n_train = min(100_000 if args.train_nodes is None else args.train_nodes, perm.size // 2)
    n_val = min(10_000 if args.val_nodes is None else args.val_nodes, perm.size - n_train)
    return perm[:n_train], perm[n_train:n_train + n_val]


# ---- sampling ----------------------------------------------------------------


@dataclass
class Subgraph:
    n_id: torch.Tensor        # global ids of every sampled node (sorted, unique)
    edge_index: torch.Tensor  # [2, E] local ids, messages flow source -> target
    seed_pos: torch.Tensor    # local ids of the seeds, in seed order


def sample(seeds: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, fanouts: List[int],
           gen: torch.Generator) -> Subgraph:
    """Uniform neighbour sampling with replacement, hop by hop from the seeds."""
    frontier = seeds
    src: List[torch.Tensor] = []
    dst: List[torch.Tensor] = []
    for k in fanouts:
        start = indptr[frontier]
        deg = indptr[frontier + 1] - start
        has = deg > 0
        f, start, deg = frontier[has], start[has], deg[has]
        if f.numel() == 0:
            break
        r = (torch.rand((f.numel(), k), generator=gen, device=f.device) * deg[:, None]).long()
        nbr = indices[(start[:, None] + r).reshape(-1)].long()
        src.append(nbr)
        dst.append(f.repeat_interleave(k))
        frontier = torch.unique(nbr)
    everything = torch.cat([seeds] + src + dst)
    n_id, inverse = torch.unique(everything, return_inverse=True)
    b, e = seeds.numel(), sum(s.numel() for s in src)
    edge_index = torch.stack([inverse[b:b + e], inverse[b + e:]]) if e else inverse.new_empty((2, 0))
    return Subgraph(n_id, edge_index, inverse[:b])


# ---- the model -----------------------------------------------------------------


class SAGE(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, classes: int, layers: int) -> None:
        super().__init__()
        sizes = [dim] + [hidden] * (layers - 1) + [classes]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i + 1 < len(self.convs):
                x = F.relu(x)
        return x


# ---- feature sources -------------------------------------------------------------


@dataclass
class Source:
    name: str
    gather: Callable[[torch.Tensor], torch.Tensor]  # global ids (torch device) -> rows (torch device, float32)
    setup_s: float
    detail: Dict[str, object] = field(default_factory=dict)
    stats: Optional[Callable[[], Dict[str, int]]] = None


def memory_source(ds: Dataset, device: torch.device) -> Source:
    t0 = time.perf_counter()
    table = torch.empty((ds.nodes, ds.dim), dtype=torch.float32, device=device)
    ds.fill(table)
    return Source("memory", lambda ids: table[ids], time.perf_counter() - t0,
                  {"where": f"{device} memory", "bytes": table.numel() * 4})


def uva_source(ds: Dataset, device: torch.device) -> Source:
    """The table in pinned host memory, its rows gathered by the GPU through the
    mapping (zero-copy, "UVA"): what PyTorch users do when the table fits in host
    RAM. The gather is CuPy's, on torch's current stream."""
    try:
        import cupy as cp
    except ImportError as e:
        fail(f"mode uva gathers rows from pinned host memory with CuPy (pip install cupy-cuda13x): {e}")
    if device.type != "cuda":
        fail("mode uva gathers on a CUDA GPU")
    t0 = time.perf_counter()
    host = torch.empty((ds.nodes, ds.dim), dtype=torch.float32, pin_memory=True)
    ds.fill(host)
    gpu = device.index if device.index is not None else torch.cuda.current_device()
    with cp.cuda.Device(gpu):
        mem = cp.cuda.UnownedMemory(host.data_ptr(), host.numel() * 4, host, gpu)
        table = cp.ndarray((ds.nodes, ds.dim), dtype=cp.float32, memptr=cp.cuda.MemoryPointer(mem, 0))

    def gather(ids: torch.Tensor) -> torch.Tensor:
        with cp.cuda.Device(gpu):
            with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream, which older CuPy needs
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = cp.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream)
            with stream:
                rows = cp.take(table, cp.from_dlpack(ids.contiguous()), axis=0)
        return torch.from_dlpack(rows)

    return Source("uva", gather, time.perf_counter() - t0,
                  {"where": "pinned host memory, gathered zero-copy by the GPU", "bytes": host.numel() * 4,
                   "cupy": cp.__version__})


def available_host_memory() -> Optional[int]:
    """Host memory this process may still take, in bytes: MemAvailable of
    /proc/meminfo, or less where a cgroup (a container) limits the process;
    None where neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) << 10
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            room = max(0, int(limit) - used)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def table_does_not_fit(ds: Dataset, mode: str, device: torch.device, args: argparse.Namespace,
                       dist: "Dist") -> Optional[str]:
    """Why mode `memory` or `uva` cannot hold the whole float32 table with
    --headroom-gib to spare, or None when it can. `memory` holds it in the torch
    device's free memory, `uva` in pinned host memory, a copy per process of the
    host. Every process of the job gets the same answer."""
    need = ds.nodes * ds.dim * 4
    on_gpu = mode == "memory" and device.type == "cuda"
    copies = 1 if on_gpu else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    free = torch.cuda.mem_get_info(device)[0] if on_gpu else available_host_memory()
    # Where the host's memory cannot be read, the mode is tried.
    short = -1.0 if free is None else float(need * copies + args.headroom_gib * 2**30 - free)
    short = dist.reduce([short], "max", device)[0]
    if short <= 0:
        return None
    where = "the GPU's free memory" if on_gpu else "available host memory"
    each = f" per process, {copies} processes on this host" if copies > 1 else ""
    return (f"the table ({need / 2**30:.1f} GiB{each}) does not fit in {where} with {args.headroom_gib:g} GiB "
            f"to spare: {short / 2**30:.1f} GiB short")


def memmap_source(ds: Dataset, device: torch.device) -> Source:
    if ds.features_file is None:
        fail("mode memmap reads the feature file, and this dataset has none (made with --no-features-file)")
    mm = ds.memmap()

    def gather(ids: torch.Tensor) -> torch.Tensor:
        rows = torch.from_numpy(np.asarray(mm[ids.cpu().numpy()], dtype=np.float32))
        if device.type == "cuda":
            rows = rows.pin_memory()
        return rows.to(device, non_blocking=True)

    return Source("memmap", gather, 0.0, {"where": ds.features_file})


def in_process_medium(device: str) -> bool:
    """A software-controller medium that lives and dies with its process
    (not shared memory, not a file or an SSD)."""
    return device.startswith(("emu-gpu:", "emu:ram")) and not device.startswith(("emu-gpu:shm=", "emu:shm="))


def shm_medium(device: str) -> Optional[tuple[str, str]]:
    """(name, lba option) of a shared-memory medium (`emu:shm=NAME,...` or
    `emu-gpu:shm=NAME,...`), else None."""
    for kind in ("emu-gpu:", "emu:"):
        if device.startswith(kind + "shm="):
            opts = device[len(kind):].split(",")
            lba = next((o for o in opts if o.startswith("lba=")), "")
            return opts[0][len("shm="):], lba
    return None


def reading_device(placed: str) -> str:
    """The device string mode bam reads a table from that the dataset tool
    wrote to `placed`: the same, except that shared memory the tool wrote
    through the CPU engine (`emu:shm=NAME`, the host's way in) is read through
    the GPU engine (`emu-gpu:shm=NAME`: the same memory, served by GPU threads)."""
    shm = shm_medium(placed)
    if shm is None or not placed.startswith("emu:"):
        return placed
    name, lba = shm
    return f"emu-gpu:shm={name}" + (f",{lba}" if lba else "")


def same_medium(a: str, b: str) -> bool:
    """Do device strings `a` and `b` name the same medium (the same string, or the same shared memory)?"""
    return a == b or (shm_medium(a) is not None and shm_medium(a) == shm_medium(b))


def default_page_size(row_bytes: int, storage) -> int:
    """A row rounded up to a power of two, 512 to 4096 bytes (a random row
    then brings in little beside it), at least the storage's block size, and
    large enough for the cache to address the whole storage (2^34 pages)."""
    page = min(4096, max(512, 1 << (row_bytes - 1).bit_length()))
    page = max(page, storage.lba_size)
    while storage.bytes > page << 34:
        page *= 2
    return page


def bam_source(ds: Dataset, args: argparse.Namespace, dist: "Dist") -> Source:
    try:
        import bam
        from bam.torch_geometric import FeatureStore
    except ImportError as e:
        fail(f"mode bam needs the bam package (pip install ./python): {e}")
    if ds.dtype != np.float32:
        fail("mode bam: this example reads float32 features")
    t0 = time.perf_counter()
    mib = max(64, math.ceil(ds.nodes * ds.row_bytes / (1 << 20)) + 1)
    device = args.device
    placed = ds.placement
    if not device and placed and ds.features_file is None:
        device = reading_device(placed["device"])  # the table is only there (an SSD, shared memory)
    if not device and dist.on:
        # One copy of the table for every process: shared memory named by rank 0.
        token = [secrets.token_hex(6) if dist.main else None]
        torch.distributed.broadcast_object_list(token, src=0)
        device = f"emu-gpu:shm=sage-{token[0]},size={mib}M,unlink"
    device = device or f"emu-gpu:ram={mib}M"
    # The processes of the job build one cache together (a collective).
    group = bam.CacheGroup.from_torch() if args.node_cache else None
    storage = bam.open(device)
    # Shared memory, a file, an SSD: one medium for every process of the host, loaded once.
    shared = not in_process_medium(device)
    if args.page_size is None:
        args.page_size = default_page_size(ds.row_bytes, storage)
    if placed and same_medium(placed.get("device", ""), device) and not in_process_medium(device):
        offset = int(placed["offset"])
        how = f"the table the dataset tool wrote at byte {offset}"
    else:
        if ds.features_file is None:
            where = placed["device"]
            fail(f"mode bam: the dataset has no feature file, and its table was written to {where}, "
                 + ("a medium that ends with the process that wrote it: make the dataset again onto one that "
                    "outlives it (emu-gpu:shm=NAME,size=..., a file, an SSD)" if in_process_medium(where)
                    else "(run without --device, or with that device)"))
        offset = 0
        if not (shared and dist.on and dist.local_rank != 0):  # a shared medium: the first process of the host loads it
            bam.load(storage, ds.memmap(), offset=0, progress=not args.quiet)
        how = f"loaded before training ({ds.nodes * ds.row_bytes} bytes)"
        if shared and dist.on:
            dist.barrier()
    cache = bam.PageCache(page_size=args.page_size, capacity=args.cache_mib << 20, group=group)
    array = bam.Array(cache, storage, (ds.nodes, ds.dim), "float32", offset)
    store = FeatureStore()
    store.add(array, group_name="node", attr_name="x")
    layout = f"one cache over the {dist.world} processes' GPUs" if group else "a cache per process" if dist.on else "a cache"
    if not args.quiet:
        print(f"bam: features on {device}: {how}; {layout}, {args.cache_mib} MiB of {args.page_size}-byte pages "
              f"on each GPU")
    return Source("bam", lambda ids: store["node", "x", ids], time.perf_counter() - t0,
                  {"device": device, "cache_mib": args.cache_mib, "page_size": args.page_size, "placement": how,
                   "cache_layout": layout},
                  cache.stats)


def bam_graph(ds: Dataset, args: argparse.Namespace, dist: "Dist") -> tuple:
    """The CSR's neighbour ids as a bam.Array, read through a page cache of
    their own when sampling: for a graph larger than a GPU's memory. They are
    loaded from the dataset's indices file onto --graph-device (default:
    shared memory that every process of a torchrun job reads, emu-gpu:ram
    without torchrun); with --node-cache the processes build one graph cache
    together too. The offsets stay in GPU memory (8 bytes a node). Returns the
    array and what the JSON records."""
    try:
        import bam
    except ImportError as e:
        fail(f"--graph bam needs the bam package (pip install ./python): {e}")
    t0 = time.perf_counter()
    dtype = ds.indices.dtype.name
    if dtype not in ("int32", "int64") or not ds.indices.dtype.isnative:
        fail(f"--graph bam: neighbour ids must be int32 or int64 in this machine's byte order, the dataset's are "
             f"{ds.indices.dtype.str}")
    if ds.indices.shape[0] == 0:
        fail("--graph bam: the graph has no edges")
    mib = max(64, math.ceil(ds.indices.nbytes / (1 << 20)) + 1)
    device = args.graph_device
    if not device and dist.on:
        token = [secrets.token_hex(6) if dist.main else None]
        torch.distributed.broadcast_object_list(token, src=0)
        device = f"emu-gpu:shm=sage-graph-{token[0]},size={mib}M,unlink"
    device = device or f"emu-gpu:ram={mib}M"
    shared = not in_process_medium(device)  # one medium for every process of the host, loaded once
    if args.node_cache and not shared:
        fail(f"--graph bam --node-cache: one cache over the processes reads one medium, and {device} lives in one "
             "process (name shared memory, a file or an SSD with --graph-device, or leave it out)")
    group = bam.CacheGroup.from_torch() if args.node_cache else None
    storage = bam.open(device)
    if not (shared and dist.on and dist.local_rank != 0):  # a shared medium: the first process of the host loads it
        bam.load(storage, ds.indices, offset=0, progress=not args.quiet)
    if shared and dist.on:
        dist.barrier()
    cache = bam.PageCache(page_size=args.graph_page_size, capacity=args.graph_cache_mib << 20, group=group)
    array = bam.Array(cache, storage, (ds.indices.shape[0],), dtype, 0)
    if not args.quiet:
        print(f"bam: neighbour ids ({ds.indices.nbytes / 2**30:.2f} GiB) on {device}, sampled through "
              f"{args.graph_cache_mib} MiB of {args.graph_page_size}-byte pages on each GPU"
              + (", one cache over the processes' GPUs" if group else ""))
    return array, {"where": "bam", "device": device, "cache_mib": args.graph_cache_mib,
                   "page_size": args.graph_page_size, "node_cache": bool(group),
                   "setup_s": time.perf_counter() - t0}


# ---- training --------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_memory() -> Dict[str, int]:
    """This process's resident host memory now, in bytes: its own (anonymous)
    pages, and the shared ones it has touched (shared memory such as an
    `emu-gpu:shm` table, mapped files), which every process touching them
    counts again."""
    kib = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssFile", "RssShmem"):
                    kib[key] = int(rest.split()[0])
    except OSError:
        return {}
    return {"host_own_bytes": kib.get("RssAnon", 0) << 10,
            "host_shared_bytes": (kib.get("RssFile", 0) + kib.get("RssShmem", 0)) << 10}


def memory_used(device: torch.device, dist: "Dist") -> Dict[str, int]:
    """Memory a mode holds, taken while it runs: host memory per process, the
    GPU's memory in use (everything on this process's GPU: the CUDA context,
    torch's allocations, a bam cache) and torch's own peak. The largest over
    the job's processes."""
    m = host_memory()
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        m["gpu_used_bytes"] = total - free
        m["torch_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    keys = sorted(m)
    top = dist.reduce([float(m[k]) for k in keys], "max", device)
    return {f"{k.removesuffix('_bytes')}_bytes_max_per_process": int(v) for k, v in zip(keys, top)}


@dataclass
class Dist:
    """This process's place among those torchrun started (rank 0 of 1 without it)."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def on(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """Every process of the job waits for the others (on this process's GPU under NCCL)."""
        if torch.distributed.get_backend() == "nccl":
            torch.distributed.barrier(device_ids=[torch.cuda.current_device()])
        else:
            torch.distributed.barrier()

    def reduce(self, values: List[float], op: str, device: torch.device) -> List[float]:
        if not self.on:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM)
        return t.tolist()


def init_dist(torch_device: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    backend = "nccl" if torch_device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend=backend)
    return Dist(torch.distributed.get_rank(), torch.distributed.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def run_mode(src: Source, ds: Dataset, graph, labels: torch.Tensor, splits, args, device, reference,
             dist: Dist) -> dict:
    indptr, indices = graph
    train_ids, val_ids = splits
    torch.manual_seed(args.seed)
    model = SAGE(ds.dim, args.hidden, args.classes, len(args.fanouts)).to(device)
    if dist.on:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator(device=device)
    epochs = []
    checked = 0
    gathered_bytes = 0
    for epoch in range(args.epochs):
        gen.manual_seed(args.seed * 1000 + epoch)
        order = train_ids[torch.randperm(train_ids.numel(), generator=gen, device=device)]
        if dist.on:
            # Every process the same number of batches: its share of the epoch's order.
            share = order.numel() // dist.world
            order = order[dist.rank * share:(dist.rank + 1) * share]
        gen.manual_seed(args.seed * 1000 + epoch + 7919 * dist.rank)
        t = {"sample": 0.0, "gather": 0.0, "train": 0.0}
        losses = []
        model.train()
        sync(device)
        e0 = time.perf_counter()
        batches = range(0, order.numel(), args.batch_size)
        for bi, lo in enumerate(batches):
            seeds = order[lo:lo + args.batch_size]
            a = time.perf_counter()
            sg = sample(seeds, indptr, indices, args.fanouts, gen)
            sync(device)
            b = time.perf_counter()
            x = src.gather(sg.n_id)
            sync(device)
            c = time.perf_counter()
            gathered_bytes += sg.n_id.numel() * ds.row_bytes
            if checked < args.check_batches:
                want = reference(sg.n_id)
                if not torch.equal(x.cpu(), want.cpu()):
                    bad = (x.cpu() != want.cpu()).any(dim=1).nonzero().reshape(-1)
                    fail(f"mode {src.name}: batch {bi} of epoch {epoch}: {bad.numel()} of {x.shape[0]} gathered "
                         f"rows differ from the feature file (first: node {int(sg.n_id[bad[0]])})")
                checked += 1
            opt.zero_grad()
            out = model(x, sg.edge_index)[sg.seed_pos]
            loss = F.cross_entropy(out, labels[seeds])
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            sync(device)
            d = time.perf_counter()
            t["sample"] += b - a
            t["gather"] += c - b
            t["train"] += d - c
            if not args.quiet and dist.main and (bi + 1) % args.progress_every == 0:
                print(f"  {src.name}: epoch {epoch} batch {bi + 1}/{len(batches)}", flush=True)
        sync(device)
        seconds = dist.reduce([time.perf_counter() - e0], "max", device)[0]
        acc = evaluate(model, src, val_ids, labels, graph, args, device, dist)
        loss = dist.reduce([float(torch.stack(losses).mean())], "sum", device)[0] / dist.world
        epochs.append({"epoch": epoch, "seconds": seconds, **{f"{k}_s": v for k, v in t.items()},
                       "loss": loss, "val_accuracy": acc})
        if not args.quiet and dist.main:
            print(f"{src.name:>7} epoch {epoch}: {seconds:7.2f} s (sample {t['sample']:.2f}, gather "
                  f"{t['gather']:.2f}, train {t['train']:.2f}), loss {loss:.4f}, val accuracy {acc:.4f}", flush=True)
    gathered_bytes = int(dist.reduce([gathered_bytes], "sum", device)[0])
    steady = [e["seconds"] for e in epochs[1:]] or [epochs[0]["seconds"]]
    res = {"mode": src.name, "setup_s": src.setup_s, "epochs": epochs, "epoch_s": float(np.median(steady)),
           "final_val_accuracy": epochs[-1]["val_accuracy"], "gathered_bytes": gathered_bytes,
           "gather_GB_per_s": gathered_bytes / max(1e-9, sum(e["gather_s"] for e in epochs)) / 1e9,
           "checked_batches": checked, "processes": dist.world, "memory": memory_used(device, dist), **src.detail}
    if src.stats is not None:
        res["cache_stats"] = src.stats()
    return res


@torch.no_grad()
def evaluate(model, src: Source, val_ids, labels, graph, args, device, dist: Dist) -> float:
    model.eval()
    if dist.on:
        model = model.module  # no gradient sync while evaluating
        val_ids = val_ids[dist.rank::dist.world]
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 7)
    right = 0
    for lo in range(0, val_ids.numel(), args.batch_size):
        seeds = val_ids[lo:lo + args.batch_size]
        sg = sample(seeds, graph[0], graph[1], args.fanouts, gen)
        out = model(src.gather(sg.n_id), sg.edge_index)[sg.seed_pos]
        right += int((out.argmax(dim=1) == labels[seeds]).sum())
    right, total = dist.reduce([right, val_ids.numel()], "sum", device)
    return right / max(1, total)


def commit_of(path: str) -> str:
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("BAM_COMMIT", "unknown")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", help="a bam-gnn dataset directory (manifest.json, indptr.npy, indices.npy, features)")
    p.add_argument("--features", help="modes to run, in order (bam, memory, memmap, uva; default bam,memory,memmap, "
                   "and bam,memory for a dataset without a feature file)")
    p.add_argument("--device", help="bam's device string (default: emu-gpu:ram sized to the table)")
    p.add_argument("--cache-mib", type=int, default=1024, help="bam's page cache")
    p.add_argument("--page-size", type=int, help="bam's cache page size (default: a row rounded up to a power of "
                   "two, 512 to 4096 bytes, at least the storage's block size)")
    p.add_argument("--node-cache", action="store_true",
                   help="under torchrun: the processes build one page cache together, --cache-mib on each GPU, one "
                        "copy of a page for all (bam.CacheGroup.from_torch()); default: a cache per process")
    p.add_argument("--headroom-gib", type=float, default=4.0,
                   help="memory the memory and uva modes leave free beside the table (the graph, the training); a "
                        "mode whose table does not fit is skipped, with the reason")
    p.add_argument("--graph", choices=("memory", "bam"), default="memory",
                   help="where sampling reads the neighbour ids: memory (the CSR in each GPU's memory) or bam "
                        "(through a bam page cache, for a graph larger than a GPU; the offsets stay in memory)")
    p.add_argument("--graph-device", help="with --graph bam: the medium the neighbour ids are loaded onto (default: "
                   "shared memory under torchrun, else emu-gpu:ram)")
    p.add_argument("--graph-cache-mib", type=int, help="with --graph bam: the graph's page cache (default 1024)")
    p.add_argument("--graph-page-size", type=int, help="with --graph bam: its page size (default 4096)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per layer")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--classes", type=int, default=16, help="classes of the labels derived from the features")
    p.add_argument("--labels", help="labels.npy: one integer class per node, -1 for none "
                   "(default: the dataset's labels.npy, else derived from the features)")
    p.add_argument("--train-nodes", type=int, help="training nodes (default: the dataset's split/train.npy, "
                   "else 100000 drawn at random)")
    p.add_argument("--val-nodes", type=int, help="validation nodes (default: the dataset's split/valid.npy, "
                   "else 10000 drawn at random)")
    p.add_argument("--check-batches", type=int, default=2, help="batches per mode checked against the feature file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--progress-every", type=int, default=50, help="a progress line every N batches")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    modes = [m.strip() for m in (args.features or DEFAULT_MODES).split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            fail(f"--features: unknown mode {m!r} (modes: {', '.join(MODES)})")
    try:
        args.fanouts = [int(k) for k in args.fanouts.split(",")]
    except ValueError:
        fail(f"--fanouts: {args.fanouts!r} is not a comma-separated list of integers")
    if not args.fanouts or min(args.fanouts) < 1:
        fail("--fanouts: give at least one layer, each at least 1")
    if args.torch_device not in ("cuda", "cpu"):
        fail(f"--torch-device: cuda or cpu, not {args.torch_device!r}")
    if args.torch_device == "cuda" and not torch.cuda.is_available():
        fail("--torch-device cuda: torch sees no CUDA GPU (--torch-device cpu runs the memory and memmap modes)")
    if args.node_cache and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        fail("--node-cache: one cache for the processes torchrun starts; run under torchrun --nproc-per-node N")
    if args.node_cache and "bam" not in modes and args.graph != "bam":
        fail("--node-cache is the cache of mode bam (and of --graph bam): add bam to --features")
    if args.graph == "bam" and args.torch_device != "cuda":
        fail("--graph bam samples on a CUDA GPU; without one, keep the graph in memory (--graph memory)")
    if args.graph != "bam" and (args.graph_device or args.graph_cache_mib is not None
                                or args.graph_page_size is not None):
        fail("--graph-device, --graph-cache-mib and --graph-page-size are for --graph bam")
    if args.graph == "bam":
        args.graph_cache_mib = 1024 if args.graph_cache_mib is None else args.graph_cache_mib
        args.graph_page_size = 4096 if args.graph_page_size is None else args.graph_page_size
    if "bam" in modes and args.torch_device != "cuda":
        fail("mode bam gathers on a CUDA GPU; without one, run --features memory,memmap --torch-device cpu")
    dist = init_dist(args.torch_device)
    if args.torch_device == "cuda":
        if dist.on and dist.local_rank >= torch.cuda.device_count():
            fail(f"process {dist.rank}: local rank {dist.local_rank}, but torch sees {torch.cuda.device_count()} GPU(s)")
        torch.cuda.set_device(dist.local_rank)
        device = torch.device("cuda", dist.local_rank)
    else:
        device = torch.device("cpu")
    if dist.on and not dist.main:
        args.quiet = True

    ds = open_dataset(args.dataset)
    if args.features is None and ds.features_file is None:
        modes.remove("memmap")  # nothing to map: the table is only on its device
    if args.labels is None and os.path.isfile(os.path.join(ds.root, "labels.npy")):
        args.labels = os.path.join(ds.root, "labels.npy")
    labels_np = make_labels(ds, args.classes, args.seed, args.labels, device)
    train_np, val_np = make_splits(ds, labels_np, args)
    n_train, n_val = len(train_np), len(val_np)
    args.train_nodes, args.val_nodes = n_train, n_val  # as recorded in the JSON
    splits = (torch.from_numpy(train_np).to(device), torch.from_numpy(val_np).to(device))
    labels = torch.from_numpy(labels_np).to(device)
    args.classes = max(args.classes, int(labels.max()) + 1)
    graph_info: Dict[str, object] = {"where": "memory"}
    if args.graph == "bam":
        indices, graph_info = bam_graph(ds, args, dist)
    else:
        indices = to_torch(ds.indices, device)
    graph = (to_torch(ds.indptr, device), indices)
    def reference(ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(ds.rows(ids.cpu().numpy()))

    if not args.quiet:
        procs = f", {dist.world} processes" if dist.on else ""
        print(f"dataset {ds.root}: {ds.nodes} nodes, {ds.indices.shape[0]} edges, {ds.dim} x {ds.dtype.name} features "
              f"({ds.nodes * ds.row_bytes / 2**30:.2f} GiB); {n_train} training and {n_val} validation nodes, "
              f"fanouts {args.fanouts}, batch {args.batch_size}, on {device}{procs}")
    results = []
    for m in modes:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        why = table_does_not_fit(ds, m, device, args, dist) if m in ("memory", "uva") else None
        if why is not None:
            if not args.quiet:
                print(f"{m:>7} skipped: {why}", flush=True)
            results.append({"mode": m, "skipped": why, "processes": dist.world})
            continue
        src = (bam_source(ds, args, dist) if m == "bam" else memory_source(ds, device) if m == "memory"
               else uva_source(ds, device) if m == "uva" else memmap_source(ds, device))
        results.append(run_mode(src, ds, graph, labels, splits, args, device, reference, dist))
        del src
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if dist.on:
        dist.barrier()
        torch.distributed.destroy_process_group()
        if not dist.main:
            return 0
    base = next((r for r in results if r["mode"] == "memory" and "skipped" not in r), None)
    print(f"\n{'mode':>7} {'epoch s':>9} {'vs memory':>10} {'gather GB/s':>12} {'val acc':>8} {'GPU GiB':>8} "
          f"{'host GiB':>9}")
    for r in results:
        if "skipped" in r:
            print(f"{r['mode']:>7}   skipped: {r['skipped']}")
            continue
        ratio = f"{r['epoch_s'] / base['epoch_s']:.2f}x" if base else "-"
        mem = r["memory"]
        gpu = f"{mem['gpu_used_bytes_max_per_process'] / 2**30:.2f}" if "gpu_used_bytes_max_per_process" in mem else "-"
        host = f"{mem['host_own_bytes_max_per_process'] / 2**30:.2f}" if "host_own_bytes_max_per_process" in mem else "-"
        print(f"{r['mode']:>7} {r['epoch_s']:9.3f} {ratio:>10} {r['gather_GB_per_s']:12.2f} {r['final_val_accuracy']:8.4f} "
              f"{gpu:>8} {host:>9}")
    if args.json:
        out = {"benchmark": "train_sage", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
               "commit": commit_of(os.path.dirname(os.path.abspath(__file__))), "torch": torch.__version__,
               "machine": platform.node(), "torch_device": str(device), "processes": dist.world,
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
               "dataset": {"path": os.path.abspath(ds.root), "nodes": ds.nodes, "edges": int(ds.indices.shape[0]),
                           "dim": ds.dim, "dtype": ds.dtype.name},
               "settings": {k: getattr(args, k) for k in ("epochs", "batch_size", "fanouts", "hidden", "lr", "classes",
                                                          "train_nodes", "val_nodes", "seed", "cache_mib", "page_size",
                                                          "node_cache", "headroom_gib", "graph")},
               "graph": {**graph_info,
                         **({"cache_stats_first_process": graph[1].stats()} if args.graph == "bam" else {})},
               "results": results}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
