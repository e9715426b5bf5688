// SPDX-License-Identifier: MIT
// Under load the GPU runtime slows down, never fails: kernels of up to
// 524,288 threads writing scattered elements and reading them back, caches
// with fewer slots than waiting warps, every page size, every transport.
// Each combination either works with every element verified, or is refused
// before any kernel runs with an error naming the limit. The whole matrix
// is hidden from the default run (tag [long]; CTest label long).
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

using bam_test::counters;
using bam_test::device_counters;
using bam_test::layout;
using Catch::Matchers::ContainsSubstring;

namespace {

//! Thread t's element: a bijection of the thread index onto [0, n) (n a power of two).
__host__ __device__ std::uint64_t scatter(std::uint64_t t, std::uint64_t n) {
  return (t * 0x9e3779b1ull + 12345) & (n - 1);
}
__host__ __device__ std::uint32_t value_of(std::uint64_t i, std::uint32_t salt) {
  return static_cast<std::uint32_t>(bam_test::rnd(i ^ (std::uint64_t{salt} << 40)));
}

enum class op { read, write, mixed };

// Each thread touches `per_thread` scattered elements: reads check the media
// pattern; writes store value_of; mixed does both (odd threads write).
__global__ void scatter_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t threads, int per_thread, op o,
                               std::uint32_t salt, layout l, bool check_reads, counters* c) {
  const std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (t >= threads) return;
  unsigned long long bad = 0;
  for (int k = 0; k < per_thread; ++k) {
    const std::uint64_t i = scatter(t + k * threads, a.size());
    const bool w = o == op::write || (o == op::mixed && (t & 1));
    if (w) {
      a.write(i, value_of(i, salt));
    } else {
      const std::uint32_t v = a[i];
      if (check_reads && v != l.expected(i)) ++bad;
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, static_cast<unsigned long long>(per_thread));
}

// Read back what scatter_kernel wrote (and, mixed, what it left alone).
__global__ void readback_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t threads, int per_thread, op o,
                                std::uint32_t salt, counters* c) {
  const std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (t >= threads) return;
  unsigned long long bad = 0;
  for (int k = 0; k < per_thread; ++k) {
    const std::uint64_t i = scatter(t + k * threads, a.size());
    const bool w = o == op::write || (o == op::mixed && (t & 1));
    if (w && a[i] != value_of(i, salt)) {
      if (bad == 0) atomicMin(&c->first_bad_index, static_cast<unsigned long long>(i));
      ++bad;
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
}

struct combination {
  std::string device;  //!< device string (a file path is filled in)
  std::size_t page;    //!< page size
  std::size_t cache;   //!< cache bytes
  std::uint64_t array; //!< array bytes (a power of two)
  op o;
  std::uint64_t threads;
  int per_thread;
};

std::string describe(const combination& k) {
  const char* names[] = {"read", "write", "mixed"};
  return k.device + ", page " + std::to_string(k.page) + ", cache " + std::to_string(k.cache >> 10) + " KiB, array " +
         std::to_string(k.array >> 20) + " MiB, " + names[static_cast<int>(k.o)] + ", " + std::to_string(k.threads) +
         " threads x " + std::to_string(k.per_thread);
}

//! Run one combination; returns "" when it worked, else why it was refused
//! (a bam::error thrown before any kernel ran). Fails the test on anything else.
std::string run(combination k) {
  const std::string path = "/tmp/bam-overload-" + std::to_string(::getpid()) + ".img";
  const auto pos = k.device.find("FILE");
  if (pos != std::string::npos) k.device.replace(pos, 4, path);
  INFO(describe(k));
  std::optional<bam::storage> s;
  std::optional<bam::page_cache> cache;
  std::optional<bam::array<std::uint32_t>> a;
  try {
    s.emplace(k.device);
    cache.emplace(bam::page_cache_config{.page_size = k.page, .capacity = k.cache});
    a.emplace(*cache, *s, k.array / 4);
  } catch (const bam::error& e) {
    std::remove(path.c_str());
    return e.what();
  }
  const bool null_media = s->spec().media == bam::media_kind::null;
  bam_test::fill_pattern(*s);
  const layout l{0, static_cast<std::uint32_t>(k.page), s->lba_size(), s->controller_count()};
  device_counters c;
  const unsigned threads_per_block = 256;
  const unsigned blocks = static_cast<unsigned>((k.threads + threads_per_block - 1) / threads_per_block);
  const auto t0 = std::chrono::steady_clock::now();
  scatter_kernel<<<blocks, threads_per_block>>>(a->ref(), k.threads, k.per_thread, k.o, 7, l, !null_media, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a->check());
  CHECK(c.get().done == k.threads * k.per_thread);
  CHECK(c.get().bad == 0);
  if (k.o != op::read && !null_media) { // null media keeps no data to read back
    c.reset();
    readback_kernel<<<blocks, threads_per_block>>>(a->ref(), k.threads, k.per_thread, k.o, 7, c.ptr());
    BAM_TEST_SYNC();
    REQUIRE_NOTHROW(a->check());
    INFO("first bad index " << c.get().first_bad_index);
    CHECK(c.get().bad == 0);
    REQUIRE_NOTHROW(cache->flush());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  ok %6.2f s  %s\n", secs, describe(k).c_str());
  a.reset();
  cache.reset();
  s.reset();
  std::remove(path.c_str());
  return "";
}

constexpr std::uint64_t many = 524'288;

} // namespace

// ---- the cases seen by users -------------------------------------------------

TEST_CASE("a file through the CPU engine with 16 KiB pages works", "[gpu][overload]") {
  const auto cache = GENERATE(std::size_t{256} << 20, std::size_t{4} << 20);
  CHECK(run({"emu:file=FILE,size=64M,queues=32,depth=64", 16384, cache, 4ull << 20, op::mixed, many, 1}) == "");
  CHECK(run({"emu:file=FILE,size=64M,queues=32,depth=64", 16384, cache, 64ull << 20, op::write, many, 1}) == "");
}

TEST_CASE("a file through the CPU engine with a cache smaller than the data makes progress", "[gpu][overload]") {
  const auto page = GENERATE(std::size_t{4096}, std::size_t{8192});
  CHECK(run({"emu:file=FILE,size=64M,queues=32,depth=64", page, 32ull << 20, 64ull << 20, op::write, many, 1}) == "");
}

TEST_CASE("fewer cache slots than warps waiting for one: slower, never a timeout", "[gpu][overload]") {
  // 2,048 slots of 8 KiB for 16,384 warps, each lane on a page of its own.
  CHECK(run({"emu-gpu:hbm=256M,queues=128,depth=256", 8192, 16ull << 20, 256ull << 20, op::write, many, 1}) == "");
}

TEST_CASE("settings the runtime cannot serve are refused before a kernel runs, naming the limit", "[gpu][overload]") {
  // Pages smaller than the LBA size.
  CHECK_THAT(run({"emu-gpu:hbm=16M,lba=4096,queues=8,depth=32", 512, 1 << 20, 8ull << 20, op::read, 1024, 1}),
             ContainsSubstring("not a multiple of the LBA size"));
  // Pages larger than the cache supports.
  CHECK_THAT(run({"emu-gpu:hbm=16M,queues=8,depth=32", 128 << 10, 8 << 20, 8ull << 20, op::read, 1024, 1}),
             ContainsSubstring("page size must be a power of two in [512, 65536]"));
  // A cache smaller than one set.
  CHECK_THAT(run({"emu-gpu:hbm=16M,queues=8,depth=32", 65536, 65536, 8ull << 20, op::read, 1024, 1}),
             ContainsSubstring("holds no set"));
  // An array larger than the storage.
  CHECK_THAT(run({"emu-gpu:hbm=16M,queues=8,depth=32", 4096, 1 << 20, 32ull << 20, op::read, 1024, 1}),
             ContainsSubstring("do not fit"));
}

// ---- the matrix --------------------------------------------------------------

namespace {

const char* transports[] = {
    "emu-gpu:hbm=64M,queues=64,depth=128",      "emu-gpu:ram=64M,queues=64,depth=128",
    "emu-gpu:null=64M,queues=64,depth=128",     "emu:file=FILE,size=64M,queues=32,depth=64,threads=4",
    "emu:ram=64M,queues=32,depth=64,threads=4",
};

//! Cache sizes: fewer slots than the warps that wait, a quarter of the data, more than the data.
std::size_t cache_bytes(int which, std::size_t page, std::uint64_t array) {
  switch (which) {
  case 0: return std::max<std::size_t>(64 * page, 8 * page); // 64 slots
  case 1: return array / 4;
  default: return array * 2;
  }
}

} // namespace

TEST_CASE("overload matrix, fast subset", "[gpu][overload][matrix]") {
  const int transport = GENERATE(Catch::Generators::range(0, 5));
  const std::size_t page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{65536});
  const int cache = GENERATE(0, 1);
  const std::uint64_t array = 16ull << 20;
  CHECK(run({transports[transport], page, cache_bytes(cache, page, array), array, op::mixed, 65536, 2}) == "");
}

//! BAM_MATRIX_TRANSPORTS=3,4 runs the whole matrix on those transports only
//! (indices into `transports`); unset: all of them.
bool transport_selected(int t) {
  const char* env = std::getenv("BAM_MATRIX_TRANSPORTS");
  if (env == nullptr || *env == 0) return true;
  for (const char* p = env; *p != 0; ++p)
    if (*p - '0' == t) return true;
  return false;
}

//! BAM_MATRIX_PAGES=16384,65536 runs the whole matrix with those page sizes
//! only; unset: all of them.
bool page_selected(std::size_t page) {
  const char* env = std::getenv("BAM_MATRIX_PAGES");
  if (env == nullptr || *env == 0) return true;
  for (const char* p = env; *p != 0;) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(p, &end, 10);
    if (end == p) break;
    if (v == page) return true;
    p = *end == ',' ? end + 1 : end;
  }
  return false;
}

TEST_CASE("overload matrix, every combination", "[.long][overload][matrix]") {
  const int transport = GENERATE(Catch::Generators::range(0, 5));
  if (!transport_selected(transport)) SKIP("transport " << transport << " not in BAM_MATRIX_TRANSPORTS");
  const std::size_t page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{16384}, std::size_t{65536});
  if (!page_selected(page)) SKIP("page size " << page << " not in BAM_MATRIX_PAGES");
  const int cache = GENERATE(0, 1, 2);
  const op o = GENERATE(op::read, op::write, op::mixed);
  const std::uint64_t threads = GENERATE(std::uint64_t{4096}, many);
  const std::uint64_t array = 32ull << 20;
  CHECK(run({transports[transport], page, cache_bytes(cache, page, array), array, o, threads, 1}) == "");
}
