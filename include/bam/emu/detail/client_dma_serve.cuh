// SPDX-License-Identifier: MIT
//! Device side of the CPU engine for GPU clients: a warp waiting on one of
//! the engine's queues moves the data the engine's threads staged for it
//! (the protocol: `client_dma.hpp`).
//!   1. one lane claims up to one task per lane of the warp (an atomic
//!      counter in GPU memory against the lane's `posted`, a host word that
//!      one warp at a time reads across the bus);
//!   2. each lane reads its task; a task whose sequence number is not the
//!      one claimed was cancelled and is skipped;
//!   3. the whole warp moves each task's bytes together, walking its PRPs
//!      (lists read from GPU memory) between the staging bytes and the
//!      targets;
//!   4. each lane fences (system scope) and stamps its task done with the
//!      walk's status; the engine then completes the command.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>
#include <bam/emu/client_dma.hpp>
#include <bam/emu/detail/warp_copy.cuh>
#include <bam/nvme/prp.hpp>

#include <cuda/atomic>

#include <cstdint>

namespace bam::emu::detail {

//! Move up to one task per lane of `mask` (the calling warp, converged) of
//! queue `qid`. Returns how many tasks were claimed (the same on every lane).
BAM_DEVICE BAM_NOINLINE inline unsigned serve_client_dma(const client_dma_ref& r, std::uint16_t qid, unsigned mask) {
  const unsigned lane = lane_index();
  const unsigned leader = __ffs(mask) - 1;
  const unsigned rank = __popc(mask & ((1u << lane) - 1));
  if (qid == 0 || qid > r.max_qid) return 0;
  client_dma_lane& dl = r.lanes[qid];
  constexpr std::uint64_t page_bytes = 4096; // dma_page_size

  // 1. Claim.
  unsigned k = 0;
  unsigned long long c = 0;
  if (lane == leader) {
    client_dma_claim& cl = r.claim[qid];
    cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> claimed(cl.claimed);
    cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> seen(cl.seen);
    c = claimed.load(cuda::memory_order_relaxed);
    // Acquire: the tasks another warp saw published are visible to this one.
    std::uint64_t posted = seen.load(cuda::memory_order_acquire);
    if (c >= posted) {
      // Nothing known to be left: one warp at a time asks the host.
      cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device> reading(cl.reading);
      if (reading.load(cuda::memory_order_relaxed) == 0 && reading.exchange(1, cuda::memory_order_relaxed) == 0) {
        posted = cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(dl.posted).load(cuda::memory_order_acquire);
        seen.fetch_max(posted, cuda::memory_order_release);
        reading.store(0, cuda::memory_order_relaxed);
        c = claimed.load(cuda::memory_order_relaxed);
      }
    }
    if (c < posted) {
      const std::uint64_t avail = posted - c;
      const unsigned want = static_cast<unsigned>(avail < __popc(mask) ? avail : __popc(mask));
      std::uint64_t expect = c;
      if (claimed.compare_exchange_strong(expect, c + want, cuda::memory_order_relaxed)) k = want;
    }
  }
  k = __shfl_sync(mask, k, leader);
  if (k == 0) return 0;
  c = __shfl_sync(mask, c, leader);

  // 2. Each lane reads its task (host memory the engine rewrites: not cached).
  const bool mine = rank < k;
  const std::uint64_t seq = c + rank;
  client_dma_task t;
  bool valid = false;
  if (mine) {
    client_dma_task& slot = dl.task[seq % client_dma_lane::ring];
    const std::uint64_t s =
        cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(slot.seq).load(cuda::memory_order_acquire);
    if (s == seq) {
      // Two 16-byte reads: each read across the host link is a request of its own.
      const uint4 a = bam::detail::ld_cv(reinterpret_cast<const uint4*>(&slot.prp1));
      const uint4 b = bam::detail::ld_cv(reinterpret_cast<const uint4*>(&slot.staging));
      t.prp1 = static_cast<std::uint64_t>(a.y) << 32 | a.x;
      t.prp2 = static_cast<std::uint64_t>(a.w) << 32 | a.z;
      t.staging = static_cast<std::uint64_t>(b.y) << 32 | b.x;
      t.bytes = b.z;
      t.direction = static_cast<dma_direction>(b.w);
      valid = true;
    }
  }

  // 3. The warp moves each task's data together.
  nvme::status st;
  unsigned todo = __ballot_sync(mask, valid);
  while (todo != 0) {
    const unsigned src = __ffs(todo) - 1;
    todo &= todo - 1;
    const std::uint64_t prp1 = __shfl_sync(mask, static_cast<unsigned long long>(t.prp1), src);
    const std::uint64_t prp2 = __shfl_sync(mask, static_cast<unsigned long long>(t.prp2), src);
    auto* staging =
        reinterpret_cast<unsigned char*>(__shfl_sync(mask, static_cast<unsigned long long>(t.staging), src));
    const std::uint32_t bytes = __shfl_sync(mask, t.bytes, src);
    const bool to_gpu = __shfl_sync(mask, static_cast<std::uint32_t>(t.direction), src) ==
                        static_cast<std::uint32_t>(dma_direction::to_gpu);
    std::uint64_t done = 0;
    const nvme::status s = nvme::walk_prp(
        prp1, prp2, bytes, page_bytes,
        [](std::uint64_t bus, std::uint64_t* d, std::size_t n) {
          const auto* list = reinterpret_cast<const unsigned long long*>(bus);
          for (std::size_t i = 0; i < n; ++i)
            d[i] = bam::detail::ld_cg(list + i); // written by another SM
          return true;
        },
        [&](std::uint64_t bus, std::uint64_t len) {
          if (to_gpu)
            warp_copy<true>(reinterpret_cast<void*>(bus), staging + done, len, mask);
          else
            warp_copy(staging + done, reinterpret_cast<const void*>(bus), len, mask);
          done += len;
          return true;
        });
    if (lane == src) st = s;
  }

  // 4. Every lane's bytes are in place before any stamp says so.
  __syncwarp(mask);
  if (valid) {
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
    cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(dl.done[seq % client_dma_lane::ring])
        .store(dma_stamp(seq, st), cuda::memory_order_relaxed);
  }
  return k;
}

} // namespace bam::emu::detail
