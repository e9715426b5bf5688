// SPDX-License-Identifier: MIT
//! The GPU runtime's I/O engine room: commands of the lanes of one warp
//! driven together through the queue protocol's non-blocking steps.
//!
//! Each lane may own one command (`io_slot`, in registers). One call of
//! `warp_io_step` (all lanes of the warp's mask, converged) advances every
//! command by what is possible now and never waits:
//!   1. lanes that need a ticket on the same queue take them with one atomic
//!      add (`reserve(n)`);
//!   2. lanes whose ticket may be used build their command (PRPs in the
//!      command id's list) and write their entry; per queue one lane fences
//!      and rings the doorbell once;
//!   3. for each queue with a command of the warp in flight, the whole warp
//!      runs the transport's progress hook (for the software controller's
//!      GPU engine: the warp serves the queue) and one lane consumes
//!      completions;
//!   4. lanes whose completion is filed collect it.
//! The caller loops until its lanes are done, and decides about deadlines
//! with `io_progress_marker`: a wait ends with a timeout only when the
//! controller made no progress (see queue.hpp's rule).
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/queue.hpp>
#include <bam/runtime/queue_set.cuh>
#include <bam/transport/device_progress.cuh>

#include <cstdint>

namespace bam::detail {

BAM_DEVICE inline unsigned lane_id() {
  unsigned l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}
BAM_DEVICE inline unsigned lanes_below() { return (1u << lane_id()) - 1u; }

enum class io_state : std::uint8_t {
  none,        //!< no command
  need_ticket, //!< described, no ticket yet
  reserved,    //!< ticket taken, waiting until it may be used
  submitted,   //!< entry written and rung, waiting for the completion
  done,        //!< completed (or refused): `status` says how
};

//! One lane's command in flight.
struct io_slot {
  const queue_set_ref* qs = nullptr;
  const std::uint64_t* page_bus = nullptr; //!< bus address of every 4 KiB page of the target region
  std::uint64_t offset = 0;                //!< byte offset of the data in that region
  std::uint64_t lba = 0;
  std::uint64_t ticket = 0;
  std::uint32_t nblocks = 0;
  std::uint32_t queue = 0;
  nvme::nvm_opcode op = nvme::nvm_opcode::read;
  io_state state = io_state::none;
  std::uint16_t status = 0;

  BAM_DEVICE const nvme::queue_pair_ref& q() const { return qs->queue(queue); }

  //! Describe a read/write; checks it first (a bad request completes at once).
  BAM_DEVICE void start_rw(const queue_set_ref& set, nvme::nvm_opcode o, std::uint64_t l, std::uint32_t n,
                           const std::uint64_t* bus, std::uint64_t off) {
    qs = &set;
    op = o;
    lba = l;
    nblocks = n;
    page_bus = bus;
    offset = off;
    queue = set.pick_queue();
    const nvme::status st =
        device_progress_compiled(set.progress()) ? set.check_rw(l, n, off) : nvme::status_no_progress_hook;
    status = st.raw;
    state = st.ok() ? io_state::need_ticket : io_state::done;
  }
  //! Describe a Flush of the namespace.
  BAM_DEVICE void start_flush(const queue_set_ref& set) {
    qs = &set;
    op = nvme::nvm_opcode::flush;
    queue = set.pick_queue();
    const bool served = device_progress_compiled(set.progress());
    status = served ? 0 : nvme::status_no_progress_hook.raw;
    state = served ? io_state::need_ticket : io_state::done;
  }
};

//! Build the lane's command (PRPs in its command id's list) and write its entry.
BAM_DEVICE BAM_NOINLINE inline void write_command(io_slot& s) {
  const nvme::queue_pair_ref& q = s.q();
  const nvme::command cmd = s.op == nvme::nvm_opcode::flush ? nvme::make_flush(s.qs->nsid())
                                                            : s.qs->build_rw(s.op, s.lba, s.nblocks, s.page_bus,
                                                                             s.offset, s.queue, q.cid_of(s.ticket));
  q.write_entry(s.ticket, cmd);
  s.state = io_state::submitted;
}

//! One round of the warp's I/O (see the file comment). All lanes of `mask`
//! call it, converged. Returns true on every lane if any lane's command moved.
BAM_DEVICE inline bool warp_io_step(io_slot& s, unsigned mask) {
  const unsigned lane = lane_id();
  bool moved = false;

  // 1. Tickets, one atomic add per queue.
  const unsigned want = __ballot_sync(mask, s.state == io_state::need_ticket);
  if (s.state == io_state::need_ticket) {
    const nvme::queue_pair_ref& q = s.q();
    const unsigned peers = __match_any_sync(want, reinterpret_cast<unsigned long long>(&q));
    const unsigned leader = __ffs(peers) - 1;
    unsigned long long base = 0;
    if (lane == leader) base = q.broken() ? ~0ull : q.reserve(__popc(peers));
    base = __shfl_sync(peers, base, leader);
    if (base == ~0ull) {
      s.status = nvme::status_queue_broken.raw;
      s.state = io_state::done;
    } else {
      s.ticket = base + __popc(peers & lanes_below());
      s.state = io_state::reserved;
    }
    moved = true;
  }

  // 2. Entries whose ticket may be used; one fence and doorbell per queue.
  bool wrote = false;
  if (s.state == io_state::reserved && s.q().slot_free(s.ticket)) {
    write_command(s);
    wrote = true;
    moved = true;
  }
  const unsigned writers = __ballot_sync(mask, wrote);
  if (wrote) {
    const nvme::queue_pair_ref& q = s.q();
    const unsigned peers = __match_any_sync(writers, reinterpret_cast<unsigned long long>(&q));
    if (lane == static_cast<unsigned>(__ffs(peers) - 1)) {
      nvme::queue_pair_ref::fence_after_publish();
      q.ring();
    }
  }
  __syncwarp(mask);

  // 3. Progress and completions, once per queue the warp waits on.
  unsigned pending = __ballot_sync(mask, s.state == io_state::reserved || s.state == io_state::submitted);
  while (pending != 0) {
    const unsigned leader = __ffs(pending) - 1;
    const auto qaddr =
        __shfl_sync(mask, reinterpret_cast<unsigned long long>(s.qs != nullptr ? &s.q() : nullptr), leader);
    const auto saddr = __shfl_sync(mask, reinterpret_cast<unsigned long long>(s.qs), leader);
    const auto& q = *reinterpret_cast<const nvme::queue_pair_ref*>(qaddr);
    const auto& set = *reinterpret_cast<const queue_set_ref*>(saddr);
    if (make_progress(set.progress(), q.qid, mask)) moved = true;
    if (lane == leader) {
      q.ring(); // entries published while another lane held the doorbell lock
      if (q.poll() != 0) moved = true;
    }
    const unsigned same =
        __ballot_sync(mask, ((pending >> lane) & 1u) && reinterpret_cast<unsigned long long>(&s.q()) == qaddr);
    pending &= ~same;
  }

  // 4. Collect.
  if (s.state == io_state::submitted) {
    nvme::status st;
    if (s.q().try_collect(s.ticket, st)) {
      s.status = st.raw;
      s.state = io_state::done;
      moved = true;
    }
  }
  return __any_sync(mask, moved);
}

//! What this lane's command contributes to the warp's progress marker: the
//! queue's completion count while the command waits for a ticket or for the
//! controller to fetch it (a backlog moves); nothing once it is fetched
//! (then it must complete within the deadline on its own).
BAM_DEVICE inline std::uint32_t io_progress_marker(const io_slot& s) {
  if (s.state == io_state::reserved) return static_cast<std::uint32_t>(s.q().progress_count());
  if (s.state == io_state::submitted && !s.q().fetched(s.ticket))
    return static_cast<std::uint32_t>(s.q().progress_count());
  return 0;
}

//! Whether the controller behind the lane's queue ran for a whole `timeout_ns`
//! (its serving threads were not kept off the CPU): only then may a wait
//! that ran out give up on the lane's command.
BAM_DEVICE inline bool io_controller_ran_for(const io_slot& s, std::uint64_t timeout_ns) {
  if (s.qs == nullptr || s.state == io_state::none || s.state == io_state::done) return true;
  return s.q().controller_ran_for(timeout_ns);
}

//! Give up on this lane's command after a deadline: the queue can never
//! publish an unused ticket or reuse a command id that may still complete,
//! so it is marked broken. Only a command that was submitted reports a
//! timeout (it may still execute); one that never reached the queue reports
//! that the queue had no room for it.
BAM_DEVICE inline void io_abandon(io_slot& s) {
  if (s.state == io_state::reserved || s.state == io_state::submitted) {
    s.q().mark_broken();
    s.status = s.state == io_state::reserved ? nvme::status_queue_full.raw : nvme::status_timeout.raw;
    s.state = io_state::done;
  } else if (s.state == io_state::need_ticket) {
    s.status = nvme::status_queue_full.raw;
    s.state = io_state::done;
  }
}

//! A warp's deadline: read the clock only when a round moved nothing;
//! restart while the progress marker (summed over the warp) changes.
struct warp_deadline {
  std::uint64_t deadline = 0;
  std::uint32_t marker = 0;
  std::uint32_t idle = 0;

  //! A round moved something: the wait starts over.
  BAM_DEVICE void restart() {
    deadline = 0;
    idle = 0;
  }
  //! A round moved nothing: back off, then decide with this lane's progress
  //! marker. True (on every lane) when the wait has run out.
  BAM_DEVICE bool expired_idle(std::uint32_t lane_marker, std::uint64_t timeout_ns, unsigned mask) {
    ++idle;
    relax(idle < 16 ? 64 : 512);
    const std::uint64_t now = now_ns();
    const std::uint32_t m = __reduce_add_sync(mask, lane_marker);
    if (deadline == 0 || m != marker) {
      deadline = deadline_after(now, timeout_ns);
      marker = m;
      return false;
    }
    return now > deadline;
  }
  BAM_DEVICE bool expired(bool moved, std::uint32_t lane_marker, std::uint64_t timeout_ns, unsigned mask) {
    if (moved) {
      restart();
      return false;
    }
    return expired_idle(lane_marker, timeout_ns, mask);
  }
};

//! One lane's wait without progress (kept with the lane's request, so that
//! it survives the calls that drive it): the deadline starts when the lane
//! first moves nothing, and starts over when the lane moves or its own
//! progress marker changes. Other lanes and other warps do not extend it.
struct lane_wait {
  std::uint64_t deadline = 0; //!< 0: not waiting
  std::uint32_t marker = 0;

  BAM_HD void restart() { deadline = 0; }
  //! This round moved nothing for the lane: true when its wait has run out.
  BAM_DEVICE bool expired(std::uint32_t lane_marker, std::uint64_t timeout_ns) {
    const std::uint64_t now = now_ns();
    if (deadline == 0 || lane_marker != marker) {
      deadline = deadline_after(now, timeout_ns);
      marker = lane_marker;
      return false;
    }
    return now > deadline;
  }
};

//! Run every lane's command of `mask` to completion (or to its deadline).
BAM_DEVICE inline void warp_io_run(io_slot& s, unsigned mask, std::uint64_t timeout_ns) {
  warp_deadline dl;
  while (__any_sync(mask, s.state != io_state::done && s.state != io_state::none)) {
    const bool moved = warp_io_step(s, mask);
    if (dl.expired(moved, io_progress_marker(s), timeout_ns, mask) && io_controller_ran_for(s, timeout_ns))
      io_abandon(s);
  }
}

} // namespace bam::detail

namespace bam {

BAM_DEVICE inline std::uint32_t queue_set_ref::pick_queue() const {
#if BAM_DEVICE_CODE
  unsigned smid, warpid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm volatile("mov.u32 %0, %%warpid;" : "=r"(warpid));
  return (smid + warpid * l_.num_sms) % l_.nqueues;
#else
  return 0;
#endif
}

BAM_DEVICE inline nvme::status queue_set_ref::io(nvme::nvm_opcode op, std::uint64_t lba, std::uint32_t n,
                                                 const std::uint64_t* page_bus, std::uint64_t offset) const {
  const unsigned mask = __activemask();
  detail::io_slot s;
  s.start_rw(*this, op, lba, n, page_bus, offset);
  detail::warp_io_run(s, mask, timeout_ns());
  return nvme::status(s.status);
}

BAM_DEVICE inline nvme::status queue_set_ref::flush() const {
  const unsigned mask = __activemask();
  detail::io_slot s;
  s.start_flush(*this);
  detail::warp_io_run(s, mask, timeout_ns());
  return nvme::status(s.status);
}

} // namespace bam
