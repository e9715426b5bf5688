// SPDX-License-Identifier: MIT
//! Reading a file through raw block commands on the controller of its disk,
//! with an `extent_map` saying where its blocks are, and choosing that path or
//! the software controller's CPU engine reading the file itself.
//!
//!   check_same_namespace(ctrl, nsid, map)  refuses a controller namespace that
//!                                          is not the file's disk
//!   read_mapped(ctrl, nsid, map, off, dst, len)
//!                                          bytes of the file, by block reads;
//!                                          holes as zeroes; fails (ESTALE) if
//!                                          the file changed meanwhile
//!   write_mapped(ctrl, nsid, map, off, src, len)
//!                                          overwrites bytes of the file in its
//!                                          allocated blocks (map made with
//!                                          for_writing); never allocates
//!   fs_medium_of(ctrl, nsid)               the namespace as a medium of bam::fs_image:
//!                                          a file system on an SSD bound to bam's
//!                                          driver, read by NVMe commands
//!   plan_file_access(path)                 which device string reads `path`
//!                                          (emu:extents=PATH or emu:file=PATH,ro),
//!                                          and why
//!
//! @code
//!   bam::extent_map m = bam::extent_map::of_file("/mnt/data/features.bin");
//!   bam::controller ctrl(bam::open_host_transports(bam::parse_device("/dev/bam-nvme1")).at(0));
//!   bam::check_same_namespace(ctrl, m.device().nsid, m);
//!   std::vector<char> buf(1 << 20);
//!   bam::read_mapped(ctrl, m.device().nsid, m, 0, buf.data(), buf.size());
//! @endcode
#pragma once

#include <bam/driver/controller.hpp>
#include <bam/file/extent_map.hpp>
#include <bam/file/fs_medium.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bam {

namespace detail {

//! The sysfs wwid Linux gives an NVMe namespace without usable identifiers:
//! "nvme.VVVV-<serial hex>-<model hex>-NNNNNNNN" (PCI vendor id, serial and
//! model without trailing blanks, namespace id). Empty if `id` is not that form.
struct nvme_wwid {
  std::uint16_t vendor = 0;
  std::string serial, model;
  std::uint32_t nsid = 0;
};
inline std::optional<nvme_wwid> parse_nvme_wwid(const std::string& id) {
  if (id.rfind("nvme.", 0) != 0) return std::nullopt;
  std::vector<std::string> parts;
  std::size_t from = 5;
  for (std::size_t dash; (dash = id.find('-', from)) != std::string::npos; from = dash + 1)
    parts.push_back(id.substr(from, dash - from));
  parts.push_back(id.substr(from));
  if (parts.size() != 4 || parts[0].size() != 4 || parts[3].size() != 8) return std::nullopt;
  auto unhex = [](const std::string& h, std::string& out) {
    if (h.size() % 2 != 0) return false;
    for (std::size_t i = 0; i < h.size(); i += 2) {
      char* end = nullptr;
      const std::string byte = h.substr(i, 2);
      const long v = std::strtol(byte.c_str(), &end, 16);
      if (end != byte.c_str() + 2) return false;
      out += static_cast<char>(v);
    }
    return true;
  };
  nvme_wwid w;
  char* end = nullptr;
  w.vendor = static_cast<std::uint16_t>(std::strtoul(parts[0].c_str(), &end, 16));
  if (*end != '\0') return std::nullopt;
  w.nsid = static_cast<std::uint32_t>(std::strtoul(parts[3].c_str(), &end, 16));
  if (*end != '\0' || !unhex(parts[1], w.serial) || !unhex(parts[2], w.model)) return std::nullopt;
  return w;
}

//! An identify string field without its trailing blanks and NULs (as Linux trims it for the wwid).
inline std::string trim_id_field(const char* s, std::size_t n) {
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\0'))
    --n;
  return std::string(s, n);
}

//! Walks bytes [offset, offset + len) of a mapped file in pieces that are
//! one run each and at most `max_blocks` blocks: f(lba or extent_hole,
//! blocks, skip, n) for the piece's `blocks` whole blocks from `lba`, of
//! which bytes [skip, skip + n) are the file's bytes asked for.
template <class F>
void for_each_piece(const extent_map& map, std::uint64_t offset, std::uint64_t len, std::uint64_t max_blocks, F&& f) {
  const extent_map_ref m = map.ref();
  const std::uint64_t lbs = map.lba_size();
  const std::uint64_t end = offset + len;
  const std::uint64_t last_block = (end + lbs - 1) / lbs; // one past the last block needed
  for (std::uint64_t pos = offset; pos < end;) {
    const std::uint64_t block = pos / lbs;
    const extent_map_ref::where w = m.find(block);
    const std::uint64_t blocks = std::min({w.blocks, last_block - block, max_blocks});
    const std::uint64_t skip = pos - block * lbs;
    const std::uint64_t n = std::min(blocks * lbs - skip, end - pos);
    f(w.lba, blocks, skip, n);
    pos += n;
  }
}

} // namespace detail

//! Refuses (ENXIO) a namespace that is evidently not the disk the map was
//! made on: a different logical block size, another size than the disk's,
//! an NGUID or EUI-64 that differs where both sides report one, or (where
//! Linux could only name the namespace by its controller) another PCI
//! vendor, serial number, model or namespace id than the disk's wwid.
inline void check_same_namespace(const controller& ctrl, std::uint32_t nsid, const extent_map& map) {
  const namespace_info& ns = ctrl.ns(nsid);
  const block_device_info& d = map.device();
  auto refuse = [&](const std::string& why) {
    error_context c;
    c.controller = ctrl.name();
    c.errnum = ENXIO;
    throw error("namespace " + std::to_string(nsid) + " is not " + d.disk_node + ", the disk " + map.path() +
                    " is on: " + why,
                c);
  };
  if (ns.lba_size != d.lba_size)
    refuse("its logical blocks are " + std::to_string(ns.lba_size) + " bytes, the disk's " +
           std::to_string(d.lba_size));
  if (d.disk_bytes != 0 && ns.blocks * ns.lba_size != d.disk_bytes)
    refuse("it holds " + std::to_string(ns.blocks * ns.lba_size) + " bytes, the disk " + std::to_string(d.disk_bytes));
  auto nonzero = [](const auto& a) {
    return std::any_of(std::begin(a), std::end(a), [](std::uint8_t b) { return b != 0; });
  };
  if (nonzero(d.nguid) && nonzero(ns.id.nguid) && std::memcmp(d.nguid.data(), ns.id.nguid, 16) != 0)
    refuse("its NGUID differs");
  if (nonzero(d.eui64) && nonzero(ns.id.eui64) && std::memcmp(d.eui64.data(), ns.id.eui64, 8) != 0)
    refuse("its EUI-64 differs");
  if (const auto w = detail::parse_nvme_wwid(d.wwid)) {
    const nvme_id_ctrl& id = ctrl.identify_data();
    const std::string serial = detail::trim_id_field(id.sn, sizeof id.sn);
    const std::string model = detail::trim_id_field(id.mn, sizeof id.mn);
    if (w->vendor != id.vid || w->serial != serial || w->model != model || w->nsid != nsid)
      refuse("the disk is namespace " + std::to_string(w->nsid) + " of controller '" + w->model + "' serial '" +
             w->serial + "' (wwid " + d.wwid + "), this is namespace " + std::to_string(nsid) + " of '" + model +
             "' serial '" + serial + "'");
  }
}

//! Namespace `nsid` of `ctrl` as a `fs_medium`: bytes read with NVMe read
//! commands on I/O queue `queue` through a bounce buffer of at most 1 MiB
//! (and the controller's transfer limit; one read at a time, also from the
//! copies the maps' change checks keep; other threads should not use
//! `queue` meanwhile), so that `bam::fs_image` reads the
//! file system of an SSD bound to bam's driver and maps its files in the
//! namespace's LBAs. `ctrl` must outlive the medium and what is made from it
//! (the fs_image, its maps' change checks).
inline fs_medium fs_medium_of(controller& ctrl, std::uint32_t nsid, std::uint32_t queue = 0) {
  const namespace_info& ns = ctrl.ns(nsid);
  const std::uint64_t lbs = ns.lba_size;
  std::uint64_t chunk = std::min<std::uint64_t>(1ull << 20, ctrl.max_transfer_bytes());
  chunk = std::max<std::uint64_t>(chunk / lbs * lbs, lbs);
  std::shared_ptr<dma_region> bounce = ctrl.transport().alloc(chunk);
  auto one_at_a_time = std::make_shared<std::mutex>(); // the bounce buffer and the queue, for every copy of the medium
  fs_medium m;
  m.name = ctrl.name() + " namespace " + std::to_string(nsid);
  m.bytes = ns.blocks * lbs;
  m.lba_size = ns.lba_size;
  m.read = [&ctrl, nsid, queue, bounce, one_at_a_time, lbs, chunk](std::uint64_t offset, void* dst, std::size_t n) {
    const std::lock_guard hold(*one_at_a_time);
    auto* out = static_cast<unsigned char*>(dst);
    while (n > 0) {
      const std::uint64_t skip = offset % lbs;
      const std::uint64_t take = std::min<std::uint64_t>(n, chunk - skip);
      const auto blocks = static_cast<std::uint32_t>((skip + take + lbs - 1) / lbs);
      ctrl.read(nsid, offset / lbs, blocks, *bounce, 0, queue);
      std::memcpy(out, bounce->as<unsigned char>() + skip, take);
      out += take;
      offset += take;
      n -= static_cast<std::size_t>(take);
    }
  };
  return m;
}

//! Reads `len` bytes of the mapped file from byte `offset` into `dst`, with
//! read commands on `nsid` of `ctrl` for the blocks the map names (several
//! per call when the file is fragmented, each within the controller's
//! transfer limit) and zeroes for holes. Reading past the end of the file is
//! refused (EINVAL). After reading, the file is checked against the map
//! (extent_map::check_unchanged): a file that changed meanwhile fails with
//! ESTALE and `dst` must be discarded.
inline void read_mapped(controller& ctrl, std::uint32_t nsid, const extent_map& map, std::uint64_t offset, void* dst,
                        std::size_t len, std::uint32_t queue = 0) {
  if (offset > map.file_size() || len > map.file_size() - offset) {
    error_context c;
    c.errnum = EINVAL;
    throw error("reading " + std::to_string(len) + " bytes at offset " + std::to_string(offset) + " of " + map.path() +
                    " (" + std::to_string(map.file_size()) + " bytes): past the end of the file",
                c);
  }
  if (len == 0) return;
  const std::uint64_t lbs = map.lba_size();
  if (ctrl.ns(nsid).lba_size != lbs) check_same_namespace(ctrl, nsid, map); // throws with the reason
  // Bounce buffer: what the request needs, at most 1 MiB per command.
  constexpr std::uint64_t chunk = 1ull << 20;
  const std::uint64_t need = (offset % lbs + len + lbs - 1) / lbs * lbs;
  const std::uint64_t bounce_bytes = std::max<std::uint64_t>(std::min(chunk, need), lbs);
  std::unique_ptr<dma_region> bounce = ctrl.transport().alloc(bounce_bytes);
  auto* out = static_cast<unsigned char*>(dst);
  detail::for_each_piece(map, offset, len, bounce_bytes / lbs,
                         [&](std::uint64_t lba, std::uint64_t blocks, std::uint64_t skip, std::uint64_t n) {
                           if (lba == extent_hole) {
                             std::memset(out, 0, n);
                           } else {
                             ctrl.read(nsid, lba, static_cast<std::uint32_t>(blocks), *bounce, 0, queue);
                             std::memcpy(out, bounce->as<unsigned char>() + skip, n);
                           }
                           out += n;
                         });
  map.check_unchanged();
}

//! Overwrites `len` bytes of the mapped file from byte `offset` with `src`,
//! by block writes on `nsid` of `ctrl`: only blocks the file system has
//! already allocated to the file (the map must be made with `for_writing`,
//! which refuses holes, unwritten and shared extents), never past the end of
//! the file. Partial blocks at either end are read, merged and written back.
//! The file is checked against the map before and after (ESTALE if it
//! changed). The file system's page cache does not see raw writes: drop the
//! file's cached pages (posix_fadvise DONTNEED) before reading it through
//! the file system.
inline void write_mapped(controller& ctrl, std::uint32_t nsid, const extent_map& map, std::uint64_t offset,
                         const void* src, std::size_t len, std::uint32_t queue = 0) {
  if (!map.options().for_writing || map.has_holes()) {
    error_context c;
    c.errnum = EINVAL;
    throw error("writing " + map.path() +
                    " through raw blocks needs a map made for writing "
                    "(extent_map_options::for_writing): it refuses holes and shared blocks",
                c);
  }
  if (offset > map.file_size() || len > map.file_size() - offset) {
    error_context c;
    c.errnum = EINVAL;
    throw error("writing " + std::to_string(len) + " bytes at offset " + std::to_string(offset) + " of " + map.path() +
                    " (" + std::to_string(map.file_size()) +
                    " bytes): past the end of the file, which raw "
                    "writes cannot extend",
                c);
  }
  if (len == 0) return;
  check_same_namespace(ctrl, nsid, map);
  map.check_unchanged();
  const std::uint64_t lbs = map.lba_size();
  constexpr std::uint64_t chunk = 1ull << 20;
  const std::uint64_t bounce_bytes = std::max<std::uint64_t>(chunk, lbs);
  std::unique_ptr<dma_region> bounce = ctrl.transport().alloc(bounce_bytes);
  const auto* in = static_cast<const unsigned char*>(src);
  detail::for_each_piece(map, offset, len, bounce_bytes / lbs,
                         [&](std::uint64_t lba, std::uint64_t blocks, std::uint64_t skip, std::uint64_t n) {
                           const auto nb = static_cast<std::uint32_t>(blocks);
                           // Partial first or last block: keep the bytes around the new ones.
                           if (skip != 0) ctrl.read(nsid, lba, 1, *bounce, 0, queue);
                           if ((skip + n) % lbs != 0) ctrl.read(nsid, lba + nb - 1, 1, *bounce, (nb - 1) * lbs, queue);
                           std::memcpy(bounce->as<unsigned char>() + skip, in, n);
                           ctrl.write(nsid, lba, nb, *bounce, 0, queue);
                           in += n;
                         });
  ctrl.flush(nsid, queue);
  map.check_unchanged();
}

//! How a file is read: through raw blocks of its disk (`direct`:
//! `emu:extents=PATH`, a software controller whose namespace is the file,
//! read from the raw disk through the map) or by the software controller's
//! CPU engine reading the file itself (`via_file`: `emu:file=PATH,ro`).
//! Either way byte x of namespace 1 is byte x of the file, so a
//! `bam::array` or a host reader opens `device` and reads from offset 0.
struct file_access {
  enum class path { direct, via_file };
  path kind = path::via_file;
  std::string device;            //!< device string to open
  std::string reason;            //!< why this path (printed by tools and examples)
  std::optional<extent_map> map; //!< where the file's blocks are (always set for direct; set for
                                 //!< via_file when only the disk could not be opened)
};

//! Chooses the path for reading `path`: direct when the file system reports
//! the file's blocks on one disk and that disk can be opened for reading
//! here (which needs read access to the block device node), else via the
//! file, saying why. Refusals that concern the file's content (holes not
//! allowed, data not yet on disk) are not a reason to fall back: they are
//! thrown, since the file path would read the same bytes only by luck of
//! timing.
inline file_access plan_file_access(const std::string& path, const extent_map_options& opts = {}) {
  file_access a;
  a.device = "emu:file=" + path + ",ro";
  std::optional<extent_map> m;
  try {
    m = extent_map::of_file(path, opts);
  } catch (const error& e) {
    if (e.errnum() != ENODEV && e.errnum() != EOPNOTSUPP && e.errnum() != ENOTTY) throw;
    std::string w = e.what();
    a.reason = "reading the file with the software controller's CPU engine: " + w.substr(w.find(": ") + 2);
    return a;
  }
  const std::string node = m->device().disk_node;
  const int fd = ::open(node.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    a.reason = "reading the file with the software controller's CPU engine: its disk " + node +
               " cannot be opened here (" + std::strerror(e) + ")";
    a.map = std::move(m);
    return a;
  }
  ::close(fd);
  a.kind = file_access::path::direct;
  a.device = "emu:extents=" + path + (opts.allow_holes ? ",holes" : "");
  a.reason = "reading " + std::to_string(m->runs()) + " run(s) of raw blocks of " + node +
             (m->device().partition.empty() ? ""
                                            : " (partition " + m->device().partition + " at byte " +
                                                  std::to_string(m->device().partition_start) + ")") +
             " through the software controller";
  a.map = std::move(m);
  return a;
}

} // namespace bam
