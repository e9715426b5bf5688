// SPDX-License-Identifier: MIT
// bam::array over the page cache, on the software controller's GPU engine.
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cstdio>
#include <string>

using bam_test::layout;
using bam_test::rnd;

namespace {

struct counters {
  unsigned long long bad;
  unsigned long long done;
  unsigned long long first_bad_index;
};

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
    case 0: { const auto i = (r >> 8) % a.size(); bad += a[i] != la.expected(i); break; }
    case 1: { const auto i = (r >> 8) % b.size(); bad += b[i] != lb.expected(i); break; }
    default: { const auto i = (r >> 8) % c3.size(); bad += c3[i] != lc.expected(i); break; }
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
    for (std::uint32_t k = lane; k < len; k += 32) bad += out[k] != l.expected(begin + k);
    __syncwarp();
  }
  if (bad) atomicAdd(&c->bad, bad);
  if (lane == 0) atomicAdd(&c->done, static_cast<unsigned long long>(iters));
}

__global__ void index_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t i, std::uint32_t* out) {
  out[threadIdx.x] = a[i + threadIdx.x];
}

struct device_counters {
  bam::gpu::device_buffer<counters> buf{1};
  device_counters() { reset(); }
  void reset() {
    counters c{0, 0, ~0ull};
    bam::gpu::copy_to_device(buf.get(), &c, 1);
  }
  counters get() const {
    counters c{};
    bam::gpu::copy_to_host(&c, buf.get(), 1);
    return c;
  }
};

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
  bam::gpu::device dev(dev_string(media.c_str(), 64, ssds));
  bam_test::fill_pattern(dev);
  const std::uint64_t array_bytes = 64ull << 20;               // spread over the controllers
  const std::size_t cache_bytes = array_bytes / 4;             // working set: 4x the cache
  bam::page_cache cache({.page_size = page, .capacity = cache_bytes});
  bam::array<std::uint32_t> a(cache, dev.storage(), array_bytes / 4);
  const layout l{0, static_cast<std::uint32_t>(page), dev.storage().lba_size(), ssds};
  device_counters c;
  // 131,072 threads. With 64 KiB pages each miss moves 16x the bytes: fewer
  // rounds keep the volume (and so the run time) in line with the others.
  const int blocks = 1024, threads = 128, iters = page >= 65536 ? 2 : 16;
  random_read_kernel<<<blocks, threads>>>(a.ref(), l, iters, 42, c.buf.get());
  BAM_CUDA_TRY(cudaGetLastError());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  const counters r = c.get();
  CHECK(r.done == static_cast<unsigned long long>(blocks) * threads * iters);
  INFO("first bad index " << r.first_bad_index);
  CHECK(r.bad == 0);
  const auto [misses, writebacks] = cache.counters();
  CHECK(misses > cache.slot_count()); // the working set does not fit: pages were evicted and reloaded
  CHECK(writebacks == 0);
}

TEST_CASE("small random read for the sanitizers", "[gpu][array][sanitize]") {
  bam::gpu::device dev("emu-gpu:hbm=4M,ssds=2,queues=8,depth=32");
  bam_test::fill_pattern(dev);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10}); // 16 pages: evictions
  bam::array<std::uint32_t> a(cache, dev.storage(), (256ull << 10) / 4);
  const layout l{0, 4096, 512, 2};
  device_counters c;
  random_read_kernel<<<4, 64>>>(a.ref(), l, 2, 7, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  write_kernel<<<4, 64>>>(a.ref(), 3);
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  c.reset();
  verify_kernel<<<4, 64>>>(a.ref(), 3, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  REQUIRE_NOTHROW(cache.flush());
}

TEST_CASE("writes, eviction write-back, flush and reread", "[gpu][array]") {
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096}, std::size_t{65536});
  const std::uint32_t ssds = 2;
  INFO("page " << page);
  bam::gpu::device dev(dev_string("hbm", 32, ssds));
  bam_test::fill_pattern(dev);
  const std::uint64_t n = (64ull << 20) / 4;  // 64 MiB over 2 controllers
  bam::page_cache cache({.page_size = page, .capacity = 16ull << 20});
  bam::array<std::uint32_t> a(cache, dev.storage(), n);
  write_kernel<<<512, 256>>>(a.ref(), 77);
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  const auto [misses, writebacks] = cache.counters();
  CHECK(writebacks > 0); // 4x the cache written: dirty pages were evicted
  // Reread through the cache (most pages come back from the media).
  device_counters c;
  verify_kernel<<<512, 256>>>(a.ref(), 77, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().done == n);
  CHECK(c.get().bad == 0);
  // Flush, then check the media itself from the host.
  REQUIRE_NOTHROW(cache.flush());
  std::vector<std::uint32_t> media(dev.storage().blocks_per_controller() * 512 / 4);
  const std::uint64_t per_page = page / 4;
  std::uint64_t bad = 0;
  for (std::uint32_t ctrl = 0; ctrl < ssds; ++ctrl) {
    dev.read_media(ctrl, 0, media.data(), media.size() * 4);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t p = i / per_page;
      if (p % ssds != ctrl) continue;
      const std::uint64_t off = (p / ssds) * per_page + i % per_page;
      std::uint64_t x = i * 31 + 77;
      x += 0x9e3779b97f4a7c15ull;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      x ^= x >> 31;
      bad += media[off] != static_cast<std::uint32_t>(x);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("many arrays share one cache", "[gpu][array]") {
  bam::gpu::device dev(dev_string("ram", 64, 2));
  bam_test::fill_pattern(dev);
  bam::page_cache cache({.page_size = 4096, .capacity = 8ull << 20});
  // Three arrays at different places of the same namespaces.
  const std::uint64_t n = (16ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, dev.storage(), n, 0);
  bam::array<std::uint32_t> b(cache, dev.storage(), n, 20000);
  bam::array<std::uint32_t> c3(cache, dev.storage(), n / 2 + 123, 50000);
  const layout la{0, 4096, 512, 2}, lb{20000, 4096, 512, 2}, lc{50000, 4096, 512, 2};
  device_counters c;
  multi_array_kernel<<<512, 256>>>(a.ref(), la, b.ref(), lb, c3.ref(), lc, 8, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(b.check());
  REQUIRE_NOTHROW(c3.check());
  CHECK(c.get().done == 512ull * 256 * 8);
  CHECK(c.get().bad == 0);
}

TEST_CASE("warp-cooperative range copies", "[gpu][array]") {
  const auto page = GENERATE(std::size_t{512}, std::size_t{4096});
  bam::gpu::device dev(dev_string("hbm", 64, 4));
  bam_test::fill_pattern(dev);
  bam::page_cache cache({.page_size = page, .capacity = 16ull << 20});
  bam::array<std::uint32_t> a(cache, dev.storage(), (256ull << 20) / 4);
  const layout l{0, static_cast<std::uint32_t>(page), 512, 4};
  const std::uint32_t max_len = 5000;
  const int blocks = 256, threads = 128;
  bam::gpu::device_buffer<std::uint32_t> scratch(static_cast<std::size_t>(blocks) * threads / 32 * max_len);
  device_counters c;
  copy_range_kernel<<<blocks, threads>>>(a.ref(), l, scratch.get(), max_len, 4, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().bad == 0);
  CHECK(c.get().done == static_cast<unsigned long long>(blocks) * threads / 32 * 4);
}

TEST_CASE("a bad index is recorded and check() throws with the index", "[gpu][array][sanitize]") {
  bam::gpu::device dev("emu-gpu:hbm=4M,queues=4,depth=16");
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  bam::array<std::uint32_t> a(cache, dev.storage(), 1000);
  bam::gpu::device_buffer<std::uint32_t> out(32);
  index_kernel<<<1, 32>>>(a.ref(), 990, out.get()); // lanes 10.. are out of range
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  try {
    a.check();
    FAIL("check() did not throw");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.context().index.has_value());
    CHECK(*e.context().index >= 1000);
    CHECK(*e.context().index < 1022);
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == bam::nvme::status_out_of_range);
  }
  REQUIRE_NOTHROW(a.check()); // collected: the record is clear again
}

TEST_CASE("an injected error status makes check() throw with LBA and status", "[gpu][array]") {
  bam::gpu::device dev("emu-gpu:hbm=16M,ssds=2,queues=16,depth=64");
  bam_test::fill_pattern(dev);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, dev.storage(), (16ull << 20) / 4);
  const bam::nvme::status bad{bam::nvme::status_type::media_error, bam::nvme::media_status::unrecovered_read_error, true};
  dev.gpu_engines()[1]->inject_error(800, 808, bad); // one page on controller 1
  device_counters c;
  const layout l{0, 4096, 512, 2};
  random_read_kernel<<<256, 128>>>(a.ref(), l, 32, 5, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  try {
    a.check();
    FAIL("check() did not throw");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == bad);
    REQUIRE(e.context().lba.has_value());
    CHECK(*e.context().lba == 800);
    REQUIRE(e.context().index.has_value());
    CHECK(*e.context().index / 1024 == 2 * 100 + 1); // page 201: controller 1, LBA 800
  }
  dev.gpu_engines()[1]->clear_error();
}

TEST_CASE("a controller that stops answering gives a timeout error, and the process goes on", "[gpu][array]") {
  bam::gpu::device dev("emu-gpu:hbm=16M,queues=8,depth=32,timeout=300ms");
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20, .timeout_ns = 2'000'000'000ull});
  bam::array<std::uint32_t> a(cache, dev.storage(), (16ull << 20) / 4);
  dev.gpu_engines()[0]->set_paused(true);
  device_counters c;
  const auto t0 = std::chrono::steady_clock::now();
  random_read_kernel<<<64, 128>>>(a.ref(), layout{0, 4096, 512, 1}, 4, 9, c.buf.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("kernel took " << s << " s");
  CHECK(s < 30);
  try {
    a.check();
    FAIL("check() did not throw");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.status().has_value());
    CHECK((*e.status() == bam::nvme::status_timeout || *e.status() == bam::nvme::status_queue_broken ||
           *e.status() == bam::nvme::status_queue_full));
  }
  dev.gpu_engines()[0]->set_paused(false);
}
