// SPDX-License-Identifier: MIT
// The extent lookup compiles for the device as for the host (nvcc), and
// the host side of that build answers as the g++ build does. A kernel that
// translates file blocks is compiled here too; GPU tests launch such kernels.
#include <bam/file/extent_map_ref.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <vector>

namespace {

__global__ void translate(bam::extent_map_ref m, const std::uint64_t* blocks, std::uint64_t* lba, std::uint64_t n) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n) lba[i] = m.find(blocks[i]).lba;
}

} // namespace

TEST_CASE("extent_map_ref under nvcc: runs, holes, the end", "[extent]") {
  // Runs: file blocks [0,8) at LBA 100, [8,12) a hole, [12,20) at LBA 40.
  const std::vector<std::uint64_t> start = {0, 8, 12, 20};
  const std::vector<std::uint64_t> lba = {100, bam::extent_hole, 40};
  bam::extent_map_ref m;
  m.start = start.data();
  m.lba = lba.data();
  m.runs = 3;
  m.file_size = 20 * 512;
  CHECK(m.blocks() == 20);
  CHECK(m.find(0).lba == 100);
  CHECK(m.find(7).lba == 107);
  CHECK(m.find(7).blocks == 1);
  CHECK(m.find(8).lba == bam::extent_hole);
  CHECK(m.find(11).blocks == 1);
  CHECK(m.find(12).lba == 40);
  CHECK(m.find(19).lba == 47);
  CHECK(m.find(20).blocks == 0);
  CHECK(bam::extent_map_ref{}.find(0).blocks == 0);
  (void)&translate; // the device instantiation exists
}
