// SPDX-License-Identifier: MIT
// The program scripts/qemu-test runs inside the guest of its "files"
// scenario: one NVMe subsystem, two controllers, one shared namespace. The
// kernel's nvme driver keeps controller A with an ext4 file system mounted
// from a partition of the namespace; controller B is bound to bam_nvme. Files
// are mapped with bam::extent_map::of_file (FIEMAP plus the partition's
// start) and read through controller B with bam::read_mapped, and every byte
// is compared with read() through the file system. Every case prints one line
// "BAMTEST CASE <name> PASS|FAIL <detail>" that the host collects; the exit
// status is the number of failures. Built with libext2fs (BAM_HAVE_LIBEXT2FS),
// it also reads the partition's file system itself through controller B, as
// on an SSD the kernel cannot mount, and maps the files the host put in.
//
//   bam_file_test DEV DIR
//
// DIR holds (the host preloads the first three into the image, /init writes
// the others through the mounted file system):
//   big.bin            larger than the controller's transfer limit, contiguous
//   small.bin          a few blocks, the last one partly used
//   empty.bin          no bytes
//   frag-a.bin         appended in turns with frag-b.bin, synced in between
//   frag-b.bin
//   sparse.bin         data, a hole, data
//   synced.bin         written, then synced
//   unsynced.bin       written just before the test (delayed allocation)
// It writes change.bin there itself.
#include "guest_report.hpp"

#include <bam/host.hpp>
#include <bam/file/mapped_file.hpp>
#include <bam/transport/pci.hpp>
#if defined(BAM_HAVE_LIBEXT2FS)
#include <bam/file/fs_image.hpp>
#endif

#include <fcntl.h>
#include <linux/fiemap.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using bam::guest::failures;
using bam::guest::info;
using bam::guest::report;

std::string hex_bytes(const std::uint8_t* p, std::size_t n) {
  std::string s;
  char b[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

bool nonzero(const std::uint8_t* p, std::size_t n) {
  return std::any_of(p, p + n, [](std::uint8_t b) { return b != 0; });
}

//! The file's bytes through the file system.
std::vector<unsigned char> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bam::throw_errno("opening " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    bam::throw_errno("stat " + path);
  }
  std::vector<unsigned char> out(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n <= 0) {
      ::close(fd);
      bam::throw_errno("reading " + path, n == 0 ? EIO : errno);
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return out;
}

//! Appends or overwrites bytes through the file system and waits for them (fsync).
void write_file(const std::string& path, const std::vector<unsigned char>& data, int flags, off_t at = -1) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | flags, 0644);
  if (fd < 0) bam::throw_errno("opening " + path);
  const ssize_t n = at < 0 ? ::write(fd, data.data(), data.size()) : ::pwrite(fd, data.data(), data.size(), at);
  const int e = errno;
  const bool ok = n == static_cast<ssize_t>(data.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) bam::throw_errno("writing " + path, n < 0 ? e : EIO);
}

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v)
    b = static_cast<unsigned char>(g());
  return v;
}

//! Runs `fn` and returns the bam::error it throws (empty if none).
std::optional<bam::error> error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const bam::error& e) {
    return e;
  }
  return std::nullopt;
}

std::string errno_name(int e) {
  switch (e) {
  case 0: return "no errno";
  case EINVAL: return "EINVAL";
  case ESTALE: return "ESTALE";
  case ENXIO: return "ENXIO";
  case EAGAIN: return "EAGAIN";
  case ENODEV: return "ENODEV";
  default: return "errno " + std::to_string(e);
  }
}

std::string layout_of(const bam::extent_map& m) {
  return std::to_string(m.runs()) + " runs, " + std::to_string(m.raw_extents()) + " raw extents";
}

struct tester {
  std::string dev, dir;
  std::shared_ptr<bam::pci_transport> t;
  std::unique_ptr<bam::controller> c;
  std::uint32_t nsid = 0;

  std::string path(const std::string& name) const { return dir + "/" + name; }

  //! Bytes [off, off+len) of the file through the map and controller B.
  std::vector<unsigned char> read_bam(const bam::extent_map& m, std::uint64_t off, std::size_t len) {
    std::vector<unsigned char> out(len, 0xa5);
    bam::read_mapped(*c, nsid, m, off, out.data(), len);
    return out;
  }

  //! The ranges a file is read in besides the whole file: unaligned starts
  //! and ends, across block, transfer-limit and run boundaries, and a few
  //! random ones.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_of(const bam::extent_map& m) {
    const std::uint64_t size = m.file_size(), lbs = m.lba_size(), mt = c->max_transfer_bytes();
    std::vector<std::pair<std::uint64_t, std::uint64_t>> want = {
        {1, 1}, {lbs - 1, 2}, {4095, 4098}, {size / 3 + 7, size / 3}, {size - 1, 1}, {mt - 5, 10}, {mt + 3, mt + 1000}};
    for (std::uint64_t i = 1; i < m.runs() && i <= 64; ++i)
      want.push_back({m.run_starts()[i] * lbs - 3, 7}); // across a run boundary
    std::mt19937_64 g(size);
    for (int i = 0; i < 4 && size > 1; ++i) {
      const std::uint64_t off = g() % size;
      want.push_back({off, 1 + g() % (size - off)});
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (const auto& [off, len] : want)
      if (len > 0 && off < size && len <= size - off) out.push_back({off, len});
    return out;
  }

  //! Checks the namespace against the map of `name` and compares the whole
  //! file and some sub-ranges read through controller B with read().
  bool compare_file(const std::string& name, const bam::extent_map& m, std::string& detail) {
    const std::vector<unsigned char> want = read_file(path(name));
    if (want.size() != m.file_size()) {
      detail = "file system says " + std::to_string(want.size()) + " bytes, map " + std::to_string(m.file_size());
      return false;
    }
    bam::check_same_namespace(*c, nsid, m);
    const std::vector<unsigned char> got = read_bam(m, 0, want.size());
    if (got != want) {
      const auto at = std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin();
      detail = "whole file differs from read() first at byte " + std::to_string(at);
      return false;
    }
    const auto ranges = ranges_of(m);
    for (const auto& [off, len] : ranges) {
      const std::vector<unsigned char> part = read_bam(m, off, len);
      if (!std::equal(part.begin(), part.end(), want.begin() + static_cast<std::ptrdiff_t>(off))) {
        detail = "bytes [" + std::to_string(off) + ", +" + std::to_string(len) + ") differ from read()";
        return false;
      }
    }
    detail = std::to_string(want.size()) + " bytes, " + layout_of(m) + "; whole file and " +
             std::to_string(ranges.size()) + " unaligned sub-ranges equal to read()";
    return true;
  }

  // ---- cases ---------------------------------------------------------------

  void open_controller() {
    t = std::make_shared<bam::pci_transport>(dev);
    bam::controller_options o;
    o.io_queues = 2;
    o.queue_depth = 64;
    o.io_timeout_ns = 30'000'000'000ull;
    o.admin_timeout_ns = 30'000'000'000ull;
    c = std::make_unique<bam::controller>(t, o);
    std::string nss;
    for (const auto& ns : c->namespaces())
      nss += (nss.empty() ? "" : ",") + std::to_string(ns.nsid) + ":" + std::to_string(ns.lba_size);
    report("open-controller-b", c->namespaces().size() == 1,
           dev + " at " + t->pci_address() + " (IOMMU " + (t->iommu() ? "on" : "off") + "), serial '" + c->serial() +
               "', namespaces " + nss + ", transfer limit " + std::to_string(c->max_transfer_bytes()) + " bytes");
  }

  void identity() {
    const bam::extent_map m = bam::extent_map::of_file(path("small.bin"));
    const bam::block_device_info& d = m.device();
    nsid = d.nsid;
    info("file system disk", d.disk_node + " partition " + d.partition + " at byte " +
                                 std::to_string(d.partition_start) + ", " + std::to_string(d.disk_bytes) + " bytes, " +
                                 std::to_string(d.lba_size) + "-byte blocks, nsid " + std::to_string(d.nsid) +
                                 ", wwid " + d.wwid);
    const bam::namespace_info& ns = c->ns(nsid);
    const bool eui_ok = nonzero(d.eui64.data(), 8) && std::memcmp(d.eui64.data(), ns.id.eui64, 8) == 0;
    const bool same = !error_of([&] { bam::check_same_namespace(*c, nsid, m); }).has_value();
    report("same-namespace", same && eui_ok && !d.partition.empty() && d.partition_start == (1u << 20),
           "file system on " + d.partition + " of " + d.disk + " (partition at byte " +
               std::to_string(d.partition_start) + "), nsid " + std::to_string(nsid) + "; EUI-64 sysfs " +
               hex_bytes(d.eui64.data(), 8) + ", controller B identify " + hex_bytes(ns.id.eui64, 8) +
               "; NGUID sysfs " + (nonzero(d.nguid.data(), 16) ? hex_bytes(d.nguid.data(), 16) : "none") +
               ", identify " + (nonzero(ns.id.nguid, 16) ? hex_bytes(ns.id.nguid, 16) : "none") +
               "; check_same_namespace " + (same ? "accepts" : "refuses"));

    // A map of another disk: refused.
    auto refused = [&](bam::block_device_info other, const std::string& expect) {
      const bam::extent_map fake = bam::extent_map::from_extents(path("other"), {}, 0, other);
      const auto e = error_of([&] { bam::check_same_namespace(*c, nsid, fake); });
      return std::make_pair(e && e->errnum() == ENXIO && std::string(e->what()).find(expect) != std::string::npos,
                            e ? std::string(e->what()) : std::string("accepted"));
    };
    bam::block_device_info other = d;
    other.eui64[7] ^= 1;
    const auto [eui_refused, eui_msg] = refused(other, "EUI-64 differs");
    other = d;
    other.disk_bytes += 1 << 20;
    const auto [size_refused, size_msg] = refused(other, "bytes");
    report("other-namespace-refused", eui_refused && size_refused, eui_msg + " | " + size_msg);
  }

  //! Runs one case; an exception fails it.
  static void guard(const std::string& cname, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      report(cname, false, std::string("exception: ") + e.what());
    }
  }

  void plain_file(const std::string& name, const std::string& cname,
                  const std::function<bool(const bam::extent_map&, std::string&)>& extra = {}) {
    guard(cname, [&] {
      const bam::extent_map m = bam::extent_map::of_file(path(name));
      std::string detail;
      bool ok = compare_file(name, m, detail);
      if (ok && extra) ok = extra(m, detail);
      report(cname, ok, name + ": " + detail);
    });
  }

  //! A file just written, its blocks not yet allocated: mapping without a
  //! sync is refused (EAGAIN); of_file's sync makes it mappable.
  void unsynced() {
    guard("file-unsynced-delalloc", [&] {
      const std::string p = path("unsynced.bin");
      const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) bam::throw_errno("opening " + p);
      std::vector<bam::raw_extent> raw;
      try {
        raw = bam::extent_map::fiemap(p, fd, false);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
      const auto delalloc = std::count_if(raw.begin(), raw.end(),
                                          [](const bam::raw_extent& x) { return x.flags & FIEMAP_EXTENT_DELALLOC; });
      bam::extent_map_options o;
      o.sync = false;
      const auto e = error_of([&] { (void)bam::extent_map::of_file(p, o); });
      const bool refused = e && e->errnum() == EAGAIN;
      const bam::extent_map m = bam::extent_map::of_file(p);
      std::string detail;
      const bool ok = compare_file("unsynced.bin", m, detail);
      report("file-unsynced-delalloc", delalloc > 0 && refused && ok,
             "unsynced.bin: " + std::to_string(delalloc) + " delayed-allocation extents before mapping; without sync " +
                 (e ? errno_name(e->errnum()) + " (" + e->what() + ")" : std::string("mapped")) +
                 "; mapped with sync: " + detail);
    });
  }

  void files() {
    plain_file("big.bin", "file-big-contiguous", [&](const bam::extent_map& m, std::string& d) {
      const bool ok = m.runs() == 1 && m.file_size() > 2 * c->max_transfer_bytes();
      d += "; " + std::to_string(m.file_size() / c->max_transfer_bytes()) + "x the transfer limit in " +
           std::to_string(m.runs()) + " run";
      return ok;
    });
    plain_file("small.bin", "file-small", {});
    plain_file("empty.bin", "file-empty", [](const bam::extent_map& m, std::string&) { return m.runs() == 0; });
    for (const char* f : {"frag-a.bin", "frag-b.bin"})
      plain_file(f, std::string("file-fragmented-") + (f[5] == 'a' ? "a" : "b"),
                 [](const bam::extent_map& m, std::string& d) {
                   d += m.runs() > 1 ? "; fragmented" : "; NOT fragmented (one run)";
                   return m.runs() > 1;
                 });
    plain_file("synced.bin", "file-synced", {});
  }

  //! The partition's file system read by bam through controller B (NVMe
  //! commands, no kernel): the files the host put in (on the disk before the
  //! mount; later writes may still sit in the kernel's journal) map to the
  //! runs FIEMAP gives, and read back as read() does.
  void file_system_through_bam() {
#if defined(BAM_HAVE_LIBEXT2FS)
    guard("fs-read-through-bam", [&] {
      const std::uint64_t start = bam::extent_map::of_file(path("small.bin")).device().partition_start;
      const bam::fs_image fs(bam::fs_medium_of(*c, nsid), start);
      bool ok = true;
      std::string detail = "partition at byte " + std::to_string(start);
      for (const std::string name : {"big.bin", "small.bin"}) {
        const bam::extent_map kernel = bam::extent_map::of_file(path(name));
        const bam::extent_map own = fs.map("/" + name);
        const auto k = kernel.extents(), o = own.extents();
        bool same = k.size() == o.size() && !k.empty();
        for (std::size_t i = 0; same && i < k.size(); ++i)
          same = k[i].file_offset == o[i].file_offset && k[i].disk_offset == o[i].disk_offset &&
                 k[i].length == o[i].length;
        std::string bytes;
        const bool equal = same && compare_file(name, own, bytes);
        ok = ok && same && equal;
        detail += "; " + name + ": " + std::to_string(o.size()) + " run(s), " +
                  (same ? "as FIEMAP's" : "NOT as FIEMAP's (" + std::to_string(k.size()) + ")") +
                  (equal  ? ", bytes equal to read()"
                   : same ? ", " + bytes
                          : "");
      }
      report("fs-read-through-bam", ok, detail);
    });
#else
    info("fs-read-through-bam", "not built: this program was built without libext2fs");
#endif
  }

  void sparse() {
    const std::string p = path("sparse.bin");
    guard("sparse-refused-without-holes", [&] {
      const auto e = error_of([&] { (void)bam::extent_map::of_file(p); });
      const std::string msg = e ? e->what() : "mapped";
      report("sparse-refused-without-holes", e && e->errnum() == EINVAL && msg.find("hole") != std::string::npos,
             errno_name(e ? e->errnum() : 0) + ": " + msg);
    });
    guard("sparse-with-holes-allowed", [&] { sparse_allowed(p); });
  }

  void sparse_allowed(const std::string& p) {
    bam::extent_map_options o;
    o.allow_holes = true;
    const bam::extent_map m = bam::extent_map::of_file(p, o);
    std::string detail;
    bool ok = m.has_holes() && compare_file("sparse.bin", m, detail);
    std::uint64_t hole_bytes = 0;
    bool zero_ok = true;
    if (ok) {
      const std::vector<unsigned char> got = read_bam(m, 0, m.file_size());
      for (const bam::file_extent& x : m.extents()) {
        if (x.disk_offset != bam::extent_hole) continue;
        const std::uint64_t end = std::min(x.file_offset + x.length, m.file_size());
        hole_bytes += end - x.file_offset;
        zero_ok = zero_ok &&
                  std::all_of(got.begin() + static_cast<std::ptrdiff_t>(x.file_offset),
                              got.begin() + static_cast<std::ptrdiff_t>(end), [](unsigned char b) { return b == 0; });
      }
      ok = zero_ok && hole_bytes > 0;
    }
    report("sparse-with-holes-allowed", ok,
           "sparse.bin: " + detail + "; " + std::to_string(hole_bytes) + " hole bytes read as zeroes" +
               (m.has_holes() ? "" : "; the map has no hole"));
  }

  void changed() {
    const std::string p = path("change.bin");
    guard("appended-after-map-estale", [&] {
      write_file(p, random_bytes(200 * 1024 + 11, 7), O_CREAT | O_TRUNC);
      const bam::extent_map m = bam::extent_map::of_file(p);
      // Ten bytes appended through the file system after mapping.
      write_file(p, random_bytes(10, 8), O_APPEND);
      std::vector<unsigned char> buf(4096);
      const auto e = error_of([&] { bam::read_mapped(*c, nsid, m, 0, buf.data(), buf.size()); });
      const auto e2 = error_of([&] { m.check_unchanged(); });
      const bam::extent_map again = bam::extent_map::of_file(p);
      std::string detail;
      const bool reread = compare_file("change.bin", again, detail);
      report("appended-after-map-estale", e && e->errnum() == ESTALE && e2 && e2->errnum() == ESTALE && reread,
             "read_mapped: " + errno_name(e ? e->errnum() : 0) + " (" + (e ? e->what() : "no error") +
                 "); check_unchanged: " + errno_name(e2 ? e2->errnum() : 0) + "; mapped again: " + detail);
    });
    guard("overwritten-after-map-estale", [&] {
      const bam::extent_map m = bam::extent_map::of_file(p);
      // Past the coarse clock's tick, so the new modification time differs.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      write_file(p, random_bytes(100, 9), 0, 4096); // same size, new bytes
      const auto e = error_of([&] { m.check_unchanged(); });
      std::vector<unsigned char> buf(8192);
      const auto e2 = error_of([&] { bam::read_mapped(*c, nsid, m, 0, buf.data(), buf.size()); });
      report("overwritten-after-map-estale", e && e->errnum() == ESTALE && e2 && e2->errnum() == ESTALE,
             "check_unchanged: " + errno_name(e ? e->errnum() : 0) + " (" + (e ? e->what() : "no error") +
                 "); read_mapped: " + errno_name(e2 ? e2->errnum() : 0));
    });
    guard("read-past-end-refused", [&] {
      const bam::extent_map m = bam::extent_map::of_file(p);
      std::vector<unsigned char> buf(2);
      const auto e = error_of([&] { bam::read_mapped(*c, nsid, m, m.file_size() - 1, buf.data(), 2); });
      report("read-past-end-refused", e && e->errnum() == EINVAL,
             errno_name(e ? e->errnum() : 0) + ": " + (e ? e->what() : "read"));
    });
  }
};

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DEVICE DIR   e.g. %s /dev/bam-nvme0 /mnt\n", argv[0], argv[0]);
    return 2;
  }
  tester t;
  t.dev = argv[1];
  t.dir = argv[2];
  const std::vector<std::pair<std::string, std::function<void()>>> steps = {
      {"open-controller-b", [&] { t.open_controller(); }},
      {"same-namespace", [&] { t.identity(); }},
      {"unsynced", [&] { t.unsynced(); }},
      {"files", [&] { t.files(); }},
      {"fs-read-through-bam", [&] { t.file_system_through_bam(); }},
      {"sparse", [&] { t.sparse(); }},
      {"changed", [&] { t.changed(); }},
  };
  for (const auto& [name, fn] : steps) {
    try {
      fn();
    } catch (const std::exception& e) {
      report(name, false, std::string("exception: ") + e.what());
      if (!t.c || t.nsid == 0) break; // nothing below can run
    }
  }
  return failures;
}
