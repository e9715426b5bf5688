// SPDX-License-Identifier: MIT
// The other process of the shared-media tests (test_shared_media.cu starts
// it with posix_spawn): opens a device string on one GPU with a page cache of
// its own, and writes or checks a range of the table.
//
//   bam_test_shm_peer write|check DEVICE GPU FIRST COUNT SALT
//
// Exit status 0: written and flushed, or every element checked and right.
#include "shm_table.cuh"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  using namespace bam_shm_test;
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s write|check DEVICE GPU FIRST COUNT SALT\n", argv[0]);
    return 2;
  }
  const std::string what = argv[1], device = argv[2];
  const int gpu = std::atoi(argv[3]);
  const std::uint64_t first = std::strtoull(argv[4], nullptr, 0), count = std::strtoull(argv[5], nullptr, 0);
  const auto salt = static_cast<std::uint32_t>(std::strtoul(argv[6], nullptr, 0));
  try {
    BAM_CUDA_TRY(cudaSetDevice(gpu));
    bam::storage s(device);
    bam::page_cache cache({.page_size = page_bytes, .capacity = cache_bytes});
    bam::array<std::uint32_t> a(cache, s, table_words);
    if (what == "write") {
      write_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt);
      BAM_CUDA_TRY(cudaGetLastError());
      a.check();
      cache.flush();
      std::printf("peer on GPU %d: wrote %llu elements from %llu\n", gpu, static_cast<unsigned long long>(count),
                  static_cast<unsigned long long>(first));
      return 0;
    }
    if (what != "check") {
      std::fprintf(stderr, "peer: unknown action %s\n", what.c_str());
      return 2;
    }
    device_tally t;
    check_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt, t.buf.get());
    BAM_CUDA_TRY(cudaGetLastError());
    a.check();
    const tally r = t.get();
    std::printf("peer on GPU %d: checked %llu of %llu elements, %llu wrong (first at %llu)\n", gpu, r.done,
                static_cast<unsigned long long>(count), r.bad, r.bad ? r.first_bad : 0ull);
    return r.done == count && r.bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer: %s\n", e.what());
    return 3;
  }
}
