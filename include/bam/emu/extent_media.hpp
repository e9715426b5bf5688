// SPDX-License-Identifier: MIT
//! A file as a namespace, read from the raw disk under it: byte `x` of the
//! namespace is byte `x` of the file, found on the disk through the file's
//! extent map (bam/file/extent_map.hpp), holes (when the map allows them) read as
//! zeroes, and so does the namespace past the file's end (up to a multiple
//! of 64 KiB). Read-only: writes are answered Namespace is Write Protected.
//!
//! The software controller over this media (device string
//! `emu:extents=/data/features.bin`) serves the file to host and GPU clients
//! alike while the file system stays in charge of the layout. The file is
//! watched: its size, modification time and inode are compared at most every
//! `check_interval_ns` (100 ms by default), and once they differ from the map
//! every read fails (ESTALE, an Unrecovered Read Error at the controller)
//! and `bam::warn` says why, instead of returning stale data.
#pragma once

#include <bam/emu/media.hpp>
#include <bam/file/extent_map.hpp>

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bam::emu {

namespace detail {

class extent_media final : public media {
public:
  extent_media(extent_map map, std::shared_ptr<media> disk, std::uint64_t check_interval_ns)
      : map_(std::move(map)), disk_(std::move(disk)), ref_(map_.ref()), interval_ns_(check_interval_ns) {
    // Past the file's end: zeroes, up to a multiple of 64 KiB (as read-only file media).
    size_ = align_up(ref_.blocks() << ref_.lba_shift, file_namespace_alignment);
    if (size_ == 0) {
      error_context c;
      c.errnum = EINVAL;
      throw error("media over " + map_.path() + ": the file is empty", c);
    }
  }

  std::uint64_t size() const override { return size_; }
  std::string describe() const override {
    return "file " + map_.path() + " through its " + std::to_string(map_.runs()) + " run(s) on " + disk_->describe() +
           ", read-only";
  }
  const extent_map& map() const { return map_; }

  int read(std::uint64_t offset, std::span<const iovec> segs) override {
    const std::uint64_t len = total_bytes(segs);
    if (offset > size_ || len > size_ - offset) return EINVAL;
    if (int err = check_fresh()) return err;
    const std::uint64_t lbs = std::uint64_t{1} << ref_.lba_shift;
    std::vector<iovec> piece;
    std::size_t seg = 0;    // segment holding the next byte
    std::uint64_t into = 0; // bytes of it already filled
    for (std::uint64_t pos = offset; pos < offset + len;) {
      const std::uint64_t block = pos / lbs;
      extent_map_ref::where w = ref_.find(block);
      if (w.blocks == 0) w = {extent_hole, (size_ - block * lbs + lbs - 1) / lbs}; // past the file: zeroes
      const std::uint64_t n = std::min((block + w.blocks) * lbs, offset + len) - pos;
      // The segments' bytes [pos, pos + n), as iovecs.
      piece.clear();
      for (std::uint64_t left = n; left > 0;) {
        const std::uint64_t take = std::min<std::uint64_t>(segs[seg].iov_len - into, left);
        piece.push_back({static_cast<unsigned char*>(segs[seg].iov_base) + into, take});
        left -= take;
        into += take;
        if (into == segs[seg].iov_len) {
          ++seg;
          into = 0;
        }
      }
      if (w.lba == extent_hole) {
        for (const iovec& v : piece)
          std::memset(v.iov_base, 0, v.iov_len);
      } else if (int err = disk_->read(w.lba * lbs + (pos - block * lbs), piece)) {
        return err;
      }
      pos += n;
    }
    return 0;
  }
  int write(std::uint64_t, std::span<const iovec>) override { return EROFS; }
  int flush() override { return 0; }
  int write_zeroes(std::uint64_t, std::uint64_t) override { return EROFS; }
  int deallocate(std::uint64_t, std::uint64_t) override { return EROFS; }

private:
  //! ESTALE once the file is no longer the one mapped (checked at most every interval).
  int check_fresh() {
    if (stale_.load(std::memory_order_relaxed)) return ESTALE;
    const extent_map::file_identity& id = map_.identity();
    if (id.ino == 0) return 0; // a map made without a file: nothing to watch
    const std::uint64_t now = bam::detail::now_ns();
    std::uint64_t last = last_check_ns_.load(std::memory_order_relaxed);
    if (now - last < interval_ns_ || !last_check_ns_.compare_exchange_strong(last, now)) return 0;
    struct stat st {};
    const bool same = ::stat(map_.path().c_str(), &st) == 0 && st.st_dev == id.dev && st.st_ino == id.ino &&
                      static_cast<std::uint64_t>(st.st_size) == id.size && st.st_mtim.tv_sec == id.mtime_sec &&
                      st.st_mtim.tv_nsec == id.mtime_nsec;
    if (same) return 0;
    if (!stale_.exchange(true))
      bam::warn(map_.path() + " changed after it was mapped (size, modification time or inode): reads of it " +
                "fail from now on; open it again");
    return ESTALE;
  }

  extent_map map_;
  std::shared_ptr<media> disk_;
  extent_map_ref ref_;
  std::uint64_t size_ = 0;
  std::uint64_t interval_ns_;
  std::atomic<std::uint64_t> last_check_ns_{0};
  std::atomic<bool> stale_{false};
};

} // namespace detail

//! The file `map` describes, read through its extents from the raw disk
//! (opened read-only, O_DIRECT). Throws bam::error if the disk cannot be
//! opened here (permissions: reading a raw disk takes root or the disk group).
inline std::shared_ptr<media> make_extent_media(extent_map map, std::uint64_t check_interval_ns = 100'000'000) {
  auto disk = make_block_media(map.device().disk_node, 0, /*direct=*/true, /*read_only=*/true);
  return std::make_shared<detail::extent_media>(std::move(map), std::move(disk), check_interval_ns);
}

} // namespace bam::emu
