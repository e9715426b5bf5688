// SPDX-License-Identifier: MIT
//! The CPU engine for GPU clients: CPU threads serve the software
//! controller's I/O queues for GPU submitters, from any emu media (a file, a
//! block device, RAM), so a GPU application runs on a plain file.
//!
//!  - SQ/CQ rings live in pinned host memory mapped into the GPU; doorbells
//!    are host words the GPU writes and these threads poll.
//!  - Each thread keeps up to `slots` commands in flight and runs every one
//!    through the one executor (`process_nvm`: checks, fault rules,
//!    statistics). The data path makes no CUDA call (`client_dma.hpp`): data
//!    moves between the media and staging bytes in pinned host memory, and
//!    GPU threads waiting on the queue move it between the staging bytes and
//!    the command's PRP targets. A write's data is staged before the media is
//!    written; a read completes only once its data is in place. A bad PRP
//!    found by the GPU threads completes the command with its status.
//!  - Media held in memory (RAM, shared memory) that the GPU can reach
//!    (`client_in_place`: pinned and mapped) are read in place: a read's
//!    task points the GPU threads at the media's own bytes, with no copy by
//!    the engine's threads and no staging bytes taken.
//!  - A completion with no room in its CQ waits (it is never dropped); the
//!    thread keeps serving other queues meanwhile.
//!  - A thread with nothing in flight backs off to short sleeps: an idle
//!    storage costs little CPU.
//!
//! This file has no CUDA in it: tests serve the data tasks from a host thread
//! (`serve_client_dma_host`).
//!
//! @code
//!   auto engine = bam::emu::make_client_engine(media, 128, 4);   // client_engine.cuh
//!   // cfg.io_engine = engine; bam::storage puts the queue rings in pinned host memory
//!   // (the engine registers itself with queue_ring_memory::pinned_host)
//! @endcode
#pragma once

#include <bam/emu/client_dma.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/media.hpp>
#include <bam/emu/nvm_executor.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/transport.hpp>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <bitset>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace bam::emu {

//! Media bytes GPU threads can read where they are (pinned host memory
//! mapped into the GPU): reads need no staging copy.
struct client_in_place {
  std::uint64_t device = 0; //!< where GPU threads see the media's byte 0 (0: not readable in place)
  std::uint64_t bytes = 0;  //!< how many bytes from there
};

class client_engine final : public io_engine {
public:
  //! Commands in flight per thread, at most.
  static constexpr std::uint32_t slots = 512;
  //! Staging memory per thread, handed out in 4 KiB pages: a command takes
  //! the pages its data needs while it is in flight.
  static constexpr std::size_t staging_bytes = 4u << 20;
  //! Largest transfer of one command through the staging bytes (the MDTS the
  //! controller must report: `mdts` 5).
  static constexpr std::size_t max_transfer = 128 * 1024;

  //! `doorbells`: 2 * (max_qid + 1) words the GPU writes (doorbell stride 0).
  //! `dma`: the lanes (max_qid + 1, zeroed; pinned host memory mapped into the
  //! GPU) and claim counters the data tasks go through. `alloc_staging`
  //! returns memory the GPU can reach (pinned, mapped); host memory if null.
  //! `in_place`: where the GPU threads read the media's bytes themselves, if
  //! they can.
  client_engine(std::shared_ptr<media> m, std::uint32_t max_qid, std::uint32_t threads,
                std::span<std::uint32_t> doorbells, client_dma_ref dma,
                std::function<void*(std::size_t)> alloc_staging = nullptr,
                std::function<void(void*)> free_staging = nullptr, client_in_place in_place = {})
      : media_(std::move(m)), max_qid_(max_qid), doorbells_(doorbells), dma_(dma), in_place_(in_place),
        free_staging_(std::move(free_staging)), lanes_(static_cast<std::size_t>(max_qid) + 1) {
    if (in_place_.device != 0 && in_place_.bytes < media_->size())
      throw error("CPU engine for GPU clients: the media's bytes read in place are fewer than its size");
    if (doorbells_.size() < 2 * (static_cast<std::size_t>(max_qid) + 1))
      throw error("CPU engine for GPU clients: too few doorbell words for " + std::to_string(max_qid) + " queues");
    if (dma_.lanes == nullptr || dma_.claim == nullptr || dma_.max_qid < max_qid)
      throw error("CPU engine for GPU clients: no data lanes for " + std::to_string(max_qid) + " queues");
    const std::uint32_t n = std::max<std::uint32_t>(threads, 1);
    if (dma_.run_ns == nullptr) {
      own_run_ns_.assign(n, 0);
      dma_.run_ns = own_run_ns_.data();
    }
    for (std::uint32_t i = 0; i < n; ++i) {
      auto w = std::make_unique<worker>();
      w->staging = static_cast<std::uint8_t*>(alloc_staging ? alloc_staging(staging_bytes)
                                                            : std::aligned_alloc(dma_page_size, staging_bytes));
      if (w->staging == nullptr) throw error("CPU engine for GPU clients: no memory for staging buffers");
      w->slot.resize(slots);
      for (std::uint32_t k = slots; k-- > 0;)
        w->free_slots.push_back(static_cast<std::uint16_t>(k));
      workers_.push_back(std::move(w));
    }
    for (std::uint32_t i = 0; i < n; ++i) {
      worker* w = workers_[i].get();
      w->thread = std::thread([this, w, i] { run(*w, dma_.run_ns[i]); });
      const std::string tname = "bam-gpuclnt-" + std::to_string(i % 100);
      pthread_setname_np(w->thread.native_handle(), tname.c_str());
    }
  }
  ~client_engine() override {
    stop_.store(true, std::memory_order_release);
    for (auto& w : workers_) {
      w->wake.notify_all();
      w->thread.join();
      if (free_staging_)
        free_staging_(w->staging);
      else
        std::free(w->staging);
    }
  }
  client_engine(const client_engine&) = delete;
  client_engine& operator=(const client_engine&) = delete;

  std::shared_ptr<media> media_ref() const { return media_; }
  const client_dma_ref& dma() const { return dma_; }
  //! Whether GPU threads read the media in place (no staging copy).
  bool reads_in_place() const { return in_place_.device != 0; }

  nvme::status queue_created(const queue_info& q) override {
    if (q.qid > max_qid_ || q.cq->cqid > max_qid_ || q.target == nullptr)
      return {nvme::status_type::command_specific, nvme::command_specific_status::invalid_queue_identifier, true};
    worker& w = *workers_[q.cq->cqid % workers_.size()];
    faults_.store(q.target->faults, std::memory_order_release);
    auto s = std::make_unique<sq_runtime>();
    s->info = q;
    s->lane = &dma_.lanes[q.qid];
    s->cpu = &lanes_[q.qid];
    store(doorbells_[2 * q.qid], 0);
    store(doorbells_[2 * q.cq->cqid + 1], 0);
    {
      std::lock_guard lock(w.mutex);
      w.sqs.push_back(std::move(s));
    }
    w.wake.notify_all();
    return nvme::status_success;
  }
  void queue_deleted(std::uint16_t sqid) override {
    for (auto& w : workers_) {
      std::lock_guard lock(w->mutex);
      // Completions still waiting for CQ room are dropped with their queue,
      // and so are commands whose data the GPU threads never moved.
      std::erase_if(w->held, [&](const held_completion& h) { return h.sq->info.qid == sqid; });
      cancel_if(*w, [&](const slot_state& sl) { return sl.sq->info.qid == sqid; });
      std::erase_if(w->sqs, [&](const auto& s) { return s->info.qid == sqid; });
    }
  }
  void reset() override {
    faults_.store(nullptr, std::memory_order_release);
    for (auto& w : workers_) {
      std::lock_guard lock(w->mutex);
      w->held.clear();
      cancel_if(*w, [](const slot_state&) { return true; });
      w->sqs.clear();
    }
  }
  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
    if (offset < nvme::reg::doorbell_base || (offset - nvme::reg::doorbell_base) % 4 != 0) return nullptr;
    const std::uint32_t idx = (offset - nvme::reg::doorbell_base) / 4;
    if (idx >= 2 * (max_qid_ + 1)) return nullptr;
    return doorbells_.data() + idx; // pinned and mapped: the same address on the GPU (UVA)
  }
  void attached(std::uint32_t dstrd) override {
    if (dstrd != 0)
      throw error("CPU engine for GPU clients: doorbell stride 0 only (CAP.DSTRD " + std::to_string(dstrd) + ")");
  }
  //! The run-time word of the thread serving the SQs of CQ `cqid` (see `detail::run_clock`).
  const std::uint64_t* run_ns(std::uint16_t cqid) const override { return dma_.run_ns + cqid % workers_.size(); }

private:
  //! The engine's own view of a queue's lane (it outlives the queue: the
  //! sequence numbers only grow).
  struct lane_state {
    std::uint64_t next = 0;                  //!< the next task's number
    std::bitset<client_dma_lane::ring> busy; //!< ring entries of tasks in flight
  };
  struct sq_runtime {
    queue_info info;
    std::uint32_t head = 0; //!< next entry to fetch
    client_dma_lane* lane = nullptr;
    lane_state* cpu = nullptr;
  };
  enum class phase : std::uint8_t { gather, scatter };
  struct slot_state {
    sq_runtime* sq = nullptr; //!< null: free
    nvme::command cmd{};
    std::uint8_t* staging = nullptr; //!< `pages` staging pages from `first_page`
    std::uint64_t source = 0;        //!< a read's bytes where GPU threads read them in place (0: `staging`)
    std::uint32_t first_page = 0;
    std::uint32_t pages = 0;
    std::uint64_t seq = 0;
    phase ph = phase::gather;
    command_outcome out; //!< a read's outcome, posted once its data is in place
  };
  struct held_completion {
    sq_runtime* sq;
    std::uint16_t cid;
    nvme::status status;
    std::uint32_t dw0;
    std::uint64_t due_ns;
  };
  struct worker {
    std::thread thread;
    std::mutex mutex; //!< guards everything below
    std::condition_variable wake;
    std::vector<std::unique_ptr<sq_runtime>> sqs;
    std::vector<held_completion> held;
    std::vector<slot_state> slot;
    std::vector<std::uint16_t> free_slots;                                //!< slots not in use
    std::vector<std::uint16_t> inflight;                                  //!< slots whose task the GPU threads have
    std::array<std::uint64_t, staging_bytes / dma_page_size / 64> used{}; //!< staging pages in use
    std::uint8_t* staging = nullptr;
    std::size_t next_sq = 0; //!< where the next fetch round starts (fairness)
  };

  static std::uint32_t load(const std::uint32_t& w) {
    return std::atomic_ref<std::uint32_t>(const_cast<std::uint32_t&>(w)).load(std::memory_order_acquire);
  }
  static void store(std::uint32_t& w, std::uint32_t v) {
    std::atomic_ref<std::uint32_t>(w).store(v, std::memory_order_release);
  }

  //! The executor's backend: blocks on the media through the slot's staging
  //! bytes. A read leaves its data there for the GPU threads; a write finds
  //! its data there (or the status of the failed staging).
  struct backend {
    client_engine* e;
    slot_state* s;
    nvme::status staged;  //!< how the write's data (or range list) arrived
    bool scatter = false; //!< a read's data waits in the staging bytes
    std::uint64_t scatter_bytes = 0;

    nvme::status move(std::uint32_t, std::uint64_t offset, std::uint64_t bytes, const nvme::command&, bool write) {
      if (bytes > max_transfer) return detail::generic(nvme::generic_status::invalid_field);
      if (write) {
        if (!staged.ok()) return staged;
        return detail::write_status(e->media_->write(offset, s->staging, bytes));
      }
      if (e->in_place_.device != 0) {
        // No staging bytes were taken: the GPU threads read the media itself.
        if (offset > e->in_place_.bytes || bytes > e->in_place_.bytes - offset) return detail::read_error();
        s->source = e->in_place_.device + offset;
      } else if (e->media_->read(offset, s->staging, bytes) != 0) {
        return detail::read_error();
      }
      scatter = true;
      scatter_bytes = bytes;
      return nvme::status_success;
    }
    nvme::status flush(std::uint32_t) { return e->media_->flush() == 0 ? nvme::status_success : detail::write_fault(); }
    nvme::status zero(std::uint32_t, std::uint64_t offset, std::uint64_t len, bool deallocate) {
      const int err = deallocate ? e->media_->deallocate(offset, len) : e->media_->write_zeroes(offset, len);
      return detail::write_status(err);
    }
    nvme::status fetch(const nvme::command&, std::uint64_t offset, void* dst, std::uint64_t len) {
      if (!staged.ok()) return staged;
      if (offset + len > max_transfer) return detail::generic(nvme::generic_status::invalid_field);
      std::memcpy(dst, s->staging + offset, len);
      return nvme::status_success;
    }
  };

  //! Bytes a command brings from GPU memory (0: none to stage first).
  static std::uint64_t bytes_to_stage(const nvme::command& cmd, const nvm_target& t) {
    if (cmd.nsid == 0 || cmd.nsid > t.ns_count) return 0; // the executor refuses it
    std::uint64_t bytes = 0;
    if (cmd.opcode == static_cast<std::uint8_t>(nvme::nvm_opcode::write)) {
      bytes = std::uint64_t{nvme::command_nblocks(cmd)} << t.ns[cmd.nsid - 1].lba_shift;
    } else if (cmd.opcode == static_cast<std::uint8_t>(nvme::nvm_opcode::dataset_management)) {
      const nvme::dsm_cdw11 d11{cmd.cdw11};
      if (d11.bits.ad != 0) bytes = (nvme::dsm_cdw10{cmd.cdw10}.bits.nr + 1ull) * sizeof(nvme::dsm_range);
    }
    return bytes <= max_transfer ? bytes : 0; // too large: the executor refuses it
  }

  //! Publish a task on the slot's queue lane.
  static void post(slot_state& s, dma_direction dir, std::uint64_t bytes) {
    lane_state& ls = *s.sq->cpu;
    client_dma_lane& lane = *s.sq->lane;
    s.seq = ls.next++;
    const std::uint32_t at = s.seq % client_dma_lane::ring;
    ls.busy.set(at);
    client_dma_task& t = lane.task[at];
    t.prp1 = s.cmd.prp1;
    t.prp2 = s.cmd.prp2;
    t.staging = s.source != 0 ? s.source : reinterpret_cast<std::uint64_t>(s.staging);
    t.bytes = static_cast<std::uint32_t>(bytes);
    t.direction = dir;
    std::atomic_ref<std::uint64_t>(t.seq).store(s.seq, std::memory_order_release);
    std::atomic_ref<std::uint64_t>(lane.posted).store(ls.next, std::memory_order_release);
  }
  //! Forget a slot's command: its task, if any, is never moved.
  static void cancel(slot_state& s) {
    const std::uint32_t at = s.seq % client_dma_lane::ring;
    if (s.sq->cpu->busy.test(at)) {
      std::atomic_ref<std::uint64_t>(s.sq->lane->task[at].seq).store(~0ull, std::memory_order_release);
      s.sq->cpu->busy.reset(at);
    }
  }

  //! Take `n` contiguous staging pages (first fit); false if there are none.
  static bool take_pages(worker& w, std::uint32_t n, std::uint32_t& first) {
    constexpr std::uint32_t total = staging_bytes / dma_page_size;
    if (n == 1) {
      for (std::uint32_t k = 0; k < w.used.size(); ++k) {
        if (w.used[k] == ~0ull) continue;
        first = k * 64 + static_cast<std::uint32_t>(std::countr_one(w.used[k]));
        w.used[k] |= 1ull << (first % 64);
        return true;
      }
      return false;
    }
    std::uint32_t run = 0;
    for (std::uint32_t p = 0; p < total; ++p) {
      run = (w.used[p / 64] >> (p % 64)) & 1u ? 0 : run + 1;
      if (run == n) {
        first = p + 1 - n;
        for (std::uint32_t q = first; q <= p; ++q)
          w.used[q / 64] |= 1ull << (q % 64);
        return true;
      }
    }
    return false;
  }
  //! Give a slot and its staging pages back.
  static void release(worker& w, std::uint16_t idx) {
    slot_state& s = w.slot[idx];
    for (std::uint32_t q = s.first_page; q < s.first_page + s.pages; ++q)
      w.used[q / 64] &= ~(1ull << (q % 64));
    s.pages = 0;
    s.sq = nullptr;
    w.free_slots.push_back(idx);
  }
  //! Staging bytes a command moves (0: none, or refused by the executor).
  std::uint64_t staging_need(const nvme::command& cmd, const nvm_target& t) const {
    if (cmd.opcode == static_cast<std::uint8_t>(nvme::nvm_opcode::read)) {
      if (in_place_.device != 0) return 0; // read where it is
      if (cmd.nsid == 0 || cmd.nsid > t.ns_count) return 0;
      const std::uint64_t bytes = std::uint64_t{nvme::command_nblocks(cmd)} << t.ns[cmd.nsid - 1].lba_shift;
      return bytes <= max_transfer ? bytes : 0;
    }
    return bytes_to_stage(cmd, t);
  }
  //! Forget the in-flight commands `pred` picks: their tasks are never moved.
  template <class Pred>
  static void cancel_if(worker& w, Pred&& pred) {
    for (std::size_t i = 0; i < w.inflight.size();) {
      const std::uint16_t idx = w.inflight[i];
      if (!pred(w.slot[idx])) {
        ++i;
        continue;
      }
      cancel(w.slot[idx]);
      release(w, idx);
      w.inflight[i] = w.inflight.back();
      w.inflight.pop_back();
    }
  }

  //! Post a completion if its CQ has room and it is due; false otherwise.
  bool try_post(const held_completion& h) {
    if (h.due_ns != 0 && bam::detail::now_ns() < h.due_ns) return false;
    cq_state& cq = *h.sq->info.cq;
    // The consumer's head doorbell is this engine's word (the GPU writes it).
    cq.head = consumer_head(cq.head, load(doorbells_[2 * cq.cqid + 1]), cq.depth);
    if (cq.tail - cq.head >= cq.depth - 1) return false;
    // The SQ head as fetched by now: never behind an earlier report, even
    // when completions are posted out of fetch order.
    detail::post_completion(cq, h.sq->info.qid, static_cast<std::uint16_t>(h.sq->head), h.cid, h.status, h.dw0);
    return true;
  }
  void complete(worker& w, slot_state& s, const command_outcome& out) {
    if (!out.drop) {
      const held_completion h{s.sq, s.cmd.cid, out.status, out.dw0,
                              out.delay_ns ? bam::detail::now_ns() + out.delay_ns : 0};
      if (!w.held.empty() || !try_post(h)) w.held.push_back(h); // keep CQ order
    }
  }

  //! Start a fetched command in its slot; true if its task is now in flight.
  bool start(worker& w, slot_state& s) {
    const nvm_target& t = *s.sq->info.target;
    if (const std::uint64_t bytes = bytes_to_stage(s.cmd, t); bytes != 0) {
      s.ph = phase::gather; // the data leaves GPU memory first
      post(s, dma_direction::from_gpu, bytes);
      return true;
    }
    backend be{this, &s, nvme::status_success};
    const command_outcome out = process_nvm(s.cmd, s.sq->info.qid, t, be);
    if (be.scatter && out.status.ok() && !out.drop) {
      s.ph = phase::scatter; // completes once the GPU threads moved the data
      s.out = out;
      post(s, dma_direction::to_gpu, be.scatter_bytes);
      return true;
    }
    complete(w, s, out);
    return false;
  }
  //! A slot's task is done (`st`: how the data moved).
  void finish(worker& w, slot_state& s, nvme::status st) {
    s.sq->cpu->busy.reset(s.seq % client_dma_lane::ring);
    if (s.ph == phase::scatter) {
      command_outcome out = s.out;
      if (!st.ok()) out.status = st;
      complete(w, s, out);
      return;
    }
    backend be{this, &s, st};
    complete(w, s, process_nvm(s.cmd, s.sq->info.qid, *s.sq->info.target, be));
  }

  //! One round over the worker's queues; true if anything moved.
  bool round(worker& w) {
    std::lock_guard lock(w.mutex);
    const fault_table* faults = w.sqs.empty() ? nullptr : w.sqs.front()->info.target->faults;
    if (faults != nullptr && faults->is_paused()) return false;
    bool progressed = false;
    // Completions that found no room before, or were not due yet.
    progressed |= std::erase_if(w.held, [this](const held_completion& h) { return try_post(h); }) != 0;
    // Tasks the GPU threads finished.
    for (std::size_t i = 0; i < w.inflight.size();) {
      const std::uint16_t idx = w.inflight[i];
      slot_state& s = w.slot[idx];
      const std::uint64_t stamp = std::atomic_ref<std::uint64_t>(s.sq->lane->done[s.seq % client_dma_lane::ring])
                                      .load(std::memory_order_acquire);
      if ((stamp >> 16) != s.seq + 1) {
        ++i;
        continue;
      }
      finish(w, s, nvme::status{static_cast<std::uint16_t>(stamp & 0xffff)});
      release(w, idx);
      w.inflight[i] = w.inflight.back();
      w.inflight.pop_back();
      progressed = true;
    }
    // New commands, while slots and staging pages are free; queues taken in turn.
    const std::size_t nq = w.sqs.size();
    bool full = false;
    for (std::size_t i = 0; i < nq && !full; ++i) {
      sq_runtime& q = *w.sqs[(w.next_sq + i) % nq];
      const std::uint32_t tail = load(doorbells_[2 * q.info.qid]);
      if (tail >= q.info.sq_depth) continue; // an invalid doorbell value: ignored
      for (std::uint32_t budget = 64; budget > 0 && q.head != tail; --budget) {
        if (q.cpu->busy.test(q.cpu->next % client_dma_lane::ring)) break; // its lane is full
        if (w.free_slots.empty()) {
          full = true;
          break;
        }
        const std::uint16_t idx = w.free_slots.back();
        slot_state& s = w.slot[idx];
        s.cmd = q.info.sq[q.head];
        const std::uint64_t need = staging_need(s.cmd, *q.info.target);
        s.pages = static_cast<std::uint32_t>((need + dma_page_size - 1) / dma_page_size);
        if (s.pages != 0 && !take_pages(w, s.pages, s.first_page)) {
          s.pages = 0;
          full = true;
          break;
        }
        w.free_slots.pop_back();
        s.staging = s.pages != 0 ? w.staging + std::size_t{s.first_page} * dma_page_size : nullptr;
        s.source = 0;
        q.head = (q.head + 1) % q.info.sq_depth;
        s.sq = &q;
        if (start(w, s))
          w.inflight.push_back(idx);
        else
          release(w, idx);
        progressed = true;
      }
      if (full) w.next_sq = (w.next_sq + i + 1) % nq;
    }
    return progressed;
  }
  bool idle(worker& w) {
    std::lock_guard lock(w.mutex);
    return w.held.empty() && w.inflight.empty();
  }

  //! Whether the controller's fault table says its threads stop running.
  //! Read under the worker's lock: `reset` forgets the table (the controller
  //! is going away) and waits for every worker's lock.
  bool stalled(worker& w) {
    std::lock_guard lock(w.mutex);
    const fault_table* faults = faults_.load(std::memory_order_acquire);
    return faults != nullptr && faults->is_stalled();
  }
  void run(worker& w, std::uint64_t& run_word) {
    detail::precise_sleeps();
    detail::run_clock run_time;
    unsigned quiet = 0;
    std::uint64_t idle_since = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      if (stalled(w)) { // a test's stand-in for a busy host
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      run_time.tick(run_word);
      if (round(w)) {
        quiet = 0;
        idle_since = 0;
        continue;
      }
      // Nothing moved. While commands are in flight the GPU threads are
      // about to answer: keep polling. Otherwise back off to sleeps that
      // grow with the time idle (`detail::idle_nap`); a queue created wakes
      // the thread at once.
      ++quiet;
      const bool waiting = quiet >= 64 && !idle(w);
      if (quiet < 64 || (waiting && quiet < 4096)) {
        std::this_thread::yield();
        continue;
      }
      // Tasks no GPU thread takes for this long: their waiters gave up.
      const std::uint64_t now = bam::detail::now_ns();
      if (idle_since == 0) idle_since = now;
      const auto nap = waiting ? std::chrono::microseconds(20) : detail::idle_nap(now - idle_since);
      if (nap.count() == 0) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock lock(w.mutex);
      w.wake.wait_for(lock, nap);
    }
  }

  std::shared_ptr<media> media_;
  std::uint32_t max_qid_;
  std::span<std::uint32_t> doorbells_;
  client_dma_ref dma_;
  client_in_place in_place_;
  std::function<void(void*)> free_staging_;
  std::vector<lane_state> lanes_; //!< per queue id, guarded by the serving worker's mutex
  std::vector<std::uint64_t> own_run_ns_;
  std::atomic<const fault_table*> faults_{nullptr}; //!< the controller's (from its queues)
  std::vector<std::unique_ptr<worker>> workers_;
  std::atomic<bool> stop_{false};
};

} // namespace bam::emu
