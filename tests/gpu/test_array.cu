// SPDX-License-Identifier: MIT
// bam::array over the page cache, on the software controller's GPU engine:
// random reads with eviction, writes and write-back, shared caches, range
// copies, readers, page handles, every element size, bad indices and device errors.
#include "test_util.cuh"

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cstdio>
#include <string>

using bam_test::counters;
using bam_test::device_counters;
using bam_test::layout;
using bam_test::rnd;

namespace {

__global__ void random_read_kernel(bam::array_ref<std::uint32_t> a, layout l, int iters, std::uint64_t seed,
                                   counters* c) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  unsigned long long bad = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t i = rnd(seed ^ (tid * 1315423911ull + it)) % a.size();
    const std::uint32_t v = a[i];
    if (v != l.expected(i)) {
      if (bad == 0) atomicMin(&c->first_bad_index, static_cast<unsigned long long>(i));
      ++bad;
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, static_cast<unsigned long long>(iters));
}

__global__ void multi_array_kernel(bam::array_ref<std::uint32_t> a, layout la, bam::array_ref<std::uint32_t> b,
                                   layout lb, bam::array_ref<std::uint32_t> c3, layout lc, int iters, counters* c) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  unsigned long long bad = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t r = rnd(tid * 7919 + it);
    switch (r % 3) {
    case 0: {
      const auto i = (r >> 8) % a.size();
      bad += a[i] != la.expected(i);
      break;
    }
    case 1: {
      const auto i = (r >> 8) % b.size();
      bad += b[i] != lb.expected(i);
      break;
    }
    default: {
      const auto i = (r >> 8) % c3.size();
      bad += c3[i] != lc.expected(i);
      break;
    }
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, static_cast<unsigned long long>(iters));
}

__device__ std::uint32_t written_value(std::uint64_t i, std::uint32_t salt) {
  return static_cast<std::uint32_t>(rnd(i * 31 + salt));
}

__global__ void write_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, written_value(i, salt));
}

__global__ void verify_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt, counters* c) {
  unsigned long long bad = 0, done = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    bad += a[i] != written_value(i, salt);
    ++done;
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, done);
}

// Each warp copies a random range (crossing pages) and checks it.
__global__ void copy_range_kernel(bam::array_ref<std::uint32_t> a, layout l, std::uint32_t* scratch,
                                  std::uint32_t max_len, int iters, counters* c) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  std::uint32_t* out = scratch + warp * max_len;
  unsigned long long bad = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t r = rnd(warp * 104729 + it);
    const std::uint32_t len = 1 + static_cast<std::uint32_t>(r % max_len);
    const std::uint64_t begin = (r >> 20) % (a.size() - len);
    if (!a.copy_to(begin, len, out)) ++bad;
    __syncwarp();
    for (std::uint32_t k = lane; k < len; k += 32)
      bad += out[k] != l.expected(begin + k);
    __syncwarp();
  }
  if (bad) atomicAdd(&c->bad, bad);
  if (lane == 0) atomicAdd(&c->done, static_cast<unsigned long long>(iters));
}

// Each warp walks a random stretch with a reader (pages held between accesses).
__global__ void reader_kernel(bam::array_ref<std::uint32_t> a, layout l, std::uint32_t stretch, int iters,
                              counters* c) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  unsigned long long bad = 0, done = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t begin = rnd(warp * 7 + it) % (a.size() - stretch);
    auto r = a.reader();
    for (std::uint32_t k = lane; k < stretch; k += 32) {
      bad += r[begin + k] != l.expected(begin + k);
      ++done;
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, done);
}

//! Every thread prefetches the page of element `page * per_page + 7` of its
//! own page (pages `tid * stride`), except every eighth lane, which names an
//! index past the end; then reads that element. Counts the prefetches that
//! said the page arrived (`done`), wrong answers (`errors`: an arrival for a
//! bad index, none for a good one) and wrong values (`bad`).
__global__ void prefetch_kernel(bam::array_ref<std::uint32_t> a, layout l, std::uint64_t per_page, std::uint64_t stride,
                                counters* c) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const bool past_end = tid % 8 == 7;
  const std::uint64_t i = past_end ? a.size() + tid : (tid * stride) * per_page + 7;
  std::uint32_t slot = ~0u;
  const bool arrived = a.prefetch(i, true, &slot);
  const bool nothing_wanted = a.prefetch(i, false, nullptr);
  if (arrived) atomicAdd(&c->done, 1ull);
  if (arrived == past_end || nothing_wanted || (arrived && slot >= bam::detail::ref_access::cache(a).slot_count()))
    atomicAdd(&c->errors, 1ull);
  if (!past_end && a[i] != l.expected(i)) atomicAdd(&c->bad, 1ull);
}

__global__ void index_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t i, std::uint32_t* out) {
  out[threadIdx.x] = a[i + threadIdx.x];
}

std::string dev_string(const char* media, std::uint64_t mib, std::uint32_t ssds, const char* extra = "") {
  return std::string("emu-gpu:") + media + "=" + std::to_string(mib) + "M,ssds=" + std::to_string(ssds) +
         ",queues=128,depth=256" + extra;
}

} // namespace

TEST_CASE("random reads: working set 4x the cache, >= 100,000 threads", "[gpu][array]") {
  const auto media = GENERATE(as<std::string>{}, "hbm", "ram");
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{65536});
  const std::uint32_t ssds = page == 4096 ? 2 : 1;
  INFO("media " << media << ", page " << page << ", controllers " << ssds);
  bam::storage s(dev_string(media.c_str(), 64, ssds));
  bam_test::fill_pattern(s);
  const std::uint64_t array_bytes = 64ull << 20;   // spread over the controllers
  const std::size_t cache_bytes = array_bytes / 4; // working set: 4x the cache
  bam::page_cache cache({.page_size = page, .capacity = cache_bytes});
  bam::array<std::uint32_t> a(cache, s, array_bytes / 4);
  const layout l{0, static_cast<std::uint32_t>(page), s.lba_size(), ssds};
  device_counters c;
  // 131,072 threads. With 64 KiB pages each miss moves 16x the bytes: fewer
  // rounds keep the volume (and so the run time) in line with the others.
  const int blocks = 1024, threads = 128, iters = page >= 65536 ? 2 : 16;
  random_read_kernel<<<blocks, threads>>>(a.ref(), l, iters, 42, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  const counters r = c.get();
  CHECK(r.done == static_cast<unsigned long long>(blocks) * threads * iters);
  INFO("first bad index " << r.first_bad_index);
  CHECK(r.bad == 0);
  const auto k = cache.counters();
  CHECK(k.misses > cache.slot_count()); // the working set does not fit: pages were evicted and reloaded
  CHECK(k.writebacks == 0);
}

TEST_CASE("small random read for the sanitizers", "[gpu][array][sanitize]") {
  bam::storage s("emu-gpu:hbm=4M,ssds=2,queues=8,depth=32");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10}); // 16 pages: evictions
  bam::array<std::uint32_t> a(cache, s, (256ull << 10) / 4);
  const layout l{0, 4096, 512, 2};
  device_counters c;
  random_read_kernel<<<4, 64>>>(a.ref(), l, 2, 7, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  write_kernel<<<4, 64>>>(a.ref(), 3);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  c.reset();
  verify_kernel<<<4, 64>>>(a.ref(), 3, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  REQUIRE_NOTHROW(cache.flush());
}

TEST_CASE("writes, eviction write-back, flush and reread", "[gpu][array]") {
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{65536});
  const std::uint32_t ssds = 2;
  INFO("page " << page);
  bam::storage s(dev_string("hbm", 32, ssds));
  bam_test::fill_pattern(s);
  const std::uint64_t n = (64ull << 20) / 4; // 64 MiB over 2 controllers
  bam::page_cache cache({.page_size = page, .capacity = 16ull << 20});
  bam::array<std::uint32_t> a(cache, s, n);
  write_kernel<<<512, 256>>>(a.ref(), 77);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(cache.counters().writebacks > 0); // 4x the cache written: dirty pages were evicted
  device_counters c;
  verify_kernel<<<512, 256>>>(a.ref(), 77, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().done == n);
  CHECK(c.get().bad == 0);
  // Flush, then check the media itself from the host.
  REQUIRE_NOTHROW(cache.flush());
  std::vector<std::uint32_t> media(s.blocks_per_controller() * 512 / 4);
  const std::uint64_t per_page = page / 4;
  std::uint64_t bad = 0;
  for (std::uint32_t ctrl = 0; ctrl < ssds; ++ctrl) {
    bam::emu::read_media(s, ctrl, 0, media.data(), media.size() * 4);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t p = i / per_page;
      if (p % ssds != ctrl) continue;
      const std::uint64_t off = (p / ssds) * per_page + i % per_page;
      bad += media[off] != static_cast<std::uint32_t>(rnd(i * 31 + 77));
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("many arrays share one cache", "[gpu][array]") {
  bam::storage s(dev_string("ram", 64, 2));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 8ull << 20});
  // Three arrays at different places of the same namespaces (page aligned: 8 blocks).
  const std::uint64_t n = (16ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n, 0);
  bam::array<std::uint32_t> b(cache, s, n, 20000);
  bam::array<std::uint32_t> c3(cache, s, n / 2 + 123, 50000);
  const layout la{0, 4096, 512, 2}, lb{20000, 4096, 512, 2}, lc{50000, 4096, 512, 2};
  device_counters c;
  multi_array_kernel<<<512, 256>>>(a.ref(), la, b.ref(), lb, c3.ref(), lc, 8, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(b.check());
  REQUIRE_NOTHROW(c3.check());
  CHECK(c.get().done == 512ull * 256 * 8);
  CHECK(c.get().bad == 0);
}

TEST_CASE("warp-cooperative range copies", "[gpu][array]") {
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096});
  bam::storage s(dev_string("hbm", 64, 4));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = page, .capacity = 16ull << 20});
  bam::array<std::uint32_t> a(cache, s, (256ull << 20) / 4);
  const layout l{0, static_cast<std::uint32_t>(page), 512, 4};
  const std::uint32_t max_len = 5000;
  const int blocks = 256, threads = 128;
  bam::device_buffer<std::uint32_t> scratch(static_cast<std::size_t>(blocks) * threads / 32 * max_len);
  device_counters c;
  copy_range_kernel<<<blocks, threads>>>(a.ref(), l, scratch.get(), max_len, 4, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  CHECK(c.get().done == static_cast<unsigned long long>(blocks) * threads / 32 * 4);
}

namespace {

//! 128 MiB over two controllers behind a 4 MiB cache: walks through it evict all the time.
struct eviction_walk {
  explicit eviction_walk(std::size_t page)
      : s(filled(dev_string("hbm", 64, 2))), cache({.page_size = page, .capacity = 4ull << 20}),
        a(cache, s, (128ull << 20) / 4), l{0, static_cast<std::uint32_t>(page), 512, 2} {}
  static bam::storage filled(const std::string& device) {
    bam::storage st(device);
    bam_test::fill_pattern(st);
    return st;
  }
  bam::storage s;
  bam::page_cache cache;
  bam::array<std::uint32_t> a;
  layout l;
};

} // namespace

TEST_CASE("readers walking through pages see the right data under eviction", "[gpu][array]") {
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{16384});
  eviction_walk w(page);
  auto& a = w.a;
  const layout& l = w.l;
  device_counters c;
  reader_kernel<<<256, 256>>>(a.ref(), l, 3000, 4, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  CHECK(c.get().done == 256ull * 256 / 32 * 3000 * 4);
}

namespace {

// Lanes 16..31 read page b and then leave the loop; lanes 0..15 go on to
// page c. With a cache of one slot, page c needs the slot of page b: a
// reader that kept its page between accesses would leave it pinned by lanes
// parked at the loop's exit, and lanes 0..15 would wait for it until the
// deadline.
__global__ void reader_early_exit_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t pb, std::uint64_t pc,
                                         std::uint32_t per_page, std::uint32_t* out) {
  const unsigned lane = threadIdx.x % 32;
  auto r = a.reader();
  for (int step = 0; step < 2; ++step) {
    if (step == 0) {
      if (lane >= 16) out[lane] = r[pb * per_page + lane];
      continue;
    }
    if (lane >= 16) break;
    out[lane] = r[pc * per_page + lane];
  }
}

} // namespace

TEST_CASE("a reader's lanes that leave a loop do not keep the rest of the warp from the cache",
          "[gpu][array][sanitize]") {
  bam::storage s(dev_string("hbm", 16, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 4096, .ways = 1, .timeout_ns = 2'000'000'000ull});
  bam::array<std::uint32_t> a(cache, s, (4ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  bam::device_buffer<std::uint32_t> out(32);
  reader_early_exit_kernel<<<1, 32>>>(a.ref(), 5, 7, 1024, out.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  std::vector<std::uint32_t> got(32);
  bam::copy_to_host(got.data(), out.get(), got.size());
  for (unsigned lane = 0; lane < 32; ++lane)
    CHECK(got[lane] == l.expected((lane < 16 ? 7 : 5) * 1024ull + lane));
}

namespace {

// Each warp walks a random stretch page by page with a page handle per page;
// the lanes read that page's elements of the stretch (a stretch's first and
// last pages leave some lanes without one: the warp diverges inside the
// handle's scope). With `use_span`, a held page is read through its span.
__global__ void page_walk_kernel(bam::array_ref<std::uint32_t> a, layout l, std::uint32_t stretch, int iters,
                                 counters* c, unsigned long long* pinned, bool use_span) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t per_page = l.page_size / 4;
  unsigned long long bad = 0, done = 0, held = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t begin = rnd(warp * 7 + it) % (a.size() - stretch);
    for (std::uint64_t p0 = begin; p0 < begin + stretch; p0 = (p0 / per_page + 1) * per_page) {
      const std::uint64_t end =
          (p0 / per_page + 1) * per_page < begin + stretch ? (p0 / per_page + 1) * per_page : begin + stretch;
      auto pg = a.page(p0);
      held += lane == 0 && pg.pinned();
      const bam::page_span<std::uint32_t> sp = use_span ? pg.span() : bam::page_span<std::uint32_t>{};
      for (std::uint64_t i = p0 + lane; i < end; i += 32) {
        bad += (sp.size() != 0 ? sp[i - sp.first()] : pg[i]) != l.expected(i);
        ++done;
      }
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
  atomicAdd(&c->done, done);
  if (held) atomicAdd(pinned, held);
}

// The same walk's pages counted on the host.
std::uint64_t pages_walked(std::uint64_t begin, std::uint64_t stretch, std::uint64_t per_page) {
  return (begin + stretch - 1) / per_page - begin / per_page + 1;
}

} // namespace

TEST_CASE("page handles walking through pages see the right data under eviction, read by index and by span",
          "[gpu][array]") {
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{16384});
  const bool use_span = GENERATE(false, true);
  INFO((use_span ? "through spans" : "by index"));
  eviction_walk w(page);
  auto& a = w.a;
  const layout& l = w.l;
  device_counters c;
  bam::device_buffer<unsigned long long> pinned(1);
  const unsigned long long zero = 0;
  bam::copy_to_device(pinned.get(), &zero, 1);
  const int blocks = 256, threads = 256, iters = 4;
  const std::uint32_t stretch = 3000;
  page_walk_kernel<<<blocks, threads>>>(a.ref(), l, stretch, iters, c.ptr(), pinned.get(), use_span);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  CHECK(c.get().done == static_cast<unsigned long long>(blocks) * threads / 32 * stretch * iters);
  // Nearly every handle holds its page (none would if the pin after a miss never took).
  std::uint64_t handles = 0;
  for (std::uint64_t warp = 0; warp < static_cast<std::uint64_t>(blocks) * threads / 32; ++warp)
    for (int it = 0; it < iters; ++it)
      handles += pages_walked(bam_test::rnd(warp * 7 + it) % (a.size() - stretch), stretch, page / 4);
  unsigned long long held = 0;
  bam::copy_to_host(&held, pinned.get(), 1);
  INFO(held << " of " << handles << " page handles held their page");
  CHECK(held * 2 > handles);
  CHECK(held <= handles);
}

namespace {

// With a cache of one slot: lanes 16..31 leave the first handle's loop early
// (parked, still inside its scope) while lanes 0..15 read on; the handle's
// end lets the slot go, so the second handle's page (same set) can load.
__global__ void page_early_exit_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t pb, std::uint64_t pc,
                                       std::uint32_t per_page, layout l, std::uint32_t* out, counters* c,
                                       bool use_span) {
  const unsigned lane = threadIdx.x % 32;
  unsigned long long bad = 0;
  {
    auto pg = a.page(pb * per_page);
    bad += !pg.pinned();
    const bam::page_span<std::uint32_t> sp = use_span ? pg.span() : bam::page_span<std::uint32_t>{};
    bad += use_span && (sp.size() != per_page || sp.first() != pb * per_page);
    for (std::uint32_t k = lane; k < per_page; k += 32) {
      if (lane >= 16 && k >= 64) break;
      bad += (use_span ? sp[k] : pg[pb * per_page + k]) != l.expected(pb * per_page + k);
    }
  }
  {
    auto pg = a.page(pc * per_page + lane);
    bad += !pg.pinned();
    out[lane] = pg[pc * per_page + lane];
  }
  if (bad) atomicAdd(&c->bad, bad);
}

template <class T>
__global__ void page_index_kernel(bam::array_ref<T> a, std::uint64_t i, T* out, unsigned* pinned) {
  auto pg = a.page(i + threadIdx.x);
  out[threadIdx.x] = pg[i + threadIdx.x];
  pinned[threadIdx.x] = pg.pinned();
}

} // namespace

TEST_CASE("a page handle's lanes that leave a loop early do not keep its page pinned past its scope",
          "[gpu][array][sanitize]") {
  bam::storage s(dev_string("hbm", 16, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 4096, .ways = 1, .timeout_ns = 2'000'000'000ull});
  bam::array<std::uint32_t> a(cache, s, (4ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  bam::device_buffer<std::uint32_t> out(32);
  device_counters c;
  const bool use_span = GENERATE(false, true);
  page_early_exit_kernel<<<1, 32>>>(a.ref(), 5, 7, 1024, l, out.get(), c.ptr(), use_span);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  std::vector<std::uint32_t> got(32);
  bam::copy_to_host(got.data(), out.get(), got.size());
  for (unsigned lane = 0; lane < 32; ++lane)
    CHECK(got[lane] == l.expected(7 * 1024ull + lane));
}

TEST_CASE("a page handle over a bad index holds nothing and reports the index", "[gpu][array]") {
  bam::storage s("emu-gpu:hbm=16M,queues=4,depth=64");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  bam::array<std::uint32_t> a(cache, s, 1000);
  const layout l{0, 4096, 512, 1};
  bam::device_buffer<std::uint32_t> out(32);
  bam::device_buffer<unsigned> pinned(32);
  page_index_kernel<<<1, 32>>>(a.ref(), 990, out.get(), pinned.get()); // lanes 10.. are out of range
  BAM_TEST_SYNC();
  bam_test::require_bad_index(a, 1000, 1022);
  std::vector<std::uint32_t> got(32);
  std::vector<unsigned> held(32);
  bam::copy_to_host(got.data(), out.get(), got.size());
  bam::copy_to_host(held.data(), pinned.get(), held.size());
  for (unsigned lane = 0; lane < 32; ++lane) {
    CHECK(held[lane] == 0); // all or none: one bad index, no lane holds its page
    CHECK(got[lane] == (lane < 10 ? l.expected(990 + lane) : 0u));
  }
  // In range, the same handle holds its page and reports nothing.
  page_index_kernel<<<1, 32>>>(a.ref(), 900, out.get(), pinned.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  bam::copy_to_host(got.data(), out.get(), got.size());
  bam::copy_to_host(held.data(), pinned.get(), held.size());
  for (unsigned lane = 0; lane < 32; ++lane) {
    CHECK(held[lane] == 1);
    CHECK(got[lane] == l.expected(900 + lane));
  }
}

namespace {

// A handle on page 0 (every lane), read on its page and off it (page 1,
// served as a[j]).
__global__ void page_off_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t per_page, std::uint32_t* out,
                                unsigned* pinned) {
  const unsigned lane = threadIdx.x % 32;
  auto pg = a.page(lane);
  pinned[lane] = pg.pinned();
  out[lane] = pg[lane];
  out[32 + lane] = pg[per_page + lane];
}

// A handle on the array's last, partial page, read past the array's end.
__global__ void page_past_end_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t* out, unsigned* pinned) {
  const unsigned lane = threadIdx.x % 32;
  auto pg = a.page(a.size() - 1 - lane);
  pinned[lane] = pg.pinned();
  out[lane] = pg[a.size() + lane];
}

} // namespace

TEST_CASE("a page handle reads off its page as a[j], and past the array's end as a bad index", "[gpu][array]") {
  bam::storage s("emu-gpu:hbm=16M,queues=4,depth=64");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  const std::uint64_t n = 2 * 1024 + 100; // three pages, the last one partial
  bam::array<std::uint32_t> a(cache, s, n);
  const layout l{0, 4096, 512, 1};
  bam::device_buffer<std::uint32_t> out(64);
  bam::device_buffer<unsigned> pinned(32);
  std::vector<std::uint32_t> got(64);
  std::vector<unsigned> held(32);
  page_off_kernel<<<1, 32>>>(a.ref(), 1024, out.get(), pinned.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  bam::copy_to_host(got.data(), out.get(), got.size());
  bam::copy_to_host(held.data(), pinned.get(), held.size());
  for (unsigned lane = 0; lane < 32; ++lane) {
    CHECK(held[lane] == 1);
    CHECK(got[lane] == l.expected(lane));
    CHECK(got[32 + lane] == l.expected(1024 + lane));
  }
  page_past_end_kernel<<<1, 32>>>(a.ref(), out.get(), pinned.get());
  BAM_TEST_SYNC();
  bam_test::require_bad_index(a, n, n + 32);
  bam::copy_to_host(got.data(), out.get(), 32);
  bam::copy_to_host(held.data(), pinned.get(), held.size());
  for (unsigned lane = 0; lane < 32; ++lane) {
    CHECK(held[lane] == 1); // the page itself is in range
    CHECK(got[lane] == 0u);
  }
}

TEST_CASE("prefetch brings a warp's pages in together and records nothing for bad indices", "[gpu][array][sanitize]") {
  bam::storage s("emu-gpu:hbm=8M,ssds=2,queues=8,depth=64");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 8 << 20}); // the whole array: nothing is evicted
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  const layout l{0, 4096, 512, 2};
  device_counters c;
  const std::uint64_t threads = 256, good = threads - threads / 8;
  const auto before = cache.counters();
  prefetch_kernel<<<4, 64>>>(a.ref(), l, 1024, 3, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check()); // the bad indices were only prefetched, never read
  const auto after = cache.counters();
  const counters got = c.get();
  CHECK(got.done == good);
  CHECK(got.errors == 0);
  CHECK(got.bad == 0);
  // Each good lane's page was loaded once, by the prefetch: the read hit.
  CHECK(after.misses - before.misses == good);
}

namespace {

//! Warp w takes pages w, w + warps, ...: reads each whole page with a[i]
//! (the warp on one page), copies it with copy_to, reads it through a page
//! handle, and looks it up both ways: `pin` by one lane (a scan of the set)
//! and `pin_warp` (a way per lane), which must agree. done: pages looked up
//! and found; errors: lookups that disagree; `high`: pages found in way 32
//! or above.
__global__ void one_page_warps_kernel(bam::array_ref<std::uint32_t> a, layout l, std::uint64_t pages,
                                      std::uint32_t* scratch, counters* c, unsigned long long* high_ways) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t per_page = a.elements_per_page();
  std::uint32_t* out = scratch + warp * per_page;
  unsigned long long bad = 0, found = 0, disagree = 0, high = 0;
  for (std::uint64_t p = warp; p < pages; p += warps) {
    const std::uint64_t base = p * per_page;
    for (std::uint64_t k = lane; k < per_page; k += 32)
      bad += a[base + k] != l.expected(base + k);
    a.copy_to(base, per_page, out);
    __syncwarp();
    for (std::uint64_t k = lane; k < per_page; k += 32)
      bad += out[k] != l.expected(base + k);
    __syncwarp();
    {
      auto pg = a.page(base + lane);
      for (std::uint64_t k = lane; k < per_page; k += 32)
        bad += pg[base + k] != l.expected(base + k);
    }
    const bam::page_cache_ref& cache = bam::detail::ref_access::cache(a);
    const std::uint64_t key = bam::detail::ref_access::key_of(a, base);
    bam::pin_result one{0, bam::pin_state::miss};
    if (lane == 0) one = cache.pin(key, false);
    const bam::pin_result all = cache.pin_warp(key, 0, 0);
    if (lane == 0) {
      const bool hit1 = one.state == bam::pin_state::hit, hit2 = all.state == bam::pin_state::hit;
      disagree += hit1 != hit2 || (hit1 && one.slot != all.slot);
      found += hit2;
      high += hit2 && all.slot % cache.ways() >= 32;
      if (hit1) cache.release(one.slot);
      if (hit2) cache.release(all.slot);
    }
  }
  if (bad) atomicAdd(&c->bad, bad);
  if (found) atomicAdd(&c->done, found);
  if (disagree) atomicAdd(&c->errors, disagree);
  if (high) atomicAdd(high_ways, high);
}

} // namespace

TEST_CASE("a warp on one page finds it in any way of its set: 1 8 and 64 ways", "[gpu][array]") {
  const std::uint32_t ways = GENERATE(1u, 8u, 64u);
  bam::storage s(dev_string("hbm", 32, 1));
  bam_test::fill_pattern(s);
  // 16 sets; the pages fit the cache but not evenly its sets, so some are
  // evicted while others stay: every lookup must agree either way.
  bam::page_cache cache({.page_size = 4096, .capacity = 16ull * ways * 4096, .ways = ways});
  bam::array<std::uint32_t> a(cache, s, (32ull << 20) / 4);
  const std::uint64_t pages = 12ull * ways;
  bam::device_buffer<std::uint32_t> scratch(8 * 1024);
  bam::device_buffer<unsigned long long> high(1);
  const unsigned long long zero = 0;
  bam::copy_to_device(high.get(), &zero, 1);
  device_counters c;
  one_page_warps_kernel<<<8, 32>>>(a.ref(), layout{0, 4096, 512, 1}, pages, scratch.get(), c.ptr(), high.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  const counters got = c.get();
  INFO(ways << " ways");
  CHECK(got.bad == 0);
  CHECK(got.errors == 0);
  CHECK(got.done >= pages / 2); // most pages are still there when looked up
  unsigned long long in_high_ways = 0;
  bam::copy_to_host(&in_high_ways, high.get(), 1);
  if (ways == 64) CHECK(in_high_ways > 0); // the warp's second round of ways was used
}

TEST_CASE("a cache with one way per set", "[gpu][array]") {
  bam::storage s(dev_string("hbm", 32, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 2ull << 20, .ways = 1});
  bam::array<std::uint32_t> a(cache, s, (32ull << 20) / 4);
  device_counters c;
  random_read_kernel<<<512, 128>>>(a.ref(), layout{0, 4096, 512, 1}, 8, 3, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  write_kernel<<<256, 256>>>(a.ref(), 5);
  BAM_TEST_SYNC();
  c.reset();
  verify_kernel<<<256, 256>>>(a.ref(), 5, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  CHECK(c.get().done == (32ull << 20) / 4);
}

// ---- every element size ------------------------------------------------------

namespace {

struct pair16 {
  std::uint64_t a, b;
};
struct vec32 {
  std::uint32_t w[8];
};

//! The bytes element i holds on the media, by the layout (element size E).
template <class T>
__host__ __device__ T expected_element(const layout& l, std::uint64_t i) {
  unsigned char bytes[sizeof(T)];
  for (std::uint32_t k = 0; k < sizeof(T); ++k) {
    // Byte k of element i is byte (i * E + k) of the array.
    const std::uint64_t b = i * sizeof(T) + k;
    layout l4 = l;
    l4.elem = 4;
    const std::uint32_t w = l4.word(b / 4, 0);
    bytes[k] = static_cast<unsigned char>(w >> (8 * (b % 4)));
  }
  T t;
  memcpy(&t, bytes, sizeof(T));
  return t;
}
template <class T>
__host__ __device__ T written_element(std::uint64_t i) {
  unsigned char bytes[sizeof(T)];
  for (std::uint32_t k = 0; k < sizeof(T); ++k)
    bytes[k] = static_cast<unsigned char>(rnd(i * 131 + k) >> 7);
  T t;
  memcpy(&t, bytes, sizeof(T));
  return t;
}
template <class T>
__host__ __device__ bool same(const T& x, const T& y) {
  const auto* a = reinterpret_cast<const unsigned char*>(&x);
  const auto* b = reinterpret_cast<const unsigned char*>(&y);
  for (std::size_t k = 0; k < sizeof(T); ++k)
    if (a[k] != b[k]) return false;
  return true;
}

template <class T>
__global__ void element_read_kernel(bam::array_ref<T> a, layout l, counters* c) {
  unsigned long long bad = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    bad += !same(a[i], expected_element<T>(l, i));
  if (bad) atomicAdd(&c->bad, bad);
}
template <class T>
__global__ void element_write_kernel(bam::array_ref<T> a) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    if (i % 3 != 0) a.write(i, written_element<T>(i));
}
template <class T>
__global__ void element_check_kernel(bam::array_ref<T> a, layout l, T* scratch, counters* c) {
  // Every element through a reader and through page handles, and every 1000-element range through copy_to.
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  constexpr std::uint64_t chunk = 1000;
  unsigned long long bad = 0;
  T* out = scratch + warp * chunk;
  for (std::uint64_t begin = warp * chunk; begin < a.size(); begin += warps * chunk) {
    const std::uint64_t len = a.size() - begin < chunk ? a.size() - begin : chunk;
    auto r = a.reader();
    for (std::uint64_t k = lane; k < ((len + 31) / 32) * 32; k += 32) {
      const std::uint64_t i = begin + (k < len ? k : len - 1);
      const T want = i % 3 != 0 ? written_element<T>(i) : expected_element<T>(l, i);
      bad += !same(r[i], want);
    }
    r.forget();
    // Every element again, through a page handle per 32 elements (two pages where a chunk crosses one).
    for (std::uint64_t k = lane; k < ((len + 31) / 32) * 32; k += 32) {
      const std::uint64_t i = begin + (k < len ? k : len - 1);
      const T want = i % 3 != 0 ? written_element<T>(i) : expected_element<T>(l, i);
      auto pg = a.page(i);
      bad += !same(pg[i], want);
    }
    a.copy_to(begin, len, out);
    __syncwarp();
    for (std::uint64_t k = lane; k < len; k += 32) {
      const std::uint64_t i = begin + k;
      bad += !same(out[k], i % 3 != 0 ? written_element<T>(i) : expected_element<T>(l, i));
    }
    __syncwarp();
  }
  if (bad) atomicAdd(&c->bad, bad);
}

} // namespace

TEMPLATE_TEST_CASE("every element size: reads, writes, readers, page handles and range copies",
                   "[gpu][array][elements]", std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t, pair16, vec32) {
  using T = TestType;
  bam::storage s(dev_string("hbm", 16, 2));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1ull << 20}); // a quarter of the data
  const std::uint64_t n = (4ull << 20) / sizeof(T) + 7;               // not a whole number of pages
  bam::array<T> a(cache, s, n, 64);
  layout l{64, 4096, 512, 2};
  l.elem = sizeof(T);
  device_counters c;
  element_read_kernel<T><<<256, 256>>>(a.ref(), l, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  element_write_kernel<T><<<256, 256>>>(a.ref());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  const int blocks = 64, threads = 128;
  bam::device_buffer<T> scratch(static_cast<std::size_t>(blocks) * threads / 32 * 1000);
  c.reset();
  element_check_kernel<T><<<blocks, threads>>>(a.ref(), l, scratch.get(), c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  // On the media, after a flush: written elements and untouched ones.
  REQUIRE_NOTHROW(cache.flush());
  std::vector<unsigned char> media(s.blocks_per_controller() * 512);
  std::vector<unsigned char> other(media.size());
  bam::emu::read_media(s, 0, 0, media.data(), media.size());
  bam::emu::read_media(s, 1, 0, other.data(), other.size());
  std::uint64_t bad = 0;
  const std::uint64_t per_page = 4096 / sizeof(T);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t p = i / per_page;
    const auto& m = p % 2 == 0 ? media : other;
    const std::uint64_t off = 64 * 512 + (p / 2) * 4096 + (i % per_page) * sizeof(T);
    T got;
    std::memcpy(&got, m.data() + off, sizeof(T));
    bad += !same(got, i % 3 != 0 ? written_element<T>(i) : expected_element<T>(l, i));
  }
  CHECK(bad == 0);
}

TEST_CASE("arrays move; a moved-from array detaches nothing", "[gpu][array]") {
  bam::storage s(dev_string("hbm", 8, 1));
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  std::vector<bam::array<std::uint32_t>> arrays;
  arrays.emplace_back(cache, s, (1ull << 20) / 4, 0);
  arrays.emplace_back(cache, s, (1ull << 20) / 4, 4096);
  bam::array<std::uint32_t> moved = std::move(arrays[0]);
  device_counters c;
  random_read_kernel<<<64, 128>>>(moved.ref(), layout{0, 4096, 512, 1}, 4, 1, c.ptr());
  random_read_kernel<<<64, 128>>>(arrays[1].ref(), layout{4096, 4096, 512, 1}, 4, 2, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(moved.check());
  REQUIRE_NOTHROW(arrays[1].check());
  CHECK(c.get().bad == 0);
  arrays.clear(); // the moved-from one too: no double detach
  random_read_kernel<<<64, 128>>>(moved.ref(), layout{0, 4096, 512, 1}, 4, 3, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(moved.check());
  CHECK(c.get().bad == 0);
}

TEST_CASE("a bad index is recorded and check() throws with the index", "[gpu][array][sanitize]") {
  bam::storage s("emu-gpu:hbm=4M,queues=4,depth=16");
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  bam::array<std::uint32_t> a(cache, s, 1000);
  bam::device_buffer<std::uint32_t> out(32);
  index_kernel<<<1, 32>>>(a.ref(), 990, out.get()); // lanes 10.. are out of range
  BAM_TEST_SYNC();
  bam_test::require_bad_index(a, 1000, 1022); // and collected: the record is clear again
}

TEST_CASE("an injected error status makes check() throw with LBA, controller and status", "[gpu][array]") {
  bam::storage s("emu-gpu:hbm=16M,ssds=2,queues=16,depth=64");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, (16ull << 20) / 4);
  bam::emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::read);
  r.lba_first = 800;
  r.lba_last = 807; // one page on controller 1
  r.count = 0;
  r.status = {bam::nvme::status_type::media_error, bam::nvme::media_status::unrecovered_read_error, true};
  bam::emu::software_controller(s, 1).faults().add(r);
  device_counters c;
  random_read_kernel<<<256, 128>>>(a.ref(), layout{0, 4096, 512, 2}, 32, 5, c.ptr());
  BAM_TEST_SYNC();
  try {
    a.check();
    FAIL("check() did not throw");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == r.status);
    REQUIRE(e.context().lba.has_value());
    CHECK(*e.context().lba == 800);
    CHECK(e.context().controller == s.controller_name(1)); // which of the two
    REQUIRE(e.context().index.has_value());
    CHECK(*e.context().index / 1024 == 2 * 100 + 1); // page 201: controller 1, LBA 800
  }
  bam::emu::software_controller(s, 1).faults().clear();
}

TEST_CASE("a controller that stops answering gives a timeout error, and the process goes on", "[gpu][array]") {
  bam::storage s("emu-gpu:hbm=16M,queues=8,depth=32,timeout=300ms");
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20, .timeout_ns = 300'000'000ull});
  bam::array<std::uint32_t> a(cache, s, (16ull << 20) / 4);
  bam::emu::software_controller(s, 0).stop_answering(true);
  device_counters c;
  const auto t0 = std::chrono::steady_clock::now();
  random_read_kernel<<<64, 128>>>(a.ref(), layout{0, 4096, 512, 1}, 4, 9, c.ptr());
  BAM_TEST_SYNC();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("kernel took " << secs << " s");
  CHECK(secs < 30);
  try {
    a.check();
    FAIL("check() did not throw");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.status().has_value());
    CHECK((*e.status() == bam::nvme::status_timeout || *e.status() == bam::nvme::status_queue_broken ||
           *e.status() == bam::nvme::status_queue_full));
  }
  bam::emu::software_controller(s, 0).stop_answering(false);
}
