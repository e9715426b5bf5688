# SPDX-License-Identifier: MIT
"""examples/gnn/train_sage.py on a small dataset written here in the bam-gnn
format: every mode gathers the rows of the feature file, trains the same model
on the same batches, and learns the labels. The memory and memmap modes run on
the CPU; the bam mode runs where torch sees a CUDA GPU."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

import torch  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gnn", "train_sage.py")
NODES, DIM, DEGREE = 3000, 16, 8


def write_dataset(root, header_bytes=0, nodes=NODES, degree=DEGREE):
    """A random undirected graph in CSR and float32 features, as `bam-gnn make` lays them out."""
    rng = np.random.default_rng(3)
    src = rng.integers(0, nodes, nodes * degree // 2)
    dst = rng.integers(0, nodes, nodes * degree // 2)
    u, v = np.concatenate([src, dst]), np.concatenate([dst, src])
    order = np.argsort(u, kind="stable")
    indices = v[order].astype(np.int32)
    indptr = np.zeros(nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=nodes), out=indptr[1:])
    np.save(os.path.join(root, "indptr.npy"), indptr)
    np.save(os.path.join(root, "indices.npy"), indices)
    feats = rng.standard_normal((nodes, DIM)).astype(np.float32)
    with open(os.path.join(root, "features.bin"), "wb") as f:
        f.write(b"\0" * header_bytes)
        f.write(feats.tobytes())
    manifest = {
        "format": "bam-gnn-dataset", "version": 1, "nodes": nodes, "edges": int(indices.shape[0]), "undirected": True,
        "graph": {"source": "test", "seed": 3, "rmat_abc": [0.57, 0.19, 0.19], "requested_degree": degree,
                  "indptr": {"file": "indptr.npy", "dtype": "int64"}, "indices": {"file": "indices.npy", "dtype": "int32"}},
        "features": {"dim": DIM, "dtype": "float32", "row_bytes": DIM * 4, "source": "test", "seed": 3,
                     "file": "features.bin", "file_offset": header_bytes},
    }
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return feats


def run(root, out, *extra):
    cmd = [sys.executable, SCRIPT, str(root), "--epochs", "4", "--batch-size", "256", "--fanouts", "5,5",
           "--hidden", "32", "--classes", "4", "--train-nodes", "1500", "--val-nodes", "1000", "--lr", "0.01",
           "--json", str(out), "--quiet", "--headroom-gib", "0", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        return json.load(f), r.stdout


def run_two_processes(root, *extra):
    """train_sage.py as two processes under torchrun, on a small training; its JSON."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT,
           str(root), "--epochs", "4", "--batch-size", "128", "--fanouts", "5,5", "--hidden", "32", "--classes", "4",
           "--train-nodes", "1500", "--val-nodes", "1000", "--lr", "0.01", "--json", str(root / "r.json"), "--quiet",
           "--headroom-gib", "0", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(root / "r.json") as f:
        res = json.load(f)
    assert res["processes"] == 2
    return {x["mode"]: x for x in res["results"]}


def test_a_table_that_does_not_fit_skips_its_mode_and_says_why(tmp_path):
    """Modes memory and uva hold the whole table; with more headroom asked for
    than the machine has, memory is skipped with the reason and the run goes on."""
    write_dataset(tmp_path)
    res, text = run(tmp_path, tmp_path / "r.json", "--features", "memory,memmap", "--torch-device", "cpu",
                    "--headroom-gib", str(1 << 30))
    by = {r["mode"]: r for r in res["results"]}
    assert "does not fit in available host memory" in by["memory"]["skipped"]
    assert "epochs" not in by["memory"]
    assert len(by["memmap"]["epochs"]) == 4 and by["memmap"]["final_val_accuracy"] > 0
    assert "skipped: the table" in text
    assert res["settings"]["headroom_gib"] == float(1 << 30)


def test_memory_and_memmap_train_alike_on_the_cpu(tmp_path):
    write_dataset(tmp_path, header_bytes=128)
    res, text = run(tmp_path, tmp_path / "r.json", "--features", "memory,memmap", "--torch-device", "cpu")
    by = {r["mode"]: r for r in res["results"]}
    assert set(by) == {"memory", "memmap"}
    for r in by.values():
        assert r["checked_batches"] == 2
        assert r["final_val_accuracy"] > 0.5  # 4 classes: chance is 0.25
    # Same rows, same batches, same seed: the same training, loss for loss.
    assert [e["loss"] for e in by["memory"]["epochs"]] == [e["loss"] for e in by["memmap"]["epochs"]]
    assert "vs memory" in text
    # Memory per process: host only on the CPU; the memory mode holds the table.
    mem = by["memory"]["memory"]
    assert set(mem) == {"host_own_bytes_max_per_process", "host_shared_bytes_max_per_process"}
    assert mem["host_own_bytes_max_per_process"] >= NODES * DIM * 4


def test_two_processes_share_the_epochs_and_agree(tmp_path):
    """torchrun with two processes on the CPU (gloo): each trains on its share
    of every epoch; the reported accuracy and losses are the processes' together."""
    write_dataset(tmp_path)
    by = run_two_processes(tmp_path, "--features", "memory,memmap", "--torch-device", "cpu")
    for x in by.values():
        assert x["processes"] == 2 and x["checked_batches"] == 2
        assert x["final_val_accuracy"] > 0.5
    assert [e["loss"] for e in by["memory"]["epochs"]] == [e["loss"] for e in by["memmap"]["epochs"]]


def test_a_short_feature_file_is_refused(tmp_path):
    write_dataset(tmp_path)
    with open(tmp_path / "features.bin", "r+b") as f:
        f.truncate(NODES * DIM * 4 - 4)
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path), "--features", "memmap", "--torch-device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "the manifest needs" in r.stderr


def make_twins(bam_gnn, root):
    """One dataset made twice by the tool: with its feature file, and with the
    table only on a device (--no-features-file). Their directories."""
    common = ["--nodes", "3000", "--degree", "8", "--dim", "16", "--seed", "3"]
    dev = f"emu:file={root / 'disk.img'},size=8M,timeout=60s"
    for name, extra in (("file", []), ("nofile", ["--no-features-file", "--device", dev])):
        r = subprocess.run([bam_gnn, "-q", "make", str(root / name), *common, *extra], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    assert not (root / "nofile" / "features.bin").exists()
    return root / "file", root / "nofile"


def test_a_dataset_without_a_feature_file_trains_alike(tmp_path, bam_gnn):
    """The rows of a table kept only on a device are generated where they are
    needed (the checks, the memory mode, the labels): the same training as the
    same dataset with its file. The memmap mode, which reads the file, is
    refused, saying why."""
    with_file, without = make_twins(bam_gnn, tmp_path)
    a, _ = run(with_file, tmp_path / "a.json", "--features", "memory", "--torch-device", "cpu")
    b, _ = run(without, tmp_path / "b.json", "--features", "memory", "--torch-device", "cpu")
    assert b["results"][0]["checked_batches"] == 2
    assert [e["loss"] for e in a["results"][0]["epochs"]] == [e["loss"] for e in b["results"][0]["epochs"]]
    r = subprocess.run([sys.executable, SCRIPT, str(without), "--features", "memmap", "--torch-device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "this dataset has none (made with --no-features-file)" in r.stderr


def test_shared_memory_the_tool_wrote_is_read_by_gpu_threads():
    """`bam-gnn make --device emu:shm=NAME` writes through the CPU engine (the
    host's way in); mode bam reads the same memory through the GPU engine and
    takes the manifest's offset for it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_sage", SCRIPT)
    ts = importlib.util.module_from_spec(spec)
    sys.modules["train_sage"] = ts  # its dataclasses look their module up
    spec.loader.exec_module(ts)
    assert ts.reading_device("emu:shm=p100,size=60G") == "emu-gpu:shm=p100"
    assert ts.reading_device("emu:shm=p100,size=60G,lba=4096,unlink") == "emu-gpu:shm=p100,lba=4096"
    for same in ("emu-gpu:shm=x,size=1G", "/dev/bam-nvme0", "emu:file=/d/img", "emu-gpu:ram=1G"):
        assert ts.reading_device(same) == same
    assert ts.same_medium("emu:shm=p100,size=60G", "emu-gpu:shm=p100")
    assert not ts.same_medium("emu:shm=p100,size=60G", "emu-gpu:shm=p10")
    assert not ts.same_medium("emu:shm=p100,lba=4096", "emu-gpu:shm=p100")
    assert not ts.same_medium("emu:file=/a", "emu:file=/b") and ts.same_medium("/dev/bam-nvme0", "/dev/bam-nvme0")


@pytest.mark.gpu
def test_bam_reads_a_table_kept_only_on_its_device(tmp_path, bam_gnn):
    """Without --device, mode bam reads the table where the dataset tool wrote
    it (the manifest's device and offset), and trains as memory does. The
    default modes leave out memmap, which has no file to map."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("bam")
    _, without = make_twins(bam_gnn, tmp_path)
    res, _ = run(without, tmp_path / "r.json", "--cache-mib", "1")
    by = {r["mode"]: r for r in res["results"]}
    assert [r["mode"] for r in res["results"]] == ["bam", "memory"]
    assert by["bam"]["device"].startswith("emu:file=")
    assert by["bam"]["placement"].startswith("the table the dataset tool wrote")
    assert by["bam"]["checked_batches"] == 2
    assert [e["loss"] for e in by["bam"]["epochs"]] == pytest.approx([e["loss"] for e in by["memory"]["epochs"]],
                                                                      rel=1e-4)
    # Naming a device of a process alone: the table is not there, and the message says so.
    r = subprocess.run([sys.executable, SCRIPT, str(without), "--features", "bam", "--device", "emu-gpu:ram=64M"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "has no feature file" in r.stderr


@pytest.mark.gpu
def test_bam_gathers_the_same_rows_and_trains_like_memory(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("bam")
    write_dataset(tmp_path)
    res, _ = run(tmp_path, tmp_path / "r.json", "--features", "bam,memory", "--cache-mib", "1")
    by = {r["mode"]: r for r in res["results"]}
    assert by["bam"]["page_size"] == 512  # 64-byte rows: the smallest page by default
    assert by["bam"]["checked_batches"] == 2
    assert by["bam"]["cache_stats"]["misses"] > 0
    assert by["bam"]["final_val_accuracy"] > 0.5
    losses_bam = [e["loss"] for e in by["bam"]["epochs"]]
    losses_mem = [e["loss"] for e in by["memory"]["epochs"]]
    assert losses_bam == pytest.approx(losses_mem, rel=1e-4)


def test_the_dataset_labels_and_split_are_used(tmp_path):
    """A dataset with labels.npy and split/ (what examples/gnn/import_ogb.py
    writes): training and validation nodes are the split's, nodes without a
    label (-1) are never trained on, and a split naming one is refused."""
    feats = write_dataset(tmp_path)
    labels = np.argmax(feats[:, :4], axis=1).astype(np.int64)
    labels[np.random.default_rng(1).random(NODES) < 0.3] = -1
    labelled = np.flatnonzero(labels >= 0)
    os.makedirs(tmp_path / "split")
    np.save(tmp_path / "labels.npy", labels)
    np.save(tmp_path / "split" / "train.npy", labelled[:1200])
    np.save(tmp_path / "split" / "valid.npy", labelled[1200:1700])
    cmd = [sys.executable, SCRIPT, str(tmp_path), "--features", "memory", "--torch-device", "cpu", "--epochs", "4",
           "--batch-size", "256", "--fanouts", "5,5", "--hidden", "32", "--lr", "0.01", "--json",
           str(tmp_path / "r.json"), "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(tmp_path / "r.json") as f:
        res = json.load(f)
    assert res["settings"]["train_nodes"] == 1200 and res["settings"]["val_nodes"] == 500
    assert res["results"][0]["final_val_accuracy"] > 0.5  # 4 classes: chance is 0.25

    np.save(tmp_path / "split" / "valid.npy", np.flatnonzero(labels < 0)[:10])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "have no label (-1)" in r.stderr


def test_node_cache_needs_torchrun_and_mode_bam(tmp_path):
    write_dataset(tmp_path)
    base = [sys.executable, SCRIPT, str(tmp_path), "--torch-device", "cpu", "--node-cache"]
    r = subprocess.run(base + ["--features", "memory"], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "WORLD_SIZE"})
    assert r.returncode != 0
    assert "--node-cache: one cache for the processes torchrun starts" in r.stderr
    r = subprocess.run(base + ["--features", "memory"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "WORLD_SIZE": "2"})
    assert r.returncode != 0
    assert "--node-cache is the cache of mode bam" in r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("node_cache", [False, True])
def test_two_gpus_under_torchrun_train_like_memory(tmp_path, node_cache):
    """torchrun with a process per GPU: the table loaded once into shared memory,
    a cache per process or one cache over both GPUs (--node-cache); the rows and
    the training are those of the memory mode."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    pytest.importorskip("bam")
    write_dataset(tmp_path)
    # 512-byte pages: the cache's runs (128 MiB) put a part on each GPU.
    by = run_two_processes(tmp_path, "--features", "bam,memory", "--page-size", "512", "--cache-mib", "128",
                           *(["--node-cache"] if node_cache else []))
    assert by["bam"]["checked_batches"] == 2
    assert by["bam"]["device"].startswith("emu-gpu:shm=")
    assert by["bam"]["cache_layout"] == ("one cache over the 2 processes' GPUs" if node_cache else "a cache per process")
    # Each process's GPU holds its cache (or its part of the node's), outside torch's allocator.
    mem = by["bam"]["memory"]
    assert mem["gpu_used_bytes_max_per_process"] >= 128 << 20
    assert mem["torch_peak_bytes_max_per_process"] < mem["gpu_used_bytes_max_per_process"]
    assert by["bam"]["final_val_accuracy"] > 0.5
    losses_bam = [e["loss"] for e in by["bam"]["epochs"]]
    losses_mem = [e["loss"] for e in by["memory"]["epochs"]]
    assert losses_bam == pytest.approx(losses_mem, rel=1e-4)


def test_graph_options_are_refused_where_they_cannot_work(tmp_path):
    write_dataset(tmp_path)
    for extra, message in ((["--graph", "bam"], "--graph bam samples on a CUDA GPU"),
                           (["--graph-cache-mib", "8"], "are for --graph bam")):
        r = subprocess.run([sys.executable, SCRIPT, str(tmp_path), "--features", "memory", "--torch-device", "cpu",
                            *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and message in r.stderr, r.stderr


@pytest.mark.gpu
def test_sampling_through_bam_trains_like_the_graph_in_memory(tmp_path):
    """--graph bam: the neighbour ids read through a page cache far smaller
    than them give the same batches, so the same training, as the CSR in GPU
    memory."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("bam")
    write_dataset(tmp_path, nodes=40_000, degree=16)  # 640,000 ids: 2.4 MiB
    mem, _ = run(tmp_path, tmp_path / "m.json", "--features", "memory")
    res, text = run(tmp_path, tmp_path / "b.json", "--features", "memory", "--graph", "bam", "--graph-cache-mib", "1",
                    "--graph-page-size", "512")
    assert res["settings"]["graph"] == "bam" and mem["settings"]["graph"] == "memory"
    g = res["graph"]
    assert g["where"] == "bam" and g["device"].startswith("emu-gpu:ram=") and g["page_size"] == 512
    # 1 MiB of 512-byte pages holds 2,048 of the ids' 5,000 pages: more misses than pages means
    # pages were evicted and read again, and every id still came back right (the same training).
    pages = -(-np.load(tmp_path / "indices.npy", mmap_mode="r").nbytes // 512)
    assert g["cache_stats_first_process"]["misses"] > pages
    assert [e["loss"] for e in res["results"][0]["epochs"]] == pytest.approx(
        [e["loss"] for e in mem["results"][0]["epochs"]], rel=1e-4)


@pytest.mark.gpu
def test_two_gpus_sample_through_one_graph_cache(tmp_path):
    """torchrun, --graph bam --node-cache: the ids loaded once into shared
    memory, one graph cache over both GPUs (each GPU reads ids homed on the
    other); the training is that of the same job with the graph in memory."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    pytest.importorskip("bam")
    write_dataset(tmp_path)
    ref = run_two_processes(tmp_path, "--features", "memory")
    by = run_two_processes(tmp_path, "--features", "memory", "--node-cache", "--graph", "bam", "--graph-cache-mib",
                           "128", "--graph-page-size", "512")
    with open(tmp_path / "r.json") as f:
        g = json.load(f)["graph"]
    assert g["where"] == "bam" and g["node_cache"] and g["device"].startswith("emu-gpu:shm=sage-graph-")
    assert g["cache_stats_first_process"]["misses"] > 0
    assert [e["loss"] for e in by["memory"]["epochs"]] == pytest.approx(
        [e["loss"] for e in ref["memory"]["epochs"]], rel=1e-4)


@pytest.mark.gpu
def test_uva_gathers_the_same_rows_and_trains_like_memory(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("cupy")
    write_dataset(tmp_path)
    res, _ = run(tmp_path, tmp_path / "r.json", "--features", "uva,memory")
    by = {r["mode"]: r for r in res["results"]}
    assert by["uva"]["checked_batches"] == 2
    assert by["uva"]["final_val_accuracy"] > 0.5
    assert [e["loss"] for e in by["uva"]["epochs"]] == pytest.approx([e["loss"] for e in by["memory"]["epochs"]],
                                                                      rel=1e-4)
