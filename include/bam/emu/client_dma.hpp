// SPDX-License-Identifier: MIT
//! How the CPU engine for GPU clients (`client_engine.hpp`) gets data in and
//! out of GPU memory without a CUDA call, the way an SSD's DMA needs none:
//! the engine's threads stage data in pinned host memory mapped into the GPU
//! and publish a task; GPU threads waiting on the queue (the transport's
//! device-side progress hook, `progress.cuh`) move it between the staging
//! bytes and the command's PRP targets, then stamp the task done. Only then
//! does the engine post the completion (a read) or write the media (a write).
//!
//! One `client_dma_lane` per I/O queue, in pinned host memory:
//!  - the engine writes a task (its sequence number last) and then `posted`
//!    with release stores;
//!  - GPU threads claim tasks in order with an atomic counter of their own
//!    (`client_dma_claim`, GPU memory; one warp at a time reads `posted`
//!    across the bus and leaves what it saw there for the others, so
//!    waiting warps do not flood the link with reads), skip a task whose sequence
//!    number is not the one claimed (cancelled when its queue was deleted),
//!    move the data, fence, and write `done[seq % ring]`:
//!    `(seq + 1) << 16 | status` (success, or a PRP error).
//! Both counters only grow, also across deleting and creating a queue.
//!
//! `serve_client_dma_host` is the same protocol with host copies: tests
//! without a GPU serve the tasks with it from a thread of their own.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/transport.hpp>

#include <atomic>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace bam::emu {

//! The `device_progress::hook` id of the CPU engine for GPU clients: kernels
//! move its data through `serve_client_engine` (progress.cuh).
inline constexpr std::uint32_t client_engine_progress_id = 0x43505545; // "CPUE"

enum class dma_direction : std::uint32_t {
  to_gpu = 1,   //!< staging -> PRP targets (a read's data)
  from_gpu = 2, //!< PRP targets -> staging (a write's data, a range list)
};

//! One data movement the engine asks of the GPU threads.
struct client_dma_task {
  std::uint64_t prp1 = 0;
  std::uint64_t prp2 = 0;
  std::uint64_t staging = 0; //!< address of the staging bytes (pinned host memory; the same on the GPU)
  std::uint32_t bytes = 0;
  dma_direction direction = dma_direction::to_gpu;
  std::uint64_t seq = ~0ull; //!< the task's number; anything else: not to be moved
  std::uint64_t reserved = 0;
};
static_assert(sizeof(client_dma_task) == 48);
static_assert(offsetof(client_dma_task, prp2) == 8 && offsetof(client_dma_task, staging) == 16 &&
              offsetof(client_dma_task, bytes) == 24 && offsetof(client_dma_task, direction) == 28);

//! The tasks of one I/O queue (pinned host memory, zeroed before use).
struct alignas(128) client_dma_lane {
  static constexpr std::uint32_t ring = 64;
  std::uint64_t posted; //!< tasks published (written by the engine only)
  std::uint64_t pad0[15];
  std::uint64_t done[ring];   //!< `(seq + 1) << 16 | status`, written by whoever moved task `seq`
  client_dma_task task[ring]; //!< 16-byte aligned: GPU threads read each in two 16-byte loads
};
static_assert(std::is_trivially_copyable_v<client_dma_lane>);
static_assert(offsetof(client_dma_lane, task) % 16 == 0 && sizeof(client_dma_task) % 16 == 0);

//! The GPU threads' side of one lane (GPU memory, zeroed).
struct alignas(32) client_dma_claim {
  std::uint64_t claimed; //!< tasks taken
  std::uint64_t seen;    //!< `posted` as last read
  std::uint32_t reading; //!< 1 while a warp reads `posted`
  std::uint32_t pad[3];
};

//! What GPU threads need: the lanes and the claim counters.
struct client_dma_ref {
  client_dma_lane* lanes = nullptr;  //!< `max_qid + 1` lanes, pinned host memory
  client_dma_claim* claim = nullptr; //!< `max_qid + 1`, GPU memory (host memory for a host server)
  std::uint32_t max_qid = 0;
  //! One word per engine thread, readable by the queues' waiters (see
  //! `detail::run_clock`); the engine keeps its own when null.
  std::uint64_t* run_ns = nullptr;
};
static_assert(std::is_trivially_copyable_v<client_dma_ref>);

//! A done stamp.
BAM_HD constexpr std::uint64_t dma_stamp(std::uint64_t seq, nvme::status st) { return (seq + 1) << 16 | st.raw; }

//! Serve up to `max_tasks` tasks of queue `qid` with host copies (a test's
//! stand-in for the GPU threads). Returns how many it claimed.
inline unsigned serve_client_dma_host(const client_dma_ref& r, std::uint16_t qid, unsigned max_tasks = 32) {
  if (qid == 0 || qid > r.max_qid) return 0;
  client_dma_lane& lane = r.lanes[qid];
  std::atomic_ref<std::uint64_t> claimed(r.claim[qid].claimed);
  const std::uint64_t posted = std::atomic_ref<std::uint64_t>(lane.posted).load(std::memory_order_acquire);
  std::uint64_t c = claimed.load(std::memory_order_relaxed);
  if (c >= posted) return 0;
  const unsigned k = static_cast<unsigned>(posted - c < max_tasks ? posted - c : max_tasks);
  if (!claimed.compare_exchange_strong(c, c + k, std::memory_order_relaxed)) return 0;
  for (std::uint64_t s = c; s < c + k; ++s) {
    client_dma_task& slot = lane.task[s % client_dma_lane::ring];
    if (std::atomic_ref<std::uint64_t>(slot.seq).load(std::memory_order_acquire) != s) continue; // cancelled
    client_dma_task t; // every field but the sequence number, which is atomic
    t.prp1 = slot.prp1;
    t.prp2 = slot.prp2;
    t.staging = slot.staging;
    t.bytes = slot.bytes;
    t.direction = slot.direction;
    std::uint64_t done = 0;
    auto* staging = reinterpret_cast<unsigned char*>(t.staging);
    const nvme::status st = nvme::walk_prp(
        t.prp1, t.prp2, t.bytes, dma_page_size,
        [](std::uint64_t bus, std::uint64_t* d, std::size_t n) {
          std::memcpy(d, reinterpret_cast<const void*>(bus), n * sizeof(std::uint64_t));
          return true;
        },
        [&](std::uint64_t bus, std::uint64_t len) {
          if (t.direction == dma_direction::to_gpu)
            std::memcpy(reinterpret_cast<void*>(bus), staging + done, len);
          else
            std::memcpy(staging + done, reinterpret_cast<const void*>(bus), len);
          done += len;
          return true;
        });
    std::atomic_ref<std::uint64_t>(lane.done[s % client_dma_lane::ring])
        .store(dma_stamp(s, st), std::memory_order_release);
  }
  return k;
}

} // namespace bam::emu
