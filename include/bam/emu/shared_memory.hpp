// SPDX-License-Identifier: MIT
//! Media in POSIX shared memory (`shm=NAME` in device strings): one copy of a
//! namespace's blocks for every process, and every GPU, that opens the name.
//! This part is host-only (no CUDA): the GPU engine pins the mapping for its
//! GPUs (`gpu_engine.cuh`), the CPU engines use it as they use RAM.
//!
//! Lifecycle of `NAME` (the object `/dev/shm/bam-NAME`, mode 0600: the
//! user's own processes share it):
//!  - Opened with a size, it is created zero-filled if it is not there (or
//!    was never sized), and attached to if it is; then its size must be the
//!    size asked for, else `bam::error` names both sizes.
//!  - Opened without a size (`bytes == 0`), it must exist.
//!  - It stays when its users close it, as a file would: its data outlives
//!    the processes (and serves the next run) until it is removed
//!    (`remove_shared_memory`, `bam shm remove NAME`, or `rm /dev/shm/bam-NAME`).
//!  - With `unlink_at_last_close`, the user that closes it last removes the
//!    name. Users are counted by the kernel (each holds a shared OFD lock on
//!    the object while it has it open), so a process killed mid-run counts
//!    as closed; killed last, it leaves the name behind, to attach to or remove.
//!  - A process opens a name once: opening it again there returns the same
//!    mapping (refcounted), whatever GPU or storage asks.
//! Writes of several processes to one block are not ordered by bam: ordering
//! them (a barrier, a lock of the application's) is the application's job.
//!
//! @code
//!   auto m = bam::emu::shared_memory::open("features", {.bytes = 1ull << 30});
//!   std::memcpy(m->data(), table, bytes);                  // every opener sees it
//!   auto media = bam::emu::make_shared_memory_media(m);    // for a software controller
//! @endcode
#pragma once

#include <bam/emu/media.hpp>
#include <bam/error.hpp>
#include <bam/transport/device_string.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bam::emu {

struct shared_memory_options {
  std::uint64_t bytes = 0;           //!< the size to create it with or find it at (0: it must exist)
  bool unlink_at_last_close = false; //!< remove the name when the last user closes it
  mode_t mode = 0600;                //!< permissions of a new object
};

namespace detail {

//! Bytes of the OFD locks on a shared-memory object (beyond its end is fine).
inline constexpr off_t shm_users_byte = 0; //!< shared by every user while it has the object open
inline constexpr off_t shm_setup_byte = 1; //!< exclusive while an opener sizes it or a closer removes it

//! An open-file-description lock (`F_OFD_SETLK[W]`) on one byte: `type` is
//! F_RDLCK, F_WRLCK or F_UNLCK. Returns 0 or an errno.
inline int shm_lock(int fd, off_t byte, short type, bool wait) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = byte;
  l.l_len = 1;
  int rc;
  do {
    rc = ::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &l);
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

//! Does `object` (a shared-memory name) still name the object open on `fd`?
inline bool shm_names_object(const std::string& object, int fd) {
  const int other = ::shm_open(object.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (other < 0) return false;
  struct stat a {
  }, b{};
  const bool same = ::fstat(fd, &a) == 0 && ::fstat(other, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  ::close(other);
  return same;
}

} // namespace detail

//! The POSIX shared-memory object's name for `shm=NAME` ("/bam-NAME").
inline std::string shared_memory_object(const std::string& name) { return "/" + std::string(shm_object_prefix) + name; }

//! A shared-memory object mapped into this process (see the top of this file).
class shared_memory {
public:
  //! Open (create or attach to) `name`; a name already open in this
  //! process returns the same object. Throws `bam::error` for a bad name,
  //! a size that differs from the object's, or a failed system call.
  static std::shared_ptr<shared_memory> open(const std::string& name, const shared_memory_options& o = {}) {
    if (const std::string why = shm_name_problem(name); !why.empty()) throw error::invalid_input(why, EINVAL);
    auto& reg = registry();
    std::lock_guard lock(reg.mutex);
    if (auto it = reg.open.find(name); it != reg.open.end()) {
      if (auto m = it->second.lock()) {
        if (o.bytes != 0 && o.bytes != m->size()) throw size_mismatch(name, o.bytes, m->size());
        if (o.unlink_at_last_close) m->unlink_ = true;
        return m;
      }
    }
    std::shared_ptr<shared_memory> m(new shared_memory(name, o));
    reg.open[name] = m;
    return m;
  }

  ~shared_memory() {
    if (data_ != nullptr) ::munmap(data_, mapped_);
    // A process forked from the opener shares its lock: only the opener removes.
    if (unlink_ && ::getpid() == owner_ && detail::shm_lock(fd_, detail::shm_setup_byte, F_WRLCK, /*wait=*/true) == 0) {
      // No other user holds the users byte: nobody else has it open.
      if (detail::shm_lock(fd_, detail::shm_users_byte, F_WRLCK, /*wait=*/false) == 0 &&
          detail::shm_names_object(object_, fd_))
        ::shm_unlink(object_.c_str());
    }
    ::close(fd_); // drops this process's locks
  }
  shared_memory(const shared_memory&) = delete;
  shared_memory& operator=(const shared_memory&) = delete;

  //! The name given (`shm=NAME`).
  const std::string& name() const { return name_; }
  //! The POSIX object ("/bam-NAME": `/dev/shm/bam-NAME` on Linux).
  const std::string& object() const { return object_; }
  //! The mapping (host memory, shared with every other opener).
  std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return bytes_; }
  //! Bytes mapped: the size rounded up to whole pages (what a registration with CUDA covers).
  std::size_t mapped_bytes() const { return mapped_; }
  //! True when this process created (or first sized) the object: it started zero-filled.
  bool created() const { return created_; }
  //! True when the name will be removed as its last user closes it.
  bool unlinks_at_last_close() const { return unlink_; }

private:
  struct open_names {
    std::mutex mutex;
    std::map<std::string, std::weak_ptr<shared_memory>> open;
  };
  static open_names& registry() {
    static open_names r;
    return r;
  }

  static error size_mismatch(const std::string& name, std::uint64_t asked, std::uint64_t found) {
    error_context c;
    c.errnum = EINVAL;
    return error("shared memory '" + name + "' (" + shared_memory_object(name) + ") is " + std::to_string(found) +
                     " bytes, not the " + std::to_string(asked) + " asked for (give size=" + std::to_string(found) +
                     ", or remove it first: bam shm remove " + name + ")",
                 c);
  }

  shared_memory(const std::string& name, const shared_memory_options& o)
      : name_(name), object_(shared_memory_object(name)), unlink_(o.unlink_at_last_close), owner_(::getpid()) {
    // A closer that removes the name may do so between our shm_open and our
    // lock: then the object we hold is no longer the name's, and we start over.
    for (int attempt = 0;; ++attempt) {
      if (attempt == max_open_attempts)
        throw error("shared memory '" + name + "': its name kept being removed while it was opened");
      fd_ = ::shm_open(object_.c_str(), O_RDWR | O_CLOEXEC | (o.bytes != 0 ? O_CREAT : 0), o.mode);
      if (fd_ < 0) {
        const int err = errno;
        if (err == ENOENT)
          throw error::invalid_input("no shared memory '" + name + "' (" + object_ + "); give size=... to create it",
                                     ENOENT);
        throw_errno("opening shared memory " + object_, err);
      }
      try {
        if (const int err = detail::shm_lock(fd_, detail::shm_setup_byte, F_WRLCK, true))
          throw_errno("locking shared memory " + object_, err);
        if (!detail::shm_names_object(object_, fd_)) {
          ::close(fd_);
          fd_ = -1;
          continue;
        }
        struct stat st {};
        if (::fstat(fd_, &st) != 0) throw_errno("stat of shared memory " + object_);
        bytes_ = static_cast<std::uint64_t>(st.st_size);
        if (bytes_ == 0) {
          // New, or left unsized by a creator that died: ours to size (zero-filled).
          if (o.bytes == 0)
            throw error::invalid_input(
                "shared memory '" + name + "' (" + object_ + ") is empty; give size=... to size it", EINVAL);
          if (::ftruncate(fd_, static_cast<off_t>(o.bytes)) != 0)
            throw_errno("sizing shared memory " + object_ + " to " + std::to_string(o.bytes) + " bytes");
          // Reserved now: a /dev/shm without room fails here, not with
          // SIGBUS on first touch. Left unsized on failure, for the next opener.
          if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(o.bytes)); err != 0) {
            (void)!::ftruncate(fd_, 0);
            throw_errno("reserving " + std::to_string(o.bytes) + " bytes of shared memory " + object_ +
                            " (is there room in /dev/shm? df /dev/shm)",
                        err);
          }
          bytes_ = o.bytes;
          created_ = true;
        } else if (o.bytes != 0 && o.bytes != bytes_) {
          throw size_mismatch(name, o.bytes, bytes_);
        }
        const long page = ::sysconf(_SC_PAGESIZE);
        const std::uint64_t p = page > 0 ? static_cast<std::uint64_t>(page) : 4096;
        mapped_ = static_cast<std::size_t>((bytes_ + p - 1) / p * p);
        void* at = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
        if (at == MAP_FAILED)
          throw_errno("mapping shared memory " + object_ + " (" + std::to_string(bytes_) + " bytes)");
        data_ = static_cast<std::uint8_t*>(at);
        // A user from here on (a closer that removes the name waits for the
        // setup byte, then finds this lock).
        if (const int err = detail::shm_lock(fd_, detail::shm_users_byte, F_RDLCK, true))
          throw_errno("locking shared memory " + object_, err);
        detail::shm_lock(fd_, detail::shm_setup_byte, F_UNLCK, false);
        return;
      } catch (...) {
        if (data_ != nullptr) ::munmap(data_, mapped_);
        data_ = nullptr;
        ::close(fd_);
        throw;
      }
    }
  }

  static constexpr int max_open_attempts = 100;

  std::string name_;
  std::string object_;
  bool unlink_ = false;
  pid_t owner_;
  int fd_ = -1;
  bool created_ = false;
  std::uint64_t bytes_ = 0;
  std::size_t mapped_ = 0;
  std::uint8_t* data_ = nullptr;
};

//! Remove shared memory `name` (`shm=NAME`): processes that have it open keep
//! their mapping; the next opener creates a new one. False when there is none.
inline bool remove_shared_memory(const std::string& name) {
  if (const std::string why = shm_name_problem(name); !why.empty()) throw error::invalid_input(why, EINVAL);
  if (::shm_unlink(shared_memory_object(name).c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw_errno("removing shared memory " + shared_memory_object(name));
}

namespace detail {

//! Media over a shared-memory mapping (the CPU engine's `shm=` media, and
//! host access to the GPU engine's).
class shared_memory_media final : public media {
public:
  explicit shared_memory_media(std::shared_ptr<shared_memory> m) : m_(std::move(m)) {}
  std::uint64_t size() const override { return m_->size(); }
  std::string describe() const override {
    return "shared memory " + m_->object() + " " + std::to_string(size()) + " bytes";
  }
  int read(std::uint64_t offset, std::span<const iovec> segs) override {
    if (!in_range(offset, total_bytes(segs))) return EINVAL;
    scatter(m_->data() + offset, segs);
    return 0;
  }
  int write(std::uint64_t offset, std::span<const iovec> segs) override {
    if (!in_range(offset, total_bytes(segs))) return EINVAL;
    gather(m_->data() + offset, segs);
    return 0;
  }
  int flush() override { return 0; }
  int write_zeroes(std::uint64_t offset, std::uint64_t len) override {
    if (!in_range(offset, len)) return EINVAL;
    std::memset(m_->data() + offset, 0, len);
    return 0;
  }
  std::span<std::uint8_t> mapping() override { return {m_->data(), m_->mapped_bytes()}; }
  const std::shared_ptr<shared_memory>& memory() const { return m_; }

private:
  bool in_range(std::uint64_t offset, std::uint64_t len) const { return offset <= size() && len <= size() - offset; }
  std::shared_ptr<shared_memory> m_;
};

} // namespace detail

//! Media over shared memory `m` (reads and writes go to the mapping every
//! opener sees).
inline std::shared_ptr<media> make_shared_memory_media(std::shared_ptr<shared_memory> m) {
  return std::make_shared<detail::shared_memory_media>(std::move(m));
}

//! The shared memory of controller `index` of a `shm=NAME` spec: NAME, or
//! NAME.0, NAME.1, ... with several controllers (`ssds=N`).
inline std::shared_ptr<shared_memory> open_shared_memory(const device_spec& spec, std::uint32_t index) {
  const std::string name = spec.ssds == 1 ? spec.shm_name : spec.shm_name + "." + std::to_string(index);
  return shared_memory::open(name, {.bytes = spec.bytes, .unlink_at_last_close = spec.shm_unlink});
}

} // namespace bam::emu
