// SPDX-License-Identifier: MIT
//! `bam::gpu::device`: open what a device string names (see bam/device.hpp)
//! and get a `bam::gpu::storage` GPU kernels can drive, whatever the transport.
//!
//! @code
//!   bam::gpu::device dev("emu-gpu:hbm=4G,ssds=2");
//!   bam::page_cache cache({.page_size = 4096, .capacity = 256 << 20});
//!   bam::array<float> a(cache, dev.storage(), n);
//! @endcode
#pragma once

#include <bam/controller.hpp>
#include <bam/device.hpp>
#include <bam/emu.hpp>
#include <bam/emu/gpu_client_engine.cuh>
#include <bam/emu/gpu_engine.cuh>
#include <bam/gpu/storage.cuh>
#include <bam/open.hpp>
#include <bam/pci_transport.hpp>

#include <memory>
#include <string>
#include <vector>

namespace bam::gpu {

class device {
public:
  explicit device(const std::string& text) : device(parse_device(text)) {}
  explicit device(const device_spec& spec) : spec_(spec) {
    controller_options copts;
    copts.io_queues = spec.io_queues;
    copts.queue_depth = spec.queue_depth;
    copts.io_timeout_ns = spec.timeout_ns;
    std::vector<emu::gpu_engine_ref> engine_refs;
    switch (spec.kind) {
    case device_kind::emu_gpu: {
      copts = gpu_queue_options(copts);
      for (std::uint32_t i = 0; i < spec.ssds; ++i) {
        emu::gpu_engine_config ec;
        ec.media = spec.media == "hbm"    ? emu::gpu_media_kind::hbm
                   : spec.media == "null" ? emu::gpu_media_kind::null
                                          : emu::gpu_media_kind::host_ram;
        ec.bytes = spec.bytes;
        ec.lba_size = spec.lba_size;
        ec.max_qid = spec.io_queues;
        ec.iops = spec.iops;
        ec.latency_ns = spec.latency_ns;
        ec.timeout_ns = spec.timeout_ns;
        auto engine = std::make_shared<emu::gpu_engine>(ec);
        emu::controller_config cc = emu_config(spec, i, engine->namespace_media(), "emu-gpu");
        cc.identity_dma = true;
        cc.io_engine = engine;
        auto ec_ctrl = emu::make_controller(std::move(cc));
        gpu_engines_.push_back(engine);
        emu_.push_back(ec_ctrl);
        ctrls_.push_back(std::make_shared<controller>(ec_ctrl, copts));
        engine_refs.push_back(engine->ref());
      }
      break;
    }
    case device_kind::emu_cpu: {
      for (std::uint32_t i = 0; i < spec.ssds; ++i) {
        std::shared_ptr<emu::media> m = open_emu_media(spec, i);
        auto engine = std::make_shared<emu::gpu_client_engine>(m, spec.lba_size, spec.io_queues, spec.threads);
        emu::controller_config cc = emu_config(spec, i, m);
        cc.identity_dma = true;
        cc.io_engine = engine;
        auto ec_ctrl = emu::make_controller(std::move(cc));
        client_engines_.push_back(engine);
        emu_.push_back(ec_ctrl);
        ctrls_.push_back(std::make_shared<controller>(ec_ctrl, emu::gpu_client_engine::queue_options(copts)));
      }
      break;
    }
    case device_kind::pci: {
      copts = gpu_queue_options(copts);
      for (const auto& path : spec.devices) {
        auto t = std::make_shared<pci_transport>(path);
        ctrls_.push_back(std::make_shared<controller>(t, copts));
      }
      break;
    }
    }
    storage_ = std::make_unique<gpu::storage>(ctrls_, engine_refs);
  }

  device(const device&) = delete;
  device& operator=(const device&) = delete;
  ~device() {
    storage_.reset();
    ctrls_.clear(); // deletes the I/O queues while the engines still serve the admin side
  }

  const device_spec& spec() const { return spec_; }
  gpu::storage& storage() const { return *storage_; }
  //! GPU engines (emu-gpu), one per controller.
  const std::vector<std::shared_ptr<emu::gpu_engine>>& gpu_engines() const { return gpu_engines_; }
  //! CPU engines serving GPU clients (emu), one per controller.
  const std::vector<std::shared_ptr<emu::gpu_client_engine>>& client_engines() const { return client_engines_; }
  //! The software controllers (emu transports), one per controller.
  const std::vector<std::shared_ptr<emu::controller>>& emu_controllers() const { return emu_; }
  //! What serves the I/O, for reports ("emu-gpu GPU engine, hbm", "emu CPU engine", "pci").
  std::string transport_name() const {
    switch (spec_.kind) {
    case device_kind::emu_gpu: return "emu-gpu (software controller, GPU engine, media " + spec_.media + ")";
    case device_kind::emu_cpu: return "emu (software controller, CPU engine, media " + spec_.media + ")";
    case device_kind::pci: return "pci (kernel module)";
    }
    return "?";
  }

  //! Host-side write of `bytes` at byte `offset` of controller `i`'s namespace
  //! (emu transports: straight into the media; loads a data set).
  void write_media(std::uint32_t i, std::uint64_t offset, const void* src, std::size_t bytes) {
    auto m = media_of(i);
    if (int e = m->write(offset, src, bytes)) throw_errno("writing media of controller " + std::to_string(i), e);
  }
  void read_media(std::uint32_t i, std::uint64_t offset, void* dst, std::size_t bytes) {
    auto m = media_of(i);
    if (int e = m->read(offset, dst, bytes)) throw_errno("reading media of controller " + std::to_string(i), e);
  }

private:
  std::shared_ptr<emu::media> media_of(std::uint32_t i) {
    if (i < gpu_engines_.size()) return gpu_engines_[i]->namespace_media();
    if (i < client_engines_.size()) return client_engines_[i]->media_ref();
    throw error("host media access needs an emu transport (controller " + std::to_string(i) + ")");
  }

  device_spec spec_;
  // Destroyed bottom-up: engines last.
  std::vector<std::shared_ptr<emu::gpu_engine>> gpu_engines_;
  std::vector<std::shared_ptr<emu::gpu_client_engine>> client_engines_;
  std::vector<std::shared_ptr<emu::controller>> emu_;
  std::vector<std::shared_ptr<controller>> ctrls_;
  std::unique_ptr<gpu::storage> storage_;
};

} // namespace bam::gpu
