// SPDX-License-Identifier: MIT
//! The queue protocol: one NVMe submission/completion queue pair shared by
//! many concurrent submitters, CPU threads or GPU threads alike.
//!
//! How it works:
//!  - A submitter takes a *ticket* (one atomic add). The ticket fixes its SQ
//!    slot (`ticket % sq_depth`) and its command id (`ticket % ncids`, with
//!    `ncids = sq_depth - 1`). The ticket waits until the previous user of
//!    that command id has collected its completion, and until the controller
//!    has fetched past the slot (the SQ head read back from completions).
//!    At most `sq_depth - 1` commands are ever in flight, so neither the SQ
//!    nor a CQ of the same depth can be overrun.
//!  - It writes the 64-byte entry and sets the slot's *ready mark* to
//!    `ticket + 1` (never ambiguous across wrap-arounds).
//!  - Whoever holds the doorbell lock advances the published tail over every
//!    contiguous ready slot and writes the SQ tail doorbell once per batch.
//!  - Whoever holds the completion lock consumes new CQ entries (phase tag
//!    tracked from the virtual head), files each one under its command id,
//!    records the SQ head it reports, and writes the CQ head doorbell once
//!    per batch.
//!  - Every wait has a deadline. A timeout marks the queue *broken*: its
//!    command ids may still complete later, so nothing is reused and every
//!    later call returns `status_queue_broken` instead of spinning.
//!
//! The same code is compiled by g++ (CPU threads, ThreadSanitizer) and nvcc.
//!
//! @code
//!   bam::nvme::queue_pair_ref q = ...;              // from a controller
//!   auto cmd = bam::nvme::make_read(1, lba, 8, prp1, prp2);
//!   bam::nvme::status st = q.execute(cmd);          // submit + wait
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

namespace bam::nvme {

namespace detail {

template <class T>
using device_atomic = cuda::atomic_ref<T, cuda::thread_scope_device>;
template <class T>
using system_atomic = cuda::atomic_ref<T, cuda::thread_scope_system>;

//! Cache-line-separated counters of one queue pair. All zero is the initial state.
struct queue_counters {
  alignas(128) std::uint64_t ticket;  //!< next ticket to hand out
  alignas(128) std::uint64_t sq_tail; //!< published tail, virtual (never wraps)
  std::uint32_t sq_lock;              //!< doorbell writer lock
  alignas(128) std::uint64_t cq_head; //!< consumed CQ entries, virtual
  std::uint64_t sq_head;              //!< SQ head from completions, virtual
  std::uint32_t sq_head_pos;          //!< last SQ head position reported
  std::uint32_t cq_lock;              //!< completion consumer lock
  alignas(128) std::uint32_t broken;  //!< set by a timeout; sticky
  std::uint64_t submitted;            //!< commands rung (statistics)
  std::uint64_t doorbells;            //!< SQ doorbell writes (statistics)
};

} // namespace detail

//! Where the completion of one command is delivered when the submitter keeps
//! several commands in flight (see `queue_pair_ref::submit`). Any thread that
//! consumes completions may fill it, so it must live in memory every submitter
//! can write through the same pointer: host memory for CPU threads, global (or
//! mapped host) memory for GPU threads — not shared memory, not a local
//! variable. It must outlive its command, also after a timeout (a late
//! completion may still be delivered there; a timed-out record is leaked).
struct completion_record {
  std::uint32_t done = 0;   //!< 1 once filled
  std::uint32_t status = 0; //!< completion status (without phase)
  std::uint32_t dw0 = 0;    //!< completion dword 0
  std::uint32_t reserved = 0;
};
static_assert(sizeof(completion_record) == 16);

namespace detail {

//! Per command id: who may use it next and what its completion said.
struct cid_state {
  std::uint32_t free_turn;   //!< turn (ticket / ncids) allowed to use this id
  std::uint32_t done;        //!< 1 once the completion is filed here
  std::uint32_t dw0;         //!< completion dword 0
  std::uint32_t status;      //!< completion status (without phase)
  completion_record* record; //!< if set, the completion goes there and the id is freed at once
  std::uint64_t reserved;
};
static_assert(sizeof(cid_state) == 32);

BAM_HD inline void mmio_write32(volatile std::uint32_t* reg, std::uint32_t value) {
#if BAM_DEVICE_CODE
  cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
  *reg = value;
#else
  system_atomic<std::uint32_t>(*const_cast<std::uint32_t*>(reg))
      .store(value, cuda::memory_order_release);
#endif
}

struct no_prepare {
  BAM_HD void operator()(command&, std::uint32_t) const {}
};
struct no_idle {
  BAM_HD void operator()() const {}
};

} // namespace detail


//! Largest command-id space the protocol uses per queue (CID is 16 bits).
inline constexpr std::uint32_t max_cids = 65535;
//! Default deadline of one wait: generous for a real SSD under load.
inline constexpr std::uint64_t default_queue_timeout_ns = 10'000'000'000ull;

//! Bytes of submitter-side state for a queue of `sq_depth` entries (zero-fill to initialize).
BAM_HD constexpr std::size_t queue_state_bytes(std::uint32_t sq_depth) {
  return sizeof(detail::queue_counters) + sizeof(std::uint64_t) * sq_depth +
         sizeof(detail::cid_state) * (sq_depth - 1);
}

//! A trivially copyable handle to one I/O (or admin) queue pair. The memory it
//! points at is owned elsewhere (the controller driver, or a GPU queue set).
struct queue_pair_ref {
  command* sq = nullptr;                      //!< SQ ring, sq_depth entries
  completion* cq = nullptr;                   //!< CQ ring, cq_depth entries
  volatile std::uint32_t* sq_doorbell = nullptr;
  volatile std::uint32_t* cq_doorbell = nullptr;
  detail::queue_counters* counters = nullptr; //!< start of the state block
  std::uint64_t* ready = nullptr;             //!< ready mark per SQ slot
  detail::cid_state* cids = nullptr;          //!< per command id
  std::uint32_t sq_depth = 0;
  std::uint32_t cq_depth = 0;
  std::uint32_t ncids = 0;
  std::uint16_t qid = 0;
  std::uint64_t timeout_ns = default_queue_timeout_ns;

  //! Point the handle's state at `state`, a zero-filled block of
  //! `queue_state_bytes(sq_depth)` bytes.
  BAM_HD void attach_state(void* state) {
    auto* base = static_cast<unsigned char*>(state);
    counters = reinterpret_cast<detail::queue_counters*>(base);
    ready = reinterpret_cast<std::uint64_t*>(base + sizeof(detail::queue_counters));
    cids = reinterpret_cast<detail::cid_state*>(base + sizeof(detail::queue_counters) +
                                                sizeof(std::uint64_t) * sq_depth);
    ncids = sq_depth - 1;
  }

  BAM_HD bool broken() const {
    return detail::device_atomic<std::uint32_t>(counters->broken).load(cuda::memory_order_relaxed) != 0;
  }
  BAM_HD void mark_broken() const {
    detail::device_atomic<std::uint32_t>(counters->broken).store(1, cuda::memory_order_relaxed);
  }

  //! Submit `cmd`. `prepare(command&, cid)` runs once the command id is known
  //! and before the entry is written (to point PRP2 at a per-cid list, say).
  //! On success `ticket` identifies the command for `wait`.
  //!
  //! Without a `record`, the completion waits under its command id until
  //! `wait(ticket)` collects it, and the id is reused only after that: fine
  //! for a thread that submits and then waits. A thread that keeps several
  //! commands in flight must pass a `completion_record` per command: its
  //! completion is delivered there and the id is freed when it is consumed,
  //! so threads blocked in `submit` never wait on results nobody collects.
  BAM_EXEC_CHECK_DISABLE
  template <class Prepare, class Idle>
  BAM_HD status submit(command cmd, std::uint64_t& ticket, Prepare&& prepare, Idle&& idle,
                       completion_record* record = nullptr) const {
    using detail::device_atomic;
    if (broken()) return status_queue_broken;
    const std::uint64_t t =
        device_atomic<std::uint64_t>(counters->ticket).fetch_add(1, cuda::memory_order_relaxed);
    const std::uint32_t cid = static_cast<std::uint32_t>(t % ncids);
    const std::uint32_t turn = static_cast<std::uint32_t>(t / ncids);
    // A ticket deep in a backlog may wait long for its turn: the deadline is
    // "no completion on this queue for timeout_ns", restarted on progress.
    std::uint64_t deadline = bam::detail::now_ns() + timeout_ns;
    device_atomic<std::uint64_t> cq_head(counters->cq_head);
    std::uint64_t progress = cq_head.load(cuda::memory_order_relaxed);
    bam::detail::backoff pause;

    // 1. The command id must be free: its previous user has collected its completion.
    device_atomic<std::uint32_t> free_turn(cids[cid].free_turn);
    while (free_turn.load(cuda::memory_order_acquire) != turn) {
      if (broken()) return status_queue_broken;
      const std::uint64_t now = bam::detail::now_ns();
      const std::uint64_t seen = cq_head.load(cuda::memory_order_relaxed);
      if (seen != progress) {
        progress = seen;
        deadline = now + timeout_ns;
      } else if (now > deadline) {
        mark_broken();
        return status_queue_full;
      }
      ring();
      idle();
      poll();
      pause();
    }
    // 2. The controller must have fetched past this slot's previous entry.
    //    (Implied by 1 for a controller that reports SQ heads correctly; checked
    //    because a full SQ must never be overrun.)
    device_atomic<std::uint64_t> sq_head(counters->sq_head);
    while (t >= sq_head.load(cuda::memory_order_acquire) + sq_depth - 1) {
      if (broken()) return status_queue_broken;
      if (bam::detail::now_ns() > deadline) {
        mark_broken();
        return status_queue_full;
      }
      ring();
      idle();
      poll();
      pause();
    }
    cmd.cid = static_cast<std::uint16_t>(cid);
    prepare(cmd, cid);
    cids[cid].record = record;
    if (record != nullptr) record->done = 0;
    sq[t % sq_depth] = cmd;
    device_atomic<std::uint64_t>(ready[t % sq_depth]).store(t + 1, cuda::memory_order_release);
    // Store-load ordering with ring()'s lock check (a Dekker pattern): either we
    // see the lock free and publish, or the holder's re-check sees our mark.
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_device);
    ticket = t;
    ring();
    return status_success;
  }

  BAM_EXEC_CHECK_DISABLE
  template <class Prepare>
  BAM_HD status submit(command cmd, std::uint64_t& ticket, Prepare&& prepare) const {
    return submit(cmd, ticket, static_cast<Prepare&&>(prepare), detail::no_idle{});
  }
  BAM_HD status submit(command cmd, std::uint64_t& ticket) const {
    return submit(cmd, ticket, detail::no_prepare{}, detail::no_idle{});
  }
  //! Submit with the completion delivered to `record` (see above).
  BAM_HD status submit(command cmd, std::uint64_t& ticket, completion_record& record) const {
    record.done = 0;
    return submit(cmd, ticket, detail::no_prepare{}, detail::no_idle{}, &record);
  }

  //! Publish every contiguous ready slot with one SQ doorbell write.
  //! Returns without waiting if another thread holds the doorbell.
  BAM_HD void ring() const {
    using detail::device_atomic;
    device_atomic<std::uint32_t> lock(counters->sq_lock);
    device_atomic<std::uint64_t> tail_ref(counters->sq_tail);
    for (;;) {
      if (lock.load(cuda::memory_order_relaxed) != 0) return;
      if (lock.exchange(1, cuda::memory_order_acquire) != 0) return;
      std::uint64_t tail = tail_ref.load(cuda::memory_order_relaxed);
      const std::uint64_t start = tail;
      while (device_atomic<std::uint64_t>(ready[tail % sq_depth]).load(cuda::memory_order_acquire) ==
             tail + 1) {
        ++tail;
      }
      if (tail != start) {
        detail::mmio_write32(sq_doorbell, static_cast<std::uint32_t>(tail % sq_depth));
        tail_ref.store(tail, cuda::memory_order_relaxed);
        device_atomic<std::uint64_t>(counters->submitted)
            .fetch_add(tail - start, cuda::memory_order_relaxed);
        device_atomic<std::uint64_t>(counters->doorbells).fetch_add(1, cuda::memory_order_relaxed);
      }
      lock.store(0, cuda::memory_order_release);
      // A slot marked ready while we held the lock may have seen the lock
      // taken and left: look once more so that no entry is left unpublished.
      // The fence pairs with the one in submit() (store-load ordering).
      cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_device);
      if (device_atomic<std::uint64_t>(ready[tail % sq_depth]).load(cuda::memory_order_acquire) !=
          tail + 1)
        return;
    }
  }

  //! Consume new completions, if no other thread is doing so. Returns the
  //! number consumed.
  BAM_HD std::uint32_t poll() const {
    using detail::device_atomic;
    using detail::system_atomic;
    device_atomic<std::uint32_t> lock(counters->cq_lock);
    if (lock.load(cuda::memory_order_relaxed) != 0) return 0;
    if (lock.exchange(1, cuda::memory_order_acquire) != 0) return 0;
    device_atomic<std::uint64_t> cq_head(counters->cq_head);
    std::uint64_t head = cq_head.load(cuda::memory_order_relaxed);
    std::uint32_t consumed = 0;
    // Stop after one ring's worth so a fast controller cannot starve the doorbell.
    while (consumed < cq_depth) {
      completion* entry = &cq[head % cq_depth];
      const std::uint32_t expected_phase = ((head / cq_depth) & 1) ? 0u : 1u;
      // Dword 3 holds the CID and the status with the phase tag.
      auto* dw3 = reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(entry) + 12);
      const std::uint32_t w = system_atomic<std::uint32_t>(*dw3).load(cuda::memory_order_acquire);
      if (((w >> 16) & 1u) != expected_phase) break;
      const std::uint32_t cid = w & 0xffffu;
      const std::uint16_t st = static_cast<std::uint16_t>(w >> 17);
      const std::uint32_t dw0 = entry->dw0;
      const std::uint32_t sq_head_pos = entry->sq_head;
      // Account for how far the controller has fetched.
      const std::uint32_t delta =
          (sq_head_pos + sq_depth - counters->sq_head_pos) % sq_depth;
      counters->sq_head_pos = sq_head_pos;
      device_atomic<std::uint64_t>(counters->sq_head)
          .store(counters->sq_head + delta, cuda::memory_order_release);
      if (cid < ncids) {
        completion_record* rec = cids[cid].record;
        if (rec != nullptr) {
          // Deliver, then free the id for its next turn right away.
          rec->dw0 = dw0;
          rec->status = st;
          cids[cid].record = nullptr;
          device_atomic<std::uint32_t>(rec->done).store(1, cuda::memory_order_release);
          device_atomic<std::uint32_t> free_turn(cids[cid].free_turn);
          free_turn.store(free_turn.load(cuda::memory_order_relaxed) + 1, cuda::memory_order_release);
        } else {
          cids[cid].dw0 = dw0;
          cids[cid].status = st;
          device_atomic<std::uint32_t>(cids[cid].done).store(1, cuda::memory_order_release);
        }
      }
      ++head;
      ++consumed;
    }
    if (consumed != 0) {
      cq_head.store(head, cuda::memory_order_relaxed);
      detail::mmio_write32(cq_doorbell, static_cast<std::uint32_t>(head % cq_depth));
    }
    lock.store(0, cuda::memory_order_release);
    return consumed;
  }

  //! Wait for the completion of `ticket`; returns its status and, if asked,
  //! completion dword 0. Consumes completions (for everyone) while waiting.
  //! `idle()` runs on every round of the wait: an engine that serves the
  //! queue from the waiting threads themselves does its work there.
  BAM_EXEC_CHECK_DISABLE
  template <class Idle>
  BAM_HD status wait(std::uint64_t ticket, std::uint32_t* dw0, Idle&& idle) const {
    using detail::device_atomic;
    const std::uint32_t cid = static_cast<std::uint32_t>(ticket % ncids);
    const std::uint32_t turn = static_cast<std::uint32_t>(ticket / ncids);
    device_atomic<std::uint32_t> done(cids[cid].done);
    const status waited =
        drive_until([&] { return done.load(cuda::memory_order_acquire) != 0; }, idle);
    if (!waited.ok()) return waited;
    const status st(static_cast<std::uint16_t>(cids[cid].status));
    if (dw0 != nullptr) *dw0 = cids[cid].dw0;
    done.store(0, cuda::memory_order_relaxed);
    device_atomic<std::uint32_t>(cids[cid].free_turn).store(turn + 1, cuda::memory_order_release);
    return st;
  }

  BAM_HD status wait(std::uint64_t ticket, std::uint32_t* dw0 = nullptr) const {
    return wait(ticket, dw0, detail::no_idle{});
  }

  //! Wait for a command submitted with a `completion_record`.
  BAM_EXEC_CHECK_DISABLE
  template <class Idle>
  BAM_HD status wait(const completion_record& record, std::uint32_t* dw0, Idle&& idle) const {
    detail::device_atomic<std::uint32_t> done(const_cast<std::uint32_t&>(record.done));
    const status waited =
        drive_until([&] { return done.load(cuda::memory_order_acquire) != 0; }, idle);
    if (!waited.ok()) return waited;
    if (dw0 != nullptr) *dw0 = record.dw0;
    return status(static_cast<std::uint16_t>(record.status));
  }
  BAM_HD status wait(const completion_record& record, std::uint32_t* dw0 = nullptr) const {
    return wait(record, dw0, detail::no_idle{});
  }

  //! Drive the queue (publish, `idle()`, consume completions) until `filed()`
  //! holds. Returns success, or the timeout (which breaks the queue) or
  //! broken status. The deadline counts from the call.
  BAM_EXEC_CHECK_DISABLE
  template <class Filed, class Idle>
  BAM_HD status drive_until(Filed&& filed, Idle&& idle) const {
    const std::uint64_t deadline = bam::detail::now_ns() + timeout_ns;
    bam::detail::backoff pause;
    for (;;) {
      if (filed()) return status{};
      ring();
      idle();
      if (poll() != 0) continue;
      if (broken()) return status_queue_broken;
      if (bam::detail::now_ns() > deadline) {
        mark_broken();
        return status_timeout;
      }
      pause();
    }
  }

  //! Submit and wait.
  BAM_EXEC_CHECK_DISABLE
  template <class Prepare>
  BAM_HD status execute(command cmd, Prepare&& prepare, std::uint32_t* dw0 = nullptr) const {
    std::uint64_t ticket = 0;
    const status st = submit(cmd, ticket, static_cast<Prepare&&>(prepare));
    if (!st.ok()) return st;
    return wait(ticket, dw0);
  }
  BAM_HD status execute(command cmd, std::uint32_t* dw0 = nullptr) const {
    return execute(cmd, detail::no_prepare{}, dw0);
  }
};

} // namespace bam::nvme
