// SPDX-License-Identifier: MIT
// The CUDA half of the package test's consumer: bam's GPU runtime in a .cu
// file of the same target as a .cpp. A kernel writes and sums a
// bam::array<std::uint32_t> on the software controller's GPU engine.
#include <bam/bam.cuh>

#include <cstdio>
#include <exception>

namespace {

__global__ void fill(bam::array_ref<std::uint32_t> a) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < a.size();
       i += std::uint64_t(gridDim.x) * blockDim.x)
    a.write(i, static_cast<std::uint32_t>(i));
}

__global__ void sum(bam::array_ref<std::uint32_t> a, unsigned long long* out) {
  unsigned long long acc = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < a.size();
       i += std::uint64_t(gridDim.x) * blockDim.x)
    acc += a[i];
  atomicAdd(out, acc);
}

} // namespace

// -1 without a GPU, 0 if the sum is right, 1 otherwise.
int sum_array_on_gpu(unsigned n) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return -1;
  try {
    bam::storage s("emu-gpu:hbm=16M");
    bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
    bam::array<std::uint32_t> a(cache, s, n);
    fill<<<64, 256>>>(a.ref());
    a.check();
    cache.flush();
    bam::device_buffer<unsigned long long> out(1);
    BAM_CUDA_TRY(cudaMemset(out.get(), 0, sizeof(unsigned long long)));
    sum<<<64, 256>>>(a.ref(), out.get());
    a.check();
    unsigned long long total = 0;
    bam::copy_to_host(&total, out.get(), 1);
    return total == static_cast<unsigned long long>(n) * (n - 1) / 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
