// SPDX-License-Identifier: MIT
// Files read by GPU threads themselves: an ext4 image made by mkfs -d (and
// fragmented with debugfs) is loaded onto a software controller's media, and
// arrays over its files find each page's blocks in the file's extent map on
// the GPU. Every element is compared with the bytes mkfs put in: contiguous,
// fragmented (pages that span several runs), sparse (holes read as zeroes)
// and a file whose size is not a whole number of pages; writes are refused.
#include <bam/bam.cuh>
#include <bam/file/fs_image.hpp>

#include "file_image.hpp"
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
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

__global__ void read_one_file(bam::file_array_ref f, std::uint64_t i, std::uint8_t* out) { f.read_file(i, out); }

__global__ void write_one(bam::array_ref<std::uint32_t> a) {
  if (threadIdx.x == 0) a.write(0, 7);
}

//! The image's bytes onto controller 0 of `st`.
void load(const std::string& image, const bam::storage& st) {
  std::ifstream f(image, std::ios::binary);
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
  load(img.path, st);
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

TEST_CASE("array::open(cache, path, storage): the file system on the storage's namespace, read there", "[gpu][files]") {
  // What a user of an SSD bound to bam's driver does: no mount, no image file
  // on this machine; the file system is read through the storage itself.
  bam::storage st("emu-gpu:ram=8M");
  const test_fs_image& img = ext4_test_image(st.lba_size());
  load(img.path, st);
  const std::uint32_t page = GENERATE(4096u, 16384u);
  CAPTURE(page);
  bam::page_cache cache({.page_size = page, .capacity = 64 * page}); // smaller than the files
  for (const auto& [path, want, map] : {std::tuple{"/fragmented.bin", &img.fragmented, &img.fragmented_map},
                                        std::tuple{"/contiguous.bin", &img.contiguous, &img.contiguous_map}}) {
    CAPTURE(path);
    auto a = bam::array<std::uint32_t>::open(cache, path, st);
    CHECK(a.size() == want->size());
    CHECK_THAT(a.source(), ContainsSubstring(path) && ContainsSubstring(std::to_string(map->runs()) + " run(s)"));
    CHECK(same(read_all(a, page == 4096), *want));
  }
  auto refused = [&](const bam::storage& where, const std::string& path) -> std::string {
    try {
      auto a = bam::array<std::uint32_t>::open(cache, path, where);
    } catch (const bam::error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(refused(st, "/no-such.bin"), ContainsSubstring("/no-such.bin"));
  CHECK_THAT(refused(st, "/sparse.bin"), ContainsSubstring("hole"));
  bam::storage blank("emu-gpu:ram=8M");
  CHECK_THAT(refused(blank, "/contiguous.bin"), ContainsSubstring("ext2/3/4 file system"));
  bam::storage two("emu-gpu:ram=8M,ssds=2");
  CHECK_THAT(refused(two, "/contiguous.bin"), ContainsSubstring("2 controllers"));
  // The cache still serves the file arrays it had, and the storage's own bytes.
  bam::array<std::uint32_t> again(cache, st, img.fragmented_map);
  CHECK(same(read_all(again, false), img.fragmented));
}

TEST_CASE("an array over a file is read-only, and a map that does not fit the storage is refused", "[gpu][files]") {
  bam::storage st("emu-gpu:ram=8M");
  const test_fs_image& img = ext4_test_image(st.lba_size());
  load(img.path, st);
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

TEST_CASE("a file array: the many files of an ext4 image read whole by GPU warps, by index", "[gpu][files]") {
  const std::uint32_t page = GENERATE(4096u, 16384u);
  CAPTURE(page);
  bam::storage st("emu-gpu:ram=8M");
  const test_file_set_image& img = ext4_file_set_image(st.lba_size());
  load(img.path, st);
  bam::page_cache cache({.page_size = page, .capacity = 16 * page}); // smaller than the set: pages get evicted
  bam::file_array files(cache, st, img.set);
  REQUIRE(files.files() == img.bytes.size());
  for (std::uint64_t i = 0; i < files.files(); ++i)
    CHECK(files.size(i) == img.bytes[i].size());

  // A batch of every file in a shuffled order, two of them twice.
  std::vector<std::uint64_t> ids(files.files());
  std::iota(ids.begin(), ids.end(), std::uint64_t{0});
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(5));
  ids.push_back(ids[3]);
  ids.push_back(ids[7]);
  std::vector<std::uint64_t> offsets;
  const std::uint64_t total = files.packed_offsets(ids, offsets);
  bam::device_buffer<std::uint64_t> d_ids(ids.size()), d_offsets(ids.size());
  bam::device_buffer<std::uint8_t> d_out(total);
  bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
  bam::copy_to_device(d_offsets.get(), offsets.data(), offsets.size());
  REQUIRE(cudaMemset(d_out.get(), 0, total) == cudaSuccess);
  files.gather_files(d_ids.get(), ids.size(), d_out.get(), d_offsets.get());
  files.check();
  std::vector<std::uint8_t> out(total);
  bam::copy_to_host(out.data(), d_out.get(), total);
  std::uint64_t wrong = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const auto& want = img.bytes[ids[k]];
    if (!std::equal(want.begin(), want.end(), out.begin() + static_cast<std::ptrdiff_t>(offsets[k]))) {
      UNSCOPED_INFO("file " << ids[k] << " (" << img.set.path(ids[k]) << ", " << want.size() << " bytes) differs");
      ++wrong;
    }
  }
  CHECK(wrong == 0);
  CHECK_NOTHROW(files.check_unchanged()); // no file of the image changed since it was mapped

  // One warp of a user's kernel reads the largest file.
  const auto largest =
      static_cast<std::uint64_t>(std::max_element(img.bytes.begin(), img.bytes.end(),
                                                  [](const auto& a, const auto& b) { return a.size() < b.size(); }) -
                                 img.bytes.begin());
  bam::device_buffer<std::uint8_t> one(files.size(largest));
  read_one_file<<<1, 32>>>(files.ref(), largest, one.get());
  REQUIRE(cudaGetLastError() == cudaSuccess);
  files.check();
  std::vector<std::uint8_t> got(files.size(largest));
  bam::copy_to_host(got.data(), one.get(), got.size());
  CHECK(std::vector<unsigned char>(got.begin(), got.end()) == img.bytes[largest]);

  // A bad id: refused on the host, recorded on the GPU and reported by check().
  CHECK_THROWS_AS(files.packed_offsets({files.files()}, offsets), bam::error);
  const std::uint64_t bad = files.files();
  bam::copy_to_device(d_ids.get(), &bad, 1);
  files.gather_files(d_ids.get(), 1, d_out.get(), d_offsets.get());
  CHECK_THROWS_AS(files.check(), bam::error);
}
