// SPDX-License-Identifier: MIT
// How memory spread over several GPUs is cut into runs (the page cache over
// several GPUs uses it for its pages and its state words): runs of the
// allocation granularity, or larger so that no GPU holds more than 64, and
// every GPU holds an equal part within a run, whatever the size.
#include <bam/detail/spread_memory.cuh>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr std::size_t mib = 1ull << 20;
constexpr std::size_t gran = 2 * mib;

//! The bytes each of `parts` GPUs holds when `bytes` go to them in runs of
//! `run`, in turn (the last run holds what is left).
std::vector<std::size_t> part_bytes(std::size_t bytes, std::size_t parts, std::size_t run) {
  std::vector<std::size_t> by(parts, 0);
  for (std::size_t off = 0, k = 0; off < bytes; off += run, ++k)
    by[k % parts] += std::min(run, bytes - off);
  return by;
}

} // namespace

TEST_CASE("spread runs: the granularity for small memory, a 64th of a GPU's part for large") {
  using bam::detail::spread_run_bytes;
  CHECK(spread_run_bytes(1, 2, gran) == gran);
  CHECK(spread_run_bytes(256 * mib, 2, gran) == gran);         // 64 runs of 2 MiB on each GPU
  CHECK(spread_run_bytes(256 * mib + 1, 2, gran) == 2 * gran); // a 65th would be needed
  CHECK(spread_run_bytes(3072 * mib, 4, gran) == 12 * mib);    // 768 MiB on each GPU: 64 runs of 12 MiB
  CHECK(spread_run_bytes(4096 * mib, 4, gran) == 16 * mib);
  CHECK(spread_run_bytes(8 * mib, 4, 64 << 10) == 64 << 10); // another granularity
}

TEST_CASE("spread runs: every GPU holds an equal part within a run, in at most 64 runs") {
  using bam::detail::max_spread_runs_per_part;
  using bam::detail::spread_run_bytes;
  const std::vector<std::size_t> sizes = {gran,       3 * gran,   100 * mib,         768 * mib,
                                          3072 * mib, 3584 * mib, 5000 * mib + 4096, (80ull << 30) + 12345,
                                          1ull << 40};
  for (const std::size_t parts : {2, 3, 4, 8})
    for (const std::size_t bytes : sizes) {
      const std::size_t run = spread_run_bytes(bytes, parts, gran);
      INFO(bytes << " bytes over " << parts << " GPUs: runs of " << run);
      CHECK(run % gran == 0);
      const std::size_t runs = (bytes + run - 1) / run;
      CHECK((runs + parts - 1) / parts <= max_spread_runs_per_part);
      const std::vector<std::size_t> by = part_bytes(bytes, parts, run);
      std::size_t most = 0, least = by[0];
      for (const std::size_t b : by) {
        most = std::max(most, b);
        least = std::min(least, b);
      }
      CHECK(most - least <= run);
      // Where a GPU's share is at least a run, every GPU holds some.
      if (bytes >= parts * run) CHECK(least > 0);
    }
}
