// SPDX-License-Identifier: MIT
// Streams of a user's program: bam's host calls work on the stream they are
// given and wait for no kernel of the caller's elsewhere (the default stream
// included), and `flush_async` enqueues the write-back without waiting.
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

__device__ __host__ std::uint32_t stream_test_value(std::uint64_t i, std::uint32_t salt) {
  return static_cast<std::uint32_t>(bam_test::rnd(i * 131 + salt));
}

__global__ void fill_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, stream_test_value(i, salt));
}

//! Spins until `*flag` is set or `timeout_ns` passes; `*saw` = the flag it saw.
__global__ void wait_for_flag_kernel(const volatile int* flag, std::uint64_t timeout_ns, int* saw) {
  const std::uint64_t t0 = bam::detail::now_ns();
  while (*flag == 0 && bam::detail::now_ns() - t0 < timeout_ns) {
  }
  *saw = *flag;
}

struct owned_stream {
  cudaStream_t s = nullptr;
  explicit owned_stream(unsigned flags) { BAM_CUDA_TRY(cudaStreamCreateWithFlags(&s, flags)); }
  ~owned_stream() { BAM_CUDA_LOG(cudaStreamDestroy(s)); }
  owned_stream(const owned_stream&) = delete;
  owned_stream& operator=(const owned_stream&) = delete;
};

//! Words of the array on the media of a one-controller storage (page-sized stripes on one controller: in order).
std::vector<std::uint32_t> media_words(const bam::storage& s, std::uint64_t n) {
  std::vector<std::uint32_t> w(n);
  bam::emu::read_media(s, 0, 0, w.data(), n * 4);
  return w;
}

} // namespace

TEST_CASE("flush_async on the caller's stream puts the data on the storage; check reports a failed NVMe Flush",
          "[gpu][array][streams]") {
  bam::storage s("emu-gpu:hbm=16M,queues=8,depth=64");
  const std::uint64_t n = (8ull << 20) / 4;
  bam::page_cache cache({.page_size = 4096, .capacity = 16ull << 20}); // no eviction: only a flush writes
  owned_stream st(cudaStreamNonBlocking);
  bam::array<std::uint32_t> a(cache, s, n, 0, st.s);

  fill_kernel<<<256, 256, 0, st.s>>>(a.ref(), 3);
  BAM_CUDA_TRY(cudaGetLastError());
  a.flush_async(st.s); // returns at once; ordered after the kernel on the stream
  BAM_CUDA_TRY(cudaStreamSynchronize(st.s));
  REQUIRE_NOTHROW(a.check(st.s));
  std::vector<std::uint32_t> w = media_words(s, n);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    bad += w[i] != stream_test_value(i, 3);
  CHECK(bad == 0);

  // An NVMe Flush that fails: recorded on the device, thrown by the next check.
  bam::emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::flush);
  r.count = 0;
  r.status = {bam::nvme::status_type::generic, bam::nvme::generic_status::internal_error, true};
  bam::emu::software_controller(s, 0).faults().add(r);
  fill_kernel<<<256, 256, 0, st.s>>>(a.ref(), 4);
  a.flush_async(st.s);
  BAM_CUDA_TRY(cudaStreamSynchronize(st.s));
  try {
    a.check(st.s);
    FAIL("check() did not report the failed NVMe Flush");
  } catch (const bam::error& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), ContainsSubstring("NVMe Flush"));
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == r.status);
  }
  REQUIRE_NOTHROW(a.check(st.s)); // reported once
  bam::emu::software_controller(s, 0).faults().clear();
  REQUIRE_NOTHROW(a.flush(st.s));
  w = media_words(s, n);
  bad = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    bad += w[i] != stream_test_value(i, 4);
  CHECK(bad == 0);
}

TEST_CASE("bam's host calls wait for no kernel of the caller's on another stream", "[gpu][array][streams]") {
  bam::storage s("emu-gpu:hbm=16M,queues=8,depth=64");
  bam_test::fill_pattern(s);
  bam::pinned_buffer<int> flag(1);
  bam::device_buffer<int> saw(1);
  // The caller's kernel, on a blocking stream (which the default stream waits
  // for), runs until the host sets the flag, or 20 s.
  owned_stream user(cudaStreamDefault);
  owned_stream mine(cudaStreamNonBlocking);
  {
    // Kernels that load at first launch are loaded before the wait starts.
    bam::page_cache warm({.page_size = 4096, .capacity = 1ull << 20});
    bam::array<std::uint32_t> a(warm, s, 1024, 0, mine.s);
    a.detach(mine.s);
  }
  constexpr std::uint64_t timeout_ns = 20'000'000'000ull;
  wait_for_flag_kernel<<<1, 1, 0, user.s>>>(flag.get(), timeout_ns, saw.get());
  BAM_CUDA_TRY(cudaGetLastError());
  const auto t0 = std::chrono::steady_clock::now();
  // Memory, a cache, an array on a stream of this thread's, its check: none
  // of them may wait for the kernel above. (Freeing GPU memory may wait for
  // the device, as cudaFree does: detach and destructors come after the flag.)
  auto cache = std::make_unique<bam::page_cache>(bam::page_cache_config{.page_size = 4096, .capacity = 4ull << 20});
  auto a = std::make_unique<bam::array<std::uint32_t>>(*cache, s, (4ull << 20) / 4, 0, mine.s);
  auto more = std::make_unique<bam::device_buffer<std::uint64_t>>(1 << 20);
  REQUIRE_NOTHROW(a->check(mine.s));
  REQUIRE_NOTHROW(cache->counters(mine.s));
  const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::atomic_ref<int>(*flag.get()).store(1);
  BAM_CUDA_TRY(cudaStreamSynchronize(user.s));
  a->detach(mine.s);
  int seen = 0;
  BAM_CUDA_TRY(cudaMemcpy(&seen, saw.get(), sizeof seen, cudaMemcpyDeviceToHost));
  INFO("host calls took " << host_s << " s");
  CHECK(seen == 1); // the kernel was still running when the host calls were done
  CHECK(host_s < 10.0);
}
