// SPDX-License-Identifier: MIT
//! Implementation of bam/host/dataset.hpp: the chunk pipeline, checksums (xxHash,
//! header-only), the resume state file and the throttle.
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace bam {
namespace detail {

//! First line of a load state file; a new layout gets a new number.
inline constexpr const char* dataset_state_magic = "bam-load-state 1";
//! Largest chunk accepted: what a few slots of pinned memory should cost.
inline constexpr std::uint64_t max_chunk_bytes = 256ull << 20;
//! Default ceilings of the pipeline.
inline constexpr std::uint32_t default_max_queues = 8;
inline constexpr std::uint32_t default_max_in_flight = 16;

[[noreturn]] inline void dataset_fail(const std::string& what, int errnum = EINVAL, std::string who = {}) {
  error_context c;
  c.errnum = errnum;
  c.controller = std::move(who);
  throw error(what, c);
}

inline std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

//! Streaming XXH3-128 in the canonical (big-endian) hex form xxhsum prints.
class xxh128_stream {
public:
  xxh128_stream() : st_(XXH3_createState()) {
    if (st_ == nullptr || XXH3_128bits_reset(st_) != XXH_OK) dataset_fail("xxHash state", ENOMEM);
  }
  ~xxh128_stream() { XXH3_freeState(st_); }
  xxh128_stream(const xxh128_stream&) = delete;
  xxh128_stream& operator=(const xxh128_stream&) = delete;
  void update(const void* p, std::size_t n) { (void)XXH3_128bits_update(st_, p, n); }
  std::string hex() const {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st_));
    std::string s = "xxh128:";
    for (unsigned char byte : c.digest) {
      static const char digits[] = "0123456789abcdef";
      s += digits[byte >> 4];
      s += digits[byte & 15];
    }
    return s;
  }

private:
  XXH3_state_t* st_;
};

inline std::uint64_t chunk_hash(const void* p, std::size_t n) { return XXH3_64bits(p, n); }

//! What a transfer of `bytes` at `o.offset` looks like on namespace `o.nsid`.
struct transfer_plan {
  std::uint32_t lba_size = 0;
  std::uint64_t first_lba = 0;
  std::uint64_t bytes = 0;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t chunks = 0;
  std::uint32_t queues = 0;
  std::uint32_t window = 0;

  std::uint64_t chunk_offset(std::uint64_t i) const { return i * chunk_bytes; }
  std::uint64_t chunk_len(std::uint64_t i) const { return std::min(chunk_bytes, bytes - i * chunk_bytes); }
  std::uint32_t chunk_blocks(std::uint64_t i) const {
    return static_cast<std::uint32_t>((chunk_len(i) + lba_size - 1) / lba_size);
  }
  std::uint64_t chunk_lba(std::uint64_t i) const { return first_lba + chunk_offset(i) / lba_size; }
};

inline transfer_plan plan_transfer(controller& c, std::uint64_t bytes, const dataset_options& o) {
  const namespace_info& ns = c.ns(o.nsid);
  transfer_plan p;
  p.lba_size = ns.lba_size;
  p.bytes = bytes;
  p.chunk_bytes = o.chunk_bytes;
  // Mistakes in what was asked for: no errno text, which would say only
  // "Invalid argument".
  auto fail = [&](const std::string& why) {
    error_context ctx;
    ctx.controller = c.name();
    throw error::invalid_input(why, EINVAL, ctx);
  };
  if (o.offset % ns.lba_size != 0)
    fail("offset " + std::to_string(o.offset) + " is not a multiple of the LBA size (" + std::to_string(ns.lba_size) +
         " bytes) of namespace " + std::to_string(o.nsid) + " (e.g. " +
         std::to_string(o.offset / ns.lba_size * ns.lba_size) + " or " +
         std::to_string((o.offset / ns.lba_size + 1) * ns.lba_size) + ")");
  if (o.chunk_bytes == 0 || o.chunk_bytes % ns.lba_size != 0 || o.chunk_bytes > max_chunk_bytes)
    fail("chunk size " + std::to_string(o.chunk_bytes) + " must be a nonzero multiple of the LBA size (" +
         std::to_string(ns.lba_size) + ") up to " + std::to_string(max_chunk_bytes >> 20) + " MiB");
  const std::uint64_t capacity = ns.blocks * ns.lba_size;
  const std::uint64_t span = (bytes + ns.lba_size - 1) / ns.lba_size * ns.lba_size;
  if (o.offset > capacity || span > capacity - o.offset)
    fail(std::to_string(bytes) + " bytes at offset " + std::to_string(o.offset) + " do not fit namespace " +
         std::to_string(o.nsid) + " of " + std::to_string(capacity) + " bytes");
  p.first_lba = o.offset / ns.lba_size;
  p.chunks = (bytes + p.chunk_bytes - 1) / p.chunk_bytes;
  const std::uint32_t have = c.io_queue_count();
  p.queues = std::max<std::uint32_t>(1, std::min(o.queues != 0 ? o.queues : default_max_queues, have));
  p.window = o.in_flight != 0 ? o.in_flight : std::min(2 * p.queues, default_max_in_flight);
  return p;
}

//! Sleeps so that no more than `rate` bytes per second are started.
struct throttle {
  std::uint64_t rate = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void admit(std::uint64_t bytes_before) const {
    if (rate == 0) return;
    const auto due = start + std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(bytes_before) *
                                                                                1e9 / static_cast<double>(rate)));
    std::this_thread::sleep_until(due);
  }
};

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

//! The resume state of one load: a header naming the source and the target,
//! then "done INDEX HASH" for every chunk known to be on the device.
class load_state {
public:
  load_state(std::string path, std::map<std::string, std::string> header)
      : path_(std::move(path)), header_(std::move(header)) {}
  ~load_state() {
    if (fd_ >= 0) ::close(fd_);
  }
  load_state(const load_state&) = delete;
  load_state& operator=(const load_state&) = delete;

  const std::string& path() const { return path_; }

  //! Chunks recorded by an earlier run with the same header. Throws if the
  //! file describes another load; returns nothing if there is no file.
  std::map<std::uint64_t, std::uint64_t> read_done() const {
    std::map<std::uint64_t, std::uint64_t> done;
    // POSIX reads and from_chars: no iostreams (see error::format).
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return done;
      dataset_fail("opening the load state file '" + path_ + "'", errno);
    }
    std::string text;
    {
      struct closer {
        int fd;
        ~closer() { ::close(fd); }
      } guard{fd};
      char buf[1 << 16];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) dataset_fail("reading the load state file '" + path_ + "'", errno);
        if (n == 0) break;
        text.append(buf, static_cast<std::size_t>(n));
      }
    }
    std::size_t pos = 0;
    auto next_line = [&](std::string& line) {
      if (pos >= text.size()) return false;
      const std::size_t end = text.find('\n', pos);
      if (end == std::string::npos) { // a torn last line
        line = text.substr(pos);
        pos = text.size();
        return true;
      }
      line = text.substr(pos, end - pos);
      pos = end + 1;
      return true;
    };
    std::string line;
    if (!next_line(line) || line != dataset_state_magic)
      dataset_fail("'" + path_ + "' is not a bam load state file: remove it or pass another state path");
    std::map<std::string, std::string> seen;
    while (next_line(line)) {
      const auto sp = line.find(' ');
      if (sp == std::string::npos) continue; // a torn last line
      const std::string key = line.substr(0, sp), value = line.substr(sp + 1);
      if (key == "done") {
        // "INDEX HASH": a decimal chunk index and 16 hex digits.
        std::uint64_t index = 0, hash = 0;
        const char* b = value.data();
        const char* e = b + value.size();
        const auto r1 = std::from_chars(b, e, index);
        if (r1.ec != std::errc{} || r1.ptr == e || *r1.ptr != ' ') continue;
        const char* h = r1.ptr + 1;
        const auto r2 = std::from_chars(h, e, hash, 16);
        if (r2.ec == std::errc{} && r2.ptr == e && e - h == 16) done[index] = hash;
      } else {
        seen[key] = value;
      }
    }
    for (const auto& [k, v] : header_) {
      auto it = seen.find(k);
      if (it == seen.end() || it->second != v)
        dataset_fail("state file '" + path_ + "' belongs to another load (" + k + " was '" +
                     (it == seen.end() ? std::string("missing") : it->second) + "', now '" + v +
                     "'): remove it, or start over (resume off)");
    }
    return done;
  }

  //! Start writing: keep the recorded chunks (`keep`) or start a new file.
  void open(const std::map<std::uint64_t, std::uint64_t>& keep) {
    const std::string tmp = path_ + ".tmp";
    std::string text = std::string(dataset_state_magic) + '\n';
    for (const auto& [k, v] : header_)
      text += k + ' ' + v + '\n';
    for (const auto& [i, h] : keep)
      text += "done " + std::to_string(i) + ' ' + hex64(h) + '\n';
    {
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) dataset_fail("cannot write the load state file '" + tmp + "'", errno);
      struct closer {
        int fd;
        ~closer() { ::close(fd); }
      } guard{fd};
      write_all(fd, text, tmp);
    }
    if (::rename(tmp.c_str(), path_.c_str()) != 0) dataset_fail("renaming '" + tmp + "' to '" + path_ + "'", errno);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd_ < 0) dataset_fail("opening the load state file '" + path_ + "'", errno);
  }

  //! Record chunks (already flushed on the device) durably.
  void append(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& chunks) {
    std::string text;
    for (const auto& [i, h] : chunks)
      text += "done " + std::to_string(i) + ' ' + hex64(h) + '\n';
    write_all(fd_, text, path_);
    (void)::fdatasync(fd_);
  }

  void remove() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
  }

private:
  static void write_all(int fd, const std::string& text, const std::string& path) {
    const char* p = text.data();
    std::size_t left = text.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) dataset_fail("writing the load state file '" + path + "'", errno);
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  std::string path_;
  std::map<std::string, std::string> header_;
  int fd_ = -1;
};

//! One chunk's place in the pipeline: its DMA buffer and the job using it.
struct chunk_slot {
  std::unique_ptr<dma_region> buf;
  std::future<void> job;
  std::uint64_t index = 0;
  std::uint64_t hash = 0;
  bool busy = false;
  bool written = false;
};

inline void read_fully(int fd, std::uint64_t offset, void* dst, std::size_t len, const std::string& what) {
  auto* p = static_cast<unsigned char*>(dst);
  while (len > 0) {
    const ssize_t n = ::pread(fd, p, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) dataset_fail("reading " + what, errno);
    if (n == 0) dataset_fail(what + " ended early (did it shrink while being read?)", EIO);
    p += n;
    offset += static_cast<std::uint64_t>(n);
    len -= static_cast<std::size_t>(n);
  }
}

inline void write_fully(int fd, const void* src, std::size_t len, const std::string& what) {
  const auto* p = static_cast<const unsigned char*>(src);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) dataset_fail("writing " + what, errno);
    p += n;
    len -= static_cast<std::size_t>(n);
  }
}

inline bool cancelled(const dataset_options& o) {
  return o.cancel != nullptr && o.cancel->load(std::memory_order_relaxed);
}

} // namespace detail

inline dataset_result load_dataset(controller& c, const data_source& src, const dataset_options& o) {
  using namespace detail;
  if (!src.read) dataset_fail("load_dataset: the data source has no read function");
  const transfer_plan p = plan_transfer(c, src.size, o);
  const auto t0 = std::chrono::steady_clock::now();
  dataset_result r;
  r.bytes = src.size;
  r.chunks = p.chunks;
  r.state_path = o.state_path.empty() ? src.identity + ".bam-load" : o.state_path;

  const namespace_info& ns = c.ns(o.nsid);
  load_state state(r.state_path, {{"source", src.identity},
                                  {"source-bytes", std::to_string(src.size)},
                                  {"device", c.model() + " / " + c.serial()},
                                  {"namespace", std::to_string(o.nsid) + " of " + std::to_string(ns.blocks) + " x " +
                                                    std::to_string(ns.lba_size) + " B"},
                                  {"offset", std::to_string(o.offset)},
                                  {"chunk-bytes", std::to_string(p.chunk_bytes)}});
  std::map<std::uint64_t, std::uint64_t> recorded;
  if (o.resume) recorded = state.read_done();
  // Records stay until a chunk is written again; a later line for the same
  // chunk replaces an earlier one.
  state.open(recorded);

  std::vector<chunk_slot> slots(std::min<std::uint64_t>(p.window, std::max<std::uint64_t>(p.chunks, 1)));
  for (auto& s : slots)
    s.buf = c.transport().alloc(p.chunk_bytes);
  xxh128_stream total;
  throttle gate{o.max_bytes_per_second, t0};
  std::atomic<std::uint64_t> verified{0};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> unrecorded; // on the device, not yet in the file
  auto last_record = std::chrono::steady_clock::now();
  std::uint64_t done_chunks = 0, done_bytes = 0, started_bytes = 0;
  std::optional<error> first_error;

  auto record = [&](bool force) {
    if (unrecorded.empty()) return;
    if (!force && seconds_since(last_record) * 1000 < static_cast<double>(o.state_interval_ms)) return;
    c.flush(o.nsid); // what the file records must survive a power loss too
    state.append(unrecorded);
    unrecorded.clear();
    last_record = std::chrono::steady_clock::now();
  };
  auto retire = [&](chunk_slot& s) {
    if (!s.busy) return;
    s.busy = false;
    if (s.job.valid()) {
      try {
        s.job.get();
      } catch (const error& e) {
        if (!first_error) first_error = e;
        return;
      } catch (const std::exception& e) {
        if (!first_error) first_error = error(e.what());
        return;
      }
    }
    if (s.written) unrecorded.emplace_back(s.index, s.hash);
    ++done_chunks;
    done_bytes += p.chunk_len(s.index);
    if (o.progress) o.progress({done_bytes, p.bytes, done_chunks, p.chunks, seconds_since(t0)});
  };

  bool interrupted = false;
  std::uint64_t i = 0;
  for (; i < p.chunks && !first_error; ++i) {
    if (cancelled(o)) {
      interrupted = true;
      break;
    }
    chunk_slot& s = slots[i % slots.size()];
    retire(s);
    if (first_error) break;
    const std::uint64_t len = p.chunk_len(i);
    const std::uint32_t nblocks = p.chunk_blocks(i);
    try {
      src.read(p.chunk_offset(i), s.buf->data(), len);
    } catch (const error& e) {
      first_error = e;
      break;
    } catch (const std::exception& e) {
      first_error = error(e.what());
      break;
    }
    std::memset(s.buf->as<unsigned char>() + len, 0, std::size_t{nblocks} * p.lba_size - len);
    total.update(s.buf->data(), len);
    s.index = i;
    s.hash = chunk_hash(s.buf->data(), len);
    s.busy = true;
    auto rec = recorded.find(i);
    if (rec != recorded.end() && rec->second == s.hash) {
      s.written = false; // already on the device and recorded
      ++r.resumed_chunks;
      continue;
    }
    s.written = true;
    gate.admit(started_bytes);
    started_bytes += len;
    const std::uint32_t queue = static_cast<std::uint32_t>(i % p.queues);
    const std::uint64_t lba = p.chunk_lba(i);
    dma_region* buf = s.buf.get();
    const std::uint64_t want = s.hash;
    const bool verify = o.verify;
    s.job = std::async(std::launch::async, [&c, &o, &verified, buf, lba, nblocks, len, queue, want, verify, i] {
      c.write(o.nsid, lba, nblocks, *buf, 0, queue);
      if (!verify) return;
      std::memset(buf->data(), 0, len);
      c.read(o.nsid, lba, nblocks, *buf, 0, queue);
      if (chunk_hash(buf->data(), len) != want) {
        error_context ec;
        ec.controller = c.name();
        ec.lba = lba;
        throw error("verify failed: chunk " + std::to_string(i) + " reads back different from what was written", ec);
      }
      verified.fetch_add(1, std::memory_order_relaxed);
    });
    try {
      record(false);
    } catch (const error& e) {
      if (!first_error) first_error = e;
    }
  }
  for (std::uint64_t k = 0; k < slots.size(); ++k)
    retire(slots[(i + k) % slots.size()]);
  r.verified_chunks = verified.load();
  r.seconds = seconds_since(t0);
  try {
    record(true);
  } catch (const error& e) {
    if (!first_error) first_error = e;
  }
  if (first_error) throw *first_error;
  if (interrupted) {
    error_context ec;
    ec.controller = c.name();
    ec.errnum = EINTR;
    throw error("load interrupted after " + std::to_string(done_chunks) + " of " + std::to_string(p.chunks) +
                    " chunks; they are recorded in '" + r.state_path + "': run it again to resume",
                ec);
  }
  state.remove();
  r.checksum = total.hex();
  return r;
}

inline dataset_result load_dataset(controller& c, const std::string& path, const dataset_options& o) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) detail::dataset_fail("opening '" + path + "'", errno);
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) detail::dataset_fail("stat '" + path + "'", errno);
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    detail::dataset_fail("'" + path + "' is not a regular file or block device");
  std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (S_ISBLK(st.st_mode)) {
    const off_t end = ::lseek(fd, 0, SEEK_END);
    if (end < 0) detail::dataset_fail("size of '" + path + "'", errno);
    size = static_cast<std::uint64_t>(end);
  }
  char* real = ::realpath(path.c_str(), nullptr);
  data_source src;
  src.identity = real != nullptr ? real : path;
  std::free(real);
  src.size = size;
  src.read = [fd, path](std::uint64_t off, void* dst, std::size_t len) {
    detail::read_fully(fd, off, dst, len, "'" + path + "'");
  };
  dataset_options opts = o;
  if (opts.state_path.empty()) opts.state_path = path + ".bam-load";
  return load_dataset(c, src, opts);
}

inline dataset_result dump_dataset(controller& c, const std::string& path, std::uint64_t length,
                                   const dataset_options& o) {
  using namespace detail;
  const transfer_plan p = plan_transfer(c, length, o);
  const auto t0 = std::chrono::steady_clock::now();
  const bool to_stdout = path == "-";
  const int fd = to_stdout ? STDOUT_FILENO : ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) dataset_fail("creating '" + path + "'", errno);
  struct closer {
    int fd;
    bool own;
    ~closer() {
      if (own) ::close(fd);
    }
  } guard{fd, !to_stdout};

  dataset_result r;
  r.bytes = length;
  r.chunks = p.chunks;
  std::vector<chunk_slot> slots(std::min<std::uint64_t>(p.window, std::max<std::uint64_t>(p.chunks, 1)));
  for (auto& s : slots)
    s.buf = c.transport().alloc(p.chunk_bytes);
  xxh128_stream total;
  throttle gate{o.max_bytes_per_second, t0};
  std::optional<error> first_error;
  std::uint64_t done_chunks = 0, done_bytes = 0;
  const std::string what = to_stdout ? std::string("standard output") : "'" + path + "'";

  // In chunk order: wait for the read, then hash and write out.
  auto retire = [&](chunk_slot& s) {
    if (!s.busy) return;
    s.busy = false;
    try {
      s.job.get();
      if (first_error) return;
      const std::uint64_t len = p.chunk_len(s.index);
      total.update(s.buf->data(), len);
      write_fully(fd, s.buf->data(), len, what);
      ++done_chunks;
      done_bytes += len;
      if (o.progress) o.progress({done_bytes, p.bytes, done_chunks, p.chunks, seconds_since(t0)});
    } catch (const error& e) {
      if (!first_error) first_error = e;
    } catch (const std::exception& e) {
      if (!first_error) first_error = error(e.what());
    }
  };
  bool interrupted = false;
  std::uint64_t i = 0;
  for (; i < p.chunks && !first_error; ++i) {
    if (cancelled(o)) {
      interrupted = true;
      break;
    }
    chunk_slot& s = slots[i % slots.size()];
    retire(s);
    if (first_error) break;
    gate.admit(p.chunk_offset(i));
    s.index = i;
    s.busy = true;
    dma_region* buf = s.buf.get();
    const std::uint64_t lba = p.chunk_lba(i);
    const std::uint32_t nblocks = p.chunk_blocks(i);
    const std::uint32_t queue = static_cast<std::uint32_t>(i % p.queues);
    s.job = std::async(std::launch::async,
                       [&c, &o, buf, lba, nblocks, queue] { c.read(o.nsid, lba, nblocks, *buf, 0, queue); });
  }
  // Drain in chunk order (the oldest sits in slot i % size) so the output stays in order.
  for (std::uint64_t k = 0; k < slots.size(); ++k)
    retire(slots[(i + k) % slots.size()]);
  r.seconds = seconds_since(t0);
  if (first_error) throw *first_error;
  if (interrupted) {
    error_context ec;
    ec.controller = c.name();
    ec.errnum = EINTR;
    throw error("dump interrupted after " + std::to_string(done_chunks) + " of " + std::to_string(p.chunks) + " chunks",
                ec);
  }
  r.checksum = total.hex();
  return r;
}

inline std::string file_checksum(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) detail::dataset_fail("opening '" + path + "'", errno);
  detail::xxh128_stream h;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      detail::dataset_fail("reading '" + path + "'", e);
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return h.hex();
}

} // namespace bam
