// SPDX-License-Identifier: MIT
//! Host side of device selection: turn a parsed device string into the
//! transports a `bam::controller` drives from host threads. (GPU programs use
//! `bam::storage` in `bam/runtime/storage.cuh`, which places queues for GPU
//! submitters; both take the same strings.)
//!
//! @code
//!   auto spec = bam::parse_device("emu:file=/tmp/disk.img,size=1G");
//!   for (auto& t : bam::open_host_transports(spec)) {
//!     bam::controller ctrl(t, {.io_queues = spec.io_queues});
//!   }
//! @endcode
#pragma once

#include <bam/device_string.hpp>
#include <bam/emu.hpp>
#include <bam/emu/extent_media.hpp>
#include <bam/error.hpp>
#include <bam/transport/pci.hpp>
#include <bam/transport/transport.hpp>

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

namespace bam {

//! Media of software controller `index` of an `emu:` or `emu-gpu:ram=` spec
//! (a file spec with several controllers uses `path.0`, `path.1`, ...).
inline std::shared_ptr<emu::media> open_emu_media(const device_spec& spec, std::uint32_t index) {
  if (spec.media == media_kind::file && spec.extents) {
    extent_map_options o;
    o.allow_holes = spec.holes;
    return emu::make_extent_media(extent_map::of_file(spec.path, o));
  }
  if (spec.media == media_kind::file) {
    const std::string path = spec.ssds == 1 ? spec.path : spec.path + "." + std::to_string(index);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISBLK(st.st_mode))
      return emu::make_block_media(path, spec.bytes, /*direct=*/true, spec.read_only);
    // size= creates or extends the file; without it the file must exist.
    return emu::make_file_media(path, spec.bytes, /*create=*/spec.bytes != 0 && !spec.read_only, /*direct=*/true,
                                spec.read_only);
  }
  if (spec.media == media_kind::ram) return emu::make_ram_media(spec.bytes);
  error_context c;
  c.controller = spec.text;
  throw error(std::string("media '") + media_name(spec.media) + "' is served by the GPU engine only (emu-gpu:)", c);
}

//! Configuration of software controller `index` of an `emu:`/`emu-gpu:` spec
//! with one namespace over `media` (the engine is the caller's to set).
inline emu::controller_config emu_config(const device_spec& spec, std::uint32_t index,
                                         std::shared_ptr<emu::media> media, const std::string& prefix = "emu") {
  emu::controller_config cfg;
  cfg.namespaces = {emu::namespace_config{media->size() / spec.lba_size, spec.lba_size, std::move(media)}};
  cfg.max_queue_entries = std::max<std::uint32_t>(spec.queue_depth, 2);
  cfg.max_io_queues = spec.io_queues;
  cfg.engine_threads = spec.threads;
  cfg.name = prefix + std::to_string(index); // also the serial number's suffix
  return cfg;
}

//! One transport per controller the spec names, for host-driven I/O:
//! software controllers with the CPU engine, or kernel-module devices.
inline std::vector<std::shared_ptr<transport>> open_host_transports(const device_spec& spec) {
  std::vector<std::shared_ptr<transport>> out;
  switch (spec.kind) {
  case device_kind::emu_cpu:
    for (std::uint32_t i = 0; i < spec.ssds; ++i) {
      out.push_back(emu::make_controller(emu_config(spec, i, open_emu_media(spec, i))));
    }
    break;
  case device_kind::pci:
    for (const auto& path : spec.devices) out.push_back(std::make_shared<pci_transport>(path));
    break;
  case device_kind::emu_gpu: {
    error_context c;
    c.controller = spec.text;
    throw error("emu-gpu devices are served by GPU threads: use bam::storage from a CUDA program "
                "(or emu:ram=/emu:file= for host I/O)",
                c);
  }
  }
  return out;
}

} // namespace bam
