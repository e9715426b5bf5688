// SPDX-License-Identifier: MIT
// Kernels compiled with the CPU engine's hook alone
// (bam/emu/client_engine_progress.cuh), as in a program that reads files
// through `emu:` and real SSDs and wants none of the GPU engine's code:
// `emu:` devices work, `emu-gpu:` commands are refused at once.
#include <bam/emu/client_engine_progress.cuh> // first: before the runtime's wait loops

#define BAM_WITHOUT_SOFTWARE_CONTROLLER
#include <bam/bam.cuh>

#include <bam/emu.hpp>
#include <bam/emu/access.hpp>
#include <bam/emu/client_engine.cuh>
#include <bam/emu/gpu_engine.cuh>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace {

__global__ void sum_and_bump_kernel(bam::array_ref<std::uint32_t> a, unsigned long long* sum) {
  unsigned long long s = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t v = a[i];
    s += v;
    a.write(i, v + 1);
  }
  atomicAdd(sum, s);
}

} // namespace

TEST_CASE("CPU engine hook alone: emu: devices read and write", "[gpu][hook]") {
  bam::storage s("emu:ram=4M,queues=4,depth=64,threads=1");
  const std::size_t n = (4u << 20) / 4;
  std::vector<std::uint32_t> v(n);
  unsigned long long want = 0;
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<std::uint32_t>(i * 7 + 1);
    want += v[i];
  }
  bam::emu::write_media(s, 0, 0, v.data(), v.size() * 4);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, n);
  bam::device_buffer<unsigned long long> sum(1);
  sum_and_bump_kernel<<<32, 256>>>(a.ref(), sum.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(cache.flush());
  unsigned long long got = 0;
  bam::copy_to_host(&got, sum.get(), 1);
  CHECK(got == want);
  std::vector<std::uint32_t> back(n);
  bam::emu::read_media(s, 0, 0, back.data(), back.size() * 4);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    wrong += back[i] != v[i] + 1;
  CHECK(wrong == 0);
}

TEST_CASE("CPU engine hook alone: emu-gpu: commands are refused at once", "[gpu][hook]") {
  bam::storage s("emu-gpu:ram=4M,queues=4,depth=64,timeout=30s");
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, (4u << 20) / 4);
  bam::device_buffer<unsigned long long> sum(1);
  sum_and_bump_kernel<<<4, 128>>>(a.ref(), sum.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  std::string what;
  try {
    a.check();
  } catch (const bam::error& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Matchers::ContainsSubstring("Kernel Compiled Without the Transport's Device Hook"));
  CHECK_FALSE(s.any_queue_broken());
}
