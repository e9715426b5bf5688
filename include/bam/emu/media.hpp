// SPDX-License-Identifier: MIT
//! Backing media of the software NVMe controller: where a namespace's blocks
//! live. RAM (anonymous memory, untouched pages cost nothing), a regular file,
//! or a block device. Files and block devices are opened with O_DIRECT and
//! driven through io_uring when the build found liburing (`BAM_HAVE_LIBURING`);
//! without it, or where O_DIRECT is refused (tmpfs), they fall back to
//! buffered pread/pwrite.
//!
//! Every operation returns 0 or an errno value; the controller turns errors
//! into NVMe media status codes (Unrecovered Read Error, Write Fault).
//! All media are safe to use from many threads at once. As on a real SSD, the
//! data of concurrent overlapping writes is not ordered.
//!
//! @code
//!   auto m = bam::emu::make_file_media("/tmp/disk.img", 64 << 20, /*create=*/true);
//!   std::vector<char> buf(4096);
//!   iovec seg{buf.data(), buf.size()};
//!   if (int err = m->read(8192, {&seg, 1})) std::printf("read: %s\n", std::strerror(err));
//! @endcode
#pragma once

#include <bam/error.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(BAM_HAVE_LIBURING)
#include <liburing.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

namespace bam::emu {

//! Storage behind a namespace. Offsets and lengths are in bytes.
class media {
public:
  virtual ~media() = default;

  //! Capacity in bytes.
  virtual std::uint64_t size() const = 0;
  //! What it is, for messages ("ram 64 MiB", "file /tmp/x (io_uring, O_DIRECT)").
  virtual std::string describe() const = 0;

  //! Read `sum(segs[i].iov_len)` bytes at `offset` into the segments, in order.
  virtual int read(std::uint64_t offset, std::span<const iovec> segs) = 0;
  //! Write the segments, in order, at `offset`.
  virtual int write(std::uint64_t offset, std::span<const iovec> segs) = 0;
  //! Make completed writes durable (fdatasync).
  virtual int flush() = 0;
  //! Set `[offset, offset + len)` to zeroes.
  virtual int write_zeroes(std::uint64_t offset, std::uint64_t len) = 0;
  //! Drop `[offset, offset + len)`: it reads back as zeroes afterwards.
  virtual int deallocate(std::uint64_t offset, std::uint64_t len) { return write_zeroes(offset, len); }

  //! The bytes themselves, when the media is memory this process maps (RAM,
  //! shared memory; byte 0 first, the mapping's whole length): engines may
  //! pin it for the GPU and read it in place. Empty for files and devices.
  virtual std::span<std::uint8_t> mapping() { return {}; }
  //! Whether pinning `mapping()` allocates memory its untouched pages do
  //! not use yet (anonymous RAM; shared memory is already allocated).
  virtual bool sparse() const { return false; }
  //! From now on the mapping's pages stay where they are (they are pinned
  //! for a GPU): freed ranges are cleared, never handed back to the kernel.
  virtual void keep_pages() {}

  //! Single-buffer conveniences.
  int read(std::uint64_t offset, void* dst, std::size_t len) {
    const iovec seg{dst, len};
    return read(offset, std::span<const iovec>(&seg, 1));
  }
  int write(std::uint64_t offset, const void* src, std::size_t len) {
    const iovec seg{const_cast<void*>(src), len};
    return write(offset, std::span<const iovec>(&seg, 1));
  }
};

namespace detail {

//! Size of a memory page for madvise and of the O_DIRECT alignment used for files.
inline constexpr std::size_t media_page_size = 4096;
//! A read-only file served as a namespace reads as zeroes past its end up to
//! a multiple of this, so that cache pages of any size (up to 64 KiB) fit.
inline constexpr std::uint64_t file_namespace_alignment = 64 * 1024;
//! Largest piece of zeroes written at once when a file system cannot zero a range itself.
inline constexpr std::size_t zero_chunk_bytes = 1u << 20;
//! Submission queue entries per io_uring ring (each ring serves one caller at a time).
inline constexpr unsigned uring_entries = 4;

inline std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }
inline std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

inline std::size_t total_bytes(std::span<const iovec> segs) {
  std::size_t n = 0;
  for (const auto& s : segs)
    n += s.iov_len;
  return n;
}

//! A per-thread aligned scratch buffer of at least `bytes` (O_DIRECT bounce buffer).
inline unsigned char* bounce_buffer(std::size_t bytes, std::size_t align) {
  struct holder {
    void* p = nullptr;
    std::size_t cap = 0;
    ~holder() { std::free(p); }
  };
  thread_local holder h;
  if (h.cap < bytes) {
    std::free(h.p);
    h.p = nullptr;
    h.cap = 0;
    const std::size_t cap = align_up(bytes, std::max<std::size_t>(align, media_page_size));
    h.p = std::aligned_alloc(std::max<std::size_t>(align, media_page_size), cap);
    if (h.p == nullptr) return nullptr;
    h.cap = cap;
  }
  return static_cast<unsigned char*>(h.p);
}

//! Copy between a contiguous buffer and a segment list.
inline void scatter(const unsigned char* src, std::span<const iovec> segs) {
  for (const auto& s : segs) {
    std::memcpy(s.iov_base, src, s.iov_len);
    src += s.iov_len;
  }
}
inline void gather(unsigned char* dst, std::span<const iovec> segs) {
  for (const auto& s : segs) {
    std::memcpy(dst, s.iov_base, s.iov_len);
    dst += s.iov_len;
  }
}

//! Positional I/O of a whole buffer with pread/pwrite: loops over short
//! transfers; a read past the end of the file fills zeroes.
inline int posix_io(int fd, bool is_write, std::uint64_t offset, void* buf, std::size_t len) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len > 0) {
    const ssize_t n =
        is_write ? ::pwrite(fd, p, len, static_cast<off_t>(offset)) : ::pread(fd, p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) {
      if (is_write) return EIO;
      std::memset(p, 0, len); // end of file
      return 0;
    }
    p += n;
    len -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

#if defined(BAM_HAVE_LIBURING)
//! io_uring rings for synchronous I/O from many threads: a caller takes a
//! ring, submits one request, waits for it and gives the ring back, so no two
//! threads ever share a ring. Rings are created on demand.
class uring_pool {
public:
  uring_pool() = default;
  uring_pool(const uring_pool&) = delete;
  uring_pool& operator=(const uring_pool&) = delete;
  ~uring_pool() {
    for (auto& r : free_)
      io_uring_queue_exit(r.get());
  }

  //! A ring, or nullptr if io_uring cannot be used here (then never again).
  std::unique_ptr<io_uring> take() {
    {
      std::lock_guard lock(mutex_);
      if (broken_) return nullptr;
      if (!free_.empty()) {
        auto r = std::move(free_.back());
        free_.pop_back();
        return r;
      }
    }
    auto r = std::make_unique<io_uring>();
    if (io_uring_queue_init(uring_entries, r.get(), 0) < 0) {
      std::lock_guard lock(mutex_);
      broken_ = true;
      return nullptr;
    }
    return r;
  }
  void give(std::unique_ptr<io_uring> r) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(r));
  }
  bool usable() const {
    std::lock_guard lock(mutex_);
    return !broken_;
  }

private:
  mutable std::mutex mutex_;
  bool broken_ = false;
  std::vector<std::unique_ptr<io_uring>> free_;
};

//! One positional transfer through `ring`, looping over short transfers.
//! Returns 0, an errno, or -1 if io_uring itself failed (use another path).
inline int uring_io(io_uring* ring, int fd, bool is_write, std::uint64_t offset, void* buf, std::size_t len) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len > 0) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) return -1;
    const unsigned n = static_cast<unsigned>(std::min<std::size_t>(len, 1u << 30));
    if (is_write) {
      io_uring_prep_write(sqe, fd, p, n, offset);
    } else {
      io_uring_prep_read(sqe, fd, p, n, offset);
    }
    if (io_uring_submit(ring) < 0) return -1;
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(ring, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return -1;
    const int res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    if (res == -EINTR || res == -EAGAIN) continue;
    if (res < 0) return -res;
    if (res == 0) {
      if (is_write) return EIO;
      std::memset(p, 0, len);
      return 0;
    }
    p += res;
    len -= static_cast<std::size_t>(res);
    offset += static_cast<std::uint64_t>(res);
  }
  return 0;
}
#endif

//! Anonymous memory; never-written pages read as zeroes and cost nothing.
class ram_media final : public media {
public:
  explicit ram_media(std::uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) {
      error_context c;
      c.errnum = EINVAL;
      throw error("RAM media needs a non-zero size", c);
    }
    mapped_ = align_up(bytes, media_page_size);
    void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw_errno("mapping " + std::to_string(mapped_) + " bytes of RAM media");
    base_ = static_cast<unsigned char*>(p);
  }
  ~ram_media() override { ::munmap(base_, mapped_); }

  std::uint64_t size() const override { return bytes_; }
  std::string describe() const override { return "ram " + std::to_string(bytes_) + " bytes"; }

  int read(std::uint64_t offset, std::span<const iovec> segs) override {
    if (!in_range(offset, total_bytes(segs))) return EINVAL;
    scatter(base_ + offset, segs);
    return 0;
  }
  int write(std::uint64_t offset, std::span<const iovec> segs) override {
    if (!in_range(offset, total_bytes(segs))) return EINVAL;
    gather(base_ + offset, segs);
    return 0;
  }
  int flush() override { return 0; }
  int write_zeroes(std::uint64_t offset, std::uint64_t len) override {
    if (!in_range(offset, len)) return EINVAL;
    std::memset(base_ + offset, 0, len);
    return 0;
  }
  //! Whole pages go back to the kernel (and read as zeroes); the edges are
  //! cleared. Pages pinned for a GPU are cleared instead: a page handed back
  //! would leave the GPU reading the old one.
  int deallocate(std::uint64_t offset, std::uint64_t len) override {
    if (!in_range(offset, len)) return EINVAL;
    if (keep_pages_.load(std::memory_order_acquire)) return write_zeroes(offset, len);
    const std::uint64_t first = align_up(offset, media_page_size);
    const std::uint64_t last = align_down(offset + len, media_page_size);
    if (last <= first) return write_zeroes(offset, len);
    std::memset(base_ + offset, 0, first - offset);
    std::memset(base_ + last, 0, offset + len - last);
    if (::madvise(base_ + first, last - first, MADV_DONTNEED) != 0) std::memset(base_ + first, 0, last - first);
    return 0;
  }

  std::span<std::uint8_t> mapping() override { return {base_, mapped_}; }
  bool sparse() const override { return true; }
  void keep_pages() override { keep_pages_.store(true, std::memory_order_release); }

private:
  bool in_range(std::uint64_t offset, std::uint64_t len) const { return offset <= bytes_ && len <= bytes_ - offset; }
  std::uint64_t bytes_;
  std::uint64_t mapped_;
  unsigned char* base_ = nullptr;
  std::atomic<bool> keep_pages_{false};
};

//! A regular file or a block device. O_DIRECT through io_uring when possible.
//! Read-only media is opened O_RDONLY and refuses every write with EROFS
//! (the controller answers Namespace is Write Protected).
class fd_media final : public media {
public:
  fd_media(const std::string& path, std::uint64_t bytes, bool create, bool block_device, bool direct,
           bool read_only = false)
      : path_(path), block_(block_device), read_only_(read_only) {
    if (read_only) create = false;
    const int flags = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (create ? O_CREAT : 0);
    buffered_fd_ = ::open(path.c_str(), flags, 0644);
    if (buffered_fd_ < 0) {
      const int err = errno;
      const std::filesystem::path dir = std::filesystem::path(path).parent_path();
      std::error_code ec;
      if (err == ENOENT && !dir.empty() && !std::filesystem::is_directory(dir, ec))
        throw_errno("opening media " + path + ": there is no directory " + dir.string() + " (make it first)", err);
      throw_errno("opening media " + path, err);
    }
    try {
      struct stat st {};
      if (::fstat(buffered_fd_, &st) != 0) throw_errno("stat of media " + path);
      if (block_) {
        if (!S_ISBLK(st.st_mode)) {
          error_context c;
          c.errnum = ENOTBLK;
          throw error("media " + path + " is not a block device", c);
        }
        std::uint64_t dev_bytes = 0;
        if (::ioctl(buffered_fd_, BLKGETSIZE64, &dev_bytes) != 0)
          throw_errno("reading the size of block device " + path);
        int lbs = 0;
        if (::ioctl(buffered_fd_, BLKSSZGET, &lbs) == 0 && lbs > 0) align_ = static_cast<std::size_t>(lbs);
        bytes_ = bytes != 0 ? std::min(bytes, dev_bytes) : dev_bytes;
      } else {
        if (!S_ISREG(st.st_mode)) {
          error_context c;
          c.errnum = EINVAL;
          throw error("media " + path + " is not a regular file", c);
        }
        bytes_ = bytes != 0 ? bytes : static_cast<std::uint64_t>(st.st_size);
        // Sized so that every O_DIRECT block of the media lies inside the file.
        const std::uint64_t want = align_up(bytes_, align_);
        // A read-only file is never extended: past its end it reads as
        // zeroes, up to a multiple of 64 KiB (any cache page size fits).
        if (read_only) bytes_ = align_up(bytes_, file_namespace_alignment);
        if (!read_only && static_cast<std::uint64_t>(st.st_size) < want &&
            ::ftruncate(buffered_fd_, static_cast<off_t>(want)) != 0)
          throw_errno("extending media file " + path + " to " + std::to_string(want) + " bytes");
      }
      if (bytes_ == 0) {
        error_context c;
        c.errnum = EINVAL;
        throw error("media " + path + " is empty", c);
      }
      // O_DIRECT is refused by some file systems (tmpfs before Linux 6.6): then stay buffered.
      if (direct) direct_fd_ = ::open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_DIRECT);
    } catch (...) {
      ::close(buffered_fd_);
      throw;
    }
  }
  ~fd_media() override {
    if (direct_fd_ >= 0) ::close(direct_fd_);
    ::close(buffered_fd_);
  }

  std::uint64_t size() const override { return bytes_; }
  std::string describe() const override {
    std::string how;
#if defined(BAM_HAVE_LIBURING)
    how = uring_.usable() ? "io_uring" : "pread/pwrite";
#else
    how = "pread/pwrite";
#endif
    how += direct_usable() ? ", O_DIRECT" : ", buffered";
    return (block_ ? "block device " : "file ") + path_ + " (" + how + (read_only_ ? ", read-only" : "") + ")";
  }
  //! True while I/O goes through O_DIRECT.
  bool direct_usable() const { return direct_fd_ >= 0 && !direct_refused_.load(std::memory_order_relaxed); }

  int read(std::uint64_t offset, std::span<const iovec> segs) override {
    const std::size_t len = total_bytes(segs);
    if (!in_range(offset, len)) return EINVAL;
    if (len == 0) return 0;
    if (direct_usable()) {
      const std::uint64_t lo = align_down(offset, align_);
      const std::uint64_t hi = align_up(offset + len, align_);
      unsigned char* bounce = bounce_buffer(hi - lo, align_);
      if (bounce == nullptr) return ENOMEM;
      const int err = direct_io(false, lo, bounce, hi - lo);
      if (err == 0) {
        scatter(bounce + (offset - lo), segs);
        return 0;
      }
      if (err != EINVAL) return err;
      direct_refused_.store(true, std::memory_order_relaxed);
    }
    for (const auto& s : segs) {
      if (int err = posix_io(buffered_fd_, false, offset, s.iov_base, s.iov_len)) return err;
      offset += s.iov_len;
    }
    return 0;
  }

  int write(std::uint64_t offset, std::span<const iovec> segs) override {
    const std::size_t len = total_bytes(segs);
    if (read_only_) return EROFS;
    if (!in_range(offset, len)) return EINVAL;
    if (len == 0) return 0;
    if (direct_usable()) {
      const std::uint64_t lo = align_down(offset, align_);
      const std::uint64_t hi = align_up(offset + len, align_);
      unsigned char* bounce = bounce_buffer(hi - lo, align_);
      if (bounce == nullptr) return ENOMEM;
      int err;
      if (lo == offset && hi == offset + len) {
        // Whole blocks: no neighbour can be clobbered.
        std::shared_lock lock(rmw_mutex_);
        gather(bounce, segs);
        err = direct_io(true, lo, bounce, len);
      } else {
        // Read-modify-write of the edge blocks; exclusive so that no other
        // write to those blocks lands between our read and our write.
        std::unique_lock lock(rmw_mutex_);
        err = direct_io(false, lo, bounce, align_);
        if (err == 0 && hi - lo > align_) err = direct_io(false, hi - align_, bounce + (hi - lo - align_), align_);
        if (err == 0) {
          gather(bounce + (offset - lo), segs);
          err = direct_io(true, lo, bounce, hi - lo);
        }
      }
      if (err == 0 || err != EINVAL) return err;
      direct_refused_.store(true, std::memory_order_relaxed);
    }
    std::shared_lock lock(rmw_mutex_);
    for (const auto& s : segs) {
      if (int err = posix_io(buffered_fd_, true, offset, s.iov_base, s.iov_len)) return err;
      offset += s.iov_len;
    }
    return 0;
  }

  int flush() override { return read_only_ || ::fdatasync(buffered_fd_) == 0 ? 0 : errno; }

  int write_zeroes(std::uint64_t offset, std::uint64_t len) override {
    if (read_only_) return EROFS;
    if (!in_range(offset, len)) return EINVAL;
    if (len == 0) return 0;
    std::unique_lock lock(rmw_mutex_);
    if (block_) {
      std::uint64_t range[2] = {offset, len};
      if (offset % align_ == 0 && len % align_ == 0 && ::ioctl(buffered_fd_, BLKZEROOUT, range) == 0) return 0;
    } else if (::fallocate(buffered_fd_, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                           static_cast<off_t>(len)) == 0) {
      return 0;
    }
    return write_zero_bytes(offset, len);
  }

  int deallocate(std::uint64_t offset, std::uint64_t len) override {
    if (read_only_) return EROFS;
    if (!in_range(offset, len)) return EINVAL;
    if (len == 0) return 0;
    if (!block_) {
      std::unique_lock lock(rmw_mutex_);
      if (::fallocate(buffered_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(len)) == 0)
        return 0;
    }
    // A discarded block-device range need not read back as zeroes: zero it.
    return write_zeroes(offset, len);
  }

private:
  bool in_range(std::uint64_t offset, std::uint64_t len) const { return offset <= bytes_ && len <= bytes_ - offset; }

  //! An aligned transfer on the O_DIRECT descriptor.
  int direct_io(bool is_write, std::uint64_t offset, void* buf, std::size_t len) {
#if defined(BAM_HAVE_LIBURING)
    if (auto ring = uring_.take()) {
      const int err = uring_io(ring.get(), direct_fd_, is_write, offset, buf, len);
      if (err >= 0) {
        uring_.give(std::move(ring));
        return err;
      }
      io_uring_queue_exit(ring.get()); // a broken ring is not reused
    }
#endif
    return posix_io(direct_fd_, is_write, offset, buf, len);
  }

  //! Caller holds `rmw_mutex_` exclusively.
  int write_zero_bytes(std::uint64_t offset, std::uint64_t len) {
    static const std::vector<unsigned char> zeroes(zero_chunk_bytes, 0);
    while (len > 0) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(len, zeroes.size()));
      if (int err = posix_io(buffered_fd_, true, offset, const_cast<unsigned char*>(zeroes.data()), n)) return err;
      offset += n;
      len -= n;
    }
    // Buffered writes above; the O_DIRECT descriptor must see them.
    return ::fdatasync(buffered_fd_) == 0 ? 0 : errno;
  }

  std::string path_;
  bool block_;
  bool read_only_;
  std::uint64_t bytes_ = 0;
  std::size_t align_ = media_page_size;
  int buffered_fd_ = -1;
  int direct_fd_ = -1;
  std::atomic<bool> direct_refused_{false};
  //! Shared by whole-block writes, exclusive for read-modify-write and zeroing.
  std::shared_mutex rmw_mutex_;
#if defined(BAM_HAVE_LIBURING)
  uring_pool uring_;
#endif
};

} // namespace detail

//! RAM media of `bytes` bytes, zero-filled.
inline std::shared_ptr<media> make_ram_media(std::uint64_t bytes) { return std::make_shared<detail::ram_media>(bytes); }

//! A regular file of `bytes` bytes (0: the file's current size). With
//! `create`, the file is created if missing; it is extended to `bytes`
//! (rounded up to 4 KiB). `direct = false` skips O_DIRECT (page-cache I/O).
//! `read_only`: opened O_RDONLY, never created or extended, writes refused.
inline std::shared_ptr<media> make_file_media(const std::string& path, std::uint64_t bytes, bool create = true,
                                              bool direct = true, bool read_only = false) {
  return std::make_shared<detail::fd_media>(path, bytes, create, false, direct, read_only);
}

//! A block device, all of it (or its first `bytes` bytes). Its data is
//! overwritten by writes, unless `read_only`.
inline std::shared_ptr<media> make_block_media(const std::string& path, std::uint64_t bytes = 0, bool direct = true,
                                               bool read_only = false) {
  return std::make_shared<detail::fd_media>(path, bytes, false, true, direct, read_only);
}

} // namespace bam::emu
