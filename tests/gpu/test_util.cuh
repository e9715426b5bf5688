// SPDX-License-Identifier: MIT
// Helpers of the GPU tests: media filled on the host with a pattern derived
// from (controller, LBA, word) alone, and the expected value of an element
// recomputed from the striping rule, independently of the runtime's code.
#pragma once

#include <bam/array.cuh>
#include <bam/cache.cuh>
#include <bam/gpu/device.cuh>

#include <cstdint>
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

//! Fill every controller's namespace with the pattern.
inline void fill_pattern(bam::gpu::device& dev) {
  const auto& s = dev.storage();
  const std::uint32_t lba = s.lba_size();
  const std::uint64_t blocks = s.blocks_per_controller();
  const std::uint64_t chunk_blocks = (8u << 20) / lba;
  std::vector<std::uint32_t> buf(chunk_blocks * lba / 4);
  for (std::uint32_t c = 0; c < s.controller_count(); ++c) {
    for (std::uint64_t b0 = 0; b0 < blocks; b0 += chunk_blocks) {
      const std::uint64_t nb = std::min(chunk_blocks, blocks - b0);
      for (std::uint64_t b = 0; b < nb; ++b)
        for (std::uint32_t w = 0; w < lba / 4; ++w) buf[b * (lba / 4) + w] = pattern(c, b0 + b, w);
      dev.write_media(c, b0 * lba, buf.data(), nb * lba);
    }
  }
}

//! Where element i of an array of 4-byte elements lives, by the documented striping rule.
struct layout {
  std::uint64_t start_lba;
  std::uint32_t page_size;
  std::uint32_t lba_size;
  std::uint32_t nctrl;
  __host__ __device__ std::uint32_t expected(std::uint64_t i) const {
    const std::uint64_t per_page = page_size / 4;
    const std::uint64_t p = i / per_page;
    const std::uint64_t byte = (i % per_page) * 4;
    const std::uint32_t c = static_cast<std::uint32_t>(p % nctrl);
    const std::uint64_t lba = start_lba + (p / nctrl) * (page_size / lba_size) + byte / lba_size;
    return pattern(c, lba, static_cast<std::uint32_t>((byte % lba_size) / 4));
  }
};

__host__ __device__ inline std::uint64_t rnd(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

} // namespace bam_test
