// SPDX-License-Identifier: MIT
// Kernels compiled without the software controller's device-side progress
// hook, as in a program over real controllers: the runtime's headers come
// first and the software controller's engines are only registered on the
// host (gpu_engine.cuh and client_engine.cuh bring no device code into the
// wait loops). Over either engine, whose commands need the waiting GPU
// threads (the GPU engine's to serve its queues, the CPU engine's to move
// the data), every command is refused at once with a status that says what
// to include: no ticket taken, no queue broken, no wait to a timeout.
#include <bam/runtime/array.cuh>
#include <bam/runtime/page_cache.cuh>
#include <bam/runtime/storage.cuh>
#include <bam/transport/device_progress.cuh>

#include <bam/emu/access.hpp>
#include <bam/emu/client_engine.cuh>
#include <bam/emu/gpu_engine.cuh>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <string>
#include <vector>

#ifdef BAM_DEVICE_PROGRESS_HOOK
#error "this file tests kernels compiled without a device progress hook"
#endif

namespace {

__global__ void sum_kernel(bam::array_ref<std::uint32_t> a, unsigned long long* sum) {
  unsigned long long s = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    s += a[i];
  atomicAdd(sum, s);
}

__global__ void raw_read_kernel(bam::queue_set_ref q, const std::uint64_t* bus, std::uint16_t* status) {
  const bam::nvme::status st = q.read(threadIdx.x, 1, bus, threadIdx.x * 4096ull);
  status[threadIdx.x] = st.raw;
}

} // namespace

TEST_CASE("Without the hook: commands on either engine are refused at once, saying why", "[gpu][hook][sanitize]") {
  CHECK_FALSE(bam::device_progress_compiled(bam::device_progress{bam::emu::gpu_engine_progress_id, 0, nullptr}));
  CHECK_FALSE(bam::device_progress_compiled(bam::device_progress{bam::emu::client_engine_progress_id, 0, nullptr}));
  const std::string device = GENERATE(std::string("emu-gpu:ram=8M,queues=4,depth=64,timeout=30s"),
                                      std::string("emu:ram=8M,queues=4,depth=64,threads=1"));
  INFO(device);
  bam::storage s(device);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, (8u << 20) / 4);
  bam::device_buffer<unsigned long long> sum(1);
  sum_kernel<<<8, 128>>>(a.ref(), sum.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  std::string what;
  try {
    a.check();
  } catch (const bam::error& e) {
    what = e.what();
  }
  // Refused, not waited for: a wait would have ended in a timeout status and
  // a broken queue.
  CHECK_THAT(what, Catch::Matchers::ContainsSubstring("Kernel Compiled Without the Transport's Device Hook"));
  CHECK_FALSE(s.any_queue_broken());

  // Direct queue I/O reports the same status, lane by lane.
  constexpr unsigned lanes = 32;
  bam::detail::aligned_device_memory target(lanes * 4096ull, bam::gpu_page_size);
  const auto mapping = s.map(target.data(), target.size());
  bam::device_buffer<std::uint16_t> status(lanes);
  raw_read_kernel<<<1, lanes>>>(s.ref(0), mapping->bus_table(0), status.get());
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  std::vector<std::uint16_t> got(lanes);
  bam::copy_to_host(got.data(), status.get(), lanes);
  for (unsigned l = 0; l < lanes; ++l)
    CHECK(bam::nvme::status(got[l]) == bam::nvme::status_no_progress_hook);
  CHECK_FALSE(s.any_queue_broken());
}
