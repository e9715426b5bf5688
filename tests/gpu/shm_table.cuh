// SPDX-License-Identifier: MIT
// A table of 32-bit words written and checked through bam arrays by the
// shared-media tests (test_shared_media.cu), the process they start
// (shm_peer.cu) and the tests of a cache over several GPUs
// (test_node_cache.cu): the value of element i depends on i and a salt alone.
#pragma once

#include <bam/bam.cuh>

#include <unistd.h>

#include <cstdint>
#include <string>

namespace bam_shm_test {

//! Bytes of every test's shared memory, and of its page caches (smaller:
//! pages are evicted and written back while a table goes through).
inline constexpr std::uint64_t media_bytes = 64ull << 20;
inline constexpr std::size_t cache_bytes = 16ull << 20;
inline constexpr std::size_t page_bytes = 4096;
//! Elements of the table: the whole medium.
inline constexpr std::uint64_t table_words = media_bytes / 4;

__host__ __device__ inline std::uint32_t table_word(std::uint64_t i, std::uint32_t salt) {
  std::uint64_t x = i * 0x9e3779b97f4a7c15ull + salt;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return static_cast<std::uint32_t>(x >> 17) ^ salt;
}

struct tally {
  unsigned long long done;
  unsigned long long bad;
  unsigned long long first_bad;
};

__global__ void write_table(bam::array_ref<std::uint32_t> a, std::uint64_t first, std::uint64_t count,
                            std::uint32_t salt) {
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(first + k, table_word(first + k, salt));
}

__global__ void check_table(bam::array_ref<std::uint32_t> a, std::uint64_t first, std::uint64_t count,
                            std::uint32_t salt, tally* t) {
  unsigned long long done = 0, bad = 0;
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    ++done;
    if (a[first + k] != table_word(first + k, salt)) {
      if (bad++ == 0) atomicMin(&t->first_bad, static_cast<unsigned long long>(first + k));
    }
  }
  atomicAdd(&t->done, done);
  if (bad != 0) atomicAdd(&t->bad, bad);
}

//! A shared-memory name of the test's own, removed at scope exit.
struct scratch_name {
  std::string name;
  scratch_name() {
    static int serial = 0;
    name = "test-gpu-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  }
  ~scratch_name() { bam::emu::remove_shared_memory(name); }
  scratch_name(const scratch_name&) = delete;
  scratch_name& operator=(const scratch_name&) = delete;
};

inline int gpu_count() {
  int n = 0;
  BAM_CUDA_TRY(cudaGetDeviceCount(&n));
  return n;
}

inline constexpr unsigned grid_blocks = 264;
inline constexpr unsigned block_threads = 256;

//! The tally of a check in GPU memory of the current device.
struct device_tally {
  bam::device_buffer<tally> buf{1};
  device_tally() {
    const tally t{0, 0, ~0ull};
    bam::copy_to_device(buf.get(), &t, 1);
  }
  tally get() const {
    tally t{};
    bam::copy_to_host(&t, buf.get(), 1);
    return t;
  }
};

//! Check [first, first + count) of `a` on the current device against `salt`
//! (and the array's recorded failures: `a.check()` throws them).
inline tally check_range(bam::array<std::uint32_t>& a, std::uint64_t first, std::uint64_t count, std::uint32_t salt) {
  device_tally t;
  check_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt, t.buf.get());
  BAM_CUDA_TRY(cudaGetLastError());
  a.check();
  return t.get();
}

} // namespace bam_shm_test
