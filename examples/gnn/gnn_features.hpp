// SPDX-License-Identifier: MIT
// Node features generated from (seed, node id, column) alone, the same on
// the host and the GPU: any row of a generated feature table can be checked
// anywhere without a reference copy.
#pragma once

#include <bam/detail/macros.hpp>

#include <cstdint>

namespace bam::gnn {

BAM_HD inline std::uint64_t mix64(std::uint64_t x) {
  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Feature `col` of node `node`: a float in [-1, 1) with 24 random bits.
BAM_HD inline float feature_value(std::uint64_t seed, std::uint64_t node, std::uint32_t col) {
  const std::uint64_t h = mix64(mix64(seed ^ (node * 0xd1b54a32d192ed03ull)) + col);
  return static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f; // 2^23
}

//! A whole row of `dim` features into `out`.
BAM_HD inline void feature_row(std::uint64_t seed, std::uint64_t node, std::uint32_t dim, float* out) {
  for (std::uint32_t c = 0; c < dim; ++c)
    out[c] = feature_value(seed, node, c);
}

} // namespace bam::gnn
