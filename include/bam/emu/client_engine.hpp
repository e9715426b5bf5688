// SPDX-License-Identifier: MIT
//! The CPU engine for GPU clients: CPU threads serve the software
//! controller's I/O queues for GPU submitters, from any emu media (a file, a
//! block device, RAM), so a GPU application runs on a plain file.
//!
//!  - SQ/CQ rings live in pinned host memory mapped into the GPU; doorbells
//!    are host words the GPU writes and these threads poll.
//!  - Each thread fetches a batch of commands and runs every one through the
//!    one executor (`process_nvm`: checks, fault rules, statistics). Data
//!    moves between the media and GPU memory through bounce buffers and a
//!    `gpu_copier` (CUDA copies on the thread's own stream,
//!    `client_engine.cuh`): data to be written is copied out of GPU memory
//!    before the media is written; read data is copied in and the copies are
//!    waited for before any completion of the batch is posted. A failed
//!    copy completes its commands with Data Transfer Error.
//!  - A completion with no room in its CQ waits (it is never dropped); the
//!    thread keeps serving other queues meanwhile.
//!
//! This file has no CUDA in it: tests drive the engine with a host copier.
//!
//! @code
//!   auto engine = bam::emu::make_client_engine(media, 512, 128, 4);   // client_engine.cuh
//!   // cfg.io_engine = engine; bam::storage puts the queue rings in pinned host memory
//!   // (the engine registers itself with queue_ring_memory::pinned_host)
//! @endcode
#pragma once

#include <bam/emu/engine.hpp>
#include <bam/emu/media.hpp>
#include <bam/emu/nvm_executor.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport/transport.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace bam::emu {

//! How the engine reaches GPU memory. One per engine thread.
class gpu_copier {
public:
  virtual ~gpu_copier() = default;
  //! Queue a copy of `n` bytes to GPU address `gpu` / out of it. False if it
  //! cannot be queued.
  virtual bool to_gpu(std::uint64_t gpu, const void* src, std::size_t n) = 0;
  virtual bool from_gpu(void* dst, std::uint64_t gpu, std::size_t n) = 0;
  //! Wait for every queued copy; false if any of them failed.
  virtual bool wait() = 0;
};

class client_engine final : public io_engine {
public:
  //! Commands fetched per batch (one wait for copies per batch).
  static constexpr std::uint32_t batch = 32;
  //! Largest transfer of one command through a bounce buffer (the MDTS the
  //! controller must report: `mdts` 5).
  static constexpr std::size_t max_transfer = 128 * 1024;

  //! `doorbells`: 2 * (max_qid + 1) words the GPU writes (doorbell stride 0).
  //! `make_copier` is called once per thread.
  client_engine(std::shared_ptr<media> m, std::uint32_t max_qid, std::uint32_t threads,
                std::span<std::uint32_t> doorbells, std::function<std::unique_ptr<gpu_copier>()> make_copier,
                std::function<void*(std::size_t)> alloc_bounce = nullptr,
                std::function<void(void*)> free_bounce = nullptr)
      : media_(std::move(m)), max_qid_(max_qid), doorbells_(doorbells), free_bounce_(std::move(free_bounce)) {
    if (doorbells_.size() < 2 * (static_cast<std::size_t>(max_qid) + 1))
      throw error("CPU engine for GPU clients: too few doorbell words for " + std::to_string(max_qid) + " queues");
    const std::uint32_t n = std::max<std::uint32_t>(threads, 1);
    for (std::uint32_t i = 0; i < n; ++i) {
      auto w = std::make_unique<worker>();
      w->copier = make_copier();
      const std::size_t bytes = batch * max_transfer;
      w->bounce =
          static_cast<std::uint8_t*>(alloc_bounce ? alloc_bounce(bytes) : std::aligned_alloc(dma_page_size, bytes));
      if (w->bounce == nullptr) throw error("CPU engine for GPU clients: no memory for bounce buffers");
      workers_.push_back(std::move(w));
    }
    for (std::uint32_t i = 0; i < n; ++i) {
      worker* w = workers_[i].get();
      w->thread = std::thread([this, w] { run(*w); });
      const std::string tname = "bam-gpuclnt-" + std::to_string(i % 100);
      pthread_setname_np(w->thread.native_handle(), tname.c_str());
    }
  }
  ~client_engine() override {
    stop_.store(true, std::memory_order_release);
    for (auto& w : workers_) {
      w->thread.join();
      if (free_bounce_)
        free_bounce_(w->bounce);
      else
        std::free(w->bounce);
    }
  }
  client_engine(const client_engine&) = delete;
  client_engine& operator=(const client_engine&) = delete;

  std::shared_ptr<media> media_ref() const { return media_; }

  nvme::status queue_created(const queue_info& q) override {
    if (q.qid > max_qid_ || q.cq->cqid > max_qid_ || q.target == nullptr)
      return {nvme::status_type::command_specific, nvme::command_specific_status::invalid_queue_identifier, true};
    worker& w = *workers_[q.cq->cqid % workers_.size()];
    auto s = std::make_unique<sq_runtime>();
    s->info = q;
    store(doorbells_[2 * q.qid], 0);
    store(doorbells_[2 * q.cq->cqid + 1], 0);
    std::lock_guard lock(w.mutex);
    w.sqs.push_back(std::move(s));
    return nvme::status_success;
  }
  void queue_deleted(std::uint16_t sqid) override {
    for (auto& w : workers_) {
      std::lock_guard lock(w->mutex);
      // Completions still waiting for CQ room are dropped with their queue.
      std::erase_if(w->held, [&](const held_completion& h) { return h.sq->info.qid == sqid; });
      std::erase_if(w->sqs, [&](const auto& s) { return s->info.qid == sqid; });
    }
  }
  void reset() override {
    for (auto& w : workers_) {
      std::lock_guard lock(w->mutex);
      w->held.clear();
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

private:
  struct sq_runtime {
    queue_info info;
    std::uint32_t head = 0; //!< next entry to fetch
  };
  struct pending {
    nvme::command cmd;
    sq_runtime* sq;
    std::uint8_t* bounce;
    bool staged_ok = true; //!< write data copied out of GPU memory
    command_outcome out;
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
    std::mutex mutex; //!< guards sqs and held
    std::vector<std::unique_ptr<sq_runtime>> sqs;
    std::vector<held_completion> held;
    std::unique_ptr<gpu_copier> copier;
    std::uint8_t* bounce = nullptr;
  };

  static std::uint32_t load(const std::uint32_t& w) {
    return std::atomic_ref<std::uint32_t>(const_cast<std::uint32_t&>(w)).load(std::memory_order_acquire);
  }
  static void store(std::uint32_t& w, std::uint32_t v) {
    std::atomic_ref<std::uint32_t>(w).store(v, std::memory_order_release);
  }

  //! The executor's backend: blocks on the media, data through the bounce
  //! buffer and the copier; PRP lists are read out of GPU memory.
  struct backend {
    client_engine* e;
    pending* p;
    gpu_copier* copier;

    bool read_list(std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
      return copier->from_gpu(dst, bus, n * sizeof(std::uint64_t)) && copier->wait();
    }
    nvme::status move(std::uint32_t, std::uint64_t offset, std::uint64_t bytes, const nvme::command& cmd, bool write) {
      if (bytes > max_transfer) return detail::generic(nvme::generic_status::invalid_field);
      if (write) {
        if (!p->staged_ok) return detail::generic(nvme::generic_status::data_transfer_error);
        return detail::write_status(e->media_->write(offset, p->bounce, bytes));
      }
      if (e->media_->read(offset, p->bounce, bytes) != 0) return detail::read_error();
      std::uint64_t done = 0;
      bool queued = true;
      const nvme::status st = nvme::walk_prp(
          cmd.prp1, cmd.prp2, bytes, dma_page_size,
          [&](std::uint64_t bus, std::uint64_t* d, std::size_t n) { return read_list(bus, d, n); },
          [&](std::uint64_t bus, std::uint64_t len) {
            queued = queued && copier->to_gpu(bus, p->bounce + done, len);
            done += len;
            return true;
          });
      if (!st.ok()) return st;
      return queued ? nvme::status_success : detail::generic(nvme::generic_status::data_transfer_error);
    }
    nvme::status flush(std::uint32_t) { return e->media_->flush() == 0 ? nvme::status_success : detail::write_fault(); }
    nvme::status zero(std::uint32_t, std::uint64_t offset, std::uint64_t len, bool deallocate) {
      const int err = deallocate ? e->media_->deallocate(offset, len) : e->media_->write_zeroes(offset, len);
      return detail::write_status(err);
    }
    nvme::status fetch(const nvme::command& cmd, std::uint64_t offset, void* dst, std::uint64_t len) {
      std::vector<unsigned char> all(offset + len);
      std::uint64_t pos = 0;
      bool ok = true;
      const nvme::status st = nvme::walk_prp(
          cmd.prp1, cmd.prp2, all.size(), dma_page_size,
          [&](std::uint64_t bus, std::uint64_t* d, std::size_t n) { return read_list(bus, d, n); },
          [&](std::uint64_t bus, std::uint64_t seg) {
            ok = ok && copier->from_gpu(all.data() + pos, bus, seg);
            pos += seg;
            return true;
          });
      if (!st.ok()) return st;
      if (!ok || !copier->wait()) return detail::generic(nvme::generic_status::data_transfer_error);
      std::memcpy(dst, all.data() + offset, len);
      return nvme::status_success;
    }
  };

  //! Stage the data of a write: copy it out of GPU memory into the bounce buffer.
  static void stage_write(pending& p, gpu_copier& copier) {
    if (p.cmd.opcode != static_cast<std::uint8_t>(nvme::nvm_opcode::write)) return;
    const nvm_target& t = *p.sq->info.target;
    if (p.cmd.nsid == 0 || p.cmd.nsid > t.ns_count) return; // the executor refuses it
    const std::uint64_t bytes = std::uint64_t{nvme::command_nblocks(p.cmd)} << t.ns[p.cmd.nsid - 1].lba_shift;
    if (bytes > max_transfer) return;
    std::uint64_t done = 0;
    nvme::walk_prp(
        p.cmd.prp1, p.cmd.prp2, bytes, dma_page_size,
        [&](std::uint64_t bus, std::uint64_t* d, std::size_t n) {
          return copier.from_gpu(d, bus, n * sizeof(std::uint64_t)) && copier.wait();
        },
        [&](std::uint64_t bus, std::uint64_t len) {
          p.staged_ok = p.staged_ok && copier.from_gpu(p.bounce + done, bus, len);
          done += len;
          return true;
        });
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

  void run(worker& w) {
    unsigned idle = 0;
    std::vector<pending> work;
    work.reserve(batch);
    while (!stop_.load(std::memory_order_acquire)) {
      bool progressed = false;
      {
        std::lock_guard lock(w.mutex);
        const fault_table* faults = w.sqs.empty() ? nullptr : w.sqs.front()->info.target->faults;
        if (faults != nullptr && faults->is_paused()) {
          work.clear();
        } else {
          // Completions that found no room before, or were not due yet.
          progressed |= std::erase_if(w.held, [this](const held_completion& h) { return try_post(h); }) != 0;
          work.clear();
          for (auto& s : w.sqs) {
            const std::uint32_t tail = load(doorbells_[2 * s->info.qid]);
            if (tail >= s->info.sq_depth) continue; // an invalid doorbell value: ignored
            while (s->head != tail && work.size() < batch) {
              pending p;
              p.cmd = s->info.sq[s->head];
              s->head = (s->head + 1) % s->info.sq_depth;
              p.sq = s.get();
              p.bounce = w.bounce + work.size() * max_transfer;
              work.push_back(p);
            }
          }
          if (!work.empty()) {
            progressed = true;
            // Data to be written leaves GPU memory first.
            for (auto& p : work)
              stage_write(p, *w.copier);
            if (!w.copier->wait())
              for (auto& p : work)
                p.staged_ok = false;
            // Execute; read data is queued towards GPU memory.
            for (auto& p : work) {
              backend be{this, &p, w.copier.get()};
              p.out = process_nvm(p.cmd, p.sq->info.qid, *p.sq->info.target, be);
            }
            // Nothing completes before its data is in GPU memory.
            if (!w.copier->wait())
              for (auto& p : work)
                if (p.cmd.opcode == static_cast<std::uint8_t>(nvme::nvm_opcode::read) && p.out.status.ok())
                  p.out.status = detail::generic(nvme::generic_status::data_transfer_error);
            for (auto& p : work) {
              if (p.out.drop) continue;
              const held_completion h{p.sq, p.cmd.cid, p.out.status, p.out.dw0,
                                      p.out.delay_ns ? bam::detail::now_ns() + p.out.delay_ns : 0};
              if (!w.held.empty() || !try_post(h)) w.held.push_back(h); // keep CQ order
            }
          }
        }
      }
      if (progressed) {
        idle = 0;
        continue;
      }
      if (++idle > 256)
        std::this_thread::sleep_for(std::chrono::microseconds(5));
      else
        std::this_thread::yield();
    }
  }

  std::shared_ptr<media> media_;
  std::uint32_t max_qid_;
  std::span<std::uint32_t> doorbells_;
  std::function<void(void*)> free_bounce_;
  std::vector<std::unique_ptr<worker>> workers_;
  std::atomic<bool> stop_{false};
};

} // namespace bam::emu
