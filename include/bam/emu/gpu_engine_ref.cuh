// SPDX-License-Identifier: MIT
//! Device side of the software controller's GPU engine: serves NVMe I/O
//! queues that live in GPU memory, on the GPU, from the threads that wait on
//! them. There is no persistent server kernel (see gpu-machine.md for the two
//! hazards one has): a GPU thread that waits for a completion calls
//! `gpu_engine_ref::serve(qid, poll)` from the `idle` hook of
//! `queue_pair_ref::submit/wait`, and in it
//!   1. claims one fetched SQ entry (atomic virtual SQ head against the tail
//!      doorbell word it reads from GPU memory) and copies the 64-byte entry,
//!   2. publishes the fetch in order (the SQ head reported back must never
//!      pass an entry not yet copied),
//!   3. executes it: walks the PRPs with `nvme::walk_prp` and copies between
//!      the media (pinned host RAM, HBM, or nothing) and the targets; with
//!      identity DMA a bus address is a GPU/UVA pointer,
//!   4. applies the optional SSD model (IOPS limit, latency),
//!   5. reserves a CQ slot, waits for CQ space (the CQ head doorbell), writes
//!      dwords 0..2 and then dword 3 with a release store carrying the phase.
//! Completions are therefore posted by many threads in parallel, out of order
//! across slots; the consumer (`queue_pair_ref::poll`) stops at the first slot
//! whose phase has not flipped yet.
//!
//! @code
//!   auto idle = [&] { engine.serve(q.qid, [&] { q.poll(); }); };
//!   q.wait(ticket, nullptr, idle);
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/gpu/memory_ops.cuh>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstdint>

namespace bam::emu {

//! Where the GPU engine keeps a namespace's blocks.
enum class gpu_media_kind : std::uint32_t {
  host_ram = 0, //!< pinned host memory, mapped into the GPU (PCIe-bound like an SSD array)
  hbm = 1,      //!< GPU memory
  null = 2,     //!< no data: reads leave the target alone, writes are dropped
};

//! Engine-side state of one I/O queue pair (GPU memory, zeroed when created).
struct gpu_engine_queue {
  nvme::command* sq;
  nvme::completion* cq;
  std::uint32_t sq_depth;
  std::uint32_t cq_depth;
  std::uint32_t active; //!< 1 while the queue exists
  std::uint16_t qid;
  std::uint16_t cqid;
  alignas(128) std::uint64_t sq_claim;   //!< virtual SQ head: entries claimed
  alignas(128) std::uint64_t sq_fetched; //!< entries copied out, advanced in order
  alignas(128) std::uint64_t cq_reserve; //!< CQ slots handed out, virtual
  alignas(128) std::uint64_t cq_head;    //!< lower bound of the consumer's virtual head
  std::uint64_t served;                  //!< commands completed (statistics)
};

//! Fault injection and the SSD model; lives in GPU memory so a test can change it between kernels.
struct gpu_engine_control {
  std::uint32_t paused;        //!< 1: the controller stops answering (nothing is served)
  std::uint32_t error_status;  //!< nonzero: status (sct<<8|sc) for commands touching [error_lba_lo, error_lba_hi)
  std::uint64_t error_lba_lo;
  std::uint64_t error_lba_hi;
  std::uint64_t ns_per_io;     //!< IOPS limit as a minimum spacing of command starts (0: none)
  std::uint64_t latency_ns;    //!< added latency per command (0: none)
  alignas(128) std::uint64_t next_start_ns; //!< token of the IOPS limiter
};

//! Trivially copyable handle to a GPU engine, passed to kernels by value.
struct gpu_engine_ref {
  gpu_engine_queue* queues = nullptr; //!< indexed by queue id (0 unused: admin stays on the CPU)
  std::uint32_t* doorbells = nullptr; //!< doorbell words, index (offset - 0x1000) / 4 (DSTRD 0)
  gpu_engine_control* control = nullptr;
  std::uint8_t* media = nullptr;      //!< device-accessible pointer (host_ram, hbm); null for null media
  std::uint64_t media_bytes = 0;
  std::uint64_t nblocks = 0;          //!< namespace 1 size in blocks
  std::uint32_t lba_size = 512;
  std::uint32_t nsid = 1;
  std::uint32_t max_qid = 0;
  gpu_media_kind media_kind = gpu_media_kind::null;
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns; //!< bound of every engine wait

  //! Serve at most one command of queue `qid`. `poll()` consumes completions
  //! (the queue's own `poll`) while waiting for CQ space, so that a CQ filled
  //! by engine threads never waits for a consumer that is itself serving.
  //! Returns true if a command was served.
  template <class Poll>
  BAM_DEVICE bool serve(std::uint16_t qid, Poll&& poll) const;

  //! Execute one command against the media (no queue involved).
  BAM_DEVICE nvme::status execute(const nvme::command& cmd) const;
};

namespace detail {

template <class T>
using dev_atomic = cuda::atomic_ref<T, cuda::thread_scope_device>;
template <class T>
using sys_atomic = cuda::atomic_ref<T, cuda::thread_scope_system>;

//! Copy `len` bytes with the widest accesses both pointers allow. Loads and
//! stores bypass L1 (which is not coherent): the bytes were written, or will
//! be read, by other SMs.
BAM_DEVICE inline void copy_bytes(void* dst, const void* src, std::uint64_t len) {
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  if (((d | s | len) & 15u) == 0) {
    auto* dv = static_cast<uint4*>(dst);
    const auto* sv = static_cast<const uint4*>(src);
    const std::uint64_t n = len / 16;
    std::uint64_t i = 0;
    // Eight independent loads in flight: PCIe reads from pinned host memory are latency-bound.
    for (; i + 8 <= n; i += 8) {
      uint4 r[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) r[k] = gpu::ld_cg(sv + i + k);
#pragma unroll
      for (int k = 0; k < 8; ++k) gpu::st_cg(dv + i + k, r[k]);
    }
    for (; i < n; ++i) gpu::st_cg(dv + i, gpu::ld_cg(sv + i));
  } else if (((d | s | len) & 3u) == 0) {
    auto* dv = static_cast<unsigned int*>(dst);
    const auto* sv = static_cast<const unsigned int*>(src);
    for (std::uint64_t i = 0; i < len / 4; ++i) gpu::st_cg(dv + i, gpu::ld_cg(sv + i));
  } else {
    auto* dv = static_cast<unsigned char*>(dst);
    const auto* sv = static_cast<const unsigned char*>(src);
    for (std::uint64_t i = 0; i < len; ++i) dv[i] = sv[i];
  }
}

} // namespace detail

BAM_DEVICE inline nvme::status gpu_engine_ref::execute(const nvme::command& cmd) const {
  using namespace bam::nvme;
  const status invalid_opcode_st{status_type::generic, generic_status::invalid_opcode, true};
  const status invalid_ns_st{status_type::generic, generic_status::invalid_namespace, true};
  const status out_of_range_st{status_type::generic, generic_status::lba_out_of_range, true};

  const auto op = cmd.opcode;
  const bool is_read = op == static_cast<std::uint8_t>(nvm_opcode::read);
  const bool is_write = op == static_cast<std::uint8_t>(nvm_opcode::write);
  if (op == static_cast<std::uint8_t>(nvm_opcode::flush)) {
    // Media in RAM/HBM is as durable as it gets; make the writes visible system-wide.
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
    return status_success;
  }
  if (!is_read && !is_write) return invalid_opcode_st;
  if (cmd.nsid != nsid) return invalid_ns_st;
  const std::uint64_t slba = command_slba(cmd);
  const std::uint32_t nlb = command_nblocks(cmd);
  if (slba >= nblocks || nlb > nblocks - slba) return out_of_range_st;
  if (control != nullptr && control->error_status != 0) {
    const std::uint64_t lo = control->error_lba_lo, hi = control->error_lba_hi;
    if (slba < hi && slba + nlb > lo) return status(static_cast<std::uint16_t>(control->error_status));
  }
  if (media_kind == gpu_media_kind::null || media == nullptr) return status_success;

  std::uint8_t* base = media + slba * lba_size;
  std::uint64_t done = 0;
  auto read_list = [](std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
    const auto* src = reinterpret_cast<const unsigned long long*>(bus);
    for (std::size_t i = 0; i < n; ++i) dst[i] = gpu::ld_cg(src + i); // written by another SM, in order
    return true;
  };
  auto segment = [&](std::uint64_t bus, std::uint64_t len) {
    void* target = reinterpret_cast<void*>(bus);
    if (is_read) detail::copy_bytes(target, base + done, len);
    else detail::copy_bytes(base + done, target, len);
    done += len;
    return true;
  };
  return nvme::walk_prp(cmd.prp1, cmd.prp2, static_cast<std::uint64_t>(nlb) * lba_size, 4096,
                                 read_list, segment);
}

template <class Poll>
BAM_DEVICE bool gpu_engine_ref::serve(std::uint16_t qid, Poll&& poll) const {
  using detail::dev_atomic;
  using detail::sys_atomic;
  if (qid == 0 || qid > max_qid) return false;
  if (control != nullptr && dev_atomic<std::uint32_t>(control->paused).load(cuda::memory_order_relaxed))
    return false;
  gpu_engine_queue& q = queues[qid];
  if (dev_atomic<std::uint32_t>(q.active).load(cuda::memory_order_acquire) == 0) return false;
  const std::uint32_t depth = q.sq_depth;

  // 1. Claim one entry between our virtual head and the tail doorbell.
  // The claim count must be read before the doorbell (acquire orders the two):
  // a doorbell older than the claim could wrap around and make an entry not
  // yet written look fetchable.
  dev_atomic<std::uint64_t> claim(q.sq_claim);
  std::uint64_t c = claim.load(cuda::memory_order_acquire);
  const std::uint32_t db = sys_atomic<std::uint32_t>(doorbells[2 * qid]).load(cuda::memory_order_acquire);
  if (db >= depth) return false; // an invalid doorbell value: ignore it
  const std::uint64_t tail = c + (db + depth - c % depth) % depth;
  if (c >= tail) return false;
  if (!claim.compare_exchange_strong(c, c + 1, cuda::memory_order_acq_rel)) return false;
  nvme::command cmd;
  {
    // Not through L1: the slot was written by a submitter on another SM.
    const auto* src = reinterpret_cast<const uint4*>(&q.sq[c % depth]);
    auto* dst = reinterpret_cast<uint4*>(&cmd);
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[k] = gpu::ld_cg(src + k);
  }

  // 2. Publish the fetch in order.
  const std::uint64_t deadline = bam::detail::now_ns() + timeout_ns;
  dev_atomic<std::uint64_t> fetched(q.sq_fetched);
  while (fetched.load(cuda::memory_order_acquire) != c) {
    if (bam::detail::now_ns() > deadline) return false; // the queue times out on the submitter side
    bam::detail::relax(32);
  }
  fetched.store(c + 1, cuda::memory_order_release);

  // 3./4. Execute, then hold the completion back as the SSD model says.
  const std::uint64_t start = bam::detail::now_ns();
  nvme::status st = execute(cmd);
  if (control != nullptr && (control->ns_per_io != 0 || control->latency_ns != 0)) {
    std::uint64_t due = start + control->latency_ns;
    if (control->ns_per_io != 0) {
      dev_atomic<std::uint64_t> next(control->next_start_ns);
      std::uint64_t old = next.load(cuda::memory_order_relaxed);
      std::uint64_t slot;
      do {
        slot = old > start ? old : start;
      } while (!next.compare_exchange_weak(old, slot + control->ns_per_io, cuda::memory_order_relaxed));
      due = slot + control->latency_ns;
    }
    while (bam::detail::now_ns() < due) bam::detail::relax(256);
  }

  // 5. Reserve a CQ slot and wait for room (the consumer's head doorbell).
  gpu_engine_queue& cq = queues[q.cqid]; // CQ producer counters live under the CQ's id
  const std::uint32_t cdepth = q.cq_depth;
  const std::uint64_t v = dev_atomic<std::uint64_t>(cq.cq_reserve).fetch_add(1, cuda::memory_order_relaxed);
  dev_atomic<std::uint64_t> head(cq.cq_head);
  for (;;) {
    std::uint64_t h = head.load(cuda::memory_order_acquire);
    if (v < h + cdepth - 1) break;
    const std::uint32_t d =
        sys_atomic<std::uint32_t>(doorbells[2 * q.cqid + 1]).load(cuda::memory_order_acquire);
    if (d < cdepth) {
      // The consumer's head is in [h, h + cdepth - 1]: the doorbell position fixes it.
      const std::uint64_t now_head = h + (d + cdepth - h % cdepth) % cdepth;
      head.fetch_max(now_head, cuda::memory_order_acq_rel);
      if (v < now_head + cdepth - 1) break;
    }
    if (bam::detail::now_ns() > deadline) return true; // dropped: the submitter times out
    poll();
    bam::detail::relax(64);
  }
  nvme::completion* e = &q.cq[v % cdepth];
  const std::uint32_t phase = ((v / cdepth) & 1) ? 0u : 1u;
  e->dw0 = 0;
  e->dw1 = 0;
  // The SQ head reported must never pass an entry not yet copied, and must
  // not go backwards in CQ order (the consumer adds up the differences).
  // Completions are posted out of fetch order, so report the count of CQ
  // slots up to this one: each belongs to a command already fetched (one SQ
  // per CQ, as bam's driver creates them), so it is a safe, monotonic bound.
  const std::uint32_t sq_head_pos = static_cast<std::uint32_t>((v + 1) % depth);
  reinterpret_cast<std::uint32_t*>(e)[2] = sq_head_pos | (static_cast<std::uint32_t>(qid) << 16);
  const std::uint32_t dw3 = static_cast<std::uint32_t>(cmd.cid) |
                            ((static_cast<std::uint32_t>(st.raw) << 1 | phase) << 16);
  sys_atomic<std::uint32_t>(reinterpret_cast<std::uint32_t*>(e)[3]).store(dw3, cuda::memory_order_release);
  dev_atomic<std::uint64_t>(q.served).fetch_add(1, cuda::memory_order_relaxed);
  return true;
}

} // namespace bam::emu
