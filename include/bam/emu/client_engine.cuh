// SPDX-License-Identifier: MIT
//! The CUDA side of the CPU engine for GPU clients (`client_engine.hpp`):
//! copies on a stream per engine thread, doorbells and bounce buffers in
//! pinned host memory, queue rings in pinned host memory mapped into the GPU.
//!
//! @code
//!   auto media = bam::emu::make_file_media("/data/x.img", 0, false);
//!   auto engine = bam::emu::make_client_engine(media, /*max_qid=*/128, /*threads=*/4);
//!   cfg.io_engine = engine;
//!   // bam::storage places its queue rings in pinned host memory mapped into
//!   // the GPU (bam::queue_ring_memory::pinned_host)
//! @endcode
//!
//! Lazy module loading (CUDA's default since 12.2): loading a kernel at its
//! first launch waits for the kernels already running, and holds up every
//! other CUDA call of the process meanwhile, the engine's copies included.
//! A kernel launched for the first time while a kernel waits on this engine
//! (e.g. queued behind it on the same stream) therefore stalls both until
//! the wait's deadline. Run such programs with `CUDA_MODULE_LOADING=EAGER`
//! (or call `prefer_eager_module_loading()` before CUDA starts); the engine
//! warns once when it finds lazy loading on. The GPU engine (`emu-gpu:`) and
//! real controllers need no CUDA call to complete a command and are not
//! affected.
#pragma once

#include <bam/cuda.cuh>
#include <bam/emu/client_engine.hpp>
#include <bam/emu/open.hpp>
#include <bam/detail/device_memory.cuh>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace bam::emu {

namespace detail {

//! Copies on a non-blocking stream of its own. Queued copies are collected
//! (neighbours on both sides merged into one) and handed to the driver as one
//! batch when `wait()` is called: one API call per batch of commands instead
//! of one per PRP entry, which is what limits a CPU thread's command rate.
class cuda_copier final : public gpu_copier {
public:
  cuda_copier() { BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~cuda_copier() override { BAM_CUDA_LOG(cudaStreamDestroy(stream_)); }
  bool to_gpu(std::uint64_t gpu, const void* src, std::size_t n) override {
    return queue(reinterpret_cast<void*>(gpu), src, n);
  }
  bool from_gpu(void* dst, std::uint64_t gpu, std::size_t n) override {
    return queue(dst, reinterpret_cast<const void*>(gpu), n);
  }
  bool wait() override {
    const bool ok = submit() && note(cudaStreamSynchronize(stream_)) && ok_;
    ok_ = true;
    return ok;
  }

private:
  bool queue(void* dst, const void* src, std::size_t n) {
    if (n == 0) return true;
    if (!dst_.empty()) {
      auto* last_dst = static_cast<unsigned char*>(dst_.back()) + size_.back();
      auto* last_src = static_cast<const unsigned char*>(src_.back()) + size_.back();
      if (last_dst == dst && last_src == src) {
        size_.back() += n;
        return true;
      }
    }
    dst_.push_back(dst);
    src_.push_back(src);
    size_.push_back(n);
    return true;
  }
  //! Hand every queued copy to the stream; per copy where the driver has no
  //! batch copies.
  bool submit() {
    bool ok = true;
    if (dst_.size() > 1 && batch_ok_) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      std::size_t first = 0;
      const cudaError_t e =
          cudaMemcpyBatchAsync(dst_.data(), src_.data(), size_.data(), dst_.size(), &attr, &first, 1, stream_);
      if (e == cudaSuccess) return clear(true);
      (void)cudaGetLastError();
      if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue) return clear(note(e));
      batch_ok_ = false; // an older driver: copy one by one from now on
    }
    for (std::size_t i = 0; i < dst_.size(); ++i)
      ok = note(cudaMemcpyAsync(dst_[i], src_[i], size_[i], cudaMemcpyDefault, stream_)) && ok;
    return clear(ok);
  }
  bool clear(bool ok) {
    dst_.clear();
    src_.clear();
    size_.clear();
    return ok;
  }
  bool note(cudaError_t e) {
    if (e != cudaSuccess) {
      ok_ = false;
      (void)cudaGetLastError(); // a failed call is reported through the command's status
    }
    return e == cudaSuccess;
  }
  cudaStream_t stream_ = nullptr;
  bool ok_ = true;
  bool batch_ok_ = true;
  std::vector<void*> dst_;
  std::vector<const void*> src_;
  std::vector<std::size_t> size_;
};

//! Pinned, GPU-mapped host memory owned by an engine.
class client_engine_owner final : public io_engine {
public:
  client_engine_owner(std::shared_ptr<media> m, std::uint32_t max_qid, std::uint32_t threads)
      : doorbells_(2 * (static_cast<std::size_t>(max_qid) + 1)),
        engine_(
            std::move(m), max_qid, threads, std::span<std::uint32_t>(doorbells_.get(), doorbells_.size()),
            [] { return std::make_unique<cuda_copier>(); },
            [](std::size_t bytes) -> void* {
              void* p = nullptr;
              return cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess ? p : nullptr;
            },
            [](void* p) { BAM_CUDA_LOG(cudaFreeHost(p)); }) {}
  client_engine& engine() { return engine_; }
  nvme::status queue_created(const queue_info& q) override { return engine_.queue_created(q); }
  void queue_deleted(std::uint16_t sqid) override { engine_.queue_deleted(sqid); }
  void reset() override { engine_.reset(); }
  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override { return engine_.device_doorbell(offset); }
  void attached(std::uint32_t dstrd) override { engine_.attached(dstrd); }

private:
  pinned_buffer<std::uint32_t> doorbells_; // destroyed after the engine's threads stop
  client_engine engine_;
};

} // namespace detail

//! Ask CUDA to load every kernel when a module loads, not at its first
//! launch (sets `CUDA_MODULE_LOADING=EAGER` unless the environment names a
//! mode). Takes effect only if called before the process's first CUDA call,
//! which it cannot tell; `lazy_module_loading()` says what CUDA chose.
//! Returns false when the environment names another mode.
inline bool prefer_eager_module_loading() {
  const char* v = std::getenv("CUDA_MODULE_LOADING");
  if (v != nullptr) return std::strcmp(v, "EAGER") == 0;
  return ::setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}

//! True when this process's CUDA loads kernels lazily (at their first launch).
inline bool lazy_module_loading() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) (void)cudaGetLastError(); // this call's own error, not one pending before it
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    // No answer from the driver: CUDA's default (lazy) unless the environment says EAGER.
    const char* v = std::getenv("CUDA_MODULE_LOADING");
    return v == nullptr || std::strcmp(v, "EAGER") != 0;
  }
  CUmoduleLoadingMode mode{};
  if (reinterpret_cast<CUresult (*)(CUmoduleLoadingMode*)>(fn)(&mode) != CUDA_SUCCESS) return false;
  return mode == CU_MODULE_LAZY_LOADING;
}

//! A CPU engine serving GPU clients from `m`, with CUDA copies. Warns once
//! per process when kernels load lazily (see the top of this file).
inline std::shared_ptr<io_engine> make_client_engine(std::shared_ptr<media> m, std::uint32_t max_qid,
                                                     std::uint32_t threads) {
  static std::once_flag checked;
  std::call_once(checked, [] {
    if (lazy_module_loading())
      warn("the CPU engine of the software controller (emu:) runs with lazy CUDA module loading: a kernel "
           "launched for the first time while another waits on this storage stalls both until the wait times "
           "out. Set CUDA_MODULE_LOADING=EAGER before the program starts CUDA");
  });
  return std::make_shared<detail::client_engine_owner>(std::move(m), max_qid, threads);
}

namespace detail {

//! `emu:` for GPU submitters: software controllers served by the CPU engine,
//! queue rings in pinned host memory.
inline gpu_transports open_client_engine_controllers(const device_spec& spec) {
  gpu_transports g;
  for (std::uint32_t i = 0; i < spec.ssds; ++i) {
    std::shared_ptr<media> m = open_media(spec, i);
    auto engine = make_client_engine(m, spec.io_queues, spec.threads);
    controller_config cc = config_for(spec, i, m);
    cc.mdts = 5; // the engine's bounce buffers: 128 KiB per command
    cc.identity_dma = true;
    cc.io_engine = engine;
    g.controllers.push_back(make_emulated_controller(std::move(cc)));
  }
  g.rings = queue_ring_memory::pinned_host;
  g.description =
      std::string("emu (software controller, CPU engine for GPU clients, media ") + media_name(spec.media) + ")";
  return g;
}

} // namespace detail

inline const bool client_engine_registered =
    register_gpu_transport(device_kind::emu_cpu, &detail::open_client_engine_controllers);

} // namespace bam::emu
