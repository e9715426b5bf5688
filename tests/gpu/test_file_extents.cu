// SPDX-License-Identifier: MIT
// Files read by GPU threads themselves: an ext4 image made by mkfs -d (and
// fragmented with debugfs) is loaded onto a software controller's media, and
// arrays over its files find each page's blocks in the file's extent map on
// the GPU. Every element is compared with the bytes mkfs put in: contiguous,
// fragmented (pages that span several runs), sparse (holes read as zeroes)
// and a file whose size is not a whole number of pages; writes are refused.
#include <bam/bam.cuh>

#include "file_image.hpp"
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

__global__ void read_elements(bam::array_ref<std::uint32_t> a, std::uint32_t* out) {
  const std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  if (i < a.size()) out[i] = a[i];
}

__global__ void copy_ranges(bam::array_ref<std::uint32_t> a, std::uint32_t* out, std::uint64_t chunk) {
  const std::uint64_t warp = (blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x) / 32;
  const std::uint64_t begin = warp * chunk;
  if (begin >= a.size()) return;
  const std::uint64_t n = begin + chunk <= a.size() ? chunk : a.size() - begin;
  a.copy_to(begin, n, out + begin);
}

__global__ void write_one(bam::array_ref<std::uint32_t> a) {
  if (threadIdx.x == 0) a.write(0, 7);
}

//! The image's bytes onto controller 0 of `st`.
void load(const test_fs_image& img, const bam::storage& st) {
  std::ifstream f(img.path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() <= st.blocks_per_controller() * st.lba_size());
  bam::emu::write_media(st, 0, 0, bytes.data(), bytes.size());
}

std::vector<std::uint32_t> read_all(bam::array<std::uint32_t>& a, bool warp_copies) {
  bam::device_buffer<std::uint32_t> out(a.size());
  if (warp_copies) {
    constexpr std::uint64_t chunk = 1000; // ranges that start and end inside pages
    const std::uint64_t warps = (a.size() + chunk - 1) / chunk;
    copy_ranges<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256>>>(a.ref(), out.get(), chunk);
  } else {
    read_elements<<<static_cast<unsigned>((a.size() + 255) / 256), 256>>>(a.ref(), out.get());
  }
  REQUIRE(cudaGetLastError() == cudaSuccess);
  a.check();
  std::vector<std::uint32_t> host(a.size());
  bam::copy_to_host(host.data(), out.get(), host.size());
  return host;
}

//! `got == want`, saying where they first differ (without printing whole arrays).
bool same(const std::vector<std::uint32_t>& got, const std::vector<std::uint32_t>& want) {
  if (got.size() != want.size()) {
    UNSCOPED_INFO("sizes " << got.size() << " and " << want.size());
    return false;
  }
  const auto m = std::mismatch(got.begin(), got.end(), want.begin());
  if (m.first == got.end()) return true;
  UNSCOPED_INFO("element " << (m.first - got.begin()) << ": " << *m.first << ", want " << *m.second);
  return false;
}

} // namespace

TEST_CASE("arrays over the files of an ext4 image: GPU threads read them through their extent maps", "[gpu][files]") {
  const std::uint32_t page = GENERATE(4096u, 16384u);
  const bool warp_copies = GENERATE(false, true);
  CAPTURE(page, warp_copies);
  bam::storage st("emu-gpu:ram=8M");
  const test_fs_image& img = ext4_test_image(st.lba_size());
  load(img, st);
  bam::page_cache cache({.page_size = page, .capacity = 64 * page}); // smaller than the files: pages get evicted

  {
    bam::array<std::uint32_t> a(cache, st, img.contiguous_map);
    CHECK(a.size() == img.contiguous.size());
    CHECK_THAT(a.source(), ContainsSubstring("extent map"));
    CHECK(same(read_all(a, warp_copies), img.contiguous));
  }
  {
    REQUIRE(img.fragmented_map.runs() > 4);
    bam::array<std::uint32_t> a(cache, st, img.fragmented_map);
    CHECK(same(read_all(a, warp_copies), img.fragmented));
  }
  {
    bam::array<std::uint32_t> a(cache, st, img.sparse_map);
    CHECK(same(read_all(a, warp_copies), img.sparse));
  }
}

TEST_CASE("an array over a file is read-only, and a map that does not fit the storage is refused", "[gpu][files]") {
  bam::storage st("emu-gpu:ram=8M");
  const test_fs_image& img = ext4_test_image(st.lba_size());
  load(img, st);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  const bam::extent_map& m = img.contiguous_map;
  {
    bam::array<std::uint32_t> a(cache, st, m);
    write_one<<<1, 32>>>(a.ref());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    a.check(); // the write lands in the cache; writing it back is what fails
    try {
      a.flush();
      FAIL("a write to a file's array was written back");
    } catch (const bam::error& e) {
      CHECK_THAT(std::string(e.what()), ContainsSubstring("Write Protected"));
    }
    try {
      a.detach();
    } catch (const bam::error&) {
    }
  }
  // The image's blocks are 1 KiB: a map counted in 512-byte blocks names LBAs past a small storage.
  bam::storage tiny("emu-gpu:ram=64K");
  try {
    bam::array<std::uint32_t> a(cache, tiny, m);
    FAIL("a map past the end of the storage was accepted");
  } catch (const bam::error& e) {
    CHECK_THAT(std::string(e.what()), ContainsSubstring("past the end"));
  }
  bam::storage two("emu-gpu:ram=8M,ssds=2");
  try {
    bam::array<std::uint32_t> a(cache, two, m);
    FAIL("a file over two controllers was accepted");
  } catch (const bam::error& e) {
    CHECK_THAT(std::string(e.what()), ContainsSubstring("one disk"));
  }
}
