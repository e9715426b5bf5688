// SPDX-License-Identifier: MIT
//! The interface between the software controller and the engines that serve
//! its queues. The controller decodes registers and admin commands; an engine
//! fetches submission queue entries, has the controller execute them and
//! posts completions. The CPU engine (`cpu_engine.hpp`) serves the admin queue
//! always and the I/O queues by default; another engine (a GPU one, say) can
//! serve the I/O queues instead through `controller_config::io_engine`.
//!
//! Rules for an engine:
//!  - Read doorbells with acquire loads; post a completion by writing dwords
//!    0..2 plainly and then dword 3 (cid | phase << 16 | status << 17) with a
//!    release store (`detail::post_completion`).
//!  - Never overwrite an unconsumed completion: a full CQ (per its head
//!    doorbell) makes the engine wait.
//!  - Report in every completion the SQ head after the entries fetched so far.
//!  - Several SQs may share one CQ; its state (`cq_state`) is the controller's
//!    and outlives them. Posting to one CQ must be serialized.
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

#include <bam/nvme/spec.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace bam::emu {

//! The result of processing one fetched command.
struct command_outcome {
  nvme::status status;        //!< completion status
  std::uint32_t dw0 = 0;      //!< completion dword 0
  bool drop = false;          //!< never complete it (fault injection)
  std::uint64_t delay_ns = 0; //!< post the completion this much later
};

//! Producer-side state of one completion queue. Owned by the controller from
//! Create I/O CQ to Delete I/O CQ; touched only by the engine thread serving it.
struct cq_state {
  nvme::completion* ring = nullptr; //!< CQ entries (virtual address)
  std::uint32_t depth = 0;
  std::uint32_t* head_doorbell = nullptr; //!< CQ head doorbell in the register file
  std::uint16_t cqid = 0;
  std::uint32_t tail = 0;     //!< next slot to write
  std::uint32_t phase = 1;    //!< phase tag of the current pass
  std::uint32_t head = 0;     //!< last valid head read from the doorbell
  std::uint32_t reserved = 0; //!< slots promised to completions not posted yet
};

//! One submission queue as an engine sees it.
struct queue_info {
  std::uint16_t qid = 0;       //!< SQ id (0: admin)
  nvme::command* sq = nullptr; //!< SQ entries (virtual address)
  std::uint32_t sq_depth = 0;
  std::uint32_t* sq_tail_doorbell = nullptr; //!< in the register file
  cq_state* cq = nullptr;                    //!< its completion queue
  std::uint64_t sq_bus = 0;                  //!< bus addresses the host gave
  std::uint64_t cq_bus = 0;
  std::uint64_t ready_at_ns = 0; //!< do not fetch before (bam::detail::now_ns clock)
  //! Process one fetched command (fault rules, execution, statistics). Any thread.
  std::function<command_outcome(const nvme::command&)> process;
};

//! An engine serving submission queues.
class io_engine {
public:
  virtual ~io_engine() = default;
  //! Start serving a new SQ (its CQ exists).
  virtual void queue_created(const queue_info& q) = 0;
  //! Stop serving SQ `sqid`; completes what it can of its outstanding
  //! commands; returns once the engine no longer touches the queue.
  virtual void queue_deleted(std::uint16_t sqid) = 0;
  //! Controller reset: forget every queue without touching queue memory again.
  virtual void reset() = 0;
  //! Stop (true) or resume (false) fetching and completing anything.
  virtual void pause(bool stop) = 0;
  //! A GPU-reachable pointer to a doorbell, if this engine provides one.
  virtual volatile std::uint32_t* device_doorbell(std::uint32_t /*offset*/) { return nullptr; }
};

namespace detail {

//! Acquire load of a doorbell the host writes with release stores.
inline std::uint32_t load_doorbell(const std::uint32_t* db) {
  return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(db))
      .load(std::memory_order_acquire);
}

//! Free CQ slots, refreshing the head from its doorbell (an out-of-range
//! head value is ignored: the previous one stays).
inline std::uint32_t cq_free_slots(cq_state& cq) {
  const std::uint32_t h = load_doorbell(cq.head_doorbell);
  if (h < cq.depth) cq.head = h;
  const std::uint32_t used = (cq.tail + cq.depth - cq.head) % cq.depth;
  const std::uint32_t free = cq.depth - 1 - used;
  return free > cq.reserved ? free - cq.reserved : 0;
}

//! Write one completion entry and advance the tail. The caller checked for room.
inline void post_completion(cq_state& cq, std::uint16_t sqid, std::uint16_t sq_head,
                            std::uint16_t cid, nvme::status st, std::uint32_t dw0) {
  nvme::completion* e = &cq.ring[cq.tail];
  e->dw0 = dw0;
  e->dw1 = 0;
  e->sq_head = sq_head;
  e->sq_id = sqid;
  const std::uint32_t dw3 = static_cast<std::uint32_t>(cid) | (cq.phase << 16) |
                            (static_cast<std::uint32_t>(st.raw & 0x7fffu) << 17);
  auto* word = reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(e) +
                                                offsetof(nvme::completion, cid));
  std::atomic_ref<std::uint32_t>(*word).store(dw3, std::memory_order_release);
  if (++cq.tail == cq.depth) {
    cq.tail = 0;
    cq.phase ^= 1u;
  }
}

} // namespace detail

} // namespace bam::emu
