// SPDX-License-Identifier: MIT
//! What the processes of one job on one host (one per GPU, e.g. under
//! torchrun) need to share a page cache: handing each other files (the
//! shareable handles of their GPU memory) and agreeing on a number per
//! medium.
//!
//!  - `exchange_files`: every process serves its files on a Unix socket in
//!    Linux's abstract namespace named after the group and its rank, and
//!    fetches every other rank's (SCM_RIGHTS). Only processes of the same
//!    user are served. The ranks also compare a description of what they
//!    build, so that a mismatch fails at once, naming both sides.
//!  - `group_directory`: a table in shared memory (a memfd, handed over by
//!    rank 0) giving each medium a number the same in every process.
//!    Entries are claimed in order and never given back, so two processes
//!    that name one medium at once get one number.
#pragma once

#include <bam/error.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace bam::detail {

//! Who this process is in its group.
struct group_spec {
  std::string name; //!< the same in every process of the group, unique on the host
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{120000}; //!< how long to wait for the others
};

namespace group_io {

//! A file descriptor closed when it goes.
struct owned_fd {
  int fd = -1;
  owned_fd() = default;
  explicit owned_fd(int f) : fd(f) {}
  owned_fd(owned_fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  owned_fd& operator=(owned_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  ~owned_fd() { reset(); }
  void reset() noexcept {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

using clock = std::chrono::steady_clock;

inline std::string who(const group_spec& g, int rank) {
  return "rank " + std::to_string(rank) + " of page cache group '" + g.name + "'";
}

//! The socket address of `rank`'s server (abstract namespace: nothing on disk).
inline sockaddr_un address(const group_spec& g, int rank, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "bam-page-cache/" + g.name + "/" + std::to_string(rank);
  if (name.size() + 1 > sizeof a.sun_path)
    throw error::invalid_input("page cache group name '" + g.name + "' is too long (at most " +
                               std::to_string(sizeof a.sun_path - 1 - (name.size() - g.name.size())) + " characters)");
  std::memcpy(a.sun_path + 1, name.data(), name.size()); // sun_path[0] = 0: abstract
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

//! Wait until `fd` is ready for `events`, or throw when `deadline` passes.
inline void wait_for(int fd, short events, clock::time_point deadline, const std::string& what) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) throw error("timed out " + what);
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r > 0) return;
    if (r < 0 && errno != EINTR) {
      error_context c;
      c.errnum = errno;
      throw error("poll " + what, c);
    }
  }
}

inline void send_all(int fd, const void* p, std::size_t n, clock::time_point deadline, const std::string& what) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    wait_for(fd, POLLOUT, deadline, what);
    const ssize_t r = ::send(fd, b, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      error_context c;
      c.errnum = errno;
      throw error(what, c);
    }
    b += r;
    n -= static_cast<std::size_t>(r);
  }
}

inline void recv_all(int fd, void* p, std::size_t n, clock::time_point deadline, const std::string& what) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    wait_for(fd, POLLIN, deadline, what);
    const ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw error(what + ": the other process closed the connection (it failed or exited)");
    if (r < 0) {
      error_context c;
      c.errnum = errno;
      throw error(what, c);
    }
    b += r;
    n -= static_cast<std::size_t>(r);
  }
}

inline void send_string(int fd, const std::string& s, clock::time_point deadline, const std::string& what) {
  const std::uint32_t n = static_cast<std::uint32_t>(s.size());
  send_all(fd, &n, sizeof n, deadline, what);
  send_all(fd, s.data(), s.size(), deadline, what);
}

inline std::string recv_string(int fd, clock::time_point deadline, const std::string& what) {
  std::uint32_t n = 0;
  recv_all(fd, &n, sizeof n, deadline, what);
  if (n > (1u << 20))
    throw error(what + ": a message of " + std::to_string(n) + " bytes (not a bam page cache group?)");
  std::string s(n, '\0');
  recv_all(fd, s.data(), n, deadline, what);
  return s;
}

//! Files per message (SCM_RIGHTS takes at most 253).
inline constexpr std::size_t files_per_message = 32;

inline void send_files(int sock, const int* fds, std::uint32_t n, clock::time_point deadline, const std::string& what) {
  char space[CMSG_SPACE(sizeof(int) * files_per_message)]{};
  iovec iov{&n, sizeof n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = space;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  for (;;) {
    wait_for(sock, POLLOUT, deadline, what);
    const ssize_t r = ::sendmsg(sock, &m, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r != static_cast<ssize_t>(sizeof n)) {
      error_context e;
      e.errnum = r < 0 ? errno : EIO;
      throw error(what, e);
    }
    return;
  }
}

//! Receive one message of files; returns them (owned).
inline std::vector<owned_fd> recv_files(int sock, clock::time_point deadline, const std::string& what) {
  std::uint32_t n = 0;
  char space[CMSG_SPACE(sizeof(int) * files_per_message)]{};
  iovec iov{&n, sizeof n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = space;
  m.msg_controllen = sizeof space;
  ssize_t r = 0;
  for (;;) {
    wait_for(sock, POLLIN, deadline, what);
    r = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    break;
  }
  std::vector<owned_fd> out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      out.emplace_back(fd);
    }
  }
  if (r == 0) throw error(what + ": the other process closed the connection (it failed or exited)");
  if (r < 0) {
    error_context e;
    e.errnum = errno;
    throw error(what, e);
  }
  if (r != static_cast<ssize_t>(sizeof n) || (m.msg_flags & MSG_CTRUNC) || out.size() != n)
    throw error(what + ": a message of files arrived cut short (the process's limit of open files?)");
  return out;
}

//! The user of the process at the other end of `sock`.
inline uid_t peer_uid(int sock) {
  ucred cr{};
  socklen_t len = sizeof cr;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
    error_context e;
    e.errnum = errno;
    throw error("SO_PEERCRED", e);
  }
  return cr.uid;
}

inline constexpr std::uint64_t hello_magic = 0x62616d2d67727031ull; // "bam-grp1"

} // namespace group_io

//! Hand files between the processes of group `g`: this process offers
//! `count` files, `offer(i)` making the i-th (a new descriptor, closed once
//! sent), and receives every other rank's, `take(rank, i, fd)` owning each
//! (ranks in order, files in the order offered). Every rank must describe
//! what it builds with the same `description` (else both sides fail,
//! naming the difference) and offer the number of files the others expect
//! (`expect(rank)`). Waits at most `g.timeout` for the others.
inline void exchange_files(const group_spec& g, const std::string& description, std::size_t count,
                           const std::function<int(std::size_t)>& offer, const std::function<std::size_t(int)>& expect,
                           const std::function<void(int, std::size_t, int)>& take) {
  using namespace group_io;
  if (g.size < 1 || g.rank < 0 || g.rank >= g.size)
    throw error::invalid_input("page cache group '" + g.name + "': rank " + std::to_string(g.rank) +
                               " is not one of 0.." + std::to_string(g.size - 1));
  if (g.name.empty()) throw error::invalid_input("a page cache group needs a name");
  const auto deadline = clock::now() + g.timeout;
  if (g.size == 1) return;

  owned_fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (listener.fd < 0) {
    error_context e;
    e.errnum = errno;
    throw error("socket for page cache group '" + g.name + "'", e);
  }
  socklen_t alen = 0;
  const sockaddr_un me = address(g, g.rank, alen);
  if (::bind(listener.fd, reinterpret_cast<const sockaddr*>(&me), alen) != 0) {
    error_context e;
    e.errnum = errno;
    if (errno == EADDRINUSE)
      throw error(who(g, g.rank) + " is already taken by another process on this host (two jobs with one group "
                                   "name, or two processes given one rank)",
                  e);
    throw error("bind for " + who(g, g.rank), e);
  }
  if (::listen(listener.fd, g.size) != 0) {
    error_context e;
    e.errnum = errno;
    throw error("listen for " + who(g, g.rank), e);
  }

  // Serve the other ranks, one connection each, while this thread fetches
  // theirs. The first failure is the one reported (the other side's often
  // follows from it: a rank that fails stops serving).
  std::exception_ptr served_error;
  std::atomic<int> first_failure{0}; // 1: serving, 2: fetching
  std::thread server([&] {
    try {
      std::vector<bool> seen(static_cast<std::size_t>(g.size), false);
      for (int done = 0; done < g.size - 1; ++done) {
        try {
          wait_for(listener.fd, POLLIN, deadline, "waiting for the other ranks of page cache group '" + g.name + "'");
        } catch (const error&) {
          std::string missing;
          int k = 0;
          for (int r = 0; r < g.size; ++r)
            if (r != g.rank && !seen[static_cast<std::size_t>(r)]) {
              missing += (missing.empty() ? "" : ", ") + std::to_string(r);
              ++k;
            }
          throw error((k == 1 ? "rank " : "ranks ") + missing + " of page cache group '" + g.name +
                      "' did not appear within " + std::to_string(g.timeout.count()) +
                      " ms (is every rank of the job building the cache, with the same group name?)");
        }
        owned_fd c(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (c.fd < 0) {
          if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) {
            --done;
            continue;
          }
          error_context e;
          e.errnum = errno;
          throw error("accept for " + who(g, g.rank), e);
        }
        if (peer_uid(c.fd) != ::getuid()) { // not ours: served nothing, not counted
          --done;
          continue;
        }
        const std::string what = "serving " + who(g, g.rank);
        std::uint64_t magic = 0;
        std::int32_t from = -1;
        recv_all(c.fd, &magic, sizeof magic, deadline, what);
        if (magic != hello_magic) {
          --done;
          continue;
        }
        recv_all(c.fd, &from, sizeof from, deadline, what);
        const std::string theirs = recv_string(c.fd, deadline, what);
        const bool ok = from >= 0 && from < g.size && from != g.rank && !seen[static_cast<std::size_t>(from)] &&
                        theirs == description;
        const std::uint64_t n = ok ? count : ~0ull;
        send_all(c.fd, &n, sizeof n, deadline, what);
        send_string(c.fd, description, deadline, what);
        if (!ok) {
          if (from < 0 || from >= g.size || from == g.rank || seen[static_cast<std::size_t>(from)])
            throw error(who(g, g.rank) + ": a process connected as rank " + std::to_string(from) +
                        " (two processes given one rank, or a group of another size)");
          throw error(who(g, g.rank) + " builds '" + description + "' but rank " + std::to_string(from) + " builds '" +
                      theirs + "': every rank needs the same page cache configuration");
        }
        seen[static_cast<std::size_t>(from)] = true;
        for (std::size_t i = 0; i < count; i += files_per_message) {
          const std::uint32_t k = static_cast<std::uint32_t>(std::min(files_per_message, count - i));
          std::vector<owned_fd> files;
          std::vector<int> raw;
          for (std::uint32_t j = 0; j < k; ++j) {
            files.emplace_back(offer(i + j));
            raw.push_back(files.back().fd);
          }
          send_files(c.fd, raw.data(), k, deadline, what);
        }
        char ack = 0;
        recv_all(c.fd, &ack, 1, deadline, what + " (waiting for rank " + std::to_string(from) + " to take its files)");
      }
    } catch (...) {
      served_error = std::current_exception();
      int none = 0;
      first_failure.compare_exchange_strong(none, 1);
    }
  });

  std::exception_ptr fetched_error;
  try {
    for (int r = 0; r < g.size; ++r) {
      if (r == g.rank) continue;
      const std::string what = who(g, g.rank) + " fetching the memory of " + who(g, r);
      socklen_t len = 0;
      const sockaddr_un there = address(g, r, len);
      owned_fd s;
      for (;;) { // until rank r listens
        s = owned_fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&there), len) == 0) break;
        if (first_failure.load() == 1) throw error(who(g, g.rank) + " stopped: serving the others failed");
        if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR) {
          error_context e;
          e.errnum = errno;
          throw error(what, e);
        }
        if (clock::now() >= deadline)
          throw error(who(g, r) + " did not appear within " + std::to_string(g.timeout.count()) +
                      " ms (is every rank of the job building the cache, with the same group name?)");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK) != 0) throw error(what + ": fcntl");
      if (peer_uid(s.fd) != ::getuid()) throw error(who(g, r) + " is served by a process of another user: refused");
      const std::int32_t me_rank = g.rank;
      send_all(s.fd, &hello_magic, sizeof hello_magic, deadline, what);
      send_all(s.fd, &me_rank, sizeof me_rank, deadline, what);
      send_string(s.fd, description, deadline, what);
      std::uint64_t n = 0;
      recv_all(s.fd, &n, sizeof n, deadline, what);
      const std::string theirs = recv_string(s.fd, deadline, what);
      if (n == ~0ull)
        throw error(who(g, g.rank) + " builds '" + description + "' but " + who(g, r) + " builds '" + theirs +
                    "': every rank needs the same page cache configuration (or two processes have one rank)");
      if (n != expect(r))
        throw error(who(g, r) + " offers " + std::to_string(n) + " files where " + std::to_string(expect(r)) +
                    " were expected");
      std::size_t got = 0;
      while (got < n) {
        std::vector<owned_fd> files = recv_files(s.fd, deadline, what);
        for (auto& f : files) {
          if (got == n) throw error(what + ": more files than offered");
          const int fd = f.fd;
          f.fd = -1;
          take(r, got++, fd);
        }
      }
      const char ack = 1;
      send_all(s.fd, &ack, 1, deadline, what);
    }
  } catch (...) {
    fetched_error = std::current_exception();
    int none = 0;
    first_failure.compare_exchange_strong(none, 2);
    // Stop serving: the others see this rank's connection close.
    ::shutdown(listener.fd, SHUT_RDWR);
  }
  server.join();
  if (first_failure.load() == 1 && served_error) std::rethrow_exception(served_error);
  if (fetched_error) std::rethrow_exception(fetched_error);
  if (served_error) std::rethrow_exception(served_error);
}

//! A number per medium, the same in every process of a group (see the top
//! of this file). Rank 0 makes it (`create`), the others open its file.
class group_directory {
public:
  static constexpr std::uint32_t entries = 127;
  static constexpr std::size_t name_bytes = 1000;

  //! A new directory in shared memory; `file()` is its descriptor to hand on.
  static group_directory create(const std::string& group) {
    const int fd = ::memfd_create(("bam-page-cache-" + group).substr(0, 200).c_str(), MFD_CLOEXEC);
    if (fd < 0) {
      error_context e;
      e.errnum = errno;
      throw error("memfd_create for page cache group '" + group + "'", e);
    }
    group_io::owned_fd f(fd);
    if (::ftruncate(fd, sizeof(layout)) != 0) {
      error_context e;
      e.errnum = errno;
      throw error("sizing the directory of page cache group '" + group + "'", e);
    }
    return group_directory(std::move(f), group);
  }
  //! The directory in file `fd` (owned from here on).
  static group_directory open(int fd, const std::string& group) {
    return group_directory(group_io::owned_fd(fd), group);
  }

  group_directory() = default;
  group_directory(group_directory&& o) noexcept { *this = std::move(o); }
  group_directory& operator=(group_directory&& o) noexcept {
    if (this != &o) {
      unmap();
      fd_ = std::move(o.fd_);
      map_ = o.map_;
      group_ = std::move(o.group_);
      o.map_ = nullptr;
    }
    return *this;
  }
  ~group_directory() { unmap(); }

  int file() const { return fd_.fd; }
  bool valid() const { return map_ != nullptr; }

  //! The number of `medium`: the one another process gave it, else the next
  //! free one. Waits (at most `timeout`) for an entry another process is
  //! writing.
  std::uint32_t number(const std::string& medium, std::chrono::milliseconds timeout) {
    if (medium.size() >= name_bytes)
      throw error("page cache group '" + group_ + "': a medium name of " + std::to_string(medium.size()) +
                  " characters (at most " + std::to_string(name_bytes - 1) + ")");
    const auto deadline = group_io::clock::now() + timeout;
    for (std::uint32_t i = 0; i < entries; ++i) {
      entry& e = map_->e[i];
      std::atomic_ref<std::uint32_t> state(e.state);
      std::uint32_t s = state.load(std::memory_order_acquire);
      if (s == free_entry && state.compare_exchange_strong(s, writing, std::memory_order_acq_rel)) {
        std::memcpy(e.name, medium.data(), medium.size());
        e.name[medium.size()] = '\0';
        state.store(written, std::memory_order_release);
        return i;
      }
      while ((s = state.load(std::memory_order_acquire)) != written) {
        if (group_io::clock::now() >= deadline)
          throw error("page cache group '" + group_ + "': a process stopped while naming a medium (entry " +
                      std::to_string(i) + ")");
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (medium == e.name) return i;
    }
    throw error("page cache group '" + group_ + "' has named " + std::to_string(entries) +
                " media, as many as it can: use fewer storages over different media");
  }

  //! The number of `medium` when a process has given it one; claims none.
  std::optional<std::uint32_t> find(const std::string& medium) {
    for (std::uint32_t i = 0; i < entries; ++i) {
      entry& e = map_->e[i];
      const std::uint32_t s = std::atomic_ref<std::uint32_t>(e.state).load(std::memory_order_acquire);
      if (s == free_entry) break; // entries are claimed in order
      if (s == written && medium == e.name) return i;
    }
    return std::nullopt;
  }

private:
  static constexpr std::uint32_t free_entry = 0, writing = 1, written = 2;
  struct entry {
    std::uint32_t state;
    char name[name_bytes];
  };
  struct layout {
    entry e[entries];
  };

  group_directory(group_io::owned_fd f, std::string group) : fd_(std::move(f)), group_(std::move(group)) {
    void* p = ::mmap(nullptr, sizeof(layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd_.fd, 0);
    if (p == MAP_FAILED) {
      error_context e;
      e.errnum = errno;
      throw error("mapping the directory of page cache group '" + group_ + "'", e);
    }
    map_ = static_cast<layout*>(p);
  }
  void unmap() noexcept {
    if (map_ != nullptr) ::munmap(map_, sizeof(layout));
    map_ = nullptr;
  }

  group_io::owned_fd fd_;
  layout* map_ = nullptr;
  std::string group_;
};

} // namespace bam::detail
