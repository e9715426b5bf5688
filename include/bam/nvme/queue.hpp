// SPDX-License-Identifier: MIT
//! The queue protocol: one NVMe submission/completion queue pair shared by
//! many concurrent submitters, CPU threads or GPU threads alike.
//!
//! How it works:
//!  - A submitter takes a *ticket* (one atomic add; `reserve(n)` takes n in
//!    one add). The ticket fixes its SQ slot (`ticket % sq_depth`) and its
//!    command id (`ticket % ncids`, with `ncids = sq_depth - 1`). The ticket
//!    may be used once the previous user of that command id has collected its
//!    completion and the controller has fetched past the slot (the SQ head
//!    read back from completions): `slot_free(ticket)`. At most
//!    `sq_depth - 1` commands are ever in flight, so neither the SQ nor a CQ
//!    of the same depth can be overrun.
//!  - `publish` writes the 64-byte entry and sets the slot's *ready mark* to
//!    `ticket + 1` (never ambiguous across wrap-arounds).
//!  - `ring`: whoever holds the doorbell lock advances the published tail
//!    over every contiguous ready slot and writes the SQ tail doorbell once
//!    per batch.
//!  - `poll`: whoever holds the completion lock consumes new CQ entries
//!    (phase tag tracked from the virtual head), files each one under its
//!    command id, records the SQ head it reports, and writes the CQ head
//!    doorbell once per batch. An entry naming another SQ, reporting an SQ
//!    head outside the queue or not past the slot of the command id's
//!    current turn (never fetched), or repeating a result already filed is
//!    consumed and dropped: a duplicate or stray completion never completes a command it
//!    is not for. `try_collect(ticket)` picks a filed result up
//!    and frees the command id for its next turn.
//!  - Every wait has a deadline that measures lack of progress of the
//!    controller (`detail::progress_deadline`): while a command waits behind
//!    others not yet fetched, the deadline restarts whenever the queue
//!    completes something; once the controller has fetched it, it must
//!    complete within `timeout_ns`. A timeout marks the queue *broken*: its
//!    command ids may still complete later, so nothing is reused and every
//!    later call returns `status_queue_broken` instead of spinning.
//!
//! The steps never block and never call anyone: the blocking helpers below
//! (`submit`, `wait`, `execute`) loop over them for callers whose controller
//! is served by someone else (a device, CPU engine threads). A caller that
//! has to make progress itself while it waits (the GPU runtime, whose
//! transport may be served by the waiting threads) runs its own loop over
//! the same steps.
//!
//! The same code is compiled by g++ (CPU threads, ThreadSanitizer) and nvcc.
//!
//! @code
//!   bam::nvme::queue_pair_ref q = ctrl.io_queue(0);   // from the driver
//!   auto cmd = bam::nvme::make_read(1, lba, 8, prp1, prp2);
//!   bam::nvme::status st = q.execute(cmd);            // submit + wait
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

namespace bam::nvme {

//! Who must see a store, or whose stores a load must see.
enum class memory_scope : std::uint8_t {
  device, //!< GPU memory touched by GPU threads only (and devices that write it by DMA)
  system, //!< host memory or MMIO: CPU threads, or a device across PCIe
};

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
//! several commands in flight (see `queue_pair_ref::publish`). Any thread that
//! consumes completions may fill it, so it must live in memory every consumer
//! can write through the same pointer: host memory for CPU threads, global (or
//! mapped host) memory for GPU threads — not shared memory, not a local
//! variable. It must outlive its command, also after a timeout (a late
//! completion may still be delivered there; a timed-out record is kept).
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

// On the GPU an acquire invalidates the SM's L1 and a release waits for
// every earlier memory operation of the thread: loads that poll are relaxed
// there, with one acquire fence once the value polled for has arrived, and a
// batch of stores shares one release fence. On the host (where acquire and
// release cost nothing and ThreadSanitizer checks the protocol) they stay
// plain acquire loads and release stores.

//! Memory order of a load that polls.
BAM_HD constexpr cuda::memory_order poll_order() {
#if BAM_DEVICE_CODE
  return cuda::memory_order_relaxed;
#else
  return cuda::memory_order_acquire;
#endif
}
//! After a poll found its value: order the reads that follow after it.
BAM_HD inline void acquire_fence() {
#if BAM_DEVICE_CODE
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
#endif
}
//! Before a batch of publishing stores (made with `publish_order`).
BAM_HD inline void release_fence() {
#if BAM_DEVICE_CODE
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
#endif
}
//! Memory order of a store published by a preceding `release_fence`.
BAM_HD constexpr cuda::memory_order publish_order() {
#if BAM_DEVICE_CODE
  return cuda::memory_order_relaxed;
#else
  return cuda::memory_order_release;
#endif
}

//! An SQ tail doorbell write (a 32-bit register) that every earlier memory
//! operation of this thread reaches before the device sees it.
BAM_HD inline void doorbell_write(volatile std::uint32_t* reg, std::uint32_t value, memory_scope scope) {
#if BAM_DEVICE_CODE
  if (scope == memory_scope::system) {
    // MMIO or host memory: order the SQ entries (GPU or host memory) before
    // the write leaves the GPU.
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
    *reg = value;
  } else {
    device_atomic<std::uint32_t>(*const_cast<std::uint32_t*>(reg)).store(value, cuda::memory_order_release);
  }
#else
  (void)scope;
  system_atomic<std::uint32_t>(*const_cast<std::uint32_t*>(reg)).store(value, cuda::memory_order_release);
#endif
}

//! A CQ head doorbell write: it hands consumed entries back to the device.
//! The loads of those entries have completed (the consumer used their
//! values), and no store of the consumer must reach the device before it,
//! so it needs no fence at all: a fence here would be paid while the
//! completion lock is held.
BAM_HD inline void head_doorbell_write(volatile std::uint32_t* reg, std::uint32_t value, memory_scope scope) {
#if BAM_DEVICE_CODE
  if (scope == memory_scope::system)
    *reg = value;
  else
    device_atomic<std::uint32_t>(*const_cast<std::uint32_t*>(reg)).store(value, cuda::memory_order_relaxed);
#else
  (void)scope;
  system_atomic<std::uint32_t>(*const_cast<std::uint32_t*>(reg)).store(value, cuda::memory_order_release);
#endif
}

//! Load of completion dword 3 in the scope of whoever writes the CQ.
BAM_HD inline std::uint32_t load_cqe_dw3(completion* entry, memory_scope scope, cuda::memory_order order) {
  auto* dw3 = reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(entry) + cqe_dw3_offset);
  if (scope == memory_scope::system) return system_atomic<std::uint32_t>(*dw3).load(order);
  return device_atomic<std::uint32_t>(*dw3).load(order);
}

} // namespace detail

//! Largest command-id space the protocol uses per queue (CID is 16 bits).
inline constexpr std::uint32_t max_cids = 65535;
//! Default deadline of one wait: generous for a real SSD under load.
inline constexpr std::uint64_t default_queue_timeout_ns = 10'000'000'000ull;

//! Bytes of submitter-side state for a queue of `sq_depth` entries (zero-fill to initialize).
BAM_HD constexpr std::size_t queue_state_bytes(std::uint32_t sq_depth) {
  return sizeof(detail::queue_counters) + sizeof(std::uint64_t) * sq_depth + sizeof(detail::cid_state) * (sq_depth - 1);
}
//! Alignment the submitter-side state needs.
inline constexpr std::size_t queue_state_alignment = alignof(detail::queue_counters);

//! A trivially copyable handle to one I/O (or admin) queue pair. The memory it
//! points at is owned elsewhere (the controller driver).
struct queue_pair_ref {
  command* sq = nullptr;    //!< SQ ring, sq_depth entries
  completion* cq = nullptr; //!< CQ ring, cq_depth entries
  volatile std::uint32_t* sq_doorbell = nullptr;
  volatile std::uint32_t* cq_doorbell = nullptr;
  detail::queue_counters* counters = nullptr; //!< start of the state block
  std::uint64_t* ready = nullptr;             //!< ready mark per SQ slot
  detail::cid_state* cids = nullptr;          //!< per command id
  std::uint32_t sq_depth = 0;
  std::uint32_t cq_depth = 0;
  std::uint32_t ncids = 0;
  std::uint16_t qid = 0;
  memory_scope doorbell_scope = memory_scope::system; //!< who reads the doorbells
  memory_scope cq_scope = memory_scope::system;       //!< who writes the CQ
  //! The controller reports its fetch position as the SQ head of each
  //! completion (the spec's rule). False for a controller that reports a
  //! lower bound instead (the GPU engine: the count of CQ entries posted):
  //! then a completion's SQ head does not say whether its command was fetched.
  bool sq_head_exact = true;
  std::uint64_t timeout_ns = default_queue_timeout_ns;
  //! For a controller served by host threads (the software controller's
  //! engines): how long the thread serving this queue has run without being
  //! kept off the CPU, in ns (null for a device). A wait gives up only once
  //! that covers a whole `timeout_ns`: a busy host makes commands slow, not
  //! failed.
  const std::uint64_t* controller_run_ns = nullptr;

  //! Whether the controller is running and has been for at least `ns`
  //! (always, for a device). The word moves with every round of the thread
  //! serving the queue (at least every 2 ms, also when it has nothing to
  //! do): a word that stays still for 3 ms belongs to a thread kept off the
  //! CPU now, whatever it says. Called only when a wait has run out.
  BAM_HD bool controller_ran_for(std::uint64_t ns) const {
    if (controller_run_ns == nullptr) return true;
    detail::system_atomic<std::uint64_t> word(*const_cast<std::uint64_t*>(controller_run_ns));
    const std::uint64_t first = word.load(cuda::memory_order_relaxed);
    const std::uint64_t start = bam::detail::now_ns();
    std::uint64_t now = first;
    while (now == first && bam::detail::now_ns() - start < 3'000'000) {
      bam::detail::relax(1000);
      now = word.load(cuda::memory_order_relaxed);
    }
    return now != first && now >= ns;
  }

  //! Point the handle's state at `state`, a zero-filled block of
  //! `queue_state_bytes(sq_depth)` bytes aligned to `queue_state_alignment`.
  BAM_HD void attach_state(void* state) {
    auto* base = static_cast<unsigned char*>(state);
    counters = reinterpret_cast<detail::queue_counters*>(base);
    ready = reinterpret_cast<std::uint64_t*>(base + sizeof(detail::queue_counters));
    cids =
        reinterpret_cast<detail::cid_state*>(base + sizeof(detail::queue_counters) + sizeof(std::uint64_t) * sq_depth);
    ncids = sq_depth - 1;
  }

  BAM_HD bool broken() const {
    return detail::device_atomic<std::uint32_t>(counters->broken).load(cuda::memory_order_relaxed) != 0;
  }
  BAM_HD void mark_broken() const {
    detail::device_atomic<std::uint32_t>(counters->broken).store(1, cuda::memory_order_relaxed);
  }

  BAM_HD std::uint16_t cid_of(std::uint64_t ticket) const { return static_cast<std::uint16_t>(ticket % ncids); }
  //! Completions consumed so far: a deadline restarts while this moves.
  BAM_HD std::uint64_t progress_count() const {
    return detail::device_atomic<std::uint64_t>(counters->cq_head).load(cuda::memory_order_relaxed);
  }
  //! True once the controller has fetched the entry of `ticket` (SQ head past it).
  BAM_HD bool fetched(std::uint64_t ticket) const {
    return detail::device_atomic<std::uint64_t>(counters->sq_head).load(cuda::memory_order_relaxed) > ticket;
  }

  // ---- the non-blocking steps --------------------------------------------

  //! Take `n` consecutive tickets; returns the first.
  BAM_HD std::uint64_t reserve(std::uint32_t n = 1) const {
    return detail::device_atomic<std::uint64_t>(counters->ticket).fetch_add(n, cuda::memory_order_relaxed);
  }

  //! True when `ticket` may be published: its command id's previous user has
  //! collected its completion, and the controller has fetched past the
  //! slot's previous entry (implied by the first for a controller that
  //! reports SQ heads correctly; checked because a full SQ must never be overrun).
  BAM_HD bool slot_free(std::uint64_t ticket) const {
    const std::uint32_t turn = static_cast<std::uint32_t>(ticket / ncids);
    if (detail::device_atomic<std::uint32_t>(cids[cid_of(ticket)].free_turn).load(detail::poll_order()) != turn)
      return false;
    if (ticket >= detail::device_atomic<std::uint64_t>(counters->sq_head).load(detail::poll_order()) + sq_depth - 1)
      return false;
    detail::acquire_fence();
    return true;
  }

  //! Write the entry of `ticket` (its command id set here) and mark the slot
  //! ready. With `record`, the completion is delivered there and the command
  //! id is freed as soon as it is consumed. Call `fence_after_publish` and
  //! `ring` afterwards (once for a batch of entries).
  BAM_HD void write_entry(std::uint64_t ticket, command cmd, completion_record* record = nullptr) const {
    const std::uint16_t cid = cid_of(ticket);
    cmd.cid = cid;
    cids[cid].record = record;
    if (record != nullptr) record->done = 0;
    sq[ticket % sq_depth] = cmd;
    detail::device_atomic<std::uint64_t>(ready[ticket % sq_depth]).store(ticket + 1, cuda::memory_order_release);
  }
  //! Store-load ordering with ring()'s lock check (a Dekker pattern): either
  //! the publisher sees the lock free and rings, or the holder's re-check
  //! sees the new ready mark.
  BAM_HD static void fence_after_publish() {
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_device);
  }
  //! `write_entry` + `fence_after_publish` + `ring`.
  BAM_HD void publish(std::uint64_t ticket, const command& cmd, completion_record* record = nullptr) const {
    write_entry(ticket, cmd, record);
    fence_after_publish();
    ring();
  }

  //! Publish every contiguous ready slot with one SQ doorbell write.
  //! Returns without waiting if another thread holds the doorbell.
  BAM_HD BAM_NOINLINE void ring() const {
    using detail::device_atomic;
    device_atomic<std::uint32_t> lock(counters->sq_lock);
    device_atomic<std::uint64_t> tail_ref(counters->sq_tail);
    for (;;) {
      if (lock.load(cuda::memory_order_relaxed) != 0) return;
      if (lock.exchange(1, detail::poll_order()) != 0) return;
      std::uint64_t tail = tail_ref.load(cuda::memory_order_relaxed);
      const std::uint64_t start = tail;
      while (device_atomic<std::uint64_t>(ready[tail % sq_depth]).load(detail::poll_order()) == tail + 1)
        ++tail;
      detail::acquire_fence(); // the lock, and the entries behind the ready marks
      if (tail != start) {
        detail::doorbell_write(sq_doorbell, static_cast<std::uint32_t>(tail % sq_depth), doorbell_scope);
        tail_ref.store(tail, cuda::memory_order_relaxed);
        device_atomic<std::uint64_t>(counters->submitted).fetch_add(tail - start, cuda::memory_order_relaxed);
        device_atomic<std::uint64_t>(counters->doorbells).fetch_add(1, cuda::memory_order_relaxed);
      }
      lock.store(0, cuda::memory_order_release);
      // A slot marked ready while we held the lock may have seen the lock
      // taken and left: look once more so that no entry is left unpublished.
      // The fence pairs with fence_after_publish() (store-load ordering).
      cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_device);
      if (device_atomic<std::uint64_t>(ready[tail % sq_depth]).load(cuda::memory_order_relaxed) != tail + 1) return;
    }
  }

  //! Consume new completions, if no other thread is doing so. Returns the
  //! number consumed.
  BAM_HD BAM_NOINLINE std::uint32_t poll() const {
    using detail::device_atomic;
    device_atomic<std::uint32_t> lock(counters->cq_lock);
    if (lock.load(cuda::memory_order_relaxed) != 0) return 0;
    if (lock.exchange(1, detail::poll_order()) != 0) return 0;
    device_atomic<std::uint64_t> cq_head(counters->cq_head);
    const std::uint64_t first = cq_head.load(cuda::memory_order_relaxed);
    // 1. How many new entries (their phase tags), one fence for all of them.
    // The first tag alone (a poll that finds nothing makes one read), then
    // the tags of `batch` entries at once: where the CQ lies across the host
    // link each read is a round trip, paid while the lock is held. Stop
    // after one ring's worth so a fast controller cannot starve the doorbell.
    constexpr std::uint32_t batch = 4;
    const auto is_new = [&](std::uint32_t dw3, std::uint64_t head) {
      return cqe_dw3{dw3}.phase_tag() == ((((head / cq_depth) & 1) != 0) ? 0u : 1u);
    };
    std::uint32_t n =
        is_new(detail::load_cqe_dw3(&cq[first % cq_depth], cq_scope, detail::poll_order()), first) ? 1 : 0;
    for (bool more = n != 0; more;) {
      std::uint32_t dw3[batch];
      BAM_UNROLL
      for (std::uint32_t j = 0; j < batch; ++j)
        dw3[j] = detail::load_cqe_dw3(&cq[(first + n + j) % cq_depth], cq_scope, detail::poll_order());
      BAM_UNROLL
      for (std::uint32_t j = 0; j < batch; ++j) {
        more = more && n < cq_depth && is_new(dw3[j], first + n);
        if (more) ++n;
      }
    }
    detail::acquire_fence(); // the lock, and the entries behind the phase tags
    if (n == 0) {
      lock.store(0, cuda::memory_order_release);
      return 0;
    }
    // 2. Read them. 3. One release fence (the entries are read before their
    // slots and command ids are handed back), then file every result.
    detail::release_fence();
    std::uint32_t sq_head_pos = counters->sq_head_pos;
    std::uint64_t sq_head = counters->sq_head;
    // One entry ahead: the next entry's read is issued before this one's
    // result is filed, and a command id's state words load together (few
    // registers: this runs inside every waiting kernel).
    struct fields {
      std::uint32_t cid, dw0, pos;
      std::uint16_t st;
      bool same_sq;
    };
    auto read_entry = [&](std::uint64_t at) {
      completion* entry = &cq[at % cq_depth];
#if BAM_DEVICE_CODE
      // The whole entry in one read (its tag was seen and acquired above):
      // across the host link every read is a request of its own.
      uint4 v;
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(entry)
                   : "memory");
      const cqe_dw3 w{v.w};
      return fields{w.command_id(), v.x, v.z & 0xffffu, w.status().raw, (v.z >> 16) == qid};
#else
      const cqe_dw3 w{detail::load_cqe_dw3(entry, cq_scope, cuda::memory_order_relaxed)};
      return fields{w.command_id(), entry->dw0, entry->sq_head, w.status().raw, entry->sq_id == qid};
#endif
    };
    fields next = read_entry(first);
    for (std::uint32_t k = 0; k < n; ++k) {
      const fields e = next;
      // Loaded after the previous entries were filed: a repeat of one sees it.
      const std::uint32_t cid = e.cid < ncids ? e.cid : 0;
      completion_record* const rec = cids[cid].record;
      const std::uint32_t filed = device_atomic<std::uint32_t>(cids[cid].done).load(cuda::memory_order_relaxed);
      const std::uint32_t turn =
          sq_head_exact ? device_atomic<std::uint32_t>(cids[cid].free_turn).load(cuda::memory_order_relaxed) : 0;
      if (k + 1 < n) next = read_entry(first + k + 1);
      // Account for how far the controller has fetched (an out-of-range
      // position from a misbehaving controller is ignored).
      const bool head_known = e.pos < sq_depth;
      if (head_known) {
        sq_head += (e.pos + sq_depth - sq_head_pos) % sq_depth;
        sq_head_pos = e.pos;
      }
      // Only a command the controller has fetched can complete: the entry
      // names this SQ, and the SQ head it reports is a slot of this queue and
      // past the slot of the command id's current turn. A result already
      // filed and not yet collected is not filed again. Anything else (a
      // stray or duplicate completion) is consumed and dropped.
      bool plausible = e.cid < ncids && e.same_sq && head_known;
      if (plausible && sq_head_exact) plausible = sq_head > std::uint64_t{turn} * ncids + cid;
      if (plausible && rec == nullptr) plausible = filed == 0;
      if (!plausible) continue;
      if (rec != nullptr) {
        // Deliver, then free the id for its next turn right away.
        rec->dw0 = e.dw0;
        rec->status = e.st;
        cids[cid].record = nullptr;
        device_atomic<std::uint32_t>(rec->done).store(1, detail::publish_order());
        device_atomic<std::uint32_t> free_turn(cids[cid].free_turn);
        free_turn.store(free_turn.load(cuda::memory_order_relaxed) + 1, detail::publish_order());
      } else {
        cids[cid].dw0 = e.dw0;
        cids[cid].status = e.st;
        device_atomic<std::uint32_t>(cids[cid].done).store(1, detail::publish_order());
      }
    }
    counters->sq_head_pos = sq_head_pos;
    device_atomic<std::uint64_t>(counters->sq_head).store(sq_head, detail::publish_order());
    cq_head.store(first + n, cuda::memory_order_relaxed);
    detail::head_doorbell_write(cq_doorbell, static_cast<std::uint32_t>((first + n) % cq_depth), doorbell_scope);
    lock.store(0, cuda::memory_order_release); // the counters above before the next holder reads them
    return n;
  }

  //! If the completion of `ticket` (published without a record) has been
  //! filed, take its status (and dword 0), free the command id for its next
  //! turn and return true.
  BAM_HD bool try_collect(std::uint64_t ticket, status& st, std::uint32_t* dw0 = nullptr) const {
    using detail::device_atomic;
    const std::uint32_t cid = cid_of(ticket);
    device_atomic<std::uint32_t> done(cids[cid].done);
    if (done.load(detail::poll_order()) == 0) return false;
    detail::acquire_fence();
    st = status(static_cast<std::uint16_t>(cids[cid].status));
    if (dw0 != nullptr) *dw0 = cids[cid].dw0;
    done.store(0, cuda::memory_order_relaxed);
    device_atomic<std::uint32_t>(cids[cid].free_turn)
        .store(static_cast<std::uint32_t>(ticket / ncids) + 1, cuda::memory_order_release);
    return true;
  }

  // ---- blocking helpers ---------------------------------------------------

  //! Take a ticket, wait until it may be used, publish `cmd`. On success
  //! `ticket` identifies the command for `wait`.
  BAM_HD status submit(const command& cmd, std::uint64_t& ticket, completion_record* record = nullptr) const;
  //! Wait for the completion of `ticket` (published without a record).
  BAM_HD status wait(std::uint64_t ticket, std::uint32_t* dw0 = nullptr) const;
  //! Wait for a command published with a `completion_record`.
  BAM_HD status wait(std::uint64_t ticket, const completion_record& record, std::uint32_t* dw0 = nullptr) const;
  //! The wait loop of both `wait`s.
  template <class Done>
  BAM_HD status wait_until(std::uint64_t ticket, Done&& done) const;
  //! Submit and wait.
  BAM_HD status execute(const command& cmd, std::uint32_t* dw0 = nullptr) const {
    std::uint64_t ticket = 0;
    const status st = submit(cmd, ticket);
    if (!st.ok()) return st;
    return wait(ticket, dw0);
  }
};

namespace detail {

//! The deadline of one wait on a queue, by the rule above: restarted while
//! the queue makes progress and the command is not fetched yet; once fetched,
//! the command has `timeout_ns` to complete. The clock is read only when the
//! caller already found nothing to do.
struct progress_deadline {
  std::uint64_t deadline = 0;
  std::uint64_t seen = 0;
  bool fetched = false;

  BAM_HD void start(const queue_pair_ref& q) {
    deadline = bam::detail::deadline_after(bam::detail::now_ns(), q.timeout_ns);
    seen = q.progress_count();
    fetched = false;
  }
  //! True once the wait for `ticket` (~0 for "no command yet") has run out.
  BAM_HD bool expired(const queue_pair_ref& q, std::uint64_t ticket) {
    const std::uint64_t now = bam::detail::now_ns();
    if (now <= deadline) return false;
    const std::uint64_t p = q.progress_count();
    if (!fetched && ticket != ~0ull && q.fetched(ticket)) {
      fetched = true;
      deadline = bam::detail::deadline_after(now, q.timeout_ns);
      return false;
    }
    if (!fetched && p != seen) {
      seen = p;
      deadline = bam::detail::deadline_after(now, q.timeout_ns);
      return false;
    }
    if (!q.controller_ran_for(q.timeout_ns)) {
      // The threads serving the controller were kept off the CPU during the
      // wait: look again once they could have run for a whole timeout.
      deadline = bam::detail::deadline_after(now, q.timeout_ns / 16 + 1);
      return false;
    }
    return true;
  }
};

} // namespace detail

BAM_HD inline status queue_pair_ref::submit(const command& cmd, std::uint64_t& ticket,
                                            completion_record* record) const {
  if (broken()) return status_queue_broken;
  const std::uint64_t t = reserve();
  detail::progress_deadline dl;
  dl.start(*this);
  bam::detail::backoff pause;
  while (!slot_free(t)) {
    if (broken()) return status_queue_broken;
    ring();
    if (poll() != 0) continue;
    if (dl.expired(*this, ~0ull)) {
      mark_broken(); // the ticket can never be published: nothing after it would be rung
      return status_queue_full;
    }
    pause();
  }
  publish(t, cmd, record);
  ticket = t;
  return status_success;
}

//! Drive the queue until `done(st)` takes the result of `ticket`, the queue
//! breaks, or the controller stops making progress.
template <class Done>
BAM_HD inline status queue_pair_ref::wait_until(std::uint64_t ticket, Done&& done) const {
  detail::progress_deadline dl;
  dl.start(*this);
  bam::detail::backoff pause;
  status st;
  for (;;) {
    if (done(st)) return st;
    ring();
    if (poll() != 0) continue;
    if (broken()) return status_queue_broken;
    if (dl.expired(*this, ticket)) {
      mark_broken();
      return status_timeout;
    }
    pause();
  }
}

BAM_HD inline status queue_pair_ref::wait(std::uint64_t ticket, std::uint32_t* dw0) const {
  return wait_until(ticket, [&](status& st) { return try_collect(ticket, st, dw0); });
}

BAM_HD inline status queue_pair_ref::wait(std::uint64_t ticket, const completion_record& record,
                                          std::uint32_t* dw0) const {
  detail::device_atomic<std::uint32_t> done(const_cast<std::uint32_t&>(record.done));
  return wait_until(ticket, [&](status& st) {
    if (done.load(cuda::memory_order_acquire) == 0) return false;
    if (dw0 != nullptr) *dw0 = record.dw0;
    st = status(static_cast<std::uint16_t>(record.status));
    return true;
  });
}

} // namespace bam::nvme
