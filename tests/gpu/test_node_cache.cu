// SPDX-License-Identifier: MIT
// One page cache over two GPUs (`page_cache_config::devices`): its slots are
// spread over both GPUs' memory, each GPU attaches an array over a storage of
// its own on one shared medium, and the node holds one copy of every page:
// a page loaded by one GPU is a hit for the other, a page written by one GPU
// is read by the other without a flush, and pages written by both GPUs at
// once, with evictions, reach the medium whole.
#include "shm_table.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace bam_shm_test;

bool peers(int a, int b) {
  int ab = 0, ba = 0;
  BAM_CUDA_TRY(cudaDeviceCanAccessPeer(&ab, a, b));
  BAM_CUDA_TRY(cudaDeviceCanAccessPeer(&ba, b, a));
  return ab != 0 && ba != 0;
}

// 512-byte pages: a run of the spread cache is 2 MiB (4,096 slots: the
// GPUs' allocation granularity, a 64th of a GPU's 128 MiB), so a 256 MiB
// cache has 64 runs on each GPU.
constexpr std::size_t small_page = 512;
constexpr std::size_t node_cache_bytes = 256ull << 20;

//! Elements `i` with (i / 64) % 2 == g: each 512-byte page is written by both GPUs.
__global__ void write_interleaved(bam::array_ref<std::uint32_t> a, std::uint64_t count, int g, std::uint32_t salt) {
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    if (static_cast<int>((k / 64) % 2) == g) a.write(k, table_word(k, salt));
}

//! Check [first, first + count) of `a` on its GPU; the tally.
tally check_on(bam::array<std::uint32_t>& a, std::uint64_t first, std::uint64_t count, std::uint32_t salt) {
  const bam::device_scope on(a.device());
  device_tally t;
  check_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt, t.buf.get());
  BAM_CUDA_TRY(cudaGetLastError());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  a.check();
  return t.get();
}

} // namespace

TEST_CASE("a cache over two GPUs: slots on both, one copy of a page for both GPUs, writes seen by the other GPU",
          "[node-cache][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  scratch_name n;
  constexpr std::uint64_t words = (64ull << 20) / 4; // 64 MiB: a quarter of the cache
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(words * 4) + ",unlink";
  bam::page_cache cache({.page_size = small_page, .capacity = node_cache_bytes, .devices = {0, 1}});
  CHECK(cache.devices() == std::vector<int>{0, 1});
  CHECK(cache.slot_count() == node_cache_bytes / small_page);
  // Runs of 2 MiB of pages on the GPUs in turn.
  const std::uint64_t run = cache.run_slots();
  CHECK(run * small_page == 2u << 20);
  CHECK(cache.slot_device(0) == 0);
  CHECK(cache.slot_device(run - 1) == 0);
  CHECK(cache.slot_device(run) == 1);
  CHECK(cache.slot_device(2 * run) == 0);
  CHECK(cache.slot_device(cache.slot_count() - 1) == 1);

  bam::storage s0(dev, {.device = 0});
  bam::storage s1(dev, {.device = 1});
  CHECK(s0.medium() == s1.medium());
  std::optional<bam::array<std::uint32_t>> a0_, a1_;
  {
    const bam::device_scope on(1); // the array's own memory is made on its storage's GPU all the same
    a0_.emplace(cache, s0, words);
    a1_.emplace(cache, s1, words);
  }
  bam::array<std::uint32_t>& a0 = *a0_;
  bam::array<std::uint32_t>& a1 = *a1_;
  CHECK(a0.device() == 0);
  CHECK(a1.device() == 1);

  // GPU 0 writes the table; GPU 1 reads it from the cache, without a flush.
  {
    const bam::device_scope on(0);
    write_table<<<grid_blocks, block_threads>>>(a0.ref(), 0, words, 11);
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    a0.check();
  }
  const std::uint64_t pages = words * 4 / small_page;
  const bam::page_cache_counters after_write = cache.counters();
  CHECK(cache.counters(0).misses == after_write.misses);
  CHECK(cache.counters(1).misses == 0);
  tally t = check_on(a1, 0, words, 11);
  CHECK(t.done == words);
  CHECK(t.bad == 0);
  // A page is in the cache once for both GPUs: GPU 1 found (nearly) every
  // page GPU 0 brought in (a set of 8 ways at a quarter full overflows rarely).
  const std::uint64_t misses_1 = cache.counters(1).misses;
  INFO("pages " << pages << ", misses by GPU 0 " << after_write.misses << ", by GPU 1 " << misses_1);
  CHECK(after_write.misses >= pages);
  CHECK(misses_1 < pages / 50);

  // Both GPUs read all of it at once.
  {
    std::vector<device_tally> ts;
    ts.reserve(2);
    for (int g = 0; g < 2; ++g) {
      const bam::device_scope on(g);
      ts.emplace_back();
      check_table<<<grid_blocks, block_threads>>>((g == 0 ? a0 : a1).ref(), 0, words, 11, ts.back().buf.get());
      BAM_CUDA_TRY(cudaGetLastError());
    }
    for (int g = 0; g < 2; ++g) {
      const bam::device_scope on(g);
      BAM_CUDA_TRY(cudaDeviceSynchronize());
      (g == 0 ? a0 : a1).check();
      const tally x = ts[static_cast<std::size_t>(g)].get();
      CHECK(x.done == words);
      CHECK(x.bad == 0);
    }
  }

  // Rows gathered and held by GPU 1 (a row a page: the set counts of holds
  // live on GPU 0, the pages on both).
  {
    constexpr std::uint64_t row = small_page / 4;
    const std::vector<std::uint64_t> ids{3, 70000, 131071, 9, 3};
    const bam::device_scope on(1);
    bam::device_buffer<std::uint64_t> d_ids(ids.size());
    bam::device_buffer<std::uint32_t> d_out(ids.size() * row);
    bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
    bam::gather_rows(a1, d_ids.get(), ids.size(), row, d_out.get()); // the rows' pages are in the cache now
    bam::row_holds<std::uint32_t> holds(a1);
    holds.hold(d_ids.get(), ids.size(), row);
    CHECK(holds.held() == 4); // row 3 twice
    BAM_CUDA_TRY(cudaMemset(d_out.get(), 0, ids.size() * row * 4));
    bam::gather_rows(a1, d_ids.get(), ids.size(), row, d_out.get());
    holds.release();
    a1.check();
    std::vector<std::uint32_t> out(ids.size() * row);
    bam::copy_to_host(out.data(), d_out.get(), out.size());
    std::uint64_t wrong = 0;
    for (std::size_t k = 0; k < ids.size(); ++k)
      for (std::uint64_t j = 0; j < row; ++j)
        wrong += out[k * row + j] != table_word(ids[k] * row + j, 11);
    CHECK(wrong == 0);
  }

  // GPU 1 writes the second half; GPU 0 sees it; a flush from GPU 1's side
  // puts every page on the medium.
  {
    const bam::device_scope on(1);
    write_table<<<grid_blocks, block_threads>>>(a1.ref(), words / 2, words / 2, 12);
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    a1.check();
  }
  t = check_on(a0, words / 2, words / 2, 12);
  CHECK(t.bad == 0);
  a1.flush();
  std::vector<std::uint32_t> medium(words);
  bam::emu::read_media(s0, 0, 0, medium.data(), words * 4);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < words; ++i)
    bad += medium[i] != table_word(i, i < words / 2 ? 11 : 12);
  CHECK(bad == 0);
}

TEST_CASE("a cache over two GPUs: pages written by both GPUs at once while pages are evicted reach the medium whole",
          "[node-cache][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  scratch_name n;
  constexpr std::uint64_t words = (1ull << 30) / 4; // 1 GiB: four times the cache
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(words * 4) + ",unlink";
  bam::page_cache cache({.page_size = small_page, .capacity = node_cache_bytes, .devices = {0, 1}});
  bam::storage s0(dev, {.device = 0});
  bam::storage s1(dev, {.device = 1});
  std::optional<bam::array<std::uint32_t>> a_[2];
  a_[0].emplace(cache, s0, words);
  a_[1].emplace(cache, s1, words);

  // Each page gets words from both GPUs, at once.
  for (int g = 0; g < 2; ++g) {
    const bam::device_scope on(g);
    write_interleaved<<<grid_blocks, block_threads>>>(a_[g]->ref(), words, g, 21);
    BAM_CUDA_TRY(cudaGetLastError());
  }
  for (int g = 0; g < 2; ++g) {
    const bam::device_scope on(g);
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    a_[g]->check();
  }
  const bam::page_cache_counters c = cache.counters();
  INFO("misses " << c.misses << ", write-backs " << c.writebacks);
  CHECK(c.writebacks > 0); // the table does not fit: pages went back while being written
  {
    const bam::device_scope on(0);
    a_[0]->flush();
  }
  // Read back by both GPUs at once (through misses again), and on the host.
  std::vector<device_tally> ts;
  ts.reserve(2);
  for (int g = 0; g < 2; ++g) {
    const bam::device_scope on(g);
    ts.emplace_back();
    check_table<<<grid_blocks, block_threads>>>(a_[g]->ref(), 0, words, 21, ts.back().buf.get());
    BAM_CUDA_TRY(cudaGetLastError());
  }
  for (int g = 0; g < 2; ++g) {
    const bam::device_scope on(g);
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    a_[g]->check();
    const tally x = ts[static_cast<std::size_t>(g)].get();
    INFO("GPU " << g << ": first wrong element " << x.first_bad);
    CHECK(x.done == words);
    CHECK(x.bad == 0);
  }
  std::vector<std::uint32_t> medium(words);
  bam::emu::read_media(s1, 0, 0, medium.data(), words * 4);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < words; ++i)
    bad += medium[i] != table_word(i, 21);
  CHECK(bad == 0);
}

TEST_CASE("a cache over two GPUs of any size holds half of its pages on each GPU, and serves both from either",
          "[node-cache][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  // 4 KiB pages, 768 MiB: less than a GiB for each GPU, and not a power of two.
  constexpr std::size_t page = 4096, capacity = 768ull << 20;
  bam::page_cache cache({.page_size = page, .capacity = capacity, .devices = {0, 1}});
  const std::uint64_t run = cache.run_slots();
  REQUIRE(run != 0);
  std::uint64_t on0 = 0;
  for (std::uint64_t k = 0; k < cache.slot_count(); ++k)
    on0 += cache.slot_part(k) == 0 ? 1 : 0;
  const std::uint64_t on1 = cache.slot_count() - on0;
  INFO("slots " << cache.slot_count() << ", runs of " << run << ": " << on0 << " on GPU 0, " << on1 << " on GPU 1");
  CHECK(on0 + run >= on1);
  CHECK(on1 + run >= on0);
  CHECK(on1 > 0);

  // Each part is in its GPU's memory: the first and last slot of every run.
  const std::uint8_t* data = cache.state()->data();
  std::uint64_t misplaced = 0;
  for (std::uint64_t k = 0; k < cache.slot_count(); k += run)
    for (const std::uint64_t slot : {k, std::min(k + run, cache.slot_count()) - 1}) {
      cudaPointerAttributes at{};
      BAM_CUDA_TRY(cudaPointerGetAttributes(&at, data + slot * page));
      misplaced += at.type != cudaMemoryTypeDevice || at.device != cache.slot_device(slot) ? 1 : 0;
    }
  CHECK(misplaced == 0);

  // GPU 0 writes a 64 MiB table into the cache (its pages land in both
  // parts, all over the runs); GPU 1 reads it there, without a flush, and
  // then GPU 0 too: no two runs share memory.
  scratch_name n;
  constexpr std::uint64_t words = (64ull << 20) / 4;
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(words * 4) + ",unlink";
  bam::storage s0(dev, {.device = 0});
  bam::storage s1(dev, {.device = 1});
  bam::array<std::uint32_t> a0(cache, s0, words);
  bam::array<std::uint32_t> a1(cache, s1, words);
  {
    const bam::device_scope on(0);
    write_table<<<grid_blocks, block_threads>>>(a0.ref(), 0, words, 5);
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    a0.check();
  }
  for (auto* a : {&a1, &a0}) {
    const tally t = check_on(*a, 0, words, 5);
    CHECK(t.done == words);
    CHECK(t.bad == 0);
  }
  CHECK(cache.counters(1).misses < words * 4 / page / 50);
}

TEST_CASE("a cache over two GPUs refuses what it cannot serve, with the reason", "[node-cache][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  scratch_name n;
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(64ull << 20) + ",unlink";
  bam::page_cache cache({.page_size = 4096, .capacity = node_cache_bytes, .devices = {0, 1}});
  bam::storage s0(dev, {.device = 0});
  // An array that does not start on a page boundary.
  try {
    bam::array<std::uint32_t> a(cache, s0, 1024, 1);
    FAIL("an unaligned array was attached");
  } catch (const bam::error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::ContainsSubstring("page boundary"));
  }
  if (gpu_count() >= 3) {
    bam::storage s2(dev, {.device = 2});
    try {
      bam::array<std::uint32_t> a(cache, s2, 1024);
      FAIL("a storage of GPU 2 was attached to a cache over GPUs 0 and 1");
    } catch (const bam::error& e) {
      CHECK_THAT(e.what(), Catch::Matchers::ContainsSubstring("not one of the cache's devices"));
    }
  }
  // A storage of another medium on the other GPU gets pages of its own.
  bam::storage ram1("emu-gpu:ram=64M", {.device = 1});
  CHECK(ram1.medium() != s0.medium());
  bam::array<std::uint32_t> a0(cache, s0, 1024);
  bam::array<std::uint32_t> r1(cache, ram1, 1024);
  {
    const bam::device_scope on(0);
    write_table<<<1, 256>>>(a0.ref(), 0, 1024, 5);
    BAM_CUDA_TRY(cudaDeviceSynchronize());
  }
  {
    const bam::device_scope on(1);
    write_table<<<1, 256>>>(r1.ref(), 0, 1024, 6);
    BAM_CUDA_TRY(cudaDeviceSynchronize());
  }
  CHECK(check_on(a0, 0, 1024, 5).bad == 0);
  CHECK(check_on(r1, 0, 1024, 6).bad == 0);
}

TEST_CASE("a cache over two GPUs: a GPU leaves dirty pages of a medium it has not attached to the GPU that has",
          "[node-cache][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  scratch_name nx, ny;
  constexpr std::uint64_t words = (64ull << 20) / 4; // 64 MiB each: four times the cache
  // One way per set: once GPU 0 has written X, almost every set holds one dirty page of X.
  bam::page_cache cache({.page_size = page_bytes,
                         .capacity = cache_bytes,
                         .ways = 1,
                         .timeout_ns = 200'000'000, // the waits below end in a timeout: keep it short
                         .devices = {0, 1}});
  bam::storage x("emu-gpu:shm=" + nx.name + ",size=" + std::to_string(words * 4), {.device = 0});
  bam::storage y("emu-gpu:shm=" + ny.name + ",size=" + std::to_string(words * 4), {.device = 1});
  bam::array<std::uint32_t> ax(cache, x, words); // medium X: GPU 0 only
  bam::array<std::uint32_t> ay(cache, y, words); // medium Y: GPU 1 only
  {
    const bam::device_scope on(1);
    write_table<<<grid_blocks, block_threads>>>(ay.ref(), 0, words, 32);
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    ay.check();
  }
  cache.flush();
  {
    // The sets end up holding dirty pages of X, which GPU 1 has no queues to write.
    const bam::device_scope on(0);
    write_table<<<grid_blocks, block_threads>>>(ax.ref(), 0, words, 31);
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    ax.check();
  }
  // GPU 1's misses find no victim it may take: they wait, and fail after the
  // deadline, leaving X's pages alone (writing them through GPU 1's table,
  // which has no queues for X, would fault).
  std::string why;
  try {
    // 64 pages, one element per thread: each miss waits one deadline (a
    // thread reading on would wait a deadline per page).
    (void)check_on(ay, 0, 64 * page_bytes / 4, 32);
  } catch (const bam::error& e) {
    why = e.what();
  }
  INFO(why);
  CHECK(why.find("imeout") != std::string::npos);
  // GPU 0 writes them back; then GPU 1 reads Y, and X holds what GPU 0 wrote.
  cache.flush();
  const tally ty = check_on(ay, 0, words, 32);
  CHECK(ty.done == words);
  CHECK(ty.bad == 0);
  const tally tx = check_on(ax, 0, words, 31);
  CHECK(tx.bad == 0);
}

namespace {

//! A bijection of [0, n) (n a power of two): operation u's element.
__host__ __device__ std::uint64_t scatter(std::uint64_t u, std::uint64_t n) {
  return (u * 0x9e3779b1ull + 12345) & (n - 1);
}

//! Operations u in [0, threads * per_thread): element scatter(u) is written
//! by GPU u % 2 (salt 41 + g) and read by the other GPU meanwhile, which
//! must see the original word (salt 40) or the writer's. Counts reads that
//! see anything else.
__global__ void two_gpu_mixed(bam::array_ref<std::uint32_t> a, std::uint64_t threads, int per_thread, int g, tally* t) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (tid >= threads) return;
  unsigned long long bad = 0;
  for (int k = 0; k < per_thread; ++k) {
    const std::uint64_t u = tid + static_cast<std::uint64_t>(k) * threads;
    const std::uint64_t i = scatter(u, a.size());
    if (static_cast<int>(u % 2) == g) {
      a.write(i, table_word(i, 41 + g));
    } else {
      const std::uint32_t v = a[i];
      if (v != table_word(i, 40) && v != table_word(i, 41 + (1 - g))) {
        if (bad == 0) atomicMin(&t->first_bad, static_cast<unsigned long long>(i));
        ++bad;
      }
    }
  }
  atomicAdd(&t->done, static_cast<unsigned long long>(per_thread));
  if (bad) atomicAdd(&t->bad, bad);
}

//! Every element the operations wrote holds its writer's word.
__global__ void two_gpu_readback(bam::array_ref<std::uint32_t> a, std::uint64_t ops, tally* t) {
  unsigned long long bad = 0, done = 0;
  for (std::uint64_t u = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; u < ops;
       u += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t i = scatter(u, a.size());
    if (a[i] != table_word(i, 41 + static_cast<std::uint32_t>(u % 2))) {
      if (bad == 0) atomicMin(&t->first_bad, static_cast<unsigned long long>(i));
      ++bad;
    }
    ++done;
  }
  atomicAdd(&t->done, done);
  if (bad) atomicAdd(&t->bad, bad);
}

struct overload_case {
  std::size_t page, cache;
  std::uint64_t words; //!< the array (a power of two)
  std::uint64_t threads;
  int per_thread;
};

//! Both GPUs of a cache over two GPUs read and write one array at once
//! (two_gpu_mixed), then both read back every written element; a flush puts
//! each on the medium, and a second flush finds nothing left to write.
void two_gpu_overload(const overload_case& k) {
  INFO("page " << k.page << ", cache " << (k.cache >> 20) << " MiB, array " << (k.words >> 18) << " MiB, " << k.threads
               << " threads x " << k.per_thread << " on each GPU");
  scratch_name n;
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(k.words * 4) + ",unlink";
  bam::page_cache cache({.page_size = k.page, .capacity = k.cache, .devices = {0, 1}});
  REQUIRE(cache.run_slots() < cache.slot_count());
  REQUIRE(cache.slot_device(cache.run_slots()) == 1); // slots on both GPUs
  bam::storage s0(dev, {.device = 0});
  bam::storage s1(dev, {.device = 1});
  {
    // The original table, on the medium.
    std::vector<std::uint32_t> chunk(1u << 22);
    for (std::uint64_t first = 0; first < k.words; first += chunk.size()) {
      for (std::uint64_t j = 0; j < chunk.size(); ++j)
        chunk[j] = table_word(first + j, 40);
      bam::emu::write_media(s0, 0, first * 4, chunk.data(), chunk.size() * 4);
    }
  }
  std::optional<bam::array<std::uint32_t>> a_[2];
  a_[0].emplace(cache, s0, k.words);
  a_[1].emplace(cache, s1, k.words);
  const auto on_both = [&](auto&& launch) {
    std::vector<device_tally> ts;
    ts.reserve(2);
    for (int g = 0; g < 2; ++g) {
      const bam::device_scope on(g);
      ts.emplace_back();
      launch(g, ts.back().buf.get());
      BAM_CUDA_TRY(cudaGetLastError());
    }
    std::vector<tally> out;
    for (int g = 0; g < 2; ++g) {
      const bam::device_scope on(g);
      BAM_CUDA_TRY(cudaDeviceSynchronize());
      REQUIRE_NOTHROW(a_[g]->check());
      out.push_back(ts[static_cast<std::size_t>(g)].get());
    }
    return out;
  };
  const unsigned blocks = static_cast<unsigned>((k.threads + block_threads - 1) / block_threads);
  const std::vector<tally> mixed = on_both(
      [&](int g, tally* t) { two_gpu_mixed<<<blocks, block_threads>>>(a_[g]->ref(), k.threads, k.per_thread, g, t); });
  for (int g = 0; g < 2; ++g) {
    INFO("GPU " << g << ": first element read wrong " << mixed[static_cast<std::size_t>(g)].first_bad);
    CHECK(mixed[static_cast<std::size_t>(g)].done == k.threads * k.per_thread);
    CHECK(mixed[static_cast<std::size_t>(g)].bad == 0);
  }
  const std::uint64_t ops = k.threads * static_cast<std::uint64_t>(k.per_thread);
  const std::vector<tally> back =
      on_both([&](int g, tally* t) { two_gpu_readback<<<grid_blocks, block_threads>>>(a_[g]->ref(), ops, t); });
  for (int g = 0; g < 2; ++g) {
    INFO("GPU " << g << ": first written element read back wrong " << back[static_cast<std::size_t>(g)].first_bad);
    CHECK(back[static_cast<std::size_t>(g)].done == ops);
    CHECK(back[static_cast<std::size_t>(g)].bad == 0);
  }
  cache.flush();
  const std::uint64_t written_back = cache.counters().writebacks;
  cache.flush();
  CHECK(cache.counters().writebacks == written_back); // nothing was left dirty
  // The medium: each written element its writer's word, the others the original.
  std::vector<std::uint32_t> medium(k.words);
  bam::emu::read_media(s1, 0, 0, medium.data(), k.words * 4);
  std::vector<std::uint32_t> want(k.words);
  for (std::uint64_t i = 0; i < k.words; ++i)
    want[i] = table_word(i, 40);
  for (std::uint64_t u = 0; u < ops; ++u) {
    const std::uint64_t i = scatter(u, k.words);
    want[i] = table_word(i, 41 + static_cast<std::uint32_t>(u % 2));
  }
  std::uint64_t bad = 0, first = ~0ull;
  for (std::uint64_t i = 0; i < k.words; ++i)
    if (medium[i] != want[i]) {
      if (bad++ == 0) first = i;
    }
  INFO("first wrong element on the medium " << first);
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("overload over two GPUs: both read and write one array at once through a cache over both, with evictions",
          "[node-cache][gpu][overload]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  // 512-byte pages, an array twice the cache (pages go back while both GPUs
  // write them); 4 KiB pages, an array half the cache.
  const overload_case k = GENERATE(overload_case{512, 256ull << 20, (512ull << 20) / 4, 524'288, 16},
                                   overload_case{4096, 2ull << 30, (1ull << 30) / 4, 524'288, 16});
  two_gpu_overload(k);
}

TEST_CASE("overload over two GPUs, small, for the sanitizers", "[node-cache][gpu][overload][sanitize]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  if (!peers(0, 1)) SKIP("GPUs 0 and 1 have no peer access");
  two_gpu_overload({512, 256ull << 20, (512ull << 20) / 4, 16'384, 4});
}
