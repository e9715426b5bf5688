// SPDX-License-Identifier: MIT
//! The CPU engine of the software controller: a few threads polling SQ tail
//! doorbells in the register file. Each thread serves a fixed subset of the
//! queues (all SQs of one CQ go to the same thread, so posting to a CQ needs
//! no lock); the entries of one SQ are fetched in order by that thread.
//! Completions delayed by fault injection are held back, slot reserved in the
//! CQ, and posted when due, so a slow command never blocks the others.
//! Idle threads spin briefly, then sleep, longer the longer nothing comes
//! (`detail::idle_nap`): an idle storage costs about 2 % of a core.
//!
//! @code
//!   auto engine = std::make_shared<bam::emu::cpu_engine>(4, "fast");
//!   bam::emu::controller_config cfg;
//!   cfg.io_engine = engine;                  // the default does the same with engine_threads
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/fault_table.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bam::emu {

namespace detail {
//! Commands fetched from one SQ per pass before the thread moves on (fairness).
inline constexpr std::uint32_t fetch_budget_per_pass = 32;
} // namespace detail

class cpu_engine final : public io_engine {
public:
  //! Start `threads` (at least 1) polling threads, named "bam-<name>-<i>".
  //! `faults` (may be null) says when the controller stops answering.
  explicit cpu_engine(std::uint32_t threads, const std::string& name = "emu", const fault_table* faults = nullptr)
      : faults_(faults) {
    const std::uint32_t n = std::max<std::uint32_t>(threads, 1);
    for (std::uint32_t i = 0; i < n; ++i)
      workers_.push_back(std::make_unique<worker>());
    run_ns_ = std::vector<std::uint64_t>(n, 0);
    for (std::uint32_t i = 0; i < n; ++i) {
      worker* w = workers_[i].get();
      w->thread = std::thread([this, w, i] { run(*w, run_ns_[i]); });
      const std::string tname = ("bam-" + name).substr(0, 11) + "-" + std::to_string(i % 1000);
      pthread_setname_np(workers_[i]->thread.native_handle(), tname.c_str());
    }
  }
  ~cpu_engine() override {
    stop_.store(true, std::memory_order_release);
    for (auto& w : workers_)
      w->thread.join();
  }
  cpu_engine(const cpu_engine&) = delete;
  cpu_engine& operator=(const cpu_engine&) = delete;

  std::uint32_t threads() const { return static_cast<std::uint32_t>(workers_.size()); }
  //! The run-time word of the thread serving the SQs of CQ `cqid` (see `detail::run_clock`).
  const std::uint64_t* run_ns(std::uint16_t cqid) const override { return &run_ns_[cqid % run_ns_.size()]; }

  nvme::status queue_created(const queue_info& q) override {
    worker& w = *workers_[q.cq->cqid % workers_.size()];
    auto sq = std::make_unique<sq_runtime>();
    sq->info = q;
    std::lock_guard lock(w.mutex);
    w.sqs.push_back(std::move(sq));
    return nvme::status_success;
  }

  void queue_deleted(std::uint16_t sqid) override {
    for (auto& wp : workers_) {
      worker& w = *wp;
      std::lock_guard lock(w.mutex);
      auto it = std::find_if(w.sqs.begin(), w.sqs.end(), [&](const auto& s) { return s->info.qid == sqid; });
      if (it == w.sqs.end()) continue;
      sq_runtime* sq = it->get();
      // Commands already executed and waiting out a delay complete now; their slots are reserved.
      for (auto p = w.pending.begin(); p != w.pending.end();) {
        if (p->sq != sq) {
          ++p;
          continue;
        }
        post_reserved(*p);
        p = w.pending.erase(p);
      }
      w.sqs.erase(it);
      return;
    }
  }

  void reset() override {
    for (auto& wp : workers_) {
      std::lock_guard lock(wp->mutex);
      wp->pending.clear();
      wp->sqs.clear();
    }
  }

private:
  struct sq_runtime {
    queue_info info;
    std::uint32_t head = 0; //!< next entry to fetch
  };
  struct pending_completion {
    std::uint64_t due_ns;
    sq_runtime* sq;
    std::uint16_t cid;
    nvme::status status;
    std::uint32_t dw0;
  };
  struct worker {
    std::mutex mutex; //!< guards sqs and pending; held for a whole pass
    std::vector<std::unique_ptr<sq_runtime>> sqs;
    std::vector<pending_completion> pending;
    std::thread thread;
  };

  static void post_reserved(const pending_completion& p) {
    cq_state& cq = *p.sq->info.cq;
    --cq.promised;
    detail::post_completion(cq, p.sq->info.qid, static_cast<std::uint16_t>(p.sq->head), p.cid, p.status, p.dw0);
  }

  void run(worker& w, std::uint64_t& run_word) {
    detail::precise_sleeps();
    detail::run_clock run_time;
    std::uint64_t idle_since = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      if (faults_ != nullptr && faults_->is_stalled()) { // a test's stand-in for a busy host
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      run_time.tick(run_word);
      std::uint64_t next_due = UINT64_MAX;
      bool progressed = false;
      {
        std::lock_guard lock(w.mutex);
        if (faults_ == nullptr || !faults_->is_paused()) progressed = pass(w, next_due);
      }
      if (progressed) {
        idle_since = 0;
        continue;
      }
      const std::uint64_t now = bam::detail::now_ns();
      if (idle_since == 0) idle_since = now;
      auto nap = detail::idle_nap(now - idle_since);
      if (nap.count() == 0 && next_due == UINT64_MAX) {
        std::this_thread::yield();
        continue;
      }
      if (next_due != UINT64_MAX) {
        if (next_due > now)
          nap = std::min(
              nap, std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::nanoseconds(next_due - now)));
        else
          nap = std::chrono::microseconds(0);
      }
      std::this_thread::sleep_for(nap);
    }
  }

  //! One pass over the worker's queues; true if anything was fetched or posted.
  static bool pass(worker& w, std::uint64_t& next_due) {
    bool progressed = false;
    std::uint64_t now = bam::detail::now_ns();
    // Delayed completions that are due.
    for (auto p = w.pending.begin(); p != w.pending.end();) {
      if (p->due_ns <= now) {
        post_reserved(*p);
        p = w.pending.erase(p);
        progressed = true;
      } else {
        next_due = std::min(next_due, p->due_ns);
        ++p;
      }
    }
    for (auto& sqp : w.sqs) {
      sq_runtime& sq = *sqp;
      const queue_info& q = sq.info;
      if (q.ready_at_ns != 0 && now < q.ready_at_ns) continue;
      const std::uint32_t tail = detail::load_doorbell(q.sq_tail_doorbell);
      if (tail >= q.sq_depth) continue; // invalid doorbell value: ignored
      cq_state& cq = *q.cq;
      for (std::uint32_t budget = detail::fetch_budget_per_pass; budget > 0 && sq.head != tail; --budget) {
        if (detail::cq_free_slots(cq) == 0) break; // full CQ: wait for the host
        const nvme::command cmd = q.sq[sq.head];
        sq.head = (sq.head + 1) % q.sq_depth;
        progressed = true;
        const command_outcome out = q.process(cmd);
        if (out.drop) continue;
        if (out.delay_ns != 0) {
          now = bam::detail::now_ns();
          ++cq.promised;
          w.pending.push_back({now + out.delay_ns, &sq, cmd.cid, out.status, out.dw0});
          next_due = std::min(next_due, now + out.delay_ns);
          continue;
        }
        detail::post_completion(cq, q.qid, static_cast<std::uint16_t>(sq.head), cmd.cid, out.status, out.dw0);
      }
    }
    return progressed;
  }

  std::vector<std::unique_ptr<worker>> workers_;
  std::vector<std::uint64_t> run_ns_; //!< per thread (see `detail::run_clock`)
  std::atomic<bool> stop_{false};
  const fault_table* faults_;
};

} // namespace bam::emu
