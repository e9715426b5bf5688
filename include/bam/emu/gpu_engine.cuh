// SPDX-License-Identifier: MIT
//! The GPU engine of the software NVMe controller (host side). It serves the
//! controller's I/O queues on the GPU, from the GPU threads that wait on them
//! (see `gpu_engine_ref.cuh`); admin commands and bring-up stay with the CPU
//! controller model. Plug it in as `controller_config::io_engine`; give the
//! controller's namespace `engine->namespace_media()` so that identify reports
//! the size and host-side access reaches the same blocks.
//!
//! Media: pinned host RAM (mapped into the GPU), HBM, or null (completes
//! without moving data); optional SSD model: an IOPS limit and a latency.
//! Queue rings and submitter state must be in GPU memory and the controller
//! must hand GPU threads this engine's doorbells (`device_doorbells = true`);
//! `gpu_queue_placement()` fills the controller options for that.
//!
//! @code
//!   auto engine = std::make_shared<bam::emu::gpu_engine>(
//!       bam::emu::gpu_engine_config{.media = bam::emu::gpu_media_kind::hbm, .bytes = 1ull << 30});
//!   // controller_config cfg; cfg.io_engine = engine; namespace media = engine->namespace_media();
//! @endcode
#pragma once

#include <bam/emu/engine.hpp>
#include <bam/emu/gpu_engine_ref.cuh>
#include <bam/emu/media.hpp>
#include <bam/gpu/cuda.cuh>
#include <bam/transport.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace bam::emu {

struct gpu_engine_config {
  gpu_media_kind media = gpu_media_kind::host_ram;
  std::uint64_t bytes = 64ull << 20;  //!< namespace size
  std::uint32_t lba_size = 512;       //!< bytes per block
  std::uint32_t max_qid = 256;        //!< highest I/O queue id served
  std::uint64_t iops = 0;             //!< SSD model: IOPS limit (0: none)
  std::uint64_t latency_ns = 0;       //!< SSD model: latency per command (0: none)
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns; //!< bound of every engine wait
};

inline const char* media_name(gpu_media_kind k) {
  switch (k) {
  case gpu_media_kind::host_ram: return "host-ram";
  case gpu_media_kind::hbm: return "hbm";
  case gpu_media_kind::null: return "null";
  }
  return "?";
}

class gpu_engine final : public io_engine {
public:
  explicit gpu_engine(const gpu_engine_config& cfg) : cfg_(cfg) {
    if (cfg.lba_size < 512 || (cfg.lba_size & (cfg.lba_size - 1)) != 0 || cfg.bytes % cfg.lba_size != 0 ||
        cfg.bytes == 0)
      throw error("GPU engine: the size must be a non-zero multiple of a power-of-two LBA size >= 512 (got " +
                  std::to_string(cfg.bytes) + " bytes, LBA " + std::to_string(cfg.lba_size) + ")");
    if (cfg.media == gpu_media_kind::host_ram) {
      BAM_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&media_), cfg.bytes,
                                 cudaHostAllocMapped | cudaHostAllocPortable));
      BAM_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&media_dev_), media_, 0));
    } else if (cfg.media == gpu_media_kind::hbm) {
      BAM_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&media_), cfg.bytes));
      BAM_CUDA_TRY(cudaMemset(media_, 0, cfg.bytes));
      media_dev_ = media_;
    }
    queues_ = gpu::device_buffer<gpu_engine_queue>(cfg.max_qid + 1);
    doorbells_ = gpu::device_buffer<std::uint32_t>(2 * (cfg.max_qid + 1));
    control_ = gpu::device_buffer<gpu_engine_control>(1);
    set_model(cfg.iops, cfg.latency_ns);
    host_queues_.resize(cfg.max_qid + 1);
  }

  ~gpu_engine() override {
    if (media_ != nullptr) {
      if (cfg_.media == gpu_media_kind::host_ram) BAM_CUDA_LOG(cudaFreeHost(media_));
      else BAM_CUDA_LOG(cudaFree(media_));
    }
  }

  //! The handle GPU threads serve the queues through.
  gpu_engine_ref ref() const {
    gpu_engine_ref r;
    r.queues = queues_.get();
    r.doorbells = doorbells_.get();
    r.control = control_.get();
    r.media = media_dev_;
    r.media_bytes = cfg_.bytes;
    r.nblocks = cfg_.bytes / cfg_.lba_size;
    r.lba_size = cfg_.lba_size;
    r.nsid = 1;
    r.max_qid = cfg_.max_qid;
    r.media_kind = cfg_.media;
    r.timeout_ns = cfg_.timeout_ns;
    return r;
  }
  const gpu_engine_config& config() const { return cfg_; }

  //! Host pointer to the media (host RAM: the pinned block; HBM: a device pointer; null: nullptr).
  std::uint8_t* media_data() const { return media_; }

  // ---- io_engine -------------------------------------------------------

  void queue_created(const queue_info& qi) override {
    std::lock_guard lock(mutex_);
    if (qi.qid == 0 || qi.qid > cfg_.max_qid || qi.cq == nullptr || qi.cq->cqid > cfg_.max_qid)
      throw error("GPU engine: queue id " + std::to_string(qi.qid) + " outside 1.." +
                  std::to_string(cfg_.max_qid));
    const std::uint16_t cqid = qi.cq->cqid;
    gpu_engine_queue q{};
    q.sq = qi.sq;
    q.cq = qi.cq->ring;
    q.sq_depth = qi.sq_depth;
    q.cq_depth = qi.cq->depth;
    q.qid = qi.qid;
    q.cqid = cqid;
    q.active = 1;
    if (cq_users_[cqid]++ == 0 && cqid != qi.qid) {
      // A fresh CQ's producer counters live in the entry of its own id.
      gpu_engine_queue cq{};
      cq.cq_depth = qi.cq->depth;
      cq.cqid = cqid;
      host_queues_[cqid] = cq;
      gpu::copy_to_device(queues_.get() + cqid, &cq, 1);
      const std::uint32_t zero = 0;
      gpu::copy_to_device(doorbells_.get() + 2 * cqid + 1, &zero, 1);
    }
    host_queues_[qi.qid] = q;
    const std::uint32_t zeros[2] = {0, 0};
    gpu::copy_to_device(doorbells_.get() + 2 * qi.qid, zeros, 2);
    gpu::copy_to_device(queues_.get() + qi.qid, &q, 1);
  }

  void queue_deleted(std::uint16_t sqid) override {
    std::lock_guard lock(mutex_);
    if (sqid == 0 || sqid > cfg_.max_qid) return;
    const std::uint32_t zero = 0;
    // Synchronous copy: no kernel serving the queue may run while it is deleted.
    gpu::copy_to_device(&queues_.get()[sqid].active, &zero, 1);
    const std::uint16_t cqid = host_queues_[sqid].cqid;
    if (cq_users_[cqid] > 0) --cq_users_[cqid];
    host_queues_[sqid].active = 0;
  }

  void reset() override {
    std::lock_guard lock(mutex_);
    for (std::uint32_t i = 1; i <= cfg_.max_qid; ++i) {
      if (host_queues_[i].active) {
        const std::uint32_t zero = 0;
        gpu::copy_to_device(&queues_.get()[i].active, &zero, 1);
        host_queues_[i].active = 0;
      }
    }
    cq_users_.clear();
  }

  void pause(bool stop) override { set_paused(stop); }

  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
    if (offset < nvme::reg::doorbell_base || (offset - nvme::reg::doorbell_base) % 4 != 0) return nullptr;
    const std::uint32_t idx = (offset - nvme::reg::doorbell_base) / 4;
    if (idx >= 2 * (cfg_.max_qid + 1)) return nullptr;
    return doorbells_.get() + idx;
  }

  // ---- fault injection and model (between kernels) ----------------------

  //! The controller stops answering (true) or resumes (false).
  void set_paused(bool stop) {
    const std::uint32_t v = stop ? 1 : 0;
    gpu::copy_to_device(&control_.get()->paused, &v, 1);
  }
  //! Complete every command touching LBAs [lo, hi) with `st` (st.raw == 0: clear).
  void inject_error(std::uint64_t lo, std::uint64_t hi, nvme::status st) {
    gpu_engine_control c = control();
    c.error_status = st.raw;
    c.error_lba_lo = lo;
    c.error_lba_hi = hi;
    gpu::copy_to_device(control_.get(), &c, 1);
  }
  void clear_error() { inject_error(0, 0, nvme::status{}); }
  void set_model(std::uint64_t iops, std::uint64_t latency_ns) {
    gpu_engine_control c = control();
    c.ns_per_io = iops != 0 ? (1'000'000'000ull + iops - 1) / iops : 0;
    c.latency_ns = latency_ns;
    c.next_start_ns = 0;
    gpu::copy_to_device(control_.get(), &c, 1);
  }
  //! Commands completed on queue `qid` so far.
  std::uint64_t served(std::uint16_t qid) const {
    std::uint64_t n = 0;
    if (qid <= cfg_.max_qid) gpu::copy_to_host(&n, &queues_.get()[qid].served, 1);
    return n;
  }

  //! The namespace's blocks as emu media: identify reports its size; host
  //! reads and writes (to load a data set, or check one) reach the same bytes.
  std::shared_ptr<media> namespace_media() { return std::make_shared<media_view>(this); }

private:
  gpu_engine_control control() const {
    gpu_engine_control c{};
    gpu::copy_to_host(&c, control_.get(), 1);
    return c;
  }

  class media_view final : public media {
  public:
    explicit media_view(gpu_engine* e) : e_(e) {}
    std::uint64_t size() const override { return e_->cfg_.bytes; }
    std::string describe() const override {
      return std::string("GPU engine ") + media_name(e_->cfg_.media) + " " + std::to_string(size()) +
             " bytes";
    }
    int read(std::uint64_t offset, std::span<const iovec> segs) override {
      if (!in_range(offset, detail::total_bytes(segs))) return EINVAL;
      for (const auto& s : segs) {
        if (e_->cfg_.media == gpu_media_kind::null) std::memset(s.iov_base, 0, s.iov_len);
        else if (cudaMemcpy(s.iov_base, e_->media_ + offset, s.iov_len, cudaMemcpyDefault) != cudaSuccess)
          return EIO;
        offset += s.iov_len;
      }
      return 0;
    }
    int write(std::uint64_t offset, std::span<const iovec> segs) override {
      if (!in_range(offset, detail::total_bytes(segs))) return EINVAL;
      for (const auto& s : segs) {
        if (e_->cfg_.media != gpu_media_kind::null &&
            cudaMemcpy(e_->media_ + offset, s.iov_base, s.iov_len, cudaMemcpyDefault) != cudaSuccess)
          return EIO;
        offset += s.iov_len;
      }
      return 0;
    }
    int flush() override { return 0; }
    int write_zeroes(std::uint64_t offset, std::uint64_t len) override {
      if (!in_range(offset, len)) return EINVAL;
      if (e_->cfg_.media == gpu_media_kind::host_ram) std::memset(e_->media_ + offset, 0, len);
      else if (e_->cfg_.media == gpu_media_kind::hbm &&
               cudaMemset(e_->media_ + offset, 0, len) != cudaSuccess)
        return EIO;
      return 0;
    }

  private:
    bool in_range(std::uint64_t offset, std::uint64_t len) const {
      return offset <= size() && len <= size() - offset;
    }
    gpu_engine* e_;
  };

  gpu_engine_config cfg_;
  std::uint8_t* media_ = nullptr;     // host view (pinned) or device pointer (HBM)
  std::uint8_t* media_dev_ = nullptr; // what GPU threads use
  gpu::device_buffer<gpu_engine_queue> queues_;
  gpu::device_buffer<std::uint32_t> doorbells_;
  gpu::device_buffer<gpu_engine_control> control_;
  std::vector<gpu_engine_queue> host_queues_;
  std::map<std::uint16_t, std::uint32_t> cq_users_;
  std::mutex mutex_;
};

} // namespace bam::emu
