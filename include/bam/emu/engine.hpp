// SPDX-License-Identifier: MIT
//! The interface between the software controller and the engines that serve
//! its queues, and the one completion writer every engine posts with.
//!
//! The controller decodes registers and admin commands; an engine fetches
//! submission queue entries, has them executed (`emu::process_nvm`, the one
//! command executor) and posts completions (`emu::write_completion`). The
//! CPU engine (`cpu_engine.hpp`) serves the admin queue always and the I/O
//! queues by default; another engine (the GPU engine, or the CPU engine for
//! GPU clients) can serve the I/O queues instead (`controller_config::io_engine`).
//!
//! Rules for an engine:
//!  - Read doorbells with acquire loads; post a completion with
//!    `write_completion`: dwords 0..2 plainly, then dword 3 (cid, phase,
//!    status) with a release store.
//!  - Never overwrite an unconsumed completion: a full CQ (per its head
//!    doorbell) makes the engine wait.
//!  - Report in every completion an SQ head that no unfetched entry is behind.
//!
//! @code
//!   class my_engine : public bam::emu::io_engine {
//!     void queue_created(const bam::emu::queue_info& q) override { ... start serving q ... }
//!     void queue_deleted(std::uint16_t sqid) override { ... stop, then return ... }
//!     void reset() override { ... forget every queue ... }
//!   };
//!   cfg.io_engine = std::make_shared<my_engine>();
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/emu/fault_table.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/device_progress.hpp>

#include <cuda/atomic>

#include <atomic>
#if defined(__linux__)
#include <sys/prctl.h>
#endif
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace bam::emu {

//! The result of processing one fetched command.
struct command_outcome {
  nvme::status status;        //!< completion status
  std::uint32_t dw0 = 0;      //!< completion dword 0
  bool drop = false;          //!< never complete it (fault injection)
  std::uint64_t delay_ns = 0; //!< post the completion this much later
};

//! Counters of the NVM commands executed, as the SMART / Health log reports
//! them. Updated with relaxed atomics by any engine.
struct nvm_counters {
  std::uint64_t units_read;    //!< 512-byte units read
  std::uint64_t units_written; //!< 512-byte units written
  std::uint64_t host_reads;    //!< read commands completed
  std::uint64_t host_writes;   //!< write commands completed
  std::uint64_t media_errors;
  std::uint64_t flushes; //!< Flush commands completed
};

//! Write completion `v` (virtual: slot `v % depth`, phase from `v / depth`)
//! into a CQ ring: dwords 0..2, then dword 3 with a release store in `scope`
//! (the consumer's). The one completion writer of every engine.
BAM_HD inline void write_completion(nvme::completion* ring, std::uint32_t depth, std::uint64_t v, std::uint16_t sq_head,
                                    std::uint16_t sqid, std::uint16_t cid, nvme::status st, std::uint32_t dw0,
                                    nvme::memory_scope scope) {
  nvme::completion* e = &ring[v % depth];
  const std::uint32_t phase = ((v / depth) & 1) ? 0u : 1u;
  nvme::cqe_dw2 d2{};
  d2.bits.sq_head = sq_head;
  d2.bits.sq_id = sqid;
  auto* words = reinterpret_cast<std::uint32_t*>(e);
  words[0] = dw0;
  words[1] = 0;
  words[2] = d2.raw;
  const nvme::cqe_dw3 d3 = nvme::cqe_dw3::make(cid, st, phase);
  if (scope == nvme::memory_scope::system)
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(words[3]).store(d3.raw, cuda::memory_order_release);
  else
    cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device>(words[3]).store(d3.raw, cuda::memory_order_release);
}

//! The consumer's virtual CQ head, from the last one known (`known`, never
//! ahead of it) and the head doorbell's slot position. An out-of-range
//! doorbell value leaves `known` as it is.
BAM_HD inline std::uint64_t consumer_head(std::uint64_t known, std::uint32_t doorbell, std::uint32_t depth) {
  if (doorbell >= depth) return known;
  return known + (doorbell + depth - known % depth) % depth;
}

//! Producer-side state of one completion queue, for engines whose threads
//! run on the host. Owned by the controller from Create I/O CQ to Delete I/O
//! CQ; touched only by the engine thread serving it.
struct cq_state {
  nvme::completion* ring = nullptr; //!< CQ entries (virtual address)
  std::uint32_t depth = 0;
  std::uint32_t* head_doorbell = nullptr; //!< CQ head doorbell in the register file
  std::uint16_t cqid = 0;
  std::uint64_t tail = 0;     //!< completions posted, virtual
  std::uint64_t head = 0;     //!< consumer's head, virtual, as last read from the doorbell
  std::uint32_t promised = 0; //!< slots promised to completions not posted yet
};

struct nvm_target; // nvm_executor.hpp

//! One submission queue as an engine sees it.
struct queue_info {
  std::uint16_t qid = 0;       //!< SQ id (0: admin)
  nvme::command* sq = nullptr; //!< SQ entries (virtual address)
  std::uint32_t sq_depth = 0;
  std::uint32_t* sq_tail_doorbell = nullptr; //!< in the register file
  cq_state* cq = nullptr;                    //!< its completion queue
  std::uint32_t cq_sq_count = 1;             //!< SQs posting to that CQ, this one included
  std::uint64_t sq_bus = 0;                  //!< bus addresses the host gave
  std::uint64_t cq_bus = 0;
  std::uint64_t ready_at_ns = 0; //!< do not fetch before (bam::detail::now_ns clock)
  //! Process one fetched command (fault rules, execution, statistics, error
  //! log) with the controller's host backend. Any thread.
  std::function<command_outcome(const nvme::command&)> process;
  //! What commands execute against, for engines that run the executor with
  //! a backend of their own (data in GPU memory).
  const nvm_target* target = nullptr;
};

//! An engine serving submission queues.
class io_engine {
public:
  virtual ~io_engine() = default;
  //! Start serving a new SQ (its CQ exists). A status other than success
  //! refuses the queue (Create I/O SQ completes with it).
  virtual nvme::status queue_created(const queue_info& q) = 0;
  //! Stop serving SQ `sqid`; completes what it can of its outstanding
  //! commands; returns once the engine no longer touches the queue.
  virtual void queue_deleted(std::uint16_t sqid) = 0;
  //! Controller reset: forget every queue without touching queue memory again.
  virtual void reset() = 0;
  //! A GPU-reachable pointer to a doorbell, if this engine provides one.
  virtual volatile std::uint32_t* device_doorbell(std::uint32_t /*offset*/) { return nullptr; }
  //! Scope of the doorbells behind `device_doorbell`.
  virtual nvme::memory_scope device_doorbell_scope() const { return nvme::memory_scope::system; }
  //! What GPU threads waiting on the queues must do (see transport/device_progress.hpp).
  virtual device_progress device_progress_hook() const { return {}; }
  //! Whether completions carry the SQ fetch position (see `transport::exact_sq_head`).
  virtual bool exact_sq_head() const { return true; }
  //! See `transport::controller_run_ns` (engines run by host threads).
  virtual const std::uint64_t* run_ns(std::uint16_t /*qid*/) const { return nullptr; }
  //! NVM commands this engine executed outside the controller's own counters.
  virtual nvm_counters counters() const { return {}; }
  //! Extra places the controller's fault table must be copied to (the GPU
  //! engine's copy in GPU memory); null if the host copy is all it reads.
  virtual std::unique_ptr<fault_table_memory> fault_table_copy() { return nullptr; }
  //! The controller's doorbell stride (CAP.DSTRD) and namespace layout are
  //! fixed before any queue exists; engines that need them hear it here.
  virtual void attached(std::uint32_t /*dstrd*/) {}
};

namespace detail {

//! An engine thread that found nothing to do keeps looking (yielding the
//! CPU between looks) for this long: a submitter that waits for each
//! completion before its next command (queue depth 1) finds it awake.
inline constexpr std::uint64_t idle_spin_ns = 200'000;

//! How long an engine thread that has found nothing to do for `idle_ns`
//! sleeps before it looks again: none while `idle_spin_ns` lasts, then a
//! fiftieth of the time it has been idle, from 20 us up to 2 ms. A busy
//! storage is answered within microseconds; an idle one costs about 2 % of a
//! core; the first command after a long pause waits at most 2 ms.
inline std::chrono::microseconds idle_nap(std::uint64_t idle_ns) {
  if (idle_ns < idle_spin_ns) return std::chrono::microseconds(0);
  const std::uint64_t us = idle_ns / 50'000;
  return std::chrono::microseconds(us < 20 ? 20 : us > 2000 ? 2000 : us);
}

//! Engine threads sleep for short times: ask the kernel to wake them on
//! time (the default timer slack adds 50 us to every sleep).
inline void precise_sleeps() {
#if defined(__linux__)
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
}

//! A host thread's uninterrupted run time: how long it has run without a
//! gap of more than `max_gap_ns` between two of its rounds (a thread kept
//! off the CPU by a busy host starts over). Published in a word the queues'
//! waiters read before they give up on a command: a controller whose threads
//! did not run is slow, not broken.
struct run_clock {
  static constexpr std::uint64_t max_gap_ns = 10'000'000;
  std::uint64_t since = 0;
  std::uint64_t last = 0;
  void tick(std::uint64_t& word) {
    const std::uint64_t now = bam::detail::now_ns();
    if (last == 0 || now - last > max_gap_ns) since = now;
    last = now;
    std::atomic_ref<std::uint64_t>(word).store(now - since, std::memory_order_release);
  }
};

//! Acquire load of a doorbell the host writes with release stores.
inline std::uint32_t load_doorbell(const std::uint32_t* db) {
  return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(db)).load(std::memory_order_acquire);
}

//! Free CQ slots of a host-served CQ, refreshing the head from its doorbell.
inline std::uint32_t cq_free_slots(cq_state& cq) {
  cq.head = consumer_head(cq.head, load_doorbell(cq.head_doorbell), cq.depth);
  const std::uint64_t used = cq.tail - cq.head;
  const std::uint64_t free = cq.depth - 1 - used;
  return free > cq.promised ? static_cast<std::uint32_t>(free - cq.promised) : 0;
}

//! Post one completion on a host-served CQ. The caller checked for room.
inline void post_completion(cq_state& cq, std::uint16_t sqid, std::uint16_t sq_head, std::uint16_t cid, nvme::status st,
                            std::uint32_t dw0) {
  write_completion(cq.ring, cq.depth, cq.tail++, sq_head, sqid, cid, st, dw0, nvme::memory_scope::system);
}

} // namespace detail

} // namespace bam::emu
