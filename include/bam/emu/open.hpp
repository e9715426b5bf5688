// SPDX-License-Identifier: MIT
//! The software controller as a registered transport: what `emu:` device
//! strings open for host I/O (`bam::open_host_transports`). Its GPU openers
//! (`emu-gpu:` and `emu:` for GPU submitters) register from `gpu_engine.cuh`
//! and `client_engine.cuh`.
#pragma once

#include <bam/emu/emulated_controller.hpp>
#include <bam/emu/extent_media.hpp>
#include <bam/emu/media.hpp>
#include <bam/emu/shared_memory.hpp>
#include <bam/error.hpp>
#include <bam/transport/device_string.hpp>
#include <bam/transport/open.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace bam::emu {

//! Shared memory of controller `index` of a `shm=` spec, checked against the
//! spec's LBA size (an object attached to without size= has its own size).
inline std::shared_ptr<shared_memory> open_spec_shared_memory(const device_spec& spec, std::uint32_t index) {
  auto m = open_shared_memory(spec, index);
  if (m->size() % spec.lba_size != 0)
    throw error::invalid_input(spec.text + ": shared memory " + m->object() + " is " + std::to_string(m->size()) +
                                   " bytes, not a multiple of the LBA size " + std::to_string(spec.lba_size),
                               EINVAL);
  return m;
}

//! Media of software controller `index` of an `emu:` or `emu-gpu:ram=` spec
//! (a file spec with several controllers uses `path.0`, `path.1`, ...; a
//! `shm=NAME` spec `NAME.0`, `NAME.1`, ...).
inline std::shared_ptr<media> open_media(const device_spec& spec, std::uint32_t index) {
  if (spec.media == media_kind::shm) return make_shared_memory_media(open_spec_shared_memory(spec, index));
  if (spec.media == media_kind::file && spec.extents) {
    extent_map_options o;
    o.allow_holes = spec.holes;
    return make_extent_media(extent_map::of_file(spec.path, o));
  }
  if (spec.media == media_kind::file) {
    const std::string path = spec.ssds == 1 ? spec.path : spec.path + "." + std::to_string(index);
    struct stat st {};
    const bool exists = ::stat(path.c_str(), &st) == 0;
    if (exists && S_ISBLK(st.st_mode)) return make_block_media(path, spec.bytes, /*direct=*/true, spec.read_only);
    // size= creates or extends the file; without it the file must exist.
    const bool create = spec.bytes != 0 && !spec.read_only;
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!exists && !create && errno == ENOENT && std::filesystem::is_directory(dir.empty() ? "." : dir, ec)) {
      if (spec.read_only) throw error::invalid_input(spec.text + ": no such file " + path, ENOENT);
      throw error::invalid_input(spec.text + ": no such file " + path + "; add size=... to create it (e.g. " +
                                     spec.text + ",size=1G)",
                                 ENOENT);
    }
    return make_file_media(path, spec.bytes, create, /*direct=*/true, spec.read_only);
  }
  if (spec.media == media_kind::ram) return make_ram_media(spec.bytes);
  error_context c;
  c.controller = spec.text;
  throw error(std::string("media '") + media_name(spec.media) + "' is served by the GPU engine only (emu-gpu:)", c);
}

//! Configuration of software controller `index` of an `emu:`/`emu-gpu:` spec
//! with one namespace over `m` (the engine is the caller's to set).
inline controller_config config_for(const device_spec& spec, std::uint32_t index, std::shared_ptr<media> m,
                                    const std::string& prefix = "emu") {
  controller_config cfg;
  cfg.namespaces = {namespace_config{m->size() / spec.lba_size, spec.lba_size, std::move(m)}};
  cfg.max_queue_entries = std::max<std::uint32_t>(spec.queue_depth, 2);
  cfg.max_io_queues = spec.io_queues;
  cfg.engine_threads = spec.threads;
  cfg.name = prefix + std::to_string(index); // also the serial number's suffix
  return cfg;
}

namespace detail {

//! `emu:` for host I/O: software controllers with the CPU engine.
inline std::vector<std::shared_ptr<transport>> open_host_controllers(const device_spec& spec) {
  std::vector<std::shared_ptr<transport>> out;
  for (std::uint32_t i = 0; i < spec.ssds; ++i)
    out.push_back(make_emulated_controller(config_for(spec, i, open_media(spec, i))));
  return out;
}

//! `emu-gpu:` has no host path: its controllers are served by GPU threads.
inline std::vector<std::shared_ptr<transport>> refuse_host_gpu_engine(const device_spec& spec) {
  error_context c;
  c.controller = spec.text;
  throw error("emu-gpu devices are served by GPU threads: use bam::storage from a CUDA program "
              "(or emu:ram=/emu:file= for host I/O)",
              c);
}

} // namespace detail

inline const bool host_transports_registered =
    register_host_transport(device_kind::emu_cpu, &detail::open_host_controllers) &&
    register_host_transport(device_kind::emu_gpu, &detail::refuse_host_gpu_engine);

} // namespace bam::emu
