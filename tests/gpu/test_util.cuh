// SPDX-License-Identifier: MIT
// Helpers of the GPU tests: media filled on the host with a pattern derived
// from (controller, LBA, word) alone, and the expected value of an element
// recomputed from the striping rule, independently of the runtime's code.
// Counters live in GPU memory; the host asserts on them.
#pragma once

#include <bam/bam.cuh>

#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bam_test {

__host__ __device__ inline std::uint32_t pattern(std::uint32_t ctrl, std::uint64_t lba, std::uint32_t word) {
  std::uint64_t x = (static_cast<std::uint64_t>(ctrl) << 56) ^ (lba << 12) ^ word;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

//! Fill one controller's namespace (`blocks` of `lba` bytes) with its pattern.
template <class Write>
void fill_pattern_with(Write&& write, std::uint32_t c, std::uint32_t lba, std::uint64_t blocks) {
  const std::uint64_t chunk_blocks = (8u << 20) / lba;
  std::vector<std::uint32_t> buf(chunk_blocks * lba / 4);
  for (std::uint64_t b0 = 0; b0 < blocks; b0 += chunk_blocks) {
    const std::uint64_t nb = std::min(chunk_blocks, blocks - b0);
    for (std::uint64_t b = 0; b < nb; ++b)
      for (std::uint32_t w = 0; w < lba / 4; ++w)
        buf[b * (lba / 4) + w] = pattern(c, b0 + b, w);
    write(b0 * lba, buf.data(), nb * lba);
  }
}

//! Fill every controller's namespace with the pattern.
inline void fill_pattern(const bam::storage& s) {
  for (std::uint32_t c = 0; c < s.controller_count(); ++c)
    fill_pattern_with([&](std::uint64_t off, const void* p, std::size_t n) { bam::emu::write_media(s, c, off, p, n); },
                      c, s.lba_size(), s.blocks_per_controller());
}
//! Fill the media of a software controller built by hand (controller index `c`).
inline void fill_pattern(bam::emu::emulated_controller& e, std::uint32_t c = 0) {
  auto& m = e.namespace_media(1);
  const std::uint32_t lba = e.config().namespaces.at(0).lba_size;
  fill_pattern_with(
      [&](std::uint64_t off, const void* p, std::size_t n) {
        if (m.write(off, p, n) != 0) throw bam::error("filling the media failed");
      },
      c, lba, e.config().namespaces.at(0).blocks);
}

//! Where element i of an array lives, by the documented striping rule (page
//! p on controller p % nctrl at start_lba + (p / nctrl) * blocks per page),
//! and the pattern word it holds there. `elem` is the element size in bytes.
struct layout {
  std::uint64_t start_lba;
  std::uint32_t page_size;
  std::uint32_t lba_size;
  std::uint32_t nctrl;
  std::uint32_t elem = 4;
  //! Pattern word `w` (4 bytes) of element i.
  __host__ __device__ std::uint32_t word(std::uint64_t i, std::uint32_t w) const {
    const std::uint64_t per_page = page_size / elem;
    const std::uint64_t p = i / per_page;
    const std::uint64_t byte = (i % per_page) * elem + 4ull * w;
    const std::uint32_t c = static_cast<std::uint32_t>(p % nctrl);
    const std::uint64_t lba = start_lba + (p / nctrl) * (page_size / lba_size) + byte / lba_size;
    return pattern(c, lba, static_cast<std::uint32_t>((byte % lba_size) / 4));
  }
  __host__ __device__ std::uint32_t expected(std::uint64_t i) const { return word(i, 0); }
};

__host__ __device__ inline std::uint64_t rnd(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Test counters in GPU memory.
struct counters {
  unsigned long long bad;
  unsigned long long done;
  unsigned long long first_bad_index;
  unsigned long long errors;
};

struct device_counters {
  bam::device_buffer<counters> buf{1};
  device_counters() { reset(); }
  void reset() {
    counters c{0, 0, ~0ull, 0};
    bam::copy_to_device(buf.get(), &c, 1);
  }
  counters get() const {
    counters c{};
    bam::copy_to_host(&c, buf.get(), 1);
    return c;
  }
  counters* operator->() const { return buf.get(); }
  counters* ptr() const { return buf.get(); }
};

//! Launch, then wait for and check the launch (test code may synchronize the device).
#define BAM_TEST_SYNC()                                                                                                \
  do {                                                                                                                 \
    BAM_CUDA_TRY(cudaGetLastError());                                                                                  \
    BAM_CUDA_TRY(cudaDeviceSynchronize());                                                                             \
  } while (0)

//! `a.check()` must throw for a bad index in [lo, hi) with the status out
//! of range (and then be clear again: the record was collected).
template <class Array>
void require_bad_index(Array& a, std::uint64_t lo, std::uint64_t hi) {
  try {
    a.check();
    FAIL("check() did not throw");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.context().index.has_value());
    CHECK(*e.context().index >= lo);
    CHECK(*e.context().index < hi);
    CHECK(std::string(e.what()).find("index " + std::to_string(*e.context().index)) != std::string::npos);
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == bam::nvme::status_out_of_range);
  }
  REQUIRE_NOTHROW(a.check());
}

} // namespace bam_test
