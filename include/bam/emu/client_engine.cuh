// SPDX-License-Identifier: MIT
//! The CUDA side of the CPU engine for GPU clients (`client_engine.hpp`):
//! doorbells, data lanes and staging bytes in pinned host memory mapped
//! into the GPU, the lanes' claim counters in GPU memory, queue rings in
//! pinned host memory; media held in memory (RAM, shared memory) pinned too,
//! so GPU threads read them in place. CUDA is called when the engine is made
//! and destroyed, never while it serves commands: GPU threads waiting on its
//! queues move the data (the device-side hook `emu/progress.cuh`, which
//! `<bam/bam.cuh>` includes), so the engine works under any CUDA module
//! loading mode and beside any stream of the user's program.
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
#include <bam/emu/detail/pinned_host_memory.cuh>
#include <bam/emu/open.hpp>
#include <bam/detail/device_memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace bam::emu {

namespace detail {

//! Memory the kernel could hand out now (MemAvailable), or 0 if unknown.
inline std::uint64_t memory_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

//! Pin media held in memory for the GPU, so the engine's reads need no
//! staging copy. Sparse RAM is pinned only while it takes at most half the
//! memory available (pinning allocates every page); media the GPU cannot
//! read in place (files, devices, RAM too large, a refused registration)
//! keep the staging path. Returns the registration, or null.
inline std::shared_ptr<pinned_host_memory> pin_media_in_place(const std::shared_ptr<media>& m) {
  const std::span<std::uint8_t> bytes = m->mapping();
  if (bytes.empty()) return nullptr;
  if (m->sparse() && bytes.size() > memory_available_bytes() / 2) return nullptr;
  std::shared_ptr<pinned_host_memory> pinned;
  try {
    pinned = pinned_host_memory::of(bytes.data(), bytes.size(), m, m->describe());
  } catch (const error&) {
    return nullptr; // the staging path serves it, and its pages may still go back to the kernel
  }
  m->keep_pages(); // no command runs yet: from the first one on, no pinned page is handed back
  return pinned;
}

//! The engine with its memory: pinned host memory mapped into the GPU for
//! the doorbells, lanes and staging bytes; GPU memory for the claim counters
//! and the handle the hook reads.
class client_engine_owner final : public io_engine {
public:
  client_engine_owner(std::shared_ptr<media> m, std::uint32_t max_qid, std::uint32_t threads)
      : doorbells_(2 * (static_cast<std::size_t>(max_qid) + 1)), lanes_(static_cast<std::size_t>(max_qid) + 1),
        claim_(static_cast<std::size_t>(max_qid) + 1), run_ns_(std::max<std::uint32_t>(threads, 1)), ref_dev_(1),
        in_place_(pin_media_in_place(m)),
        engine_(
            std::move(m), max_qid, threads, std::span<std::uint32_t>(doorbells_.get(), doorbells_.size()),
            make_ref(max_qid),
            [](std::size_t bytes) -> void* {
              void* p = nullptr;
              return cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess ? p : nullptr;
            },
            [](void* p) { BAM_CUDA_LOG(cudaFreeHost(p)); }, in_place_ref()) {}
  client_engine& engine() { return engine_; }
  nvme::status queue_created(const queue_info& q) override { return engine_.queue_created(q); }
  void queue_deleted(std::uint16_t sqid) override { engine_.queue_deleted(sqid); }
  void reset() override { engine_.reset(); }
  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override { return engine_.device_doorbell(offset); }
  void attached(std::uint32_t dstrd) override { engine_.attached(dstrd); }
  const std::uint64_t* run_ns(std::uint16_t qid) const override { return engine_.run_ns(qid); }
  device_progress device_progress_hook() const override { return {client_engine_progress_id, 0, ref_dev_.get()}; }

private:
  client_in_place in_place_ref() const {
    if (!in_place_) return {};
    return {reinterpret_cast<std::uint64_t>(in_place_->device_data()), in_place_->bytes()};
  }
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
  std::shared_ptr<pinned_host_memory> in_place_; // the media read in place; unpinned after the threads stop
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
  bool in_place = spec.ssds != 0;
  for (std::uint32_t i = 0; i < spec.ssds; ++i) {
    std::shared_ptr<media> m = open_media(spec, i);
    auto engine = std::make_shared<client_engine_owner>(m, spec.io_queues, spec.threads);
    in_place = in_place && engine->engine().reads_in_place();
    controller_config cc = config_for(spec, i, m);
    cc.mdts = 5; // the engine's staging bytes: 128 KiB per command
    cc.identity_dma = true;
    cc.io_engine = engine;
    g.controllers.push_back(make_emulated_controller(std::move(cc)));
  }
  g.rings = queue_ring_memory::pinned_host;
  g.description = std::string("emu (software controller, CPU engine for GPU clients, media ") + media_name(spec.media) +
                  (in_place ? ", read in place" : "") + ")";
  return g;
}

} // namespace detail

inline const bool client_engine_registered =
    register_gpu_transport(device_kind::emu_cpu, &detail::open_client_engine_controllers);

} // namespace bam::emu
