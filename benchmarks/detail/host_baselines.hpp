// SPDX-License-Identifier: MIT
// Host-side baselines of the block benchmark: POSIX pread from a thread pool
// into pinned memory plus cudaMemcpy to the GPU (the usual data-loader path),
// and KvikIO (compat mode where GPUDirect Storage is absent), on the same file,
// same sizes and offsets; both verify the data.
#pragma once

#include "pattern.hpp"

#include <bam/cuda.cuh>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace bench {

struct host_result {
  bool ran = false;
  std::string why_not; //!< when it did not run
  double ops_per_s = 0, gb_per_s = 0, seconds = 0;
  std::uint64_t ops = 0, bad = 0;
};

inline std::uint64_t host_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Make sure `path` holds `bytes` of controller 0's pattern (written once, reused).
inline std::string prepare_file(const std::string& path, std::uint64_t bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) == bytes) return "";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return "cannot create " + path + ": " + std::strerror(errno);
  std::vector<std::uint32_t> buf((8u << 20) / 4);
  for (std::uint64_t off = 0; off < bytes; off += buf.size() * 4) {
    const std::uint64_t n = std::min<std::uint64_t>(buf.size() * 4, bytes - off);
    for (std::uint64_t k = 0; k < n / 4; ++k)
      buf[k] = pattern_word(0, off + 4 * k);
    if (::pwrite(fd, buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      ::close(fd);
      return "writing " + path + " failed";
    }
  }
  ::fsync(fd);
  ::close(fd);
  return "";
}

//! `threads` host threads each read `ops` random `io` blocks of the file
//! (O_DIRECT) into pinned memory and copy each batch to the GPU.
inline host_result pread_baseline(const std::string& path, std::uint64_t file_bytes, std::uint32_t io, unsigned threads,
                                  std::uint64_t ops_total) {
  host_result r;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    r.why_not = "cannot open " + path + " with O_DIRECT: " + std::strerror(errno);
    return r;
  }
  constexpr unsigned batch = 32;
  const std::uint64_t units = file_bytes / io;
  std::atomic<std::uint64_t> bad{0}, done{0};
  std::atomic<bool> failed{false};
  bam::device_buffer<std::uint8_t> dev(static_cast<std::size_t>(threads) * batch * io);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        failed = true;
        return;
      }
      void* pinned = nullptr;
      if (cudaHostAlloc(&pinned, batch * io, cudaHostAllocDefault) != cudaSuccess) {
        failed = true;
        return;
      }
      auto* p = static_cast<std::uint8_t*>(pinned);
      const std::uint64_t mine = ops_total / threads;
      for (std::uint64_t i = 0; i < mine; i += batch) {
        const unsigned n = static_cast<unsigned>(std::min<std::uint64_t>(batch, mine - i));
        for (unsigned k = 0; k < n; ++k) {
          const std::uint64_t unit = host_mix(t * 0x100000001b3ull + i + k) % units;
          if (::pread(fd, p + k * io, io, static_cast<off_t>(unit * io)) != static_cast<ssize_t>(io)) failed = true;
          bad += reinterpret_cast<std::uint32_t*>(p + k * io)[0] != pattern_word(0, unit * io);
        }
        cudaMemcpyAsync(dev.get() + static_cast<std::size_t>(t) * batch * io, p, std::size_t{n} * io,
                        cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
        done += n;
      }
      cudaFreeHost(pinned);
      cudaStreamDestroy(s);
    });
  for (auto& th : pool)
    th.join();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  if (failed) {
    r.why_not = "a read or copy failed";
    return r;
  }
  r.ran = true;
  r.ops = done;
  r.bad = bad;
  r.ops_per_s = done / r.seconds;
  r.gb_per_s = r.ops_per_s * io / 1e9;
  return r;
}

//! KvikIO's FileHandle::pread into GPU memory, `inflight` reads at a time
//! on a pool of `threads` (as many as the pread baseline has), with
//! O_DIRECT like every other path here (kvikio_baseline.cpp; a stub saying
//! why when built without KvikIO).
host_result kvikio_baseline(const std::string& path, std::uint64_t file_bytes, std::uint32_t io, unsigned threads,
                            unsigned inflight, std::uint64_t ops_total);

} // namespace bench
