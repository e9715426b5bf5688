// SPDX-License-Identifier: MIT
//! Device side of the software controller's GPU engine: serves NVMe I/O
//! queues that live in GPU memory, on the GPU, from the threads that wait on
//! them. There is no persistent server kernel (gpu-machine.md lists the two
//! hazards one has): a warp that waits for a completion calls
//! `bam::make_progress` (transport/device_progress.cuh), which lands in
//! `serve_warp` here through the hook of progress.cuh, compiled
//! into the kernels of a translation unit that includes that header before
//! the runtime's. The whole warp serves:
//!   1. one lane claims up to 32 fetched SQ entries (an atomic virtual SQ
//!      head against the tail doorbell word in GPU memory), each lane copies
//!      one 64-byte entry;
//!   2. the fetch is published in order (the SQ head reported back must
//!      never pass an entry not yet copied);
//!   3. each lane runs its command through the one executor
//!      (`emu::process_nvm`), whose backend here only checks the PRPs and
//!      notes the copy to make;
//!   4. the warp moves each command's data together (32 lanes, 16-byte
//!      loads, several in flight), between the media (pinned host RAM or
//!      HBM; none for null) and the targets (identity DMA: a bus address is a
//!      GPU/UVA pointer);
//!   5. the SSD model (IOPS limit, latency) and fault delays hold the
//!      completions back;
//!   6. one lane reserves the CQ slots and waits for room (the CQ head
//!      doorbell), each lane posts its completion with the one completion
//!      writer. Completions are posted out of order across slots; the
//!      consumer stops at the first slot whose phase has not flipped yet.
//! The engine never calls the queue protocol: the consumer's progress comes
//! from the doorbells it writes.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>
#include <bam/emu/gpu_engine_ref.hpp>
#include <bam/emu/detail/warp_copy.cuh>
#include <bam/emu/nvm_executor.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstdint>

namespace bam::emu::detail {

template <class T>
using dev_atomic = cuda::atomic_ref<T, cuda::thread_scope_device>;

//! A data movement the executor asked for, made by the whole warp afterwards.
struct gpu_copy_job {
  std::uint8_t* media = nullptr; //!< namespace bytes (nullptr: nothing to move)
  std::uint64_t prp1 = 0;
  std::uint64_t prp2 = 0;
  std::uint64_t bytes = 0;
  std::uint32_t kind = 0; //!< 0 none, 1 read (media -> PRPs), 2 write (PRPs -> media), 3 zero media
};

//! The executor's backend on the GPU: checks PRPs, notes the copy.
struct gpu_backend {
  const gpu_engine_ref* e;
  gpu_copy_job job;

  BAM_DEVICE static bool read_list(std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
    const auto* src = reinterpret_cast<const unsigned long long*>(bus);
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = bam::detail::ld_cg(src + i); // written by another SM
    return true;
  }
  BAM_DEVICE nvme::status move(std::uint32_t, std::uint64_t offset, std::uint64_t bytes, const nvme::command& cmd,
                               bool write) {
    const nvme::status st = nvme::walk_prp(
        cmd.prp1, cmd.prp2, bytes, dma_page_size_bytes,
        [](std::uint64_t bus, std::uint64_t* dst, std::size_t n) { return read_list(bus, dst, n); },
        [](std::uint64_t, std::uint64_t) { return true; });
    if (!st.ok()) return st;
    if (e->media != nullptr) job = {e->media + offset, cmd.prp1, cmd.prp2, bytes, write ? 2u : 1u};
    return st;
  }
  BAM_DEVICE nvme::status flush(std::uint32_t) {
    // Media in RAM/HBM is as durable as it gets; make the writes visible system-wide.
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
    return nvme::status_success;
  }
  BAM_DEVICE nvme::status zero(std::uint32_t, std::uint64_t offset, std::uint64_t len, bool) {
    if (e->media != nullptr) job = {e->media + offset, 0, 0, len, 3u};
    return nvme::status_success;
  }
  BAM_DEVICE nvme::status fetch(const nvme::command& cmd, std::uint64_t offset, void* dst, std::uint64_t len) {
    auto* out = static_cast<unsigned char*>(dst);
    std::uint64_t pos = 0;
    return nvme::walk_prp(
        cmd.prp1, cmd.prp2, offset + len, dma_page_size_bytes,
        [](std::uint64_t bus, std::uint64_t* d, std::size_t n) { return read_list(bus, d, n); },
        [&](std::uint64_t bus, std::uint64_t seg) {
          for (std::uint64_t i = 0; i < seg; ++i, ++pos)
            if (pos >= offset) out[pos - offset] = bam::detail::ld_cg(reinterpret_cast<const unsigned char*>(bus) + i);
          return true;
        });
  }
  static constexpr std::uint64_t dma_page_size_bytes = 4096;
};

//! Make one job with the whole warp: walk its PRPs page by page (every lane
//! computes the same addresses), copying each segment together.
BAM_DEVICE inline void warp_run_job(const gpu_copy_job& job, unsigned mask) {
  if (job.kind == 0) return;
  if (job.kind == 3) {
    warp_zero(job.media, job.bytes, mask);
    return;
  }
  std::uint64_t done = 0;
  nvme::walk_prp(
      job.prp1, job.prp2, job.bytes, gpu_backend::dma_page_size_bytes,
      [](std::uint64_t bus, std::uint64_t* d, std::size_t n) { return gpu_backend::read_list(bus, d, n); },
      [&](std::uint64_t bus, std::uint64_t len) {
        void* target = reinterpret_cast<void*>(bus);
        if (job.kind == 1)
          warp_copy(target, job.media + done, len, mask);
        else
          warp_copy(job.media + done, target, len, mask);
        done += len;
        return true;
      });
}

//! Broadcast a job from lane `src` to every lane of `mask`.
BAM_DEVICE inline gpu_copy_job shfl_job(unsigned mask, const gpu_copy_job& j, unsigned src) {
  gpu_copy_job o;
  o.media = reinterpret_cast<std::uint8_t*>(__shfl_sync(mask, reinterpret_cast<unsigned long long>(j.media), src));
  o.prp1 = __shfl_sync(mask, static_cast<unsigned long long>(j.prp1), src);
  o.prp2 = __shfl_sync(mask, static_cast<unsigned long long>(j.prp2), src);
  o.bytes = __shfl_sync(mask, static_cast<unsigned long long>(j.bytes), src);
  o.kind = __shfl_sync(mask, j.kind, src);
  return o;
}

//! Serve up to one command per lane of `mask` (the calling warp's lanes,
//! converged) from SQ `qid`. Returns how many were fetched (the same on every lane).
BAM_DEVICE BAM_NOINLINE inline unsigned serve_warp(const gpu_engine_ref& e, std::uint16_t qid, unsigned mask) {
  const unsigned lane = lane_index();
  const unsigned leader = __ffs(mask) - 1;
  const unsigned rank = __popc(mask & ((1u << lane) - 1));
  if (qid == 0 || qid > e.max_qid) return 0;
  gpu_engine_queue& q = e.queues[qid];

  // 1. Claim entries between the virtual head and the tail doorbell.
  std::uint64_t c = 0;
  unsigned k = 0;
  if (lane == leader) {
    const bool paused = e.target.faults != nullptr && e.target.faults->is_paused();
    const std::uint32_t depth = q.sq_depth;
    dev_atomic<std::uint64_t> claim(q.sq_claim);
    dev_atomic<std::uint32_t> doorbell(e.doorbells[e.sq_doorbell_index(qid)]);
    // A glance first (relaxed, no fence): most calls find nothing to do.
    const std::uint64_t c0 = claim.load(cuda::memory_order_relaxed);
    const std::uint32_t db0 = doorbell.load(cuda::memory_order_relaxed);
    if (!paused && !(db0 < depth && db0 == c0 % depth) &&
        dev_atomic<std::uint32_t>(q.active).load(cuda::memory_order_relaxed) != 0) {
      // The claim count must be read before the doorbell (acquire orders the
      // two): a doorbell older than the claim could wrap around and make an
      // entry not yet written look fetchable.
      c = claim.load(cuda::memory_order_acquire);
      const std::uint32_t db = doorbell.load(cuda::memory_order_acquire);
      if (db < depth) {
        const std::uint64_t tail = c + (db + depth - c % depth) % depth;
        const std::uint64_t avail = tail - c;
        const unsigned want = static_cast<unsigned>(avail < __popc(mask) ? avail : __popc(mask));
        if (want != 0 && claim.compare_exchange_strong(c, c + want, cuda::memory_order_relaxed)) k = want;
      }
    }
  }
  k = __shfl_sync(mask, k, leader);
  if (k == 0) return 0;
  c = __shfl_sync(mask, static_cast<unsigned long long>(c), leader);
  const std::uint32_t depth = q.sq_depth;
  const bool mine = rank < k;
  nvme::command cmd{};
  unsigned token = 0;
  if (mine) {
    // Not through L1: the slot was written by a submitter on another SM.
    const auto* src = reinterpret_cast<const uint4*>(&q.sq[(c + rank) % depth]);
    auto* dst = reinterpret_cast<uint4*>(&cmd);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      dst[w] = bam::detail::ld_cg(src + w);
      token |= dst[w].x;
    }
    token = bam::detail::dependency_token(token, e.zero);
  }
  // Every lane's entry has arrived (the token depends on each): only then
  // may the fetch be published and the slots reused.
  token = __reduce_or_sync(mask, token);

  // 2. Publish the fetch in order.
  const std::uint64_t start = bam::detail::now_ns();
  const std::uint64_t deadline = bam::detail::deadline_after(start, e.timeout_ns);
  bool stuck = false;
  if (lane == leader) {
    dev_atomic<std::uint64_t> fetched(q.sq_fetched);
    while (fetched.load(cuda::memory_order_relaxed) != c) {
      if (bam::detail::now_ns() > deadline) {
        stuck = true; // an earlier claimer never published: the submitters time out
        break;
      }
      bam::detail::relax(32);
    }
    if (!stuck) fetched.store(c + k + token, cuda::memory_order_relaxed);
  }
  if (__shfl_sync(mask, stuck ? 1u : 0u, leader)) return k;

  // 3. Execute (checks, faults, PRPs); the data moves below.
  gpu_backend be{&e, {}};
  command_outcome out;
  if (mine) out = process_nvm(cmd, qid, e.target, be);
  const bool post = mine && !out.drop;

  // 4. The warp moves every command's data together.
  unsigned with_job = __ballot_sync(mask, mine && out.status.ok() && be.job.kind != 0);
  while (with_job != 0) {
    const unsigned src = __ffs(with_job) - 1;
    with_job &= with_job - 1;
    warp_run_job(shfl_job(mask, be.job, src), mask);
  }

  // 5. Hold the completions back as the SSD model and the fault rules say.
  constexpr std::uint64_t max_delay_ns = 0xffffffffull; // a fault delay beyond ~4 s is cut there
  const unsigned my_delay =
      post ? static_cast<unsigned>(out.delay_ns < max_delay_ns ? out.delay_ns : max_delay_ns) : 0u;
  std::uint64_t due = start + __reduce_max_sync(mask, my_delay);
  if (e.model != nullptr && lane == leader) {
    const std::uint64_t ns_per_io = e.model->ns_per_io, latency = e.model->latency_ns;
    if (ns_per_io != 0 || latency != 0) {
      std::uint64_t first = start;
      if (ns_per_io != 0) {
        // k commands start ns_per_io apart, from the limiter's next token on.
        dev_atomic<std::uint64_t> next(e.model->next_start_ns);
        std::uint64_t old = next.load(cuda::memory_order_relaxed);
        do {
          first = old > start ? old : start;
        } while (!next.compare_exchange_weak(old, first + k * ns_per_io, cuda::memory_order_relaxed));
      }
      const std::uint64_t last = first + (k - 1) * ns_per_io + latency;
      if (last > due) due = last;
    }
  }
  due = __shfl_sync(mask, static_cast<unsigned long long>(due), leader);
  while (bam::detail::now_ns() < due)
    bam::detail::relax(256);

  // 6. Reserve CQ slots, wait for room, post.
  const unsigned posting = __ballot_sync(mask, post);
  const unsigned n = __popc(posting);
  if (n == 0) return k;
  gpu_engine_queue& cq = e.queues[q.cqid]; // CQ producer counters live under the CQ's id
  const std::uint32_t cdepth = q.cq_depth;
  std::uint64_t v0 = 0;
  if (lane == leader) {
    v0 = dev_atomic<std::uint64_t>(cq.cq_reserve).fetch_add(n, cuda::memory_order_relaxed);
    dev_atomic<std::uint64_t> head(cq.cq_head);
    const std::uint64_t last = v0 + n - 1;
    for (;;) {
      std::uint64_t h = head.load(cuda::memory_order_relaxed);
      if (last < h + cdepth - 1) break;
      const std::uint32_t d =
          dev_atomic<std::uint32_t>(e.doorbells[e.cq_doorbell_index(q.cqid)]).load(cuda::memory_order_relaxed);
      const std::uint64_t now_head = consumer_head(h, d, cdepth);
      if (now_head != h) {
        head.fetch_max(now_head, cuda::memory_order_relaxed);
        if (last < now_head + cdepth - 1) break;
      }
      // The consumer (the waiting threads' poll) writes the head doorbell
      // right after it consumes; at most sq_depth - 1 commands are in flight.
      if (bam::detail::now_ns() > deadline) break; // dropped: the submitters time out
      bam::detail::relax(64);
    }
  }
  // The consumer has read the slots being reused (its doorbell said so).
  if (lane == leader) cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
  v0 = __shfl_sync(mask, static_cast<unsigned long long>(v0), leader);
  __syncwarp(mask); // every lane's data before any lane's completion
  if (post) {
    const std::uint64_t v = v0 + __popc(posting & ((1u << lane) - 1));
    // The SQ head reported must never pass an entry not yet copied and must
    // not go backwards in CQ order (the consumer adds up the differences).
    // Completions are posted out of fetch order, so report the count of CQ
    // slots up to this one: each belongs to a command already fetched (one SQ
    // per CQ, which this engine enforces), so it is a safe, monotonic bound.
    write_completion(q.cq, cdepth, v, static_cast<std::uint16_t>((v + 1) % depth), qid, cmd.cid, out.status, out.dw0,
                     nvme::memory_scope::device);
  }
  if (lane == leader) dev_atomic<std::uint64_t>(q.served).fetch_add(n, cuda::memory_order_relaxed);
  return k;
}

} // namespace bam::emu::detail
