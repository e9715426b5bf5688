#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The random-read ceiling of the disk under a file: random 4 KiB O_DIRECT
reads of FILE from THREADS threads for SECONDS seconds (reads/s and GB/s),
the figure bam's file path (`--device file`, `emu:file=`) is bounded by.

    benchmarks/disk_random_reads.py FILE [THREADS] [SECONDS]"""
import mmap
import os
import random
import sys
import threading
import time


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 4.0
    blocks = os.path.getsize(path) // 4096
    if blocks == 0:
        sys.exit(f"disk_random_reads: {path} holds less than 4 KiB")
    count = [0] * threads

    def work(t):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
        rng = random.Random(t)
        end = time.time() + seconds
        n = 0
        while time.time() < end:
            os.preadv(fd, [buf], rng.randrange(blocks) * 4096)
            n += 1
        count[t] = n
        os.close(fd)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    dt = time.time() - t0
    print(f"{path}: {threads} threads, random 4 KiB O_DIRECT reads: {sum(count) / dt:,.0f} reads/s, "
          f"{sum(count) * 4096 / dt / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
