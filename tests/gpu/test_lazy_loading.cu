// SPDX-License-Identifier: MIT
// A user's program over the CPU engine (emu:) with CUDA's lazy module
// loading, as CTest runs this binary (CUDA_MODULE_LOADING=LAZY): a kernel
// loaded at its first launch waits for the kernels already running, so an
// engine that needed a CUDA call to complete a command would stall both
// until the wait's deadline. Each case launches kernels no other case has
// launched (a template argument of its own), in a process of its own.
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>

#include <cuda.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

//! Whether this process's CUDA loads kernels at their first launch.
bool lazy_module_loading() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  CUmoduleLoadingMode mode{};
  if (reinterpret_cast<CUresult (*)(CUmoduleLoadingMode*)>(fn)(&mode) != CUDA_SUCCESS) return false;
  return mode == CU_MODULE_LAZY_LOADING;
}

//! Divergent element reads (a graph walk): each thread hops to an index
//! derived from the value it read.
template <int Tag>
__global__ void walk_kernel(bam::array_ref<std::uint32_t> a, bam_test::layout l, int hops, unsigned long long* bad) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  std::uint64_t i = bam_test::rnd(tid * 7919 + Tag) % a.size();
  unsigned long long b = 0;
  for (int h = 0; h < hops; ++h) {
    const std::uint32_t v = a[i];
    b += v != l.expected(i);
    i = bam_test::rnd(v + i) % a.size();
  }
  if (b) atomicAdd(bad, b);
}

template <int Tag>
__global__ void mark_kernel(unsigned* flag) {
  *flag = Tag;
}

//! Writes value(i) into every element.
template <int Tag>
__global__ void fill_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, static_cast<std::uint32_t>(i * 2654435761u) ^ salt);
}

//! Divergent reads of the filled values.
template <int Tag>
__global__ void check_fill_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt, int iters,
                                  unsigned long long* bad) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  unsigned long long b = 0;
  for (int it = 0; it < iters; ++it) {
    const std::uint64_t i = bam_test::rnd(tid * 131 + it + Tag) % a.size();
    b += a[i] != (static_cast<std::uint32_t>(i * 2654435761u) ^ salt);
  }
  if (b) atomicAdd(bad, b);
}

//! Each warp copies a range of 4 pages with `copy_to` and checks it.
template <int Tag>
__global__ void copy_check_kernel(bam::array_ref<std::uint32_t> a, std::uint32_t salt, std::uint32_t* scratch,
                                  unsigned long long* bad) {
  constexpr std::uint64_t count = 4 * 1024;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t begin = bam_test::rnd(warp + Tag) % (a.size() - count);
  std::uint32_t* out = scratch + warp * count;
  a.copy_to(begin, count, out);
  __syncwarp();
  unsigned long long b = 0;
  for (std::uint64_t k = threadIdx.x % 32; k < count; k += 32)
    b += out[k] != (static_cast<std::uint32_t>((begin + k) * 2654435761u) ^ salt);
  if (b) atomicAdd(bad, b);
}

unsigned long long read_counter(const bam::device_buffer<unsigned long long>& c) {
  unsigned long long v = ~0ull;
  bam::copy_to_host(&v, c.get(), 1);
  return v;
}

//! A kernel waits on an emu: storage on `wait_stream` while a kernel is
//! launched for the first time on `launch_stream`; both must finish.
template <int Tag>
void first_launch_while_waiting(cudaStream_t wait_stream, cudaStream_t launch_stream) {
  bam::storage s("emu:ram=16M,queues=8,depth=64,threads=2");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 2 << 20, .timeout_ns = 5'000'000'000});
  bam::array<std::uint32_t> a(cache, s, (16ull << 20) / 4);
  bam::device_buffer<unsigned long long> bad(1);
  bam::device_buffer<unsigned> flag(1);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  walk_kernel<Tag><<<64, 128, 0, wait_stream>>>(a.ref(), bam_test::layout{0, 4096, 512, 1}, 8, bad.get());
  mark_kernel<Tag><<<1, 1, 0, launch_stream>>>(flag.get()); // its first launch: the module loads now
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(launch_stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(wait_stream) == cudaSuccess);
  REQUIRE_NOTHROW(a.check());
  CHECK(read_counter(bad) == 0);
  unsigned f = 0;
  bam::copy_to_host(&f, flag.get(), 1);
  CHECK(f == Tag);
}

} // namespace

TEST_CASE("Lazy loading: this binary runs with kernels loaded at their first launch", "[lazy]") {
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  INFO("CUDA_MODULE_LOADING=" << (mode ? mode : "(unset)"));
  CHECK(lazy_module_loading());
}

TEST_CASE("Lazy loading: a first launch while a kernel waits on emu:, non-blocking streams", "[lazy]") {
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  SECTION("behind the waiting kernel on its stream") { first_launch_while_waiting<1>(a, a); }
  SECTION("on a stream of its own") { first_launch_while_waiting<2>(a, b); }
  CHECK(cudaStreamDestroy(a) == cudaSuccess);
  CHECK(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("Lazy loading: a first launch while a kernel waits on emu:, the legacy default stream", "[lazy]") {
  first_launch_while_waiting<3>(cudaStreamLegacy, cudaStreamLegacy);
}

TEST_CASE("Lazy loading: a first launch while a kernel waits on emu:, per-thread default streams", "[lazy]") {
  first_launch_while_waiting<4>(cudaStreamPerThread, cudaStreamPerThread);
}

TEST_CASE("Lazy loading: a user's program over two CPU engines at once, one cache, streams of its own", "[lazy]") {
  // Two arrays on one storage (RAM), a third on another (a file); one cache;
  // kernels on non-blocking streams; a fill, a flush, then graph walks with
  // divergent a[i] on one stream and warp copy_to on a second.
  const std::string path = "/tmp/bam-lazy-" + std::to_string(::getpid()) + ".img";
  std::remove(path.c_str());
  {
    bam::storage ram("emu:ram=32M,queues=8,depth=64,threads=2");
    bam::storage file("emu:file=" + path + ",size=16M,queues=8,depth=64,threads=2");
    bam::page_cache cache({.page_size = 4096, .capacity = 4 << 20, .timeout_ns = 5'000'000'000});
    const std::uint64_t n = (8ull << 20) / 4;
    bam::array<std::uint32_t> x(cache, ram, n);
    bam::array<std::uint32_t> y(cache, ram, n, /*start_lba*/ (16ull << 20) / 512);
    bam::array<std::uint32_t> z(cache, file, n);
    cudaStream_t s1, s2;
    REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    fill_kernel<10><<<128, 256, 0, s1>>>(x.ref(), 0x1111u);
    fill_kernel<11><<<128, 256, 0, s2>>>(y.ref(), 0x2222u);
    fill_kernel<12><<<128, 256, 0, s1>>>(z.ref(), 0x3333u);
    REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
    REQUIRE_NOTHROW(x.check(s1));
    REQUIRE_NOTHROW(y.check(s1));
    REQUIRE_NOTHROW(z.check(s1));
    REQUIRE_NOTHROW(cache.flush(s1));

    bam::device_buffer<unsigned long long> bad(3);
    constexpr unsigned warps = 64;
    bam::device_buffer<std::uint32_t> scratch(warps * 4 * 1024);
    check_fill_kernel<13><<<64, 128, 0, s1>>>(x.ref(), 0x1111u, 16, bad.get());
    copy_check_kernel<14><<<warps / 4, 128, 0, s2>>>(z.ref(), 0x3333u, scratch.get(), bad.get() + 1);
    check_fill_kernel<15><<<64, 128, 0, s1>>>(y.ref(), 0x2222u, 16, bad.get() + 2);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s1) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
    REQUIRE_NOTHROW(x.check(s1));
    REQUIRE_NOTHROW(y.check(s1));
    REQUIRE_NOTHROW(z.check(s1));
    std::vector<unsigned long long> b(3, 1);
    bam::copy_to_host(b.data(), bad.get(), 3);
    CHECK(b[0] == 0);
    CHECK(b[1] == 0);
    CHECK(b[2] == 0);
    REQUIRE(cudaStreamDestroy(s1) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(s2) == cudaSuccess);
  }
  // What the GPU wrote is in the file.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::vector<std::uint32_t> data((8u << 20) / 4);
  REQUIRE(std::fread(data.data(), 4, data.size(), f) == data.size());
  std::fclose(f);
  std::remove(path.c_str());
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < data.size(); ++i)
    wrong += data[i] != (static_cast<std::uint32_t>(i * 2654435761u) ^ 0x3333u);
  CHECK(wrong == 0);
}
