// SPDX-License-Identifier: MIT
//! The CUDA side of the CPU engine for GPU clients (`client_engine.hpp`):
//! doorbells, data lanes and staging bytes in pinned host memory mapped
//! into the GPU, the lanes' claim counters in GPU memory, queue rings in
//! pinned host memory. CUDA is called when the engine is made and destroyed,
//! never while it serves commands: GPU threads waiting on its queues move
//! the data (the device-side hook `emu/progress.cuh`, which `<bam/bam.cuh>`
//! includes), so the engine works under any CUDA module loading mode and
//! beside any stream of the user's program.
//!
//! @code
//!   auto media = bam::emu::make_file_media("/data/x.img", 0, false);
//!   auto engine = bam::emu::make_client_engine(media, /*max_qid=*/128, /*threads=*/4);
//!   cfg.io_engine = engine;
//!   // bam::storage places its queue rings in pinned host memory mapped into
//!   // the GPU (bam::queue_ring_memory::pinned_host)
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/emu/client_dma.hpp>
#include <bam/emu/client_engine.hpp>
#include <bam/emu/open.hpp>
#include <bam/detail/device_memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace bam::emu {

namespace detail {

//! The engine with its memory: pinned host memory mapped into the GPU for
//! the doorbells, lanes and staging bytes; GPU memory for the claim counters
//! and the handle the hook reads.
class client_engine_owner final : public io_engine {
public:
  client_engine_owner(std::shared_ptr<media> m, std::uint32_t max_qid, std::uint32_t threads)
      : doorbells_(2 * (static_cast<std::size_t>(max_qid) + 1)), lanes_(static_cast<std::size_t>(max_qid) + 1),
        claim_(static_cast<std::size_t>(max_qid) + 1), run_ns_(std::max<std::uint32_t>(threads, 1)), ref_dev_(1),
        engine_(
            std::move(m), max_qid, threads, std::span<std::uint32_t>(doorbells_.get(), doorbells_.size()),
            make_ref(max_qid),
            [](std::size_t bytes) -> void* {
              void* p = nullptr;
              return cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess ? p : nullptr;
            },
            [](void* p) { BAM_CUDA_LOG(cudaFreeHost(p)); }) {}
  client_engine& engine() { return engine_; }
  nvme::status queue_created(const queue_info& q) override { return engine_.queue_created(q); }
  void queue_deleted(std::uint16_t sqid) override { engine_.queue_deleted(sqid); }
  void reset() override { engine_.reset(); }
  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override { return engine_.device_doorbell(offset); }
  void attached(std::uint32_t dstrd) override { engine_.attached(dstrd); }
  const std::uint64_t* run_ns(std::uint16_t qid) const override { return engine_.run_ns(qid); }
  device_progress device_progress_hook() const override { return {client_engine_progress_id, 0, ref_dev_.get()}; }

private:
  client_dma_ref make_ref(std::uint32_t max_qid) {
    client_dma_ref r; // lanes and counters start zeroed
    r.lanes = lanes_.get();
    r.claim = claim_.get();
    r.max_qid = max_qid;
    r.run_ns = run_ns_.get();
    copy_to_device(ref_dev_.get(), &r, 1);
    return r;
  }

  pinned_buffer<std::uint32_t> doorbells_; // destroyed after the engine's threads stop
  pinned_buffer<client_dma_lane> lanes_;
  device_buffer<client_dma_claim> claim_;
  pinned_buffer<std::uint64_t> run_ns_; // the waiters read it, GPU threads included
  device_buffer<client_dma_ref> ref_dev_;
  client_engine engine_;
};

} // namespace detail

//! A CPU engine serving GPU clients from `m`.
inline std::shared_ptr<io_engine> make_client_engine(std::shared_ptr<media> m, std::uint32_t max_qid,
                                                     std::uint32_t threads) {
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
    cc.mdts = 5; // the engine's staging bytes: 128 KiB per command
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
