// SPDX-License-Identifier: MIT
//! The "CPU engine for GPU clients": CPU threads serve the software
//! controller's I/O queues for GPU submitters, from any emu media (a real
//! file, a block device, RAM), so a GPU application runs on a plain file with
//! no special hardware.
//!
//!  - SQ/CQ rings live in pinned host memory mapped into the GPU
//!    (`queue_options` sets the controller up so); doorbells are pinned words
//!    the GPU writes and these threads poll.
//!  - Data moves between the media and GPU memory through a pinned bounce
//!    buffer and `cudaMemcpyAsync` on the thread's own stream, one batch of
//!    fetched commands at a time; the stream is synchronized before any of the
//!    batch's completions is posted, so the data is in GPU memory before the
//!    completion becomes visible.
//!  - Bus addresses are GPU virtual addresses (the controller runs with identity DMA).
//!
//! Not covered by the emu controller's fault injector (commands do not go
//! through `queue_info::process`); `pause()` works.
//!
//! @code
//!   auto m = bam::emu::make_file_media("/data/x.img", 0, false);
//!   auto engine = std::make_shared<bam::emu::gpu_client_engine>(m, 512, 128, 4);
//!   // cfg.io_engine = engine; bam::controller c(ctrl, gpu_client_engine::queue_options({}));
//! @endcode
#pragma once

#include <bam/controller.hpp>
#include <bam/detail/macros.hpp>
#include <bam/emu/engine.hpp>
#include <bam/emu/media.hpp>
#include <bam/gpu/cuda.cuh>
#include <bam/gpu/storage.cuh>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/spec.hpp>
#include <bam/transport.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace bam::emu {

class gpu_client_engine final : public io_engine {
public:
  //! Commands fetched per batch (one stream synchronization per batch).
  static constexpr std::uint32_t batch = 32;
  //! Largest transfer of one command through the bounce buffer.
  static constexpr std::size_t max_transfer = 128 * 1024;

  gpu_client_engine(std::shared_ptr<media> m, std::uint32_t lba_size, std::uint32_t max_qid,
                    std::uint32_t threads)
      : media_(std::move(m)), lba_size_(lba_size), max_qid_(max_qid) {
    doorbells_ = gpu::pinned_buffer<std::uint32_t>(2 * (max_qid + 1));
    const std::uint32_t n = std::max<std::uint32_t>(threads, 1);
    for (std::uint32_t i = 0; i < n; ++i) workers_.push_back(std::make_unique<worker>());
    for (auto& w : workers_) {
      w->bounce = gpu::pinned_buffer<std::uint8_t>(batch * max_transfer);
      BAM_CUDA_TRY(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
    }
    for (auto& w : workers_) {
      worker* wp = w.get();
      w->thread = std::thread([this, wp] { run(*wp); });
    }
  }
  ~gpu_client_engine() override {
    stop_.store(true, std::memory_order_release);
    for (auto& w : workers_) {
      w->thread.join();
      BAM_CUDA_LOG(cudaStreamDestroy(w->stream));
    }
  }

  //! Controller options for this engine: rings in pinned, GPU-mapped host
  //! memory; submitter state in GPU memory; GPU doorbells.
  static controller_options queue_options(controller_options o) {
    o.ring_alloc = [](transport& t, std::size_t bytes) -> std::unique_ptr<dma_region> {
      const std::size_t size = transport::round_up(bytes);
      void* raw = nullptr; // cudaHostAlloc does not promise 4 KiB alignment for small sizes
      BAM_CUDA_TRY(cudaHostAlloc(&raw, size + dma_page_size, cudaHostAllocMapped | cudaHostAllocPortable));
      void* p = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(raw) + dma_page_size - 1) /
                                        dma_page_size * dma_page_size);
      std::memset(p, 0, size);
      try {
        return std::make_unique<pinned_region>(t.map(p, size, memory_kind::host), raw);
      } catch (...) {
        cudaFreeHost(raw);
        throw;
      }
    };
    o.state_alloc = [](std::size_t bytes) { return gpu::alloc_queue_state(bytes); };
    o.state_free = [](void* p) { BAM_CUDA_LOG(cudaFree(p)); };
    o.device_doorbells = true;
    return o;
  }

  std::shared_ptr<media> media_ref() const { return media_; }

  void queue_created(const queue_info& q) override {
    worker& w = *workers_[q.cq->cqid % workers_.size()];
    auto s = std::make_unique<sq_runtime>();
    s->qid = q.qid;
    s->sq = q.sq;
    s->depth = q.sq_depth;
    s->cq = q.cq;
    doorbells_.get()[2 * q.qid] = 0;
    doorbells_.get()[2 * q.cq->cqid + 1] = 0;
    std::lock_guard lock(w.mutex);
    w.sqs.push_back(std::move(s));
  }
  void queue_deleted(std::uint16_t sqid) override {
    for (auto& w : workers_) {
      std::lock_guard lock(w->mutex);
      std::erase_if(w->sqs, [&](const auto& s) { return s->qid == sqid; });
    }
  }
  void reset() override {
    for (auto& w : workers_) {
      std::lock_guard lock(w->mutex);
      w->sqs.clear();
    }
  }
  void pause(bool stop) override { paused_.store(stop, std::memory_order_release); }
  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
    if (offset < nvme::reg::doorbell_base || (offset - nvme::reg::doorbell_base) % 4 != 0) return nullptr;
    const std::uint32_t idx = (offset - nvme::reg::doorbell_base) / 4;
    if (idx >= 2 * (max_qid_ + 1)) return nullptr;
    return doorbells_.get() + idx; // pinned and mapped: the same address on the GPU (UVA)
  }

private:
  class pinned_region final : public dma_region {
  public:
    pinned_region(std::unique_ptr<dma_region> m, void* p)
        : dma_region(m->data(), m->size(), m->kind(), m->page_bus()), mapping_(std::move(m)), p_(p) {}
    ~pinned_region() override {
      mapping_.reset();
      BAM_CUDA_LOG(cudaFreeHost(p_));
    }

  private:
    std::unique_ptr<dma_region> mapping_;
    void* p_;
  };

  struct sq_runtime {
    std::uint16_t qid = 0;
    nvme::command* sq = nullptr;
    std::uint32_t depth = 0;
    std::uint32_t head = 0;
    cq_state* cq = nullptr;
  };
  struct pending {
    nvme::command cmd;
    nvme::status st;
    sq_runtime* sq;
    std::uint16_t sq_head;
    std::uint8_t* bounce;
    bool is_write;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> segs; // GPU address, length
  };
  struct worker {
    std::thread thread;
    std::mutex mutex;
    std::vector<std::unique_ptr<sq_runtime>> sqs;
    gpu::pinned_buffer<std::uint8_t> bounce;
    cudaStream_t stream = nullptr;
  };

  static std::uint32_t load(const volatile std::uint32_t* p) {
    return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(p)).load(std::memory_order_acquire);
  }

  void run(worker& w) {
    unsigned idle = 0;
    std::vector<pending> work;
    while (!stop_.load(std::memory_order_acquire)) {
      if (paused_.load(std::memory_order_acquire)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      work.clear();
      {
        std::lock_guard lock(w.mutex);
        for (auto& s : w.sqs) {
          const std::uint32_t tail = load(doorbells_.get() + 2 * s->qid);
          if (tail >= s->depth) continue;
          while (s->head != tail && work.size() < batch) {
            pending p;
            p.cmd = s->sq[s->head];
            s->head = (s->head + 1) % s->depth;
            p.sq = s.get();
            p.sq_head = static_cast<std::uint16_t>(s->head);
            p.bounce = w.bounce.get() + work.size() * max_transfer;
            work.push_back(std::move(p));
          }
        }
      }
      if (work.empty()) {
        if (++idle > 256) std::this_thread::sleep_for(std::chrono::microseconds(5));
        else std::this_thread::yield();
        continue;
      }
      idle = 0;
      // Reads from the media into the bounce buffer; writes copied out of GPU memory.
      bool any_copy = false;
      for (auto& p : work) any_copy |= prepare(p, w.stream);
      if (any_copy) cudaStreamSynchronize(w.stream);
      for (auto& p : work) finish_writes(p);
      any_copy = false;
      for (auto& p : work) any_copy |= deliver(p, w.stream);
      if (any_copy && cudaStreamSynchronize(w.stream) != cudaSuccess)
        for (auto& p : work) p.st = nvme::status{nvme::status_type::generic, nvme::generic_status::data_transfer_error, true};
      for (auto& p : work) post(p);
    }
  }

  //! Decode, walk the PRPs (lists are in GPU memory: copied out), read the
  //! media for reads, start the GPU->bounce copies for writes.
  bool prepare(pending& p, cudaStream_t stream) {
    using namespace nvme;
    const auto op = p.cmd.opcode;
    p.is_write = op == static_cast<std::uint8_t>(nvm_opcode::write);
    const bool is_read = op == static_cast<std::uint8_t>(nvm_opcode::read);
    if (op == static_cast<std::uint8_t>(nvm_opcode::flush)) {
      p.st = media_->flush() == 0 ? status_success
                                  : status{status_type::media_error, media_status::write_fault, true};
      return false;
    }
    if (!is_read && !p.is_write) {
      p.st = status{status_type::generic, generic_status::invalid_opcode, true};
      return false;
    }
    const std::uint64_t slba = command_slba(p.cmd);
    const std::uint64_t bytes = static_cast<std::uint64_t>(command_nblocks(p.cmd)) * lba_size_;
    if (p.cmd.nsid != 1) {
      p.st = status{status_type::generic, generic_status::invalid_namespace, true};
      return false;
    }
    if (slba * lba_size_ > media_->size() || bytes > media_->size() - slba * lba_size_) {
      p.st = status{status_type::generic, generic_status::lba_out_of_range, true};
      return false;
    }
    if (bytes > max_transfer) {
      p.st = status{status_type::generic, generic_status::invalid_field, true};
      return false;
    }
    auto read_list = [](std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
      return cudaMemcpy(dst, reinterpret_cast<const void*>(bus), n * sizeof(std::uint64_t),
                        cudaMemcpyDefault) == cudaSuccess;
    };
    auto segment = [&](std::uint64_t bus, std::uint64_t len) {
      p.segs.emplace_back(bus, len);
      return true;
    };
    p.st = walk_prp(p.cmd.prp1, p.cmd.prp2, bytes, dma_page_size, read_list, segment);
    if (!p.st.ok()) return false;
    if (is_read) {
      if (media_->read(slba * lba_size_, p.bounce, bytes) != 0)
        p.st = status{status_type::media_error, media_status::unrecovered_read_error, true};
      return false;
    }
    std::uint64_t off = 0;
    for (auto& [addr, len] : p.segs) {
      if (cudaMemcpyAsync(p.bounce + off, reinterpret_cast<const void*>(addr), len, cudaMemcpyDefault, stream) !=
          cudaSuccess)
        p.st = status{status_type::generic, generic_status::data_transfer_error, true};
      off += len;
    }
    return true;
  }
  void finish_writes(pending& p) {
    if (!p.is_write || !p.st.ok()) return;
    const std::uint64_t bytes = static_cast<std::uint64_t>(nvme::command_nblocks(p.cmd)) * lba_size_;
    if (media_->write(nvme::command_slba(p.cmd) * lba_size_, p.bounce, bytes) != 0)
      p.st = nvme::status{nvme::status_type::media_error, nvme::media_status::write_fault, true};
  }
  bool deliver(pending& p, cudaStream_t stream) {
    if (p.is_write || !p.st.ok() || p.segs.empty()) return false;
    std::uint64_t off = 0;
    for (auto& [addr, len] : p.segs) {
      if (cudaMemcpyAsync(reinterpret_cast<void*>(addr), p.bounce + off, len, cudaMemcpyDefault, stream) !=
          cudaSuccess)
        p.st = nvme::status{nvme::status_type::generic, nvme::generic_status::data_transfer_error, true};
      off += len;
    }
    return true;
  }
  void post(pending& p) {
    cq_state& cq = *p.sq->cq;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      const std::uint32_t h = load(doorbells_.get() + 2 * cq.cqid + 1);
      if (h < cq.depth) cq.head = h;
      const std::uint32_t used = (cq.tail + cq.depth - cq.head) % cq.depth;
      if (used < cq.depth - 1) break;
      if (stop_.load(std::memory_order_acquire) || std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::yield();
    }
    detail::post_completion(cq, p.sq->qid, p.sq_head, p.cmd.cid, p.st, 0);
  }

  std::shared_ptr<media> media_;
  std::uint32_t lba_size_;
  std::uint32_t max_qid_;
  gpu::pinned_buffer<std::uint32_t> doorbells_;
  std::vector<std::unique_ptr<worker>> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
};

} // namespace bam::emu
