// SPDX-License-Identifier: MIT
// Where `bam-gnn aggregate` reads the feature table from, in three steps
// around opening the storage and attaching the bam::array:
//   choose_feature_device  the device string: --device, else the device the
//                          table was loaded onto (manifest), else an
//                          in-process medium the size of the table (with
//                          --gpus N, shared memory every GPU opens);
//                          `--device file`: the dataset's own feature file;
//   locate_feature_table   where on the storage the table's first row is;
//   fill_or_check_medium   an in-process medium gets the table written into
//                          it (before any timing); a device must hold it
//                          where the manifest says.
#pragma once

#include "gnn_aggregate.hpp"
#include "gnn_cuda.cuh"

#include <bam/bam.cuh>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

namespace bam::gnn {

//! Where a run reads the feature table from.
struct feature_location {
  std::string device;          //!< the device string the storage opens
  device_spec spec;            //!< `device`, parsed
  bool from_file = false;      //!< --device file: the dataset's own feature file, read through bam
  bool in_process = false;     //!< a medium the run made (RAM, GPU memory, shared memory): it writes the table into it
  std::string file_reason;     //!< (from_file) how bam reads that file
  std::uint64_t start_lba = 0; //!< the block of the table's first row
  std::string placement;       //!< where the table is, in words (for the report)
  double load_seconds = 0;     //!< (in_process) writing the table into the medium
};

//! The device string and how it holds the table. Throws `bam::error` for a
//! medium that cannot hold it, or (--gpus N) that one GPU alone can open.
inline feature_location choose_feature_device(const aggregate_options& o, const manifest& m, const table_source& src) {
  feature_location f;
  f.device = o.device;
  if (f.device.empty()) {
    if (m.device) {
      f.device = m.device->device;
    } else {
      // Pinned RAM the size of the table in MiB, rounded up, and one MiB
      // more; with several GPUs, shared memory that every GPU's storage
      // opens (one copy), removed when the run ends.
      const std::uint64_t mib = (m.nodes * m.features.row_bytes() + (2ull << 20) - 1) >> 20;
      f.device = o.gpus > 1
                     ? "emu-gpu:shm=bam-gnn-" + std::to_string(::getpid()) + ",size=" + std::to_string(mib) + "M,unlink"
                     : "emu-gpu:ram=" + std::to_string(mib) + "M";
    }
  }
  // `--device file`: the dataset's own feature file, read through bam: from
  // its blocks on the raw disk where that disk opens here, else by the CPU
  // engine from the file (array::open's choice).
  f.from_file = f.device == "file";
  if (f.from_file) {
    if (src.path().empty())
      detail::gnn_fail(o.dir + ": --device file reads the features from their file, and this dataset has none "
                               "(made with --no-features-file): bam-gnn load it onto a device",
                       ENOENT);
    const file_access fa = plan_file_access(src.path());
    if (fa.kind == file_access::path::via_file) warn(src.path() + ": " + fa.reason);
    f.device = fa.device + ",queues=32,threads=8";
    f.file_reason = fa.reason;
  }
  f.spec = parse_device(f.device);
  if (f.spec.kind != device_kind::pci && f.spec.media == media_kind::null)
    detail::gnn_fail(f.device + ": null media keep no data; the features need a medium that holds them "
                                "(emu-gpu:ram=SIZE, emu-gpu:hbm=SIZE, emu:file=..., a loaded device)");
  const bool loaded = m.device && m.device->device == f.device;
  f.in_process =
      f.spec.kind != device_kind::pci && (f.spec.media == media_kind::ram || f.spec.media == media_kind::hbm ||
                                          (f.spec.media == media_kind::shm && !loaded && !f.from_file));
  if (o.gpus > 1 && f.spec.kind != device_kind::pci &&
      (f.spec.media == media_kind::ram || f.spec.media == media_kind::hbm))
    detail::gnn_fail(f.device + ": with --gpus " + std::to_string(o.gpus) +
                         " every GPU reads one copy of the table, and this medium belongs to one storage: use "
                         "shared memory (emu-gpu:shm=NAME,size=SIZE, the default), the feature file or a loaded "
                         "device",
                     EINVAL);
  return f;
}

//! `f.start_lba` on the opened storage `s`: the rows' offset in the feature
//! file, or where bam-gnn load wrote them (an in-process medium gets them
//! from block 0). Throws `bam::error` where bam cannot address them.
inline void locate_feature_table(feature_location& f, const storage& s, const aggregate_options& o, const manifest& m,
                                 const table_source& src) {
  if (f.from_file) {
    if (m.features.file_offset % s.lba_size() != 0)
      detail::gnn_fail(src.path() + ": the rows start at byte " + std::to_string(m.features.file_offset) +
                           ", not on a " + std::to_string(s.lba_size()) +
                           "-byte block boundary, so bam cannot address them in place: bam-gnn load the "
                           "table onto a device, or use an in-process medium (--device emu-gpu:ram=SIZE)",
                       EINVAL);
    f.start_lba = m.features.file_offset / s.lba_size();
    f.placement = "the dataset's feature file " + src.path() + ": " + f.file_reason;
  } else if (!f.in_process) {
    if (!m.device || m.device->device != f.device)
      detail::gnn_fail(
          o.dir + ": its features were not loaded onto " + f.device +
              (m.device ? " (the manifest names " + m.device->device + ")" : " (the manifest names no device)") +
              ": run bam-gnn load " + o.dir + " " + f.device +
              ", or read them from an in-process medium (--device emu-gpu:ram=SIZE or "
              "emu-gpu:hbm=SIZE)",
          ENOENT);
    if (m.device->offset % s.lba_size() != 0)
      detail::gnn_fail(f.device + ": the features start at byte " + std::to_string(m.device->offset) +
                       ", not on an LBA boundary of " + std::to_string(s.lba_size()) + " bytes");
    f.start_lba = m.device->offset / s.lba_size();
  }
}

//! Once the array is attached (it refuses a table past the storage's end):
//! writes the table into an in-process medium, striped over its controllers
//! as the array reads it, before any timing; on a device, checks the
//! namespace and the controller bam-gnn load wrote.
inline void fill_or_check_medium(feature_location& f, storage& s, const aggregate_options& o, const manifest& m,
                                 const table_source& src, thread_pool& pool) {
  const std::uint64_t table_bytes = m.nodes * m.features.row_bytes();
  if (f.in_process) {
    const std::uint64_t medium_bytes = s.blocks_per_controller() * s.lba_size() * s.controller_count();
    if (table_bytes > medium_bytes)
      detail::gnn_fail(f.device + ": the feature table (" + std::to_string(table_bytes) + " bytes) does not fit its " +
                       std::to_string(medium_bytes) + " bytes");
    if (!o.json_stdout)
      std::printf("loading the feature table (%.2f GiB, %s) into %s before timing...\n",
                  static_cast<double>(table_bytes) / (1ull << 30),
                  src.path().empty() ? "generated" : src.path().c_str(), f.device.c_str());
    std::fflush(stdout);
    const auto t0 = clock_type::now();
    load_striped(src, table_bytes, o.page_size, s.controller_count(), 0, pool,
                 [&](std::uint32_t c, std::uint64_t off, const void* p, std::size_t len) {
                   bam::emu::write_media(s, c, off, p, len);
                 });
    f.load_seconds = seconds_since(t0);
    f.placement = f.spec.media == media_kind::shm ? "loaded into the shared memory before timing"
                                                  : "loaded into the in-process medium before timing";
  } else if (!f.from_file) {
    if (m.device->nsid != s.nsid())
      detail::gnn_fail(f.device + ": the features are on namespace " + std::to_string(m.device->nsid) +
                       ", the storage opens namespace " + std::to_string(s.nsid()));
    if (s.controller_count() != 1)
      detail::gnn_fail(f.device + ": names " + std::to_string(s.controller_count()) +
                       " controllers; bam-gnn load writes the table onto one");
    f.placement = "on the device at byte " + std::to_string(m.device->offset) + " (manifest)";
  }
}

} // namespace bam::gnn
