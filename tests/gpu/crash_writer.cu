// SPDX-License-Identifier: MIT
// The process the crash test kills (test_crash.cu): opens the storage over
// FILE, writes the first pattern through a bam::array and flushes it, says
// so on the pipe, then rewrites the first half of the array with another
// pattern again and again without flushing, through a cache smaller than
// that half (evictions write pages back all along). Once write-backs of the
// second pattern have completed it says so too, and keeps its kernels
// running until it is killed.
//
//   bam_test_crash_writer FILE PIPE_FD
#include "crash_layout.cuh"

#include <bam/bam.cuh>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

namespace {

__global__ void write_flushed(bam::array_ref<std::uint32_t> a) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, bam_crash::flushed_value(i));
}

// Each pass writes every element of [0, rewritten) once; `passes` of them.
__global__ void write_unflushed(bam::array_ref<std::uint32_t> a, int passes) {
  for (int k = 0; k < passes; ++k)
    for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < bam_crash::rewritten;
         i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
      a.write(i, bam_crash::unflushed_value(i));
}

void say(int fd, char c) {
  if (::write(fd, &c, 1) != 1) {
    std::perror("crash writer: pipe");
    std::exit(3);
  }
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FILE PIPE_FD\n", argv[0]);
    return 2;
  }
  const int fd = std::atoi(argv[2]);
  try {
    bam::storage s(bam_crash::device_string(argv[1]));
    bam::page_cache cache({.page_size = bam_crash::page_size, .capacity = bam_crash::cache_bytes});
    cudaStream_t work = nullptr, look = nullptr;
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&look, cudaStreamNonBlocking));
    bam::array<std::uint32_t> a(cache, s, bam_crash::elements, bam_crash::array_lba, work);
    write_flushed<<<256, 256, 0, work>>>(a.ref());
    BAM_CUDA_TRY(cudaGetLastError());
    a.check(work);
    cache.flush(work);
    const std::uint64_t flushed_writebacks = cache.counters(work).writebacks;
    say(fd, bam_crash::flushed_mark);

    // Unflushed writes until killed. The counters are read on a stream of
    // their own while the kernels run.
    const auto t0 = std::chrono::steady_clock::now();
    bool told = false;
    for (;;) {
      write_unflushed<<<256, 256, 0, work>>>(a.ref(), 8);
      BAM_CUDA_TRY(cudaGetLastError());
      while (cudaStreamQuery(work) == cudaErrorNotReady) {
        if (!told && cache.counters(look).writebacks > flushed_writebacks) {
          say(fd, bam_crash::in_flight_mark); // pages of the second pattern reached the file
          told = true;
        }
        if (std::chrono::steady_clock::now() - t0 > std::chrono::minutes(2)) {
          std::fprintf(stderr, "crash writer: nobody killed me within 2 minutes\n");
          return 4;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      a.check(work);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash writer: %s\n", e.what());
    return 1;
  }
}
