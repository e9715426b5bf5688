// SPDX-License-Identifier: MIT
//! A file's blocks on its disk, from the file system itself (FIEMAP), so that
//! bam can read the file through raw block commands while the file system
//! stays in charge of the layout.
//!
//! `extent_map::of_file(path)` asks the file system where each piece of the
//! file lives, adds the partition's start (from sysfs) to reach the disk's
//! (the NVMe namespace's) byte offsets, and keeps the result in the disk's
//! logical blocks. It refuses, with a message saying why and what to do, what
//! raw blocks cannot return correctly:
//!   - data still in the page cache without a place on disk (delayed
//!     allocation): it syncs the file first, and refuses if that did not help;
//!   - unwritten (preallocated) extents and holes, unless `allow_holes` (then
//!     they read as zeroes, as through the file system);
//!   - inline, tail-packed, compressed (encoded) or encrypted data;
//!   - pieces not aligned to the disk's logical block size;
//!   - files on no single disk (tmpfs, overlayfs upper layers on another
//!     file system, network file systems, device-mapper, md, btrfs volumes);
//!   - for writing (`for_writing`): also shared (reflinked) extents, whose
//!     blocks other files read too.
//!
//! A map describes the file as it was: `check_unchanged()` fails (ESTALE)
//! once the file's size, modification time or layout differs, so a reader
//! checks it after reading and discards what it read if the file moved.
//!
//! @code
//!   bam::extent_map m = bam::extent_map::of_file("/data/features.bin");
//!   std::printf("%s on %s (namespace %u), %llu runs\n", m.path().c_str(),
//!               m.device().disk_node.c_str(), m.device().nsid, (unsigned long long)m.runs());
//!   auto w = m.ref().find(0);  // disk LBA of the file's first block
//! @endcode
#pragma once

#include <bam/error.hpp>
#include <bam/file/extent_map_ref.hpp>

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bam {

struct extent_map_options {
  bool allow_holes = false; //!< holes and unwritten extents read as zeroes instead of being refused
  bool sync = true;         //!< flush the file's delayed allocations before mapping (FIEMAP_FLAG_SYNC)
  bool for_writing = false; //!< also refuse shared (reflinked) extents and holes: writes go to raw blocks
};

//! The disk a file system lives on, as sysfs describes it.
struct block_device_info {
  std::string disk;                  //!< whole disk, e.g. "nvme0n1"
  std::string partition;             //!< e.g. "nvme0n1p1"; empty when the file system is on the whole disk
  std::string disk_node;             //!< "/dev/" + disk
  std::uint64_t partition_start = 0; //!< bytes from the start of the disk
  std::uint64_t disk_bytes = 0;
  std::uint32_t lba_size = 512;         //!< the disk's logical block size
  std::uint32_t nsid = 0;               //!< NVMe namespace id; 0 if the disk is not an NVMe namespace
  std::string wwid;                     //!< sysfs wwid ("eui.…", "nvme.…"); empty if none
  std::array<std::uint8_t, 16> nguid{}; //!< NVMe NGUID; zero if unknown
  std::array<std::uint8_t, 8> eui64{};  //!< NVMe EUI-64; zero if unknown
};

//! One piece of a file as the file system reports it (FIEMAP's fields).
struct raw_extent {
  std::uint64_t logical = 0;  //!< byte offset in the file
  std::uint64_t physical = 0; //!< byte offset in the file system's block device (partition)
  std::uint64_t length = 0;   //!< bytes
  std::uint32_t flags = 0;    //!< FIEMAP_EXTENT_*
};

//! One run of the map in bytes, for printing and tests.
struct file_extent {
  std::uint64_t file_offset = 0;
  std::uint64_t disk_offset = extent_hole; //!< bytes from the start of the disk, or extent_hole
  std::uint64_t length = 0;
};

namespace detail {

[[noreturn]] inline void extent_refusal(const std::string& path, const std::string& why, int errnum) {
  error_context c;
  c.errnum = errnum;
  throw error("cannot read " + path + " through raw blocks: " + why, c);
}

//! A map's file changed after it was mapped: ESTALE, saying what changed.
[[noreturn]] inline void throw_stale(const std::string& path, const std::string& what) {
  error_context c;
  c.errnum = ESTALE;
  throw error(path + " changed after it was mapped: " + what + "; map it again", c);
}

//! A file opened read-only, closed when it goes out of scope.
struct readonly_fd {
  int fd;
  readonly_fd(const std::string& path, const std::string& why) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) throw_errno("opening " + path + why);
  }
  ~readonly_fd() { ::close(fd); }
  readonly_fd(const readonly_fd&) = delete;
  readonly_fd& operator=(const readonly_fd&) = delete;
};

inline std::string read_sysfs(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string s;
  if (!f || !std::getline(f, s)) return {};
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.pop_back();
  return s;
}

//! Hex digits of `text` (separators ignored) into `out`; false unless exactly out.size() bytes.
template <std::size_t N>
bool parse_hex_id(const std::string& text, std::array<std::uint8_t, N>& out) {
  std::size_t n = 0;
  int half = -1;
  for (char ch : text) {
    int v;
    if (ch >= '0' && ch <= '9')
      v = ch - '0';
    else if (ch >= 'a' && ch <= 'f')
      v = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F')
      v = ch - 'A' + 10;
    else
      continue;
    if (half < 0) {
      half = v;
    } else {
      if (n == N) return false;
      out[n++] = static_cast<std::uint8_t>(half << 4 | v);
      half = -1;
    }
  }
  return n == N && half < 0;
}

inline std::string fiemap_flag_names(std::uint32_t f) {
  static constexpr std::pair<std::uint32_t, const char*> names[] = {{FIEMAP_EXTENT_UNKNOWN, "unknown location"},
                                                                    {FIEMAP_EXTENT_DELALLOC, "delayed allocation"},
                                                                    {FIEMAP_EXTENT_ENCODED, "encoded"},
                                                                    {FIEMAP_EXTENT_DATA_ENCRYPTED, "encrypted"},
                                                                    {FIEMAP_EXTENT_NOT_ALIGNED, "not aligned"},
                                                                    {FIEMAP_EXTENT_DATA_INLINE, "inline"},
                                                                    {FIEMAP_EXTENT_DATA_TAIL, "tail-packed"},
                                                                    {FIEMAP_EXTENT_UNWRITTEN, "unwritten"},
                                                                    {FIEMAP_EXTENT_MERGED, "merged"},
                                                                    {FIEMAP_EXTENT_SHARED, "shared"}};
  std::string s;
  for (const auto& [bit, name] : names)
    if (f & bit) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

} // namespace detail

class extent_map {
public:
  //! Identity of the file at mapping time, compared by check_unchanged().
  struct file_identity {
    std::uint64_t dev = 0, ino = 0, size = 0;
    std::int64_t mtime_sec = 0, mtime_nsec = 0;
    std::uint64_t layout_hash = 0; //!< of the raw extents, flags included
    std::uint64_t raw_extents = 0;
  };

  //! The disk of the file system that holds `path` (refuses files on no single disk).
  static block_device_info device_of(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_errno("stat " + path);
    return device_of(path, st.st_dev);
  }

  //! Maps `path`; see the file's comment for what is refused.
  static extent_map of_file(const std::string& path, const extent_map_options& opts = {}) {
    const detail::readonly_fd file(path, "");
    const int fd = file.fd;
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("stat " + path);
    if (!S_ISREG(st.st_mode)) detail::extent_refusal(path, "not a regular file", EINVAL);
    block_device_info dev = device_of(path, st.st_dev);
    std::vector<raw_extent> raw = fiemap(path, fd, opts.sync);
    if (::fstat(fd, &st) != 0) throw_errno("stat " + path); // after the sync
    extent_map m = from_extents(path, raw, static_cast<std::uint64_t>(st.st_size), dev, opts);
    m.id_.dev = st.st_dev;
    m.id_.ino = st.st_ino;
    m.id_.mtime_sec = st.st_mtim.tv_sec;
    m.id_.mtime_nsec = st.st_mtim.tv_nsec;
    m.opts_ = opts;
    m.mapped_from_file_ = true;
    return m;
  }

  //! A map from extents as FIEMAP reports them (`of_file` uses it; tests and
  //! other sources of layouts may too). Applies every refusal of `of_file`.
  static extent_map from_extents(const std::string& path, std::vector<raw_extent> raw, std::uint64_t file_size,
                                 const block_device_info& dev, const extent_map_options& opts = {}) {
    const std::uint64_t lbs = dev.lba_size;
    if (lbs < 512 || (lbs & (lbs - 1)) != 0)
      detail::extent_refusal(
          path, "the disk's logical block size " + std::to_string(lbs) + " is not a power of two >= 512", EINVAL);
    if (dev.partition_start % lbs != 0)
      detail::extent_refusal(path,
                             "partition " + dev.partition + " starts at byte " + std::to_string(dev.partition_start) +
                                 ", not a multiple of the " + std::to_string(lbs) + "-byte logical block",
                             EINVAL);
    extent_map m;
    m.path_ = path;
    m.dev_ = dev;
    m.opts_ = opts;
    m.id_.size = file_size;
    m.id_.raw_extents = raw.size();
    m.id_.layout_hash = layout_hash(raw);
    m.lba_shift_ = static_cast<std::uint32_t>(__builtin_ctzll(lbs));
    std::sort(raw.begin(), raw.end(), [](const raw_extent& a, const raw_extent& b) { return a.logical < b.logical; });

    const std::uint64_t blocks = (file_size + lbs - 1) / lbs; // blocks the map covers
    auto where = [&](std::uint64_t at) { return " at file offset " + std::to_string(at); };
    std::uint64_t next = 0; // next file block not yet covered
    for (const raw_extent& e : raw) {
      if (e.logical >= blocks * lbs) break; // preallocated past the end of the file: not part of it
      constexpr std::uint32_t unreadable = FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC;
      constexpr std::uint32_t transformed = FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED;
      constexpr std::uint32_t packed = FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DATA_TAIL | FIEMAP_EXTENT_NOT_ALIGNED;
      const std::string flags = " (" + detail::fiemap_flag_names(e.flags) + ")";
      if (e.flags & unreadable)
        detail::extent_refusal(path,
                               "data not yet on the disk" + where(e.logical) + flags +
                                   ": sync the file (fsync, or `sync FILE`) and map it again",
                               EAGAIN);
      if (e.flags & transformed)
        detail::extent_refusal(path,
                               "compressed or encrypted data" + where(e.logical) + flags +
                                   ": raw blocks hold what the file system encoded, not the file",
                               EINVAL);
      if (e.flags & packed)
        detail::extent_refusal(path,
                               "data packed with other metadata" + where(e.logical) + flags +
                                   ": the file system keeps it outside whole blocks",
                               EINVAL);
      if (opts.for_writing && (e.flags & FIEMAP_EXTENT_SHARED))
        detail::extent_refusal(path,
                               "blocks shared with other files (reflink, snapshot)" + where(e.logical) +
                                   ": writing them would change those files too",
                               EINVAL);
      if (e.logical % lbs != 0 || e.physical % lbs != 0 || e.length % lbs != 0 || e.length == 0)
        detail::extent_refusal(path,
                               "a piece of " + std::to_string(e.length) + " bytes at disk offset " +
                                   std::to_string(e.physical) + where(e.logical) + " is not in whole " +
                                   std::to_string(lbs) + "-byte logical blocks",
                               EINVAL);
      const std::uint64_t first = e.logical / lbs;
      std::uint64_t count = std::min(e.length / lbs, blocks - first);
      if (first < next)
        detail::extent_refusal(path, "the file system reported overlapping pieces" + where(e.logical), EINVAL);
      if (first > next) m.add_hole(path, next, first - next, opts);
      if (e.flags & FIEMAP_EXTENT_UNWRITTEN) {
        if (!opts.allow_holes || opts.for_writing)
          detail::extent_refusal(path,
                                 "preallocated, never written blocks" + where(e.logical) +
                                     ": they read as zeroes through the file system but hold old data on "
                                     "the disk (allow holes to read them as zeroes)",
                                 EINVAL);
        m.push(first, count, extent_hole);
      } else {
        const std::uint64_t disk = dev.partition_start + e.physical;
        if (dev.disk_bytes != 0 && (disk > dev.disk_bytes || count * lbs > dev.disk_bytes - disk))
          detail::extent_refusal(path, "a piece" + where(e.logical) + " lies past the end of " + dev.disk, EINVAL);
        m.push(first, count, disk / lbs);
      }
      next = first + count;
    }
    if (next < blocks) m.add_hole(path, next, blocks - next, opts);
    m.start_.push_back(next < blocks ? blocks : next);
    if (m.lba_.empty()) m.start_.clear();
    m.start_.shrink_to_fit();
    m.lba_.shrink_to_fit();
    return m;
  }

  const std::string& path() const { return path_; }
  const block_device_info& device() const { return dev_; }
  std::uint64_t file_size() const { return id_.size; }
  std::uint32_t lba_size() const { return 1u << lba_shift_; }
  std::uint64_t runs() const { return lba_.size(); }
  std::uint64_t raw_extents() const { return id_.raw_extents; }
  bool has_holes() const { return std::find(lba_.begin(), lba_.end(), extent_hole) != lba_.end(); }
  //! Host bytes the map takes.
  std::uint64_t bytes() const { return (start_.size() + lba_.size()) * sizeof(std::uint64_t); }
  const file_identity& identity() const { return id_; }
  const extent_map_options& options() const { return opts_; }

  //! The arrays as a view (host memory; copy both arrays to device memory for a GPU view).
  extent_map_ref ref() const {
    extent_map_ref r;
    r.start = start_.data();
    r.lba = lba_.data();
    r.runs = lba_.size();
    r.file_size = id_.size;
    r.lba_shift = lba_shift_;
    return r;
  }
  const std::vector<std::uint64_t>& run_starts() const { return start_; }
  const std::vector<std::uint64_t>& run_lbas() const { return lba_; }

  //! The largest cache page (a power of two, bytes, at most `limit`) that
  //! never straddles two runs: every page of the file is then one read
  //! command at one LBA (or all hole). A file whose pieces break at 4 KiB
  //! boundaries allows 4 KiB pages; a contiguous one any size.
  std::uint64_t max_page_size(std::uint64_t limit = 1ull << 30) const {
    std::uint64_t p = limit;
    for (std::size_t i = 1; i < lba_.size(); ++i) {
      const std::uint64_t boundary = start_[i] << lba_shift_;
      while (p > lba_size() && boundary % p != 0)
        p >>= 1;
    }
    return std::max<std::uint64_t>(p, lba_size());
  }

  std::vector<file_extent> extents() const {
    std::vector<file_extent> out;
    out.reserve(lba_.size());
    for (std::size_t i = 0; i < lba_.size(); ++i)
      out.push_back({start_[i] << lba_shift_, lba_[i] == extent_hole ? extent_hole : lba_[i] << lba_shift_,
                     (start_[i + 1] - start_[i]) << lba_shift_});
    return out;
  }

  //! What tells whether the file behind a map made by `from_extents` changed
  //! since: it returns what changed, or "" when nothing did.
  using change_check = std::function<std::string()>;
  //! Give a map made by `from_extents` a way to tell whether its file changed
  //! (`check_unchanged` runs it; `fs_image::map` sets one). Copies of the map share it.
  void set_change_check(change_check check) { change_check_ = std::make_shared<change_check>(std::move(check)); }

  //! Throws bam::error (ESTALE) if the file's size, modification time or
  //! layout is not what it was when mapped: data read through the map may
  //! then be stale. A map made by from_extents is checked by its change
  //! check (`set_change_check`), if it has one.
  void check_unchanged() const {
    if (!mapped_from_file_) {
      if (change_check_)
        if (const std::string what = (*change_check_)(); !what.empty()) detail::throw_stale(path_, what);
      return;
    }
    const detail::readonly_fd file(path_, " to check it is unchanged");
    const int fd = file.fd;
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("stat " + path_);
    std::string what;
    if (st.st_dev != id_.dev || st.st_ino != id_.ino)
      what = "it is another file now (replaced or renamed over)";
    else if (static_cast<std::uint64_t>(st.st_size) != id_.size)
      what = "its size went from " + std::to_string(id_.size) + " to " + std::to_string(st.st_size) + " bytes";
    else if (st.st_mtim.tv_sec != id_.mtime_sec || st.st_mtim.tv_nsec != id_.mtime_nsec)
      what = "it was modified";
    else {
      const std::vector<raw_extent> raw = fiemap(path_, fd, false);
      if (raw.size() != id_.raw_extents || layout_hash(raw) != id_.layout_hash)
        what = "its blocks moved (" + std::to_string(id_.raw_extents) + " pieces then, " + std::to_string(raw.size()) +
               " now)";
    }
    if (!what.empty()) detail::throw_stale(path_, what);
  }

  //! The raw extents FIEMAP reports for an open file (all of them, in batches).
  static std::vector<raw_extent> fiemap(const std::string& path, int fd, bool sync) {
    constexpr std::uint32_t batch = 512;
    std::vector<raw_extent> out;
    const std::size_t bytes = sizeof(struct fiemap) + batch * sizeof(struct fiemap_extent);
    std::unique_ptr<void, decltype(&std::free)> mem(std::calloc(1, bytes), &std::free);
    if (!mem) throw_errno("allocating a FIEMAP buffer", ENOMEM);
    auto* fm = static_cast<struct fiemap*>(mem.get());
    std::uint64_t from = 0;
    for (bool first = true;; first = false) {
      std::memset(fm, 0, bytes);
      fm->fm_start = from;
      fm->fm_length = FIEMAP_MAX_OFFSET - from;
      fm->fm_flags = sync && first ? FIEMAP_FLAG_SYNC : 0;
      fm->fm_extent_count = batch;
      if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0) {
        const int e = errno;
        if (e == EOPNOTSUPP || e == ENOTTY)
          detail::extent_refusal(path, "its file system does not report where files lie (no FIEMAP)", e);
        throw_errno("FIEMAP of " + path, e);
      }
      if (fm->fm_mapped_extents == 0) break;
      bool last = false;
      for (std::uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
        const struct fiemap_extent& x = fm->fm_extents[i];
        out.push_back({x.fe_logical, x.fe_physical, x.fe_length, x.fe_flags});
        last = last || (x.fe_flags & FIEMAP_EXTENT_LAST) != 0;
      }
      const struct fiemap_extent& end = fm->fm_extents[fm->fm_mapped_extents - 1];
      if (last || fm->fm_mapped_extents < batch || end.fe_logical + end.fe_length <= from) break;
      from = end.fe_logical + end.fe_length;
    }
    return out;
  }

private:
  void push(std::uint64_t first, std::uint64_t count, std::uint64_t lba) {
    if (count == 0) return;
    if (!lba_.empty()) {
      const std::uint64_t prev_len = first - start_.back();
      const bool both_holes = lba_.back() == extent_hole && lba == extent_hole;
      const bool contiguous = lba_.back() != extent_hole && lba != extent_hole && lba_.back() + prev_len == lba;
      if (both_holes || contiguous) return; // the previous run grows to `first + count` (start of the next)
    }
    start_.push_back(first);
    lba_.push_back(lba);
  }
  void add_hole(const std::string& path, std::uint64_t first, std::uint64_t count, const extent_map_options& opts) {
    if (!opts.allow_holes || opts.for_writing)
      detail::extent_refusal(path,
                             "a hole of " + std::to_string(count << lba_shift_) + " bytes at file offset " +
                                 std::to_string(first << lba_shift_) +
                                 (opts.for_writing ? ": writes need blocks the file system allocated"
                                                   : ": allow holes to read it as zeroes"),
                             EINVAL);
    push(first, count, extent_hole);
  }

public:
  //! A hash of a layout (every field of every piece, the last-piece flag aside).
  static std::uint64_t layout_hash(const std::vector<raw_extent>& raw) {
    std::uint64_t h = 1469598103934665603ull; // FNV-1a over the fields
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 1099511628211ull;
      }
    };
    for (const raw_extent& e : raw) {
      mix(e.logical);
      mix(e.physical);
      mix(e.length);
      mix(e.flags & ~std::uint32_t{FIEMAP_EXTENT_LAST});
    }
    return h;
  }

private:
  static block_device_info device_of(const std::string& path, dev_t st_dev) {
    namespace fs = std::filesystem;
    const unsigned maj = major(st_dev), min = minor(st_dev);
    const std::string devno = std::to_string(maj) + ":" + std::to_string(min);
    if (maj == 0)
      detail::extent_refusal(path,
                             "its file system (device " + devno +
                                 ") is on no block device (tmpfs, overlayfs, a network or multi-disk file system)",
                             ENODEV);
    std::error_code ec;
    const fs::path node = fs::canonical("/sys/dev/block/" + devno, ec);
    if (ec) detail::extent_refusal(path, "sysfs knows no block device " + devno, ENODEV);
    block_device_info d;
    fs::path disk_dir = node;
    if (fs::exists(node / "partition")) {
      d.partition = node.filename().string();
      const std::string start = detail::read_sysfs(node / "start");
      if (start.empty()) detail::extent_refusal(path, "sysfs gives no start for partition " + d.partition, ENODEV);
      d.partition_start = std::strtoull(start.c_str(), nullptr, 10) * 512; // sysfs counts 512-byte sectors
      disk_dir = node.parent_path();
    }
    d.disk = disk_dir.filename().string();
    // dm-* (LVM, dm-crypt) and md arrays map blocks again below the file
    // system. An NVMe multipath disk is one namespace: it is fine.
    if (fs::exists(disk_dir / "dm") || fs::exists(disk_dir / "md"))
      detail::extent_refusal(path, d.disk + " is a virtual device over other disks (device-mapper, md)", ENODEV);
    d.disk_node = "/dev/" + d.disk;
    const std::string lbs = detail::read_sysfs(disk_dir / "queue/logical_block_size");
    if (!lbs.empty()) d.lba_size = static_cast<std::uint32_t>(std::strtoul(lbs.c_str(), nullptr, 10));
    const std::string size = detail::read_sysfs(disk_dir / "size");
    if (!size.empty()) d.disk_bytes = std::strtoull(size.c_str(), nullptr, 10) * 512;
    const std::string nsid = detail::read_sysfs(disk_dir / "nsid");
    if (!nsid.empty()) d.nsid = static_cast<std::uint32_t>(std::strtoul(nsid.c_str(), nullptr, 10));
    d.wwid = detail::read_sysfs(disk_dir / "wwid");
    if (!detail::parse_hex_id(detail::read_sysfs(disk_dir / "nguid"), d.nguid)) d.nguid = {};
    if (!detail::parse_hex_id(detail::read_sysfs(disk_dir / "eui"), d.eui64)) d.eui64 = {};
    return d;
  }

  std::string path_;
  block_device_info dev_;
  extent_map_options opts_;
  file_identity id_;
  bool mapped_from_file_ = false;
  std::shared_ptr<change_check> change_check_; //!< a map made by from_extents: how to tell its file changed
  std::uint32_t lba_shift_ = 9;
  std::vector<std::uint64_t> start_; // runs + 1
  std::vector<std::uint64_t> lba_;   // runs
};

} // namespace bam
