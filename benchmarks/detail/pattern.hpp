// SPDX-License-Identifier: MIT
// The block benchmark's data: the 32-bit word at byte offset `byte` of
// controller `c`'s namespace. Cheap to recompute in a kernel, different everywhere.
#pragma once

#include <bam/detail/macros.hpp>

#include <cstdint>

namespace bench {

BAM_HD inline std::uint32_t pattern_word(std::uint32_t c, std::uint64_t byte) {
  return (c << 28) ^ static_cast<std::uint32_t>(byte >> 2);
}

} // namespace bench
