// SPDX-License-Identifier: MIT
//! The GPU engine of the software NVMe controller (host side). It serves the
//! controller's I/O queues on the GPU, from the GPU threads that wait on them
//! (`detail/gpu_serve.cuh`); admin commands and bring-up stay with the
//! controller on the CPU. Plug it in as `controller_config::io_engine`; give
//! the controller's namespace `engine->namespace_media()` so that identify
//! reports the size and host-side access reaches the same blocks.
//!
//! Media: pinned host RAM (mapped into the GPU), POSIX shared memory pinned
//! for every GPU of the process (`shm`: one copy for every process and GPU
//! that opens the name, see shared_memory.hpp), HBM, or null (completes
//! without moving data); optional SSD model: an IOPS limit and a latency.
//!
//! The engine belongs to one GPU (`gpu_engine_config::device`, by default
//! the one current at construction): its memory, streams and copies are
//! there, whatever device the thread that calls it has current (the
//! controller's admin work, a storage built for another GPU). The GPU
//! threads that serve its queues are that GPU's.
//! Queue rings and submitter state must be in GPU memory and the controller
//! must hand GPU threads this engine's doorbells (`device_doorbells`). The
//! engine serves one SQ per CQ (Create I/O SQ on a CQ that already has one
//! completes with Completion Queue Invalid) and any doorbell stride.
//!
//! @code
//!   auto engine = std::make_shared<bam::emu::gpu_engine>(
//!       bam::emu::gpu_engine_config{.media = bam::media_kind::hbm, .bytes = 1ull << 30});
//!   // controller_config cfg; cfg.io_engine = engine; namespace media = engine->namespace_media();
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/emu/access.hpp>
#include <bam/emu/detail/pinned_host_memory.cuh>
#include <bam/emu/engine.hpp>
#include <bam/emu/gpu_engine_ref.hpp>
#include <bam/emu/media.hpp>
#include <bam/emu/open.hpp>
#include <bam/emu/shared_memory.hpp>
#include <bam/transport/media_kind.hpp>
#include <bam/transport/transport.hpp>

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace bam::emu {

struct gpu_engine_config {
  media_kind media = media_kind::ram;                        //!< ram (pinned host memory), shm, hbm or null
  std::uint64_t bytes = 64ull << 20;                         //!< namespace size (shm: the shared memory's)
  std::uint32_t lba_size = 512;                              //!< bytes per block
  std::uint32_t max_qid = 256;                               //!< highest I/O queue id served
  std::uint64_t max_transfer_bytes = 2u << 20;               //!< the controller's MDTS in bytes
  std::uint64_t iops = 0;                                    //!< SSD model: IOPS limit (0: none)
  std::uint64_t latency_ns = 0;                              //!< SSD model: latency per command (0: none)
  std::uint64_t timeout_ns = nvme::default_queue_timeout_ns; //!< bound of every engine wait
  std::shared_ptr<shared_memory> shared;                     //!< shm media: the mapping to serve
  int device = -1;                                           //!< the GPU it serves on (-1: the current one)
};

class gpu_engine final : public io_engine {
public:
  explicit gpu_engine(const gpu_engine_config& config) : cfg_(config) {
    const gpu_engine_config& cfg = cfg_;
    device_ = cfg.device >= 0 ? cfg.device : current_device();
    cfg_.device = device_;
    const device_scope on(device_);
    if (cfg.media == media_kind::shm) {
      if (!cfg.shared) throw error("GPU engine: shm media needs the shared memory (gpu_engine_config::shared)");
      cfg_.bytes = cfg.shared->size();
    }
    if (cfg.lba_size < 512 || !std::has_single_bit(cfg.lba_size) || cfg.bytes % cfg.lba_size != 0 || cfg.bytes == 0)
      throw error("GPU engine: the size must be a non-zero multiple of a power-of-two LBA size >= 512 (got " +
                  std::to_string(cfg.bytes) + " bytes, LBA " + std::to_string(cfg.lba_size) + ")");
    if (cfg.media == media_kind::file)
      throw error("GPU engine: file media are served by the CPU engine (emu:file=...)");
    if (cfg.media == media_kind::shm) {
      pinned_ = detail::pinned_host_memory::of(cfg.shared->data(), cfg.shared->mapped_bytes(), cfg.shared,
                                               "shared memory " + cfg.shared->object());
      media_ = pinned_->data();
      BAM_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&media_dev_), media_, 0));
    } else if (cfg.media == media_kind::ram) {
      BAM_CUDA_TRY(
          cudaHostAlloc(reinterpret_cast<void**>(&media_), cfg.bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      BAM_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&media_dev_), media_, 0));
    } else if (cfg.media == media_kind::hbm) {
      BAM_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&media_), cfg.bytes));
      const cudaStream_t side = bam::detail::side_stream();
      BAM_CUDA_TRY(cudaMemsetAsync(media_, 0, cfg.bytes, side));
      BAM_CUDA_TRY(cudaStreamSynchronize(side));
      media_dev_ = media_;
    }
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    queues_ = device_buffer<gpu_engine_queue>(cfg.max_qid + 1);
    model_ = device_buffer<gpu_ssd_model>(1);
    ns_ = device_buffer<nvm_namespace>(1);
    counters_ = device_buffer<nvm_counters>(1);
    ref_dev_ = device_buffer<gpu_engine_ref>(1);
    const nvm_namespace ns{cfg.bytes / cfg.lba_size, static_cast<std::uint32_t>(std::countr_zero(cfg.lba_size)), 0};
    copy_to_device(ns_.get(), &ns, 1);
    set_model(cfg.iops, cfg.latency_ns);
    host_queues_.resize(cfg.max_qid + 1);
    attached(0);
  }

  ~gpu_engine() override {
    on_device_.enter_quietly(device_); // also while the members are destroyed
    if (media_ != nullptr && cfg_.media != media_kind::shm) {
      if (cfg_.media == media_kind::ram)
        BAM_CUDA_LOG(cudaFreeHost(media_));
      else
        BAM_CUDA_LOG(cudaFree(media_));
    }
    if (stream_ != nullptr) BAM_CUDA_LOG(cudaStreamDestroy(stream_));
  }
  gpu_engine(const gpu_engine&) = delete;
  gpu_engine& operator=(const gpu_engine&) = delete;

  //! The handle GPU threads serve the queues through.
  gpu_engine_ref ref() const {
    gpu_engine_ref r;
    r.queues = queues_.get();
    r.doorbells = doorbells_.get();
    r.dstrd = dstrd_;
    r.max_qid = cfg_.max_qid;
    r.media = media_dev_;
    r.media_bytes = cfg_.bytes;
    r.media_is = cfg_.media;
    r.target.ns = ns_.get();
    r.target.ns_count = 1;
    r.target.max_transfer_bytes = cfg_.max_transfer_bytes;
    r.target.counters = counters_.get();
    r.target.faults = faults_;
    r.model = model_.get();
    r.timeout_ns = cfg_.timeout_ns;
    return r;
  }
  const gpu_engine_config& config() const { return cfg_; }
  //! The GPU whose threads serve the queues and that holds the engine's memory.
  int device() const { return device_; }

  //! Host pointer to the media (ram: the pinned block; shm: the mapping; hbm:
  //! a device pointer; null: nullptr).
  std::uint8_t* media_data() const { return media_; }

  // ---- io_engine -------------------------------------------------------

  void attached(std::uint32_t dstrd) override {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    dstrd_ = dstrd;
    doorbells_ = device_buffer<std::uint32_t>(static_cast<std::size_t>(2 * (cfg_.max_qid + 1)) << dstrd);
    publish_ref();
  }

  nvme::status queue_created(const queue_info& qi) override {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    namespace css = nvme::command_specific_status;
    if (qi.qid == 0 || qi.qid > cfg_.max_qid || qi.cq == nullptr || qi.cq->cqid > cfg_.max_qid)
      return {nvme::status_type::command_specific, css::invalid_queue_identifier, true};
    // Completions are posted by many threads, each reporting the CQ slot count
    // as the SQ head: only sound with one SQ per CQ.
    if (qi.cq_sq_count > 1) return {nvme::status_type::command_specific, css::invalid_completion_queue, true};
    const std::uint16_t cqid = qi.cq->cqid;
    gpu_engine_queue q{};
    q.sq = qi.sq;
    q.cq = qi.cq->ring;
    q.sq_depth = qi.sq_depth;
    q.cq_depth = qi.cq->depth;
    q.qid = qi.qid;
    q.cqid = cqid;
    q.active = 1;
    if (cqid != qi.qid) {
      // A CQ's producer counters live in the entry of its own id.
      gpu_engine_queue cq{};
      cq.cq_depth = qi.cq->depth;
      cq.cqid = cqid;
      copy_to_device(queues_.get() + cqid, &cq, 1);
    }
    host_queues_[qi.qid] = q;
    const std::uint32_t zero = 0;
    copy_to_device(doorbells_.get() + ref().sq_doorbell_index(qi.qid), &zero, 1);
    copy_to_device(doorbells_.get() + ref().cq_doorbell_index(cqid), &zero, 1);
    copy_to_device(queues_.get() + qi.qid, &q, 1);
    return nvme::status_success;
  }

  void queue_deleted(std::uint16_t sqid) override {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    if (sqid == 0 || sqid > cfg_.max_qid) return;
    const std::uint32_t zero = 0;
    // Synchronous copy: no kernel serving the queue may run while it is deleted.
    copy_to_device(&queues_.get()[sqid].active, &zero, 1);
    host_queues_[sqid].active = 0;
  }

  void reset() override {
    const device_scope on(device_);
    std::lock_guard lock(mutex_);
    for (std::uint32_t i = 1; i <= cfg_.max_qid; ++i) {
      if (host_queues_[i].active) {
        const std::uint32_t zero = 0;
        copy_to_device(&queues_.get()[i].active, &zero, 1);
        host_queues_[i].active = 0;
      }
    }
  }

  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
    if (offset < nvme::reg::doorbell_base || (offset - nvme::reg::doorbell_base) % 4 != 0) return nullptr;
    const std::uint32_t idx = (offset - nvme::reg::doorbell_base) / 4;
    if (idx >= doorbells_.size()) return nullptr;
    return doorbells_.get() + idx;
  }
  //! The doorbells are GPU memory read by GPU threads only.
  nvme::memory_scope device_doorbell_scope() const override { return nvme::memory_scope::device; }
  //! Completions are posted out of fetch order and report the count of CQ
  //! entries posted as the SQ head: a safe lower bound, not the fetch position.
  bool exact_sq_head() const override { return false; }
  device_progress device_progress_hook() const override { return {gpu_engine_progress_id, 0, ref_dev_.get()}; }
  nvm_counters counters() const override {
    const device_scope on(device_);
    nvm_counters c{};
    copy_to_host(&c, counters_.get(), 1, stream_);
    return c;
  }
  std::unique_ptr<fault_table_memory> fault_table_copy() override {
    const device_scope on(device_);
    auto m = std::make_unique<device_fault_table>(stream_, device_);
    faults_ = m->table();
    publish_ref();
    return m;
  }

  // ---- the SSD model ------------------------------------------------------

  void set_model(std::uint64_t iops, std::uint64_t latency_ns) {
    const device_scope on(device_);
    gpu_ssd_model m{};
    m.ns_per_io = iops != 0 ? (1'000'000'000ull + iops - 1) / iops : 0;
    m.latency_ns = latency_ns;
    copy_to_device(model_.get(), &m, 1);
  }
  //! Commands completed on queue `qid` so far.
  std::uint64_t served(std::uint16_t qid) const {
    const device_scope on(device_);
    std::uint64_t n = 0;
    if (qid <= cfg_.max_qid) copy_to_host(&n, &queues_.get()[qid].served, 1, stream_);
    return n;
  }

  //! The namespace's blocks as emu media: identify reports its size; host
  //! reads and writes (to load a data set, or check one) reach the same bytes.
  std::shared_ptr<media> namespace_media() { return std::make_shared<media_view>(this); }

private:
  //! The fault table's copy in GPU memory; changed while kernels run, on a
  //! stream of its own that waits for no kernel.
  class device_fault_table final : public fault_table_memory {
  public:
    device_fault_table(cudaStream_t s, int device) : stream_(s), device_(device), t_(1) {}
    ~device_fault_table() override { on_device_.enter_quietly(device_); }
    fault_table* table() override { return t_.get(); }
    void write(std::size_t offset, const void* src, std::size_t bytes) override {
      const device_scope on(device_);
      BAM_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<unsigned char*>(t_.get()) + offset, src, bytes,
                                   cudaMemcpyHostToDevice, stream_));
      BAM_CUDA_TRY(cudaStreamSynchronize(stream_));
    }
    void read(std::size_t offset, void* dst, std::size_t bytes) const override {
      const device_scope on(device_);
      BAM_CUDA_TRY(cudaMemcpyAsync(dst, reinterpret_cast<const unsigned char*>(t_.get()) + offset, bytes,
                                   cudaMemcpyDeviceToHost, stream_));
      BAM_CUDA_TRY(cudaStreamSynchronize(stream_));
    }

  private:
    device_scope on_device_; // first: the device is current while t_ is freed
    cudaStream_t stream_;
    int device_;
    device_buffer<fault_table> t_;
  };

  void publish_ref() {
    const gpu_engine_ref r = ref();
    copy_to_device(ref_dev_.get(), &r, 1);
  }

  class media_view final : public media {
  public:
    explicit media_view(gpu_engine* e) : e_(e) {}
    std::uint64_t size() const override { return e_->cfg_.bytes; }
    std::string describe() const override {
      return std::string("GPU engine ") + media_name(e_->cfg_.media) + " " + std::to_string(size()) + " bytes";
    }
    int read(std::uint64_t offset, std::span<const iovec> segs) override {
      device_scope on;
      on.enter_quietly(e_->device_);
      if (!in_range(offset, detail::total_bytes(segs))) return EINVAL;
      for (const auto& s : segs) {
        if (e_->cfg_.media == media_kind::null)
          std::memset(s.iov_base, 0, s.iov_len);
        else if (!copy(s.iov_base, e_->media_ + offset, s.iov_len))
          return EIO;
        offset += s.iov_len;
      }
      return 0;
    }
    int write(std::uint64_t offset, std::span<const iovec> segs) override {
      device_scope on;
      on.enter_quietly(e_->device_);
      if (!in_range(offset, detail::total_bytes(segs))) return EINVAL;
      for (const auto& s : segs) {
        if (e_->cfg_.media != media_kind::null && !copy(e_->media_ + offset, s.iov_base, s.iov_len)) return EIO;
        offset += s.iov_len;
      }
      return 0;
    }
    int flush() override { return 0; }
    int write_zeroes(std::uint64_t offset, std::uint64_t len) override {
      device_scope on;
      on.enter_quietly(e_->device_);
      if (!in_range(offset, len)) return EINVAL;
      if (e_->cfg_.media == media_kind::ram || e_->cfg_.media == media_kind::shm)
        std::memset(e_->media_ + offset, 0, len);
      else if (e_->cfg_.media == media_kind::hbm &&
               (cudaMemsetAsync(e_->media_ + offset, 0, len, e_->stream_) != cudaSuccess ||
                cudaStreamSynchronize(e_->stream_) != cudaSuccess))
        return EIO;
      return 0;
    }

  private:
    bool copy(void* dst, const void* src, std::size_t n) const {
      return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, e_->stream_) == cudaSuccess &&
             cudaStreamSynchronize(e_->stream_) == cudaSuccess;
    }
    bool in_range(std::uint64_t offset, std::uint64_t len) const { return offset <= size() && len <= size() - offset; }
    gpu_engine* e_;
  };

  device_scope on_device_; // first: the device stays current while the members are destroyed
  gpu_engine_config cfg_;
  int device_ = 0;
  std::shared_ptr<detail::pinned_host_memory> pinned_; // shm media
  std::uint8_t* media_ = nullptr;                      // host view (pinned) or device pointer (HBM)
  std::uint8_t* media_dev_ = nullptr;                  // what GPU threads use
  cudaStream_t stream_ = nullptr;
  std::uint32_t dstrd_ = 0;
  device_buffer<gpu_engine_queue> queues_;
  device_buffer<std::uint32_t> doorbells_;
  device_buffer<gpu_ssd_model> model_;
  device_buffer<nvm_namespace> ns_;
  device_buffer<nvm_counters> counters_;
  device_buffer<gpu_engine_ref> ref_dev_;
  fault_table* faults_ = nullptr;
  std::vector<gpu_engine_queue> host_queues_;
  std::mutex mutex_;
};

namespace detail {

//! `emu-gpu:` for GPU submitters: software controllers served by the GPU
//! threads that wait on them (their kernels need the GPU engine's progress
//! hook: progress.cuh).
inline gpu_transports open_gpu_engine_controllers(const device_spec& spec) {
  gpu_transports g;
  for (std::uint32_t i = 0; i < spec.ssds; ++i) {
    gpu_engine_config ec;
    ec.media = spec.media;
    ec.bytes = spec.bytes;
    if (spec.media == media_kind::shm) {
      ec.shared = open_spec_shared_memory(spec, i);
      ec.bytes = ec.shared->size();
    }
    ec.lba_size = spec.lba_size;
    ec.max_qid = spec.io_queues;
    ec.iops = spec.iops;
    ec.latency_ns = spec.latency_ns;
    ec.timeout_ns = spec.timeout_ns;
    constexpr std::uint8_t gpu_engine_mdts = 9; // 2 MiB: what one PRP list page describes
    ec.max_transfer_bytes = dma_page_size << gpu_engine_mdts;
    auto engine = std::make_shared<gpu_engine>(ec);
    controller_config cc = config_for(spec, i, engine->namespace_media(), "emu-gpu");
    cc.mdts = gpu_engine_mdts;
    cc.identity_dma = true;
    cc.io_engine = engine;
    g.controllers.push_back(make_emulated_controller(std::move(cc)));
  }
  g.rings = queue_ring_memory::gpu;
  g.description = std::string("emu-gpu (software controller, GPU engine, media ") + media_name(spec.media) +
                  (spec.media == media_kind::shm ? " " + spec.shm_name + ", shared" : std::string()) + ")";
  return g;
}

} // namespace detail

//! The GPU engine serving controller `c` (nullptr when another engine serves it).
inline gpu_engine* gpu_engine_of(const controller& c) {
  return dynamic_cast<gpu_engine*>(&software_controller(c).engine());
}
//! The GPU engine of controller `i` of `s` (a `bam::storage`; nullptr when another engine serves it).
template <class Storage>
gpu_engine* gpu_engine_of(const Storage& s, std::uint32_t i) {
  return gpu_engine_of(s.controller_at(i));
}

inline const bool gpu_engine_registered =
    register_gpu_transport(device_kind::emu_gpu, &detail::open_gpu_engine_controllers);

} // namespace bam::emu
