// SPDX-License-Identifier: MIT
// bam::gather_rows and bam::gather_row over the page cache, on the software
// controller's GPU engine: rows that straddle pages, repeated ids, every
// element size, ids out of range. Every gathered element is compared on the
// host with the bytes the media holds at that row's place, recomputed from
// the pattern of test_util.cuh and the striping rule. Then the hot set, the
// look-ahead holds, and bam::scatter_rows / bam::scatter_row: rows written
// back through the cache, checked by gathering them again, by reading the
// whole array (nothing else changed), and on the media after a flush.
#include "test_util.cuh"

#include <bam/runtime/row_gather.cuh>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

using bam_test::layout;
using Catch::Matchers::ContainsSubstring;

namespace {

//! Byte `b` of the array (from its first element) as the media holds it.
std::uint8_t array_byte(const layout& l, std::uint64_t b) {
  layout words = l;
  words.elem = 4;
  const std::uint32_t w = words.word(b / 4, 0);
  return static_cast<std::uint8_t>(w >> (8 * (b % 4)));
}

//! Element `i` of an array of T, by the layout.
template <class T>
T expected_element(const layout& l, std::uint64_t i) {
  std::uint8_t bytes[sizeof(T)];
  for (std::uint32_t k = 0; k < sizeof(T); ++k)
    bytes[k] = array_byte(l, i * sizeof(T) + k);
  T t;
  std::memcpy(&t, bytes, sizeof(T));
  return t;
}

//! Rows `ids` gathered into `got` (rows of `width`): the number of elements
//! that differ from the layout; the first wrong (row, column) in `first`.
template <class T>
std::uint64_t wrong_elements(const layout& l, const std::vector<std::uint64_t>& ids, std::uint64_t width,
                             const std::vector<T>& got, std::string& first) {
  std::uint64_t bad = 0;
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (std::uint64_t c = 0; c < width; ++c) {
      const T want = expected_element<T>(l, ids[r] * width + c);
      if (std::memcmp(&want, &got[r * width + c], sizeof(T)) != 0 && bad++ == 0)
        first = "row " + std::to_string(r) + " (id " + std::to_string(ids[r]) + ") column " + std::to_string(c);
    }
  return bad;
}

std::string hbm(std::uint64_t mib, std::uint32_t ssds) {
  return "emu-gpu:hbm=" + std::to_string(mib) + "M,ssds=" + std::to_string(ssds) + ",queues=32,depth=64";
}

//! Gathers `ids` through bam::gather_rows and returns what arrived;
//! `rows_per_warp` rows at a time per warp (0: as gather_rows chooses).
template <class T, class Id>
std::vector<T> gather(bam::array<T>& a, const std::vector<Id>& ids, std::uint64_t width, cudaStream_t stream,
                      unsigned rows_per_warp = 0) {
  bam::device_buffer<Id> d_ids(ids.size());
  bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
  bam::device_buffer<T> out(ids.size() * width);
  if (rows_per_warp == 0)
    bam::gather_rows(a, d_ids.get(), ids.size(), width, out.get(), stream);
  else
    bam::detail::launch_gather_rows(a, d_ids.get(), ids.size(), width, out.get(), bam::hot_rows_ref<T>{}, stream,
                                    rows_per_warp);
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<T> got(ids.size() * width);
  bam::copy_to_host(got.data(), out.get(), got.size());
  return got;
}

//! Every row id below `rows` once, in a scattered order.
std::vector<std::uint64_t> every_row_shuffled(std::uint64_t rows) {
  std::vector<std::uint64_t> ids(rows);
  for (std::uint64_t r = 0; r < rows; ++r)
    ids[r] = (r * 7919) % rows; // 7919 is prime: a permutation unless it divides rows
  return ids;
}

//! Rows whose sum in `d_sums` (rows `ids` of `width` elements) differs from
//! the layout's.
std::uint64_t wrong_row_sums(const layout& l, const std::vector<std::uint64_t>& ids, std::uint64_t width,
                             const bam::device_buffer<unsigned long long>& d_sums) {
  std::vector<unsigned long long> got(ids.size());
  bam::copy_to_host(got.data(), d_sums.get(), ids.size());
  std::uint64_t bad = 0;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    unsigned long long want = 0;
    for (std::uint64_t c = 0; c < width; ++c)
      want += l.expected(ids[r] * width + c);
    bad += got[r] != want;
  }
  return bad;
}

//! A user kernel: each warp gathers the rows `ids[warp]` with bam::gather_row
//! and writes their element sum (as 64-bit integers) per row.
template <class T>
__global__ void row_sum_kernel(bam::array_ref<T> a, const std::uint64_t* ids, std::uint64_t count, std::uint64_t width,
                               T* scratch, unsigned long long* sums) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  T* row = scratch + warp * width;
  for (std::uint64_t r = warp; r < count; r += warps) {
    bam::gather_row(a, ids[r], width, row);
    __syncwarp();
    unsigned long long s = 0;
    for (std::uint64_t c = lane; c < width; c += 32)
      s += static_cast<unsigned long long>(row[c]);
    for (int o = 16; o > 0; o /= 2)
      s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) sums[r] = s;
    __syncwarp();
  }
}

//! `row_sum_kernel` with a hot set: the five-argument gather_row.
__global__ void hot_row_sum_kernel(bam::array_ref<std::uint32_t> a, bam::hot_rows_ref<std::uint32_t> hot,
                                   const std::uint64_t* ids, std::uint64_t count, std::uint64_t width,
                                   std::uint32_t* scratch, unsigned long long* sums) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  std::uint32_t* row = scratch + warp * width;
  for (std::uint64_t r = warp; r < count; r += warps) {
    bam::gather_row(a, ids[r], width, row, hot);
    __syncwarp();
    unsigned long long s = 0;
    for (std::uint64_t c = lane; c < width; c += 32)
      s += row[c];
    for (int o = 16; o > 0; o /= 2)
      s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) sums[r] = s;
    __syncwarp();
  }
}

//! One warp holds the pages of rows 0..31 (rows of `width` elements, every
//! lane one) as a 32-row gather does. out[0]: whether it holds them all;
//! out[1]: the most pins one of those pages holds meanwhile; out[2]: the
//! most after the owners let go.
__global__ void held_pins_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t width, unsigned long long* out) {
  const unsigned lane = threadIdx.x % 32;
  const bam::page_cache_ref& cache = bam::detail::ref_access::cache(a);
  bam::detail::row_pins pins;
  const bool holding = bam::detail::hold_row_pages(a, lane * width, width, true, pins);
  auto most_pins = [&] {
    unsigned long long most = 0;
    for (int k = 0; k < 2; ++k) {
      const std::uint64_t w =
          bam::detail::dev_atomic<std::uint64_t>(bam::detail::ref_access::slots(cache)[pins.slot[k]])
              .load(cuda::memory_order_relaxed);
      const unsigned long long n = pins.held[k] ? (w & bam::detail::slot_pin_mask) : 0;
      most = n > most ? n : most;
    }
    return __reduce_max_sync(0xffffffffu, static_cast<unsigned>(most));
  };
  __syncwarp();
  const unsigned during = most_pins();
  __syncwarp();
  for (int k = 0; k < 2; ++k)
    if (pins.own[k]) cache.release(pins.slot[k]);
  __syncwarp();
  __threadfence();
  const unsigned after = most_pins();
  if (lane == 0) {
    out[0] = holding;
    out[1] = during;
    out[2] = after;
  }
}

} // namespace

TEST_CASE("a hot set serves its rows from its copy in host or GPU memory, the others through the cache",
          "[gpu][row_gather]") {
  const bam::hot_memory where = GENERATE(bam::hot_memory::host, bam::hot_memory::gpu);
  INFO((where == bam::hot_memory::gpu ? "in GPU memory" : "in host memory"));
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 256 << 10});
  const std::uint64_t width = 700; // rows straddle pages
  const std::uint64_t n = (4ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 1};
  const std::uint64_t rows = n / width;
  std::vector<std::uint64_t> hot_ids;
  for (std::uint64_t r = 5; r < rows; r += 7)
    hot_ids.push_back(r);
  if (hot_ids.back() != rows - 1) hot_ids.push_back(rows - 1); // the last whole row
  hot_ids.insert(hot_ids.begin(), 0);                          // and the first
  // Given in no particular order (the hot set keeps them by id).
  const std::vector<std::uint64_t> given = every_row_shuffled(hot_ids.size());
  std::vector<std::uint64_t> scattered(hot_ids.size());
  for (std::size_t k = 0; k < hot_ids.size(); ++k)
    scattered[k] = hot_ids[given[k]];
  bam::hot_rows<std::uint32_t> hot(a, width, scattered, {}, where);
  REQUIRE(hot.size() == hot_ids.size());
  CHECK(hot.bytes() == hot_ids.size() * width * 4);
  CHECK(hot.memory() == where);
  REQUIRE_NOTHROW(a.check());
  // The copy is where it was asked to be.
  cudaPointerAttributes at{};
  REQUIRE(cudaPointerGetAttributes(&at, hot.ref().data()) == cudaSuccess);
  CHECK(at.type == (where == bam::hot_memory::gpu ? cudaMemoryTypeDevice : cudaMemoryTypeHost));
  if (where == bam::hot_memory::gpu) CHECK(at.device == a.device());

  // Hot rows only (repeated, shuffled), on a cache emptied of them: every
  // row right, and not one page loaded.
  {
    bam::page_cache other({.page_size = page, .capacity = 256 << 10});
    bam::array<std::uint32_t> b(other, s, n);
    bam::hot_rows<std::uint32_t> hot_b(b, width, hot_ids, {}, where);
    std::vector<std::uint64_t> ids;
    for (std::uint64_t k = 0; k < 3 * hot_ids.size(); ++k)
      ids.push_back(hot_ids[(k * 7919) % hot_ids.size()]);
    const auto before = other.counters();
    bam::device_buffer<std::uint64_t> d_ids(ids.size());
    bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
    bam::device_buffer<std::uint32_t> out(ids.size() * width);
    bam::gather_rows(b, d_ids.get(), ids.size(), width, out.get(), hot_b);
    BAM_TEST_SYNC();
    REQUIRE_NOTHROW(b.check());
    CHECK(other.counters().misses == before.misses);
    std::vector<std::uint32_t> got(ids.size() * width);
    bam::copy_to_host(got.data(), out.get(), got.size());
    std::string first;
    CHECK(wrong_elements(l, ids, width, got, first) == 0);
  }

  // Hot and cold rows mixed, from a user kernel: every row's sum right; the
  // cold ones are loaded through the cache.
  const std::vector<std::uint64_t> ids = every_row_shuffled(rows);
  bam::device_buffer<std::uint64_t> d_ids(rows);
  bam::copy_to_device(d_ids.get(), ids.data(), rows);
  const unsigned blocks = 32, threads = 128;
  bam::device_buffer<std::uint32_t> scratch(static_cast<std::size_t>(blocks) * threads / 32 * width);
  bam::device_buffer<unsigned long long> sums(rows);
  const auto before = cache.counters();
  hot_row_sum_kernel<<<blocks, threads>>>(a.ref(), hot.ref(), d_ids.get(), rows, width, scratch.get(), sums.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(cache.counters().misses > before.misses);
  CHECK(wrong_row_sums(l, ids, width, sums) == 0);

  // Bad input is refused, naming it.
  CHECK_THROWS_WITH(bam::hot_rows<std::uint32_t>(a, width, {3, 4, 3}), ContainsSubstring("row 3 is given twice"));
  CHECK_THROWS_WITH(bam::hot_rows<std::uint32_t>(a, width, {rows}), ContainsSubstring("past the table"));
  CHECK_THROWS_WITH(bam::hot_rows<std::uint32_t>(a, 0, {1}), ContainsSubstring("row width 0"));
  CHECK_THROWS_WITH(bam::gather_rows(a, d_ids.get(), 1, width + 1, scratch.get(), hot),
                    ContainsSubstring("hot set holds rows of 700 elements"));
  {
    bam::array<std::uint32_t> smaller(cache, s, n / 2, (8ull << 20) / 512 / 2);
    CHECK_THROWS_WITH(bam::gather_rows(smaller, d_ids.get(), 1, width, scratch.get(), hot),
                      ContainsSubstring("hot set was made from a table of"));
  }
  // An empty hot set, and one moved from, read everything through the cache.
  bam::hot_rows<std::uint32_t> none(a, width, {});
  CHECK(none.size() == 0);
  bam::gather_rows(a, d_ids.get(), 8, width, scratch.get(), none);
  bam::hot_rows<std::uint32_t> taken(std::move(hot));
  CHECK(taken.size() == hot_ids.size());
  CHECK(taken.memory() == where);
  CHECK(hot.size() == 0);
  bam::device_buffer<std::uint32_t> out(rows * width);
  bam::gather_rows(a, d_ids.get(), rows, width, out.get(), hot);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  std::vector<std::uint32_t> got(rows * width);
  bam::copy_to_host(got.data(), out.get(), got.size());
  std::string first;
  CHECK(wrong_elements(l, ids, width, got, first) == 0);
}

TEMPLATE_TEST_CASE("gather_rows: rows straddling pages, repeated ids, every element size", "[gpu][row_gather]",
                   std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  using T = TestType;
  // Widths: inside a page, not dividing it (rows straddle page boundaries),
  // wider than several pages, one element, odd sizes (unaligned copies).
  const std::uint64_t width = GENERATE(as<std::uint64_t>{}, 1, 37, 1000, 1024, 3000, 4099);
  // One row per warp, or several whose pages a warp brings in together
  // (and, when it can pin them all, copies from the pages it holds).
  const unsigned rows_per_warp = GENERATE(1u, 7u, 32u);
  constexpr std::uint32_t page = 4096, ssds = 2;
  constexpr std::uint64_t start_lba = 64;
  bam::storage s(hbm(16, ssds));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 1 << 20}); // far smaller than the rows read: eviction
  const std::uint64_t n = (6ull << 20) / sizeof(T) + 5;            // a partial last row and page
  bam::array<T> a(cache, s, n, start_lba);
  layout l{start_lba, page, s.lba_size(), ssds};
  l.elem = sizeof(T);
  const std::uint64_t rows = n / width;
  REQUIRE(bam::row_count(a.ref(), width) == rows);
  std::vector<std::uint64_t> ids;
  for (std::uint64_t k = 0; k < 1500; ++k)
    ids.push_back(bam_test::rnd(width * 7 + k) % rows);
  ids.push_back(0);
  ids.push_back(rows - 1); // the last whole row, next to the partial one
  for (int k = 0; k < 40; ++k)
    ids.push_back(ids[static_cast<std::size_t>(k) * 3]); // repeated ids
  for (int k = 0; k < 8; ++k)
    ids.push_back(rows / 2); // the same id, side by side
  cudaStream_t stream;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<T> got = gather(a, ids, width, stream, rows_per_warp);
  REQUIRE_NOTHROW(a.check(stream));
  std::string first;
  const std::uint64_t bad = wrong_elements(l, ids, width, got, first);
  INFO("width " << width << ", element size " << sizeof(T) << ", " << rows_per_warp
                << " rows per warp, first wrong: " << first);
  CHECK(bad == 0);
  // Signed ids work alike.
  std::vector<std::int64_t> signed_ids(ids.begin(), ids.begin() + 100);
  const std::vector<T> got_signed = gather(a, signed_ids, width, stream, rows_per_warp);
  REQUIRE_NOTHROW(a.check(stream));
  CHECK(std::memcmp(got_signed.data(), got.data(), got_signed.size() * sizeof(T)) == 0);
  // A hot set of some of the rows, in host and in GPU memory: hot rows come
  // from its copy (16, 4 or sizeof(T) bytes a lane, as the row's length
  // allows), the same elements as through the cache.
  std::vector<std::uint64_t> hot_ids;
  for (std::uint64_t r = 0; r < rows; r += 5)
    hot_ids.push_back(r);
  const unsigned group = rows_per_warp;
  for (const bam::hot_memory where : {bam::hot_memory::host, bam::hot_memory::gpu}) {
    const bam::hot_rows<T> hot(a, width, hot_ids, stream, where);
    bam::device_buffer<std::uint64_t> d_ids(ids.size());
    bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
    bam::device_buffer<T> d_out(ids.size() * width);
    bam::detail::launch_gather_rows(a, d_ids.get(), ids.size(), width, d_out.get(), hot.ref(), stream, group);
    REQUIRE_NOTHROW(a.check(stream));
    std::vector<T> got_hot(ids.size() * width);
    bam::copy_to_host(got_hot.data(), d_out.get(), got_hot.size(), stream);
    INFO((where == bam::hot_memory::gpu ? "hot set in GPU memory" : "hot set in host memory"));
    CHECK(std::memcmp(got_hot.data(), got.data(), got.size() * sizeof(T)) == 0);
  }
  BAM_CUDA_TRY(cudaStreamDestroy(stream));
}

TEST_CASE("gather_rows, 32 rows per warp: a cache smaller than a warp's pages, one id everywhere",
          "[gpu][row_gather]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  const std::uint64_t width = 700; // 2800 bytes: most rows straddle a page boundary
  const std::uint64_t n = (4ull << 20) / 4;
  const layout l{0, page, s.lba_size(), 1};
  const std::uint64_t rows = n / width;
  cudaStream_t stream;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SECTION("16 slots in 2 sets for up to 64 pages a warp: its pins mostly fail, none is waited for") {
    bam::page_cache cache({.page_size = page, .capacity = 16 * page});
    bam::array<std::uint32_t> a(cache, s, n);
    std::vector<std::uint64_t> ids = every_row_shuffled(rows);
    ids.insert(ids.end(), ids.begin(), ids.begin() + 500);
    const std::vector<std::uint32_t> got = gather(a, ids, width, stream, 32);
    REQUIRE_NOTHROW(a.check(stream));
    std::string first;
    const std::uint64_t bad = wrong_elements(l, ids, width, got, first);
    INFO("first wrong: " << first);
    CHECK(bad == 0);
  }
  SECTION("one row 300,000 times: more pins than a page can count (65,535) would be asked for") {
    bam::page_cache cache({.page_size = page, .capacity = 1 << 20});
    bam::array<std::uint32_t> a(cache, s, n);
    const std::vector<std::uint64_t> ids(300000, rows / 3);
    const std::vector<std::uint32_t> got = gather(a, ids, width, stream, 32);
    REQUIRE_NOTHROW(a.check(stream));
    std::uint64_t bad = 0;
    for (std::size_t r = 0; r < ids.size(); ++r)
      for (std::uint64_t c = 0; c < width; ++c)
        bad += got[r * width + c] != l.expected(ids[r] * width + c);
    CHECK(bad == 0);
  }
  BAM_CUDA_TRY(cudaStreamDestroy(stream));
}

TEST_CASE("the rows of one warp on one page hold one pin of it between them", "[gpu][row_gather]") {
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, (4ull << 20) / 4);
  bam::device_buffer<unsigned long long> out(3);
  // 8 elements: all 32 rows on page 0. 100: about ten rows a page, each
  // page a row's first page and the one before's last.
  const std::uint64_t width = GENERATE(8, 100);
  held_pins_kernel<<<1, 32>>>(a.ref(), width, out.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  unsigned long long got[3];
  bam::copy_to_host(got, out.get(), 3);
  INFO("width " << width);
  CHECK(got[0] == 1);
  CHECK(got[1] >= 1);
  CHECK(got[1] <= 2);
  CHECK(got[2] == 0);
}

TEST_CASE("gather_row from a user kernel: every row summed", "[gpu][row_gather]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 512 << 10});
  const std::uint64_t width = 700; // 2800 bytes: most rows straddle a page boundary
  const std::uint64_t n = (4ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 1};
  const std::uint64_t rows = n / width;
  const std::vector<std::uint64_t> ids = every_row_shuffled(rows);
  bam::device_buffer<std::uint64_t> d_ids(rows);
  bam::copy_to_device(d_ids.get(), ids.data(), rows);
  const unsigned blocks = 32, threads = 128;
  bam::device_buffer<std::uint32_t> scratch(static_cast<std::size_t>(blocks) * threads / 32 * width);
  bam::device_buffer<unsigned long long> sums(rows);
  row_sum_kernel<<<blocks, threads>>>(a.ref(), d_ids.get(), rows, width, scratch.get(), sums.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(wrong_row_sums(l, ids, width, sums) == 0);
}

TEST_CASE("gather_rows: an id out of range makes check() throw naming its index", "[gpu][row_gather][sanitize]") {
  bam::storage s("emu-gpu:hbm=4M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  const std::uint64_t width = 100, n = 1050; // 10 whole rows and a partial one
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, 4096, s.lba_size(), 1};
  const std::uint64_t bad_id = GENERATE(as<std::uint64_t>{}, 10, 11, 12345);
  const unsigned rows_per_warp = GENERATE(1u, 32u);
  std::vector<std::uint64_t> ids{3, bad_id, 9};
  const std::vector<std::uint32_t> got = gather(a, ids, width, nullptr, rows_per_warp);
  bam_test::require_bad_index(a, bad_id * width, bad_id * width + 1);
  // The bad row is zeroes, the others arrived.
  for (std::uint64_t c = 0; c < width; ++c) {
    CHECK(got[width + c] == 0u);
    CHECK(got[c] == l.expected(3 * width + c));
    CHECK(got[2 * width + c] == l.expected(9 * width + c));
  }
  REQUIRE_NOTHROW(a.check()); // collected: the record is clear again
  // Negative ids are out of range too.
  std::vector<std::int64_t> negative{-1};
  (void)gather(a, negative, width, nullptr);
  CHECK_THROWS_AS(a.check(), bam::error);
  // A row width the array cannot hold is refused before any launch.
  CHECK_THROWS_AS(
      bam::gather_rows(a, static_cast<const std::uint64_t*>(nullptr), 1, 0, static_cast<std::uint32_t*>(nullptr)),
      bam::error);
  CHECK_THROWS_AS(
      bam::gather_rows(a, static_cast<const std::uint64_t*>(nullptr), 1, n + 1, static_cast<std::uint32_t*>(nullptr)),
      bam::error);
}

TEST_CASE("gather_rows over the CPU engine: host RAM and a file, on a stream of its own", "[gpu][row_gather][client]") {
  const std::string path = "/tmp/bam-gpu-gather-" + std::to_string(::getpid()) + ".img";
  const std::string dev = GENERATE_COPY(std::string("emu:ram=24M,queues=16,depth=64,threads=4"),
                                        "emu:file=" + path + ",size=24M,queues=32,threads=8");
  INFO(dev);
  {
    constexpr std::uint64_t width = 1024; // 4 KiB rows, as GNN features
    bam::storage s(dev);
    bam_test::fill_pattern(s);
    bam::page_cache cache({.page_size = 4096, .capacity = 2 << 20, .timeout_ns = 2'000'000'000});
    const std::uint64_t n = (20ull << 20) / 4;
    bam::array<std::uint32_t> a(cache, s, n);
    const layout l{0, 4096, s.lba_size(), 1};
    const std::uint64_t rows = n / width;
    std::vector<std::uint64_t> ids;
    for (std::uint64_t k = 0; k < 6000; ++k)
      ids.push_back(bam_test::rnd(k * 13) % rows);
    cudaStream_t stream;
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const std::vector<std::uint32_t> got = gather(a, ids, width, stream);
    REQUIRE_NOTHROW(a.check(stream));
    std::string first;
    const std::uint64_t bad = wrong_elements(l, ids, width, got, first);
    INFO("first wrong: " << first);
    CHECK(bad == 0);
    BAM_CUDA_TRY(cudaStreamDestroy(stream));
  }
  std::remove(path.c_str());
}

namespace {

//! The cache's per-set hold counts and the pin count of every slot, read back.
struct cache_snapshot {
  std::vector<bam::detail::cache_set> sets;
  std::vector<std::uint64_t> slots;
  std::uint64_t held() const {
    std::uint64_t n = 0;
    for (const auto& s : sets)
      n += s.held;
    return n;
  }
  std::uint32_t most_held() const {
    std::uint32_t m = 0;
    for (const auto& s : sets)
      m = std::max(m, s.held);
    return m;
  }
  std::uint64_t pins() const {
    std::uint64_t n = 0;
    for (const std::uint64_t w : slots)
      n += w & bam::detail::slot_pin_mask;
    return n;
  }
};

template <class T>
cache_snapshot snapshot(const bam::array<T>& a, cudaStream_t stream) {
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
  using access = bam::detail::ref_access;
  const bam::page_cache_ref c = access::cache(a.ref());
  cache_snapshot s;
  s.sets.resize(access::set_count(c));
  s.slots.resize(c.slot_count());
  BAM_CUDA_TRY(cudaMemcpy(s.sets.data(), access::sets(c), s.sets.size() * sizeof(bam::detail::cache_set),
                          cudaMemcpyDeviceToHost));
  BAM_CUDA_TRY(
      cudaMemcpy(s.slots.data(), access::slots(c), s.slots.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  return s;
}

} // namespace

TEST_CASE("row holds keep pages through a flood of misses, at most half a set's ways, until released",
          "[gpu][row_gather][holds][sanitize]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  // 64 slots in 8 sets of 8 ways: 32 holds at most, 4 per set.
  bam::page_cache cache({.page_size = page, .capacity = 64 * page});
  const std::uint64_t width = page / 4; // a row a page
  const std::uint64_t n = (4ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 1};
  const std::uint64_t rows = n / width; // 1024
  cudaStream_t stream;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<std::uint64_t> first16(16);
  for (std::uint64_t r = 0; r < 16; ++r)
    first16[r] = r;
  // Each id twice: a warp holds a page once however many of its rows lie there.
  std::vector<std::uint64_t> twice = first16;
  twice.insert(twice.end(), first16.begin(), first16.end());
  std::sort(twice.begin(), twice.end());
  bam::device_buffer<std::uint64_t> d_twice(twice.size());
  bam::copy_to_device(d_twice.get(), twice.data(), twice.size());

  bam::row_holds<std::uint32_t> holds(a);
  CHECK(holds.capacity() == 32);
  (void)gather(a, first16, width, stream, 1); // rows 0..15 now in the cache
  holds.hold(d_twice.get(), twice.size(), width, stream);
  const std::uint64_t held = holds.held(stream);
  const cache_snapshot during = snapshot(a, stream);
  INFO("held " << held);
  CHECK(held >= 4); // 16 pages over 8 sets: only a set with more than 4 of them refuses some
  CHECK(held <= 16);
  CHECK(during.held() == held);
  CHECK(during.most_held() <= bam::detail::hold_limit(8));
  CHECK(during.pins() == held);

  // Every row through the cache, 32 rows a warp: 16 times its size in misses.
  const std::vector<std::uint64_t> all = every_row_shuffled(rows);
  const std::vector<std::uint32_t> got = gather(a, all, width, stream, 32);
  REQUIRE_NOTHROW(a.check(stream));
  std::string first;
  const std::uint64_t wrong = wrong_elements(l, all, width, got, first);
  INFO("first wrong: " << first);
  CHECK(wrong == 0);
  // The held pages are still there: rows 0..15 again miss only where unheld.
  const std::uint64_t misses0 = cache.counters(stream).misses;
  const std::vector<std::uint32_t> again = gather(a, first16, width, stream, 1);
  CHECK(cache.counters(stream).misses - misses0 == 16 - held);
  CHECK(wrong_elements(l, first16, width, again, first) == 0);

  holds.release(stream);
  CHECK(holds.held(stream) == 0);
  const cache_snapshot after = snapshot(a, stream);
  CHECK(after.held() == 0);
  CHECK(after.pins() == 0);

  // Every page resident at once is held up to the limit, never past it; a
  // gather of every row still completes with half of each set held.
  const std::vector<std::uint64_t> some = every_row_shuffled(64);
  (void)gather(a, some, width, stream, 1);
  bam::device_buffer<std::uint64_t> d_all(all.size());
  bam::copy_to_device(d_all.get(), all.data(), all.size());
  holds.hold(d_all.get(), all.size(), width, stream);
  const cache_snapshot full = snapshot(a, stream);
  CHECK(full.most_held() <= bam::detail::hold_limit(8));
  CHECK(full.held() == holds.held(stream));
  const std::vector<std::uint32_t> got2 = gather(a, all, width, stream, 32);
  REQUIRE_NOTHROW(a.check(stream));
  CHECK(wrong_elements(l, all, width, got2, first) == 0);
  holds.release(stream);
  CHECK(snapshot(a, stream).pins() == 0);
  BAM_CUDA_TRY(cudaStreamDestroy(stream));
}

TEST_CASE("row holds: rows that straddle pages, ids out of range, gathers on other streams meanwhile",
          "[gpu][row_gather][holds]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 2));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 256 * page});
  const std::uint64_t width = 700; // 2800 bytes: most rows straddle a page boundary
  const std::uint64_t n = (8ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 2};
  const std::uint64_t rows = n / width;
  cudaStream_t hold_stream, gather_stream;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&hold_stream, cudaStreamNonBlocking));
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&gather_stream, cudaStreamNonBlocking));
  {
    bam::row_holds<std::uint32_t> holds(a);
    CHECK_THROWS_WITH(holds.hold(static_cast<const std::uint64_t*>(nullptr), 1, 0, hold_stream),
                      ContainsSubstring("row width 0"));
    std::vector<std::uint64_t> ids = every_row_shuffled(rows);
    (void)gather(a, ids, width, gather_stream, 32); // every row once: the cache full
    ids.push_back(rows);                            // past the last whole row: holds nothing
    ids.push_back(~0ull - 1);                       // far past it
    bam::device_buffer<std::uint64_t> d_ids(ids.size());
    bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
    // Holds taken on one stream while every row is gathered on another, again and again.
    std::vector<std::uint64_t> valid(ids.begin(), ids.end() - 2);
    bam::device_buffer<std::uint64_t> d_valid(valid.size());
    bam::copy_to_device(d_valid.get(), valid.data(), valid.size());
    bam::device_buffer<std::uint32_t> out(valid.size() * width);
    for (int round = 0; round < 4; ++round) {
      holds.hold(d_ids.get(), ids.size(), width, hold_stream);
      bam::gather_rows(a, d_valid.get(), valid.size(), width, out.get(), gather_stream);
      holds.release(hold_stream);
    }
    BAM_CUDA_TRY(cudaStreamSynchronize(hold_stream));
    REQUIRE_NOTHROW(a.check(gather_stream)); // the out-of-range ids were only held (not), never read
    std::vector<std::uint32_t> got(valid.size() * width);
    bam::copy_to_host(got.data(), out.get(), got.size());
    std::string first;
    const std::uint64_t wrong = wrong_elements(l, valid, width, got, first);
    INFO("first wrong: " << first);
    CHECK(wrong == 0);
    // Held once more, then the destructor lets go.
    holds.hold(d_ids.get(), ids.size(), width, hold_stream);
    CHECK(holds.held(hold_stream) > 0);
    CHECK(snapshot(a, hold_stream).most_held() <= bam::detail::hold_limit(8));
  }
  const cache_snapshot after = snapshot(a, hold_stream);
  CHECK(after.held() == 0);
  CHECK(after.pins() == 0);
  BAM_CUDA_TRY(cudaStreamDestroy(hold_stream));
  BAM_CUDA_TRY(cudaStreamDestroy(gather_stream));
}

// ---------------------------------------------------------------------------
// Scatters: bam::scatter_rows and bam::scatter_row.

namespace {

//! The rows a scatter writes (`count` rows of `width`): every element a
//! value of its own, from `salt`.
template <class T>
std::vector<T> source_rows(std::uint64_t count, std::uint64_t width, std::uint64_t salt) {
  std::vector<T> v(count * width);
  for (std::uint64_t k = 0; k < v.size(); ++k)
    v[k] = static_cast<T>(bam_test::rnd(salt * 0x100000001b3ull + k));
  return v;
}

//! Distinct row ids below `rows`, shuffled: a run of up to `run` consecutive
//! rows from a third of the table on (neighbours: rows that share pages,
//! written by different warps), the first and the last whole row, and up
//! to `random` others anywhere.
std::vector<std::uint64_t> distinct_ids(std::uint64_t rows, std::uint64_t run, std::uint64_t random,
                                        std::uint64_t seed) {
  std::vector<std::uint64_t> ids;
  std::unordered_set<std::uint64_t> taken;
  auto add = [&](std::uint64_t r) {
    if (taken.insert(r).second) ids.push_back(r);
  };
  const std::uint64_t start = rows / 3;
  for (std::uint64_t r = start; r < rows && r < start + run; ++r)
    add(r);
  add(0);
  add(rows - 1);
  for (std::uint64_t k = 0; k < random; ++k)
    add(bam_test::rnd(seed * 1000003 + k) % rows);
  std::mt19937_64 g(seed);
  std::shuffle(ids.begin(), ids.end(), g);
  return ids;
}

//! Writes `rows` (rows of `width`, one per id) into rows `ids` of `a`
//! through bam::scatter_rows, and waits; `rows_per_warp` rows at a time per
//! warp (0: as scatter_rows chooses).
template <class T, class Id>
void scatter(bam::array<T>& a, const std::vector<Id>& ids, const std::vector<T>& rows, std::uint64_t width,
             cudaStream_t stream, unsigned rows_per_warp = 0) {
  bam::device_buffer<Id> d_ids(ids.size());
  bam::copy_to_device(d_ids.get(), ids.data(), ids.size(), stream);
  bam::device_buffer<T> d_rows(rows.size());
  bam::copy_to_device(d_rows.get(), rows.data(), rows.size(), stream);
  if (rows_per_warp == 0)
    bam::scatter_rows(a, d_ids.get(), ids.size(), width, d_rows.get(), stream);
  else
    bam::detail::launch_scatter_rows(a, d_ids.get(), ids.size(), width, static_cast<const T*>(d_rows.get()), stream,
                                     rows_per_warp);
  BAM_CUDA_TRY(cudaStreamSynchronize(stream));
}

//! Every element of the array, through `array_ref::copy_to` (not the gathers).
template <class T>
__global__ void read_all_kernel(bam::array_ref<T> a, T* out) {
  constexpr std::uint64_t chunk = 4096;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  for (std::uint64_t begin = warp * chunk; begin < a.size(); begin += warps * chunk)
    a.copy_to(begin, a.size() - begin < chunk ? a.size() - begin : chunk, out + begin);
}

template <class T>
std::vector<T> read_all(bam::array<T>& a, cudaStream_t stream) {
  bam::device_buffer<T> out(a.size());
  read_all_kernel<T><<<64, 128, 0, stream>>>(a.ref(), out.get());
  BAM_CUDA_TRY(cudaGetLastError());
  std::vector<T> got(a.size());
  bam::copy_to_host(got.data(), out.get(), got.size(), stream);
  return got;
}

//! Elements of the whole array `got` that differ from what it holds after
//! rows `ids` were written with `rows` (rows of `width`, one per id, ids
//! distinct): those rows' values, the layout's pattern everywhere else
//! (neighbours on the same pages, the partial last row). The first wrong
//! element in `first`.
template <class T>
std::uint64_t wrong_after_scatter(const layout& l, const std::vector<std::uint64_t>& ids, const std::vector<T>& rows,
                                  std::uint64_t width, const std::vector<T>& got, std::string& first) {
  std::vector<std::uint32_t> at(got.size() / width + 1, ~0u); // row id -> its place in `ids`
  for (std::size_t k = 0; k < ids.size(); ++k)
    at[ids[k]] = static_cast<std::uint32_t>(k);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < got.size(); ++i) {
    const std::uint32_t k = at[i / width];
    const T want = k != ~0u ? rows[k * width + i % width] : expected_element<T>(l, i);
    if (std::memcmp(&want, &got[i], sizeof(T)) != 0 && bad++ == 0)
      first = "element " + std::to_string(i) + " (row " + std::to_string(i / width) +
              (k != ~0u ? ", written)" : ", not written)");
  }
  return bad;
}

//! Elements of `a` and `b` (as long as each other) that differ.
template <class T>
std::uint64_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  std::uint64_t bad = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    bad += std::memcmp(&a[k], &b[k], sizeof(T)) != 0;
  return bad;
}

//! A user kernel: each warp writes rows `ids[r]` with bam::scatter_row from
//! `in + r * width`; `failed` counts the rows it said it could not write.
__global__ void scatter_row_kernel(bam::array_ref<std::uint32_t> a, const std::uint64_t* ids, std::uint64_t count,
                                   std::uint64_t width, const std::uint32_t* in, unsigned long long* failed) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::uint64_t r = warp; r < count; r += warps) {
    const bool ok = bam::scatter_row(a, ids[r], width, in + r * width);
    if (!ok && lane == 0) atomicAdd(failed, 1ull);
  }
}

} // namespace

TEMPLATE_TEST_CASE("scatter_rows then gather_rows: distinct random ids, rows sharing and straddling pages, every "
                   "element size",
                   "[gpu][row_gather][scatter]", std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  using T = TestType;
  // Widths: many rows a page (warps of their own write one page at once),
  // widths that do not divide a page (rows straddle page boundaries, pages
  // written in part), a page exactly for 4-byte elements, wider than a page.
  const std::uint64_t width = GENERATE(as<std::uint64_t>{}, 1, 37, 1000, 1024, 4099);
  // One row per warp, or several whose pages a warp brings in together.
  const unsigned rows_per_warp = GENERATE(1u, 7u, 32u);
  constexpr std::uint32_t page = 4096, ssds = 2;
  constexpr std::uint64_t start_lba = 64;
  bam::storage s(hbm(16, ssds));
  bam_test::fill_pattern(s);
  // A quarter of the table: dirty pages are evicted (written back) and read again.
  bam::page_cache cache({.page_size = page, .capacity = 1 << 20});
  const std::uint64_t n = (4ull << 20) / sizeof(T) + 5; // a partial last row and page
  bam::array<T> a(cache, s, n, start_lba);
  layout l{start_lba, page, s.lba_size(), ssds};
  l.elem = sizeof(T);
  const std::uint64_t rows = n / width;
  const std::vector<std::uint64_t> ids = distinct_ids(rows, 600, 1500, width * 31 + sizeof(T));
  const std::vector<T> src = source_rows<T>(ids.size(), width, width + sizeof(T));
  INFO("width " << width << ", element size " << sizeof(T) << ", " << rows_per_warp << " rows per warp, " << ids.size()
                << " rows");
  cudaStream_t stream;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  scatter(a, ids, src, width, stream, rows_per_warp);
  REQUIRE_NOTHROW(a.check(stream));
  // The rows gathered back are those written.
  const std::vector<T> back = gather(a, ids, width, stream, rows_per_warp);
  REQUIRE_NOTHROW(a.check(stream));
  CHECK(differing(back, src) == 0);
  // The whole array: the rows written, nothing else changed.
  const std::vector<T> all = read_all(a, stream);
  REQUIRE_NOTHROW(a.check(stream));
  std::string first;
  const std::uint64_t bad = wrong_after_scatter(l, ids, src, width, all, first);
  INFO("first wrong: " << first);
  CHECK(bad == 0);
  BAM_CUDA_TRY(cudaStreamDestroy(stream));
}

TEST_CASE("scatter_rows: after a flush the rows are on the media, and a fresh cache reads them back",
          "[gpu][row_gather][scatter]") {
  constexpr std::uint32_t page = 4096, ssds = 2;
  constexpr std::uint64_t start_lba = 64;
  bam::storage s(hbm(16, ssds));
  bam_test::fill_pattern(s);
  const std::uint64_t width = 700;                // 2800 bytes: most rows straddle a page boundary
  const std::uint64_t n = (4ull << 20) / 4 + 123; // a partial last row
  const layout l{start_lba, page, s.lba_size(), ssds};
  const std::uint64_t rows = n / width;
  // Every other row (the neighbours on their pages not written), shuffled.
  std::vector<std::uint64_t> ids;
  for (std::uint64_t r = 0; r < rows; r += 2)
    ids.push_back(r);
  std::mt19937_64 g(7);
  std::shuffle(ids.begin(), ids.end(), g);
  const std::vector<std::uint32_t> src = source_rows<std::uint32_t>(ids.size(), width, 99);
  {
    bam::page_cache cache({.page_size = page, .capacity = 1 << 20});
    bam::array<std::uint32_t> a(cache, s, n, start_lba);
    scatter(a, ids, src, width, nullptr); // as scatter_rows chooses
    REQUIRE_NOTHROW(a.check());
    REQUIRE_NOTHROW(a.flush());
    CHECK(cache.counters().writebacks > 0);
    // The media itself, read from the host, element i found by the striping rule.
    std::vector<std::vector<std::uint32_t>> media(ssds);
    for (std::uint32_t c = 0; c < ssds; ++c) {
      media[c].resize(s.blocks_per_controller() * s.lba_size() / 4);
      bam::emu::read_media(s, c, 0, media[c].data(), media[c].size() * 4);
    }
    const std::uint64_t per_page = page / 4;
    std::vector<std::uint32_t> on_media(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t p = i / per_page;
      on_media[i] = media[p % ssds][(start_lba * s.lba_size() + (p / ssds) * page) / 4 + i % per_page];
    }
    std::string first;
    const std::uint64_t bad = wrong_after_scatter(l, ids, src, width, on_media, first);
    INFO("on the media, first wrong: " << first);
    CHECK(bad == 0);
  }
  // A fresh cache over the same storage reads it all from the media.
  bam::page_cache fresh({.page_size = page, .capacity = 1 << 20});
  bam::array<std::uint32_t> b(fresh, s, n, start_lba);
  const std::vector<std::uint32_t> all = read_all(b, nullptr);
  REQUIRE_NOTHROW(b.check());
  CHECK(fresh.counters().misses > 0);
  std::string first;
  const std::uint64_t bad = wrong_after_scatter(l, ids, src, width, all, first);
  INFO("through a fresh cache, first wrong: " << first);
  CHECK(bad == 0);
  const std::vector<std::uint32_t> back = gather(b, ids, width, nullptr);
  REQUIRE_NOTHROW(b.check());
  CHECK(differing(back, src) == 0);
}

TEST_CASE("scatter_rows, 32 rows per warp through a cache of 16 slots: every row lands", "[gpu][row_gather][scatter]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  // 16 slots for up to 64 pages a warp: the pages brought in ahead are
  // mostly evicted again before they are written; every write waits its turn.
  bam::page_cache cache({.page_size = page, .capacity = 16 * page});
  const std::uint64_t width = 700; // 2800 bytes: most rows straddle a page boundary
  const std::uint64_t n = (4ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 1};
  const std::vector<std::uint64_t> ids = every_row_shuffled(n / width);
  const std::vector<std::uint32_t> src = source_rows<std::uint32_t>(ids.size(), width, 1234);
  cudaStream_t stream;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  scatter(a, ids, src, width, stream, 32);
  REQUIRE_NOTHROW(a.check(stream));
  CHECK(cache.counters(stream).writebacks > 0);
  const std::vector<std::uint32_t> all = read_all(a, stream);
  REQUIRE_NOTHROW(a.check(stream));
  std::string first;
  const std::uint64_t bad = wrong_after_scatter(l, ids, src, width, all, first);
  INFO("first wrong: " << first);
  CHECK(bad == 0);
  const std::vector<std::uint32_t> back = gather(a, ids, width, stream, 32);
  REQUIRE_NOTHROW(a.check(stream));
  CHECK(differing(back, src) == 0);
  BAM_CUDA_TRY(cudaStreamDestroy(stream));
}

TEST_CASE("scatter_row from a user kernel: warps writing rows of the same pages at once",
          "[gpu][row_gather][scatter][sanitize]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 16 * page}); // a quarter of the table
  // 8 elements: 128 rows a page, each written by a warp of its own; 700:
  // rows straddling pages, pages shared by two or three rows.
  const std::uint64_t width = GENERATE(as<std::uint64_t>{}, 8, 700);
  const std::uint64_t n = (256ull << 10) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 1};
  const std::vector<std::uint64_t> ids = every_row_shuffled(n / width);
  const std::vector<std::uint32_t> src = source_rows<std::uint32_t>(ids.size(), width, 77 + width);
  bam::device_buffer<std::uint64_t> d_ids(ids.size());
  bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
  bam::device_buffer<std::uint32_t> d_src(src.size());
  bam::copy_to_device(d_src.get(), src.data(), src.size());
  bam::device_buffer<unsigned long long> failed(1);
  scatter_row_kernel<<<16, 128>>>(a.ref(), d_ids.get(), ids.size(), width, d_src.get(), failed.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  unsigned long long nfailed = 0;
  bam::copy_to_host(&nfailed, failed.get(), 1);
  CHECK(nfailed == 0);
  const std::vector<std::uint32_t> all = read_all(a, nullptr);
  REQUIRE_NOTHROW(a.check());
  std::string first;
  const std::uint64_t bad = wrong_after_scatter(l, ids, src, width, all, first);
  INFO("width " << width << ", first wrong: " << first);
  CHECK(bad == 0);
}

TEST_CASE("scatter_rows with repeated ids: each element holds one of the values given for it",
          "[gpu][row_gather][scatter]") {
  constexpr std::uint32_t page = 4096;
  bam::storage s(hbm(8, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 256 << 10});
  const std::uint64_t width = 100;
  const std::uint64_t n = (1ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, page, s.lba_size(), 1};
  const std::uint64_t rows = n / width;
  const unsigned rows_per_warp = GENERATE(1u, 32u);
  // About 64 distinct rows, each given 8 times (by different warps), and one
  // given 8 times side by side (by one warp, with 32 rows a warp).
  const std::vector<std::uint64_t> distinct = distinct_ids(rows, 0, 62, 3);
  std::vector<std::uint64_t> ids;
  for (int rep = 0; rep < 8; ++rep)
    ids.insert(ids.end(), distinct.begin(), distinct.end());
  for (int rep = 0; rep < 8; ++rep)
    ids.push_back(distinct[0]);
  const std::vector<std::uint32_t> src = source_rows<std::uint32_t>(ids.size(), width, 4242);
  scatter(a, ids, src, width, nullptr, rows_per_warp);
  REQUIRE_NOTHROW(a.check());
  const std::vector<std::uint32_t> all = read_all(a, nullptr);
  REQUIRE_NOTHROW(a.check());
  std::vector<std::vector<std::size_t>> given(rows); // row id -> its places in `ids`
  for (std::size_t k = 0; k < ids.size(); ++k)
    given[ids[k]].push_back(k);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t r = i / width, c = i % width;
    if (r >= rows || given[r].empty()) {
      bad += all[i] != l.expected(i);
      continue;
    }
    bad += std::none_of(given[r].begin(), given[r].end(), [&](std::size_t k) { return all[i] == src[k * width + c]; });
  }
  INFO(rows_per_warp << " rows per warp");
  CHECK(bad == 0);
}

TEST_CASE("scatter_rows: an id out of range makes check() throw naming its index, and writes nothing",
          "[gpu][row_gather][scatter][sanitize]") {
  bam::storage s("emu-gpu:hbm=4M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  const std::uint64_t width = 100, n = 1050; // 10 whole rows and a partial one
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, 4096, s.lba_size(), 1};
  const std::uint64_t bad_id = GENERATE(as<std::uint64_t>{}, 10, 11, 12345);
  const unsigned rows_per_warp = GENERATE(1u, 32u);
  const std::vector<std::uint64_t> ids{3, bad_id, 9};
  const std::vector<std::uint32_t> src = source_rows<std::uint32_t>(ids.size(), width, bad_id);
  scatter(a, ids, src, width, nullptr, rows_per_warp);
  bam_test::require_bad_index(a, bad_id * width, bad_id * width + 1);
  // Rows 3 and 9 were written, nothing else (row 10, the partial one, neither).
  const std::vector<std::uint32_t> all = read_all(a, nullptr);
  REQUIRE_NOTHROW(a.check());
  std::vector<std::uint32_t> written(src.begin(), src.begin() + width);
  written.insert(written.end(), src.begin() + 2 * width, src.end());
  std::string first;
  const std::uint64_t bad = wrong_after_scatter(l, {3, 9}, written, width, all, first);
  INFO("first wrong: " << first);
  CHECK(bad == 0);
  // Negative ids are out of range too.
  const std::vector<std::int64_t> negative{-1};
  scatter(a, negative, std::vector<std::uint32_t>(src.begin(), src.begin() + width), width, nullptr);
  CHECK_THROWS_AS(a.check(), bam::error);
  CHECK(differing(read_all(a, nullptr), all) == 0); // and wrote nothing
  // A row width the array cannot hold is refused before any launch.
  CHECK_THROWS_WITH(bam::scatter_rows(a, static_cast<const std::uint64_t*>(nullptr), 1, 0,
                                      static_cast<const std::uint32_t*>(nullptr)),
                    ContainsSubstring("row width 0"));
  CHECK_THROWS_AS(bam::scatter_rows(a, static_cast<const std::uint64_t*>(nullptr), 1, n + 1,
                                    static_cast<const std::uint32_t*>(nullptr)),
                  bam::error);
}
