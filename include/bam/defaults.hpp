// SPDX-License-Identifier: MIT
//! Runtime settings of the library in one place. Each starts from its
//! environment variable (read once, at first use) or its built-in value, and
//! a program may change it with the setter.
//!
//! | setting                | environment variable       | built-in                 |
//! |------------------------|----------------------------|--------------------------|
//! | `gather_rows_per_warp` | `BAM_GATHER_ROWS_PER_WARP` | 0: chosen per call       |
//!
//! @code
//!   bam::defaults::set_gather_rows_per_warp(1); // one row per warp, nothing brought in ahead
//! @endcode
#pragma once

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace bam::defaults {

namespace detail {
//! An integer from the environment variable `name` within [lo, hi]; `otherwise` when unset or out of range.
inline long env_integer(const char* name, long lo, long hi, long otherwise) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return otherwise;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return end != nullptr && *end == '\0' && v >= lo && v <= hi ? v : otherwise;
}
inline std::atomic<unsigned>& gather_rows_per_warp_setting() {
  static std::atomic<unsigned> v{static_cast<unsigned>(env_integer("BAM_GATHER_ROWS_PER_WARP", 1, 32, 0))};
  return v;
}
} // namespace detail

//! Rows a warp of `bam::gather_rows` / `bam::scatter_rows` takes at a time
//! (its lanes bring in those rows' pages together): 1 to 32, or 0 to choose
//! per call (32 when there are rows enough to keep every warp busy, fewer
//! for small calls). A call's own `rows_per_warp` argument wins over it.
inline unsigned gather_rows_per_warp() { return detail::gather_rows_per_warp_setting().load(); }
//! @throw std::invalid_argument for a value above 32.
inline void set_gather_rows_per_warp(unsigned rows) {
  if (rows > 32)
    throw std::invalid_argument("bam::defaults::set_gather_rows_per_warp: " + std::to_string(rows) +
                                " rows per warp (0 to 32)");
  detail::gather_rows_per_warp_setting().store(rows);
}

} // namespace bam::defaults
