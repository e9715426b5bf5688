// SPDX-License-Identifier: MIT
// The CPU engine for GPU clients: a GPU kernel on a plain file.
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

__global__ void read_check_kernel(bam::array_ref<std::uint32_t> a, bam_test::layout l, int iters,
                                  unsigned long long* bad) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  unsigned long long b = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t i = bam_test::rnd(tid * 31337 + it) % a.size();
    b += a[i] != l.expected(i);
  }
  if (b) atomicAdd(bad, b);
}

__global__ void fill_kernel(bam::array_ref<std::uint32_t> a) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, static_cast<std::uint32_t>(i * 2654435761u));
}

} // namespace

TEST_CASE("CPU engine for GPU clients: random reads and writes on a file", "[gpu][client]") {
  const std::string path = "/tmp/bam-gpu-client-" + std::to_string(::getpid()) + ".img";
  {
    bam::storage s("emu:file=" + path + ",size=16M,queues=16,depth=64,threads=2");
    bam_test::fill_pattern(s);
    bam::page_cache cache({.page_size = 4096, .capacity = 4 << 20});
    bam::array<std::uint32_t> a(cache, s, (16ull << 20) / 4);
    bam::device_buffer<unsigned long long> bad(1);
    read_check_kernel<<<128, 128>>>(a.ref(), bam_test::layout{0, 4096, 512, 1}, 8, bad.get());
    BAM_TEST_SYNC();
    REQUIRE_NOTHROW(a.check());
    unsigned long long b = 1;
    bam::copy_to_host(&b, bad.get(), 1);
    CHECK(b == 0);

    fill_kernel<<<64, 256>>>(a.ref());
    BAM_TEST_SYNC();
    REQUIRE_NOTHROW(a.check());
    REQUIRE_NOTHROW(cache.flush());
  }
  // The file itself holds what the GPU wrote.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::vector<std::uint32_t> data((16u << 20) / 4);
  REQUIRE(std::fread(data.data(), 4, data.size(), f) == data.size());
  std::fclose(f);
  std::remove(path.c_str());
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < data.size(); ++i)
    bad += data[i] != static_cast<std::uint32_t>(i * 2654435761u);
  CHECK(bad == 0);
}

TEST_CASE("CPU engine for GPU clients: GPU threads move the staged data, reads and writes (small, for the sanitizers)",
          "[gpu][client][sanitize]") {
  bam::storage s("emu:ram=2M,queues=4,depth=32,threads=1");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 256 << 10});
  bam::array<std::uint32_t> a(cache, s, (2ull << 20) / 4);
  bam::device_buffer<unsigned long long> bad(1);
  read_check_kernel<<<4, 64>>>(a.ref(), bam_test::layout{0, 4096, 512, 1}, 4, bad.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  unsigned long long b = 1;
  bam::copy_to_host(&b, bad.get(), 1);
  CHECK(b == 0);
  fill_kernel<<<8, 128>>>(a.ref()); // the whole array: every page written back through the engine
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(cache.flush());
  std::vector<std::uint32_t> back((2u << 20) / 4);
  bam::emu::read_media(s, 0, 0, back.data(), back.size() * 4);
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < back.size(); ++i)
    wrong += back[i] != static_cast<std::uint32_t>(i * 2654435761u);
  CHECK(wrong == 0);
}

namespace {

__global__ void copy_out_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t* out) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i];
}

} // namespace

TEST_CASE("bam::array::open reads a file: through its extents on the raw disk where it opens, else the file",
          "[gpu][client][file]") {
  // A file where the tests run (a disk) and one on tmpfs (no blocks to map).
  for (const std::string dir : {std::string("."), std::string("/dev/shm")}) {
    const std::string path = dir + "/bam-gpu-open-" + std::to_string(::getpid()) + ".bin";
    const std::size_t n = (3u << 20) / 4 + 1001; // not a multiple of any page size
    std::vector<std::uint32_t> data(n);
    for (std::size_t i = 0; i < n; ++i)
      data[i] = static_cast<std::uint32_t>(i * 2654435761u);
    {
      std::FILE* f = std::fopen(path.c_str(), "wb");
      REQUIRE(f != nullptr);
      REQUIRE(std::fwrite(data.data(), 4, n, f) == n);
      REQUIRE(std::fflush(f) == 0);
      REQUIRE(::fsync(::fileno(f)) == 0);
      std::fclose(f);
    }
    std::vector<std::string> warnings;
    bam::set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    {
      bam::page_cache cache({.page_size = 16384, .capacity = 1 << 20}); // smaller than the file
      auto a = bam::array<std::uint32_t>::open(cache, path, "queues=8,threads=2");
      INFO(a.source());
      REQUIRE(a.size() == n);
      bam::device_buffer<std::uint32_t> out(n);
      copy_out_kernel<<<128, 256>>>(a.ref(), out.get());
      BAM_TEST_SYNC();
      REQUIRE_NOTHROW(a.check());
      std::vector<std::uint32_t> got(n);
      bam::copy_to_host(got.data(), out.get(), n);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)
        bad += got[i] != data[i];
      CHECK(bad == 0);
      if (a.source().rfind("emu:file=", 0) == 0) {
        CHECK(warnings.size() == 1); // the fallback is said
      } else {
        CHECK(a.source().rfind("emu:extents=", 0) == 0);
        CHECK(warnings.empty());
      }
    }
    bam::set_warning_handler({});
    std::remove(path.c_str());
  }
}

TEST_CASE("CPU engine for GPU clients: kernels on streams of their own, among many streams", "[gpu][client]") {
  // A framework keeps a pool of streams (PyTorch: 32 a priority) and runs
  // its kernels on them; the engine's copies must not queue behind a kernel
  // that waits for them.
  const std::string path = "/tmp/bam-gpu-streams-" + std::to_string(::getpid()) + ".img";
  {
    bam::storage s("emu:file=" + path + ",size=16M,queues=16,depth=64,threads=4");
    bam_test::fill_pattern(s);
    bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20, .timeout_ns = 2'000'000'000});
    bam::array<std::uint32_t> a(cache, s, (16ull << 20) / 4);
    constexpr int n_streams = 72;
    std::vector<cudaStream_t> streams(n_streams);
    for (auto& st : streams)
      REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    bam::device_buffer<unsigned long long> bad(1);
    for (int k = 0; k < n_streams; k += 7) {
      read_check_kernel<<<64, 128, 0, streams[k]>>>(a.ref(), bam_test::layout{0, 4096, 512, 1}, 4, bad.get());
      REQUIRE(cudaGetLastError() == cudaSuccess);
    }
    for (auto& st : streams) {
      CHECK(cudaStreamSynchronize(st) == cudaSuccess);
      CHECK(cudaStreamDestroy(st) == cudaSuccess);
    }
    REQUIRE_NOTHROW(a.check());
    unsigned long long b = 1;
    bam::copy_to_host(&b, bad.get(), 1);
    CHECK(b == 0);
  }
  std::remove(path.c_str());
}

TEST_CASE("CPU engine for GPU clients: threads kept off the CPU make GPU reads late, not failed", "[gpu][client]") {
  bam::storage s("emu:ram=8M,queues=4,depth=64,threads=2");
  bam_test::fill_pattern(s);
  auto& faults = bam::emu::software_controller(s, 0).faults();
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20, .timeout_ns = 200'000'000});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  bam::device_buffer<unsigned long long> bad(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(600)); // the engine has run for several timeouts
  faults.set_stalled(true);                                    // as a busy host would: the engine's threads do not run
  read_check_kernel<<<8, 64>>>(a.ref(), bam_test::layout{0, 4096, 512, 1}, 2, bad.get());
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000)); // 5 timeouts
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);         // still waiting, not failed
  faults.set_stalled(false);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK_FALSE(s.any_queue_broken());
  unsigned long long b = 1;
  bam::copy_to_host(&b, bad.get(), 1);
  CHECK(b == 0);
}

TEST_CASE("CPU engine for GPU clients: a read that timed out never lands in the pages of a page cache destroyed "
          "since",
          "[gpu][client]") {
  bam::storage s("emu:ram=8M,queues=2,depth=64,threads=1");
  bam_test::fill_pattern(s);
  auto& faults = bam::emu::software_controller(s, 0).faults();
  constexpr std::size_t cache_bytes = 1 << 20;
  std::uintptr_t old_lo = 0;
  {
    bam::page_cache cache({.page_size = 4096, .capacity = cache_bytes, .timeout_ns = 200'000'000});
    bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
    old_lo = reinterpret_cast<std::uintptr_t>(bam::detail::ref_access::data(cache.ref()));
    bam::device_buffer<unsigned long long> bad(1);
    faults.set_paused(true); // the controller fetches nothing: every read times out
    read_check_kernel<<<4, 64>>>(a.ref(), bam_test::layout{0, 4096, 512, 1}, 1, bad.get());
    BAM_TEST_SYNC();
    REQUIRE_THROWS(a.check());
    REQUIRE(s.any_queue_broken());
  } // the array and the cache are gone; the storage and its queued reads are not
  // GPU memory allocated now may reuse what the cache had; fill it with a mark.
  std::vector<bam::device_buffer<std::uint8_t>> fresh;
  for (int k = 0; k < 8; ++k) {
    fresh.emplace_back(cache_bytes);
    REQUIRE(cudaMemset(fresh.back().get(), 0xab, cache_bytes) == cudaSuccess);
  }
  bool reused = false;
  for (const auto& f : fresh) {
    const auto lo = reinterpret_cast<std::uintptr_t>(f.get());
    reused |= lo < old_lo + cache_bytes && old_lo < lo + cache_bytes;
  }
  INFO("GPU memory of the destroyed cache handed out again: " << reused);
  CHECK_FALSE(reused);      // kept until the storage is gone
  faults.set_paused(false); // the reads queued before now run, late
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::size_t changed = 0;
  std::vector<std::uint8_t> h(cache_bytes);
  for (const auto& f : fresh) {
    bam::copy_to_host(h.data(), f.get(), cache_bytes);
    for (const std::uint8_t b : h)
      changed += b != 0xab;
  }
  CHECK(changed == 0);
}

TEST_CASE("CPU engine for GPU clients: RAM and shared memory are read in place; host writes and freed ranges show at "
          "once",
          "[gpu][client]") {
  constexpr std::size_t bytes = 8u << 20, words = bytes / 4;
  const std::string shm = "bam-gpu-in-place-" + std::to_string(::getpid());
  for (const std::string spec : {std::string("emu:ram=8M,queues=4,depth=32,threads=1"),
                                 "emu:shm=" + shm + ",size=8M,unlink,queues=4,depth=32,threads=1"}) {
    CAPTURE(spec);
    bam::storage s(spec);
    INFO(s.transport_name());
    CHECK(s.transport_name().find("read in place") != std::string::npos);
    bam_test::fill_pattern(s);
    // Bytes [1 MiB, 3 MiB) freed (whole pages: RAM would hand them back to
    // the kernel, leaving the GPU the old ones), [5 MiB, 6 MiB) rewritten.
    REQUIRE(bam::emu::software_controller(s, 0).namespace_media(s.nsid()).deallocate(1u << 20, 2u << 20) == 0);
    const std::vector<std::uint32_t> fresh((1u << 20) / 4, 0xfeedf00du);
    bam::emu::write_media(s, 0, 5u << 20, fresh.data(), fresh.size() * 4);
    bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
    bam::array<std::uint32_t> a(cache, s, words);
    bam::device_buffer<std::uint32_t> out(words);
    copy_out_kernel<<<128, 256>>>(a.ref(), out.get());
    BAM_TEST_SYNC();
    REQUIRE_NOTHROW(a.check());
    std::vector<std::uint32_t> got(words);
    bam::copy_to_host(got.data(), out.get(), words);
    const bam_test::layout l{0, 4096, 512, 1};
    std::size_t bad = 0;
    for (std::size_t i = 0; i < words; ++i) {
      const std::size_t byte = i * 4;
      const std::uint32_t want = byte >= (1u << 20) && byte < (3u << 20)   ? 0u
                                 : byte >= (5u << 20) && byte < (6u << 20) ? 0xfeedf00du
                                                                           : l.expected(i);
      bad += got[i] != want;
    }
    CHECK(bad == 0);
  }
}
