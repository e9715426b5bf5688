// SPDX-License-Identifier: MIT
// The other process of the group-cache tests (test_group_cache.cu starts
// it): builds its part of a page cache shared by a group of processes,
// attaches the shared table and does what its standard input says, one
// line at a time, answering each on standard output.
//
//   bam_test_group_peer DEVICE GROUP RANK SIZE GPU PAGE_BYTES CACHE_BYTES
//     write FIRST COUNT SALT  ->  ok
//     check FIRST COUNT SALT  ->  ok DONE BAD MISSES   (this process's page loads so far)
//     flush                   ->  ok
//     quit                    ->  (exits 0)
// A failure answers "error MESSAGE" and exits 3.
#include "shm_table.cuh"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  using namespace bam_shm_test;
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DEVICE GROUP RANK SIZE GPU PAGE_BYTES CACHE_BYTES\n", argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    BAM_CUDA_TRY(cudaSetDevice(std::atoi(argv[5])));
    bam::storage s(argv[1]);
    bam::page_cache_config cfg;
    cfg.page_size = std::strtoull(argv[6], nullptr, 0);
    cfg.capacity = std::strtoull(argv[7], nullptr, 0);
    cfg.group.name = argv[2];
    cfg.group.rank = std::atoi(argv[3]);
    cfg.group.size = std::atoi(argv[4]);
    cfg.group.timeout_ms = 20000;
    bam::page_cache cache(cfg);
    bam::array<std::uint32_t> a(cache, s, table_words);
    std::printf("ready\n");
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::string what;
      std::uint64_t first = 0, count = 0;
      std::uint32_t salt = 0;
      in >> what >> first >> count >> salt;
      if (what == "quit") return 0;
      if (what == "flush") {
        cache.flush();
        std::printf("ok\n");
      } else if (what == "write") {
        write_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt);
        BAM_CUDA_TRY(cudaGetLastError());
        a.check();
        std::printf("ok\n");
      } else if (what == "check") {
        device_tally t;
        check_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt, t.buf.get());
        BAM_CUDA_TRY(cudaGetLastError());
        a.check();
        const tally r = t.get();
        std::printf("ok %llu %llu %llu\n", r.done, r.bad, static_cast<unsigned long long>(cache.counters().misses));
      } else {
        std::printf("error unknown command %s\n", what.c_str());
        return 2;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::string m = e.what();
    for (auto& c : m)
      if (c == '\n') c = ' ';
    std::printf("error %s\n", m.c_str());
    return 3;
  }
}
