// SPDX-License-Identifier: MIT
// One copy of the data for several processes and several GPUs
// (`emu-gpu:shm=NAME`): a table written through one process's storage and
// cache is read through another's, on one GPU or two; and one process with a
// storage and a cache per GPU over the same medium, kernels on both GPUs at
// once. The other process is bam_test_shm_peer (shm_peer.cu), started with
// posix_spawn: this process has initialised CUDA and must not fork.
#include "shm_table.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#ifndef BAM_TEST_SHM_PEER
#error "BAM_TEST_SHM_PEER must name the peer executable"
#endif

extern char** environ;

namespace {

using namespace bam_shm_test;

//! A shared-memory name of this test's own, removed at scope exit.
struct scratch_name {
  std::string name;
  scratch_name() {
    static int serial = 0;
    name = "test-gpu-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  }
  ~scratch_name() { bam::emu::remove_shared_memory(name); }
};

int gpu_count() {
  int n = 0;
  BAM_CUDA_TRY(cudaGetDeviceCount(&n));
  return n;
}

//! Run the peer process to its end; its exit status.
int run_peer(const std::string& what, const std::string& device, int gpu, std::uint64_t first, std::uint64_t count,
             std::uint32_t salt) {
  std::vector<std::string> args{
      BAM_TEST_SHM_PEER,   what, device, std::to_string(gpu), std::to_string(first), std::to_string(count),
      std::to_string(salt)};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

//! Check [first, first + count) of `a` on the current device against `salt`.
tally check_range(bam::array<std::uint32_t>& a, std::uint64_t first, std::uint64_t count, std::uint32_t salt) {
  device_tally t;
  check_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt, t.buf.get());
  BAM_CUDA_TRY(cudaGetLastError());
  a.check();
  return t.get();
}

//! This process on `gpu` and a peer process on `peer_gpu`, each with its own
//! storage and cache over one shared medium: the peer writes the table and
//! this process checks every element; then the other way round.
void two_processes(int gpu, int peer_gpu) {
  scratch_name n;
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(media_bytes);
  const bam::device_scope on(gpu);
  // Open while the peer runs: both processes map the medium at once.
  bam::storage s(dev);
  REQUIRE(s.spec().media == bam::media_kind::shm);
  // The peer attaches (no size= given): the object must already be there.
  REQUIRE(run_peer("write", "emu-gpu:shm=" + n.name, peer_gpu, 0, table_words, 3) == 0);

  bam::page_cache cache({.page_size = page_bytes, .capacity = cache_bytes});
  {
    bam::array<std::uint32_t> a(cache, s, table_words);
    const tally t = check_range(a, 0, table_words, 3);
    INFO("first wrong element " << t.first_bad);
    CHECK(t.done == table_words);
    CHECK(t.bad == 0);
    // And this process's writes reach the peer.
    write_table<<<grid_blocks, block_threads>>>(a.ref(), 0, table_words, 4);
    BAM_CUDA_TRY(cudaGetLastError());
    a.check();
    cache.flush();
  }
  CHECK(run_peer("check", dev, peer_gpu, 0, table_words, 4) == 0);
  // A salt nobody wrote: the peer's check must fail (it can tell).
  CHECK(run_peer("check", dev, peer_gpu, 0, table_words, 5) == 1);
}

} // namespace

TEST_CASE("shared media: two processes on one GPU, one writes the table, the other reads every element", "[shm][gpu]") {
  two_processes(0, 0);
}

TEST_CASE("shared media: two processes on two GPUs, one writes the table, the other reads every element",
          "[shm][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  two_processes(0, 1);
}

TEST_CASE("shared media: one process, a storage and a cache per GPU over one medium, both GPUs at once", "[shm][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  scratch_name n;
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(media_bytes) + ",unlink";
  // Built from GPU 1: each object goes where its options say, and the
  // caller's device is current again after each.
  const bam::device_scope start(1);
  bam::storage s0(dev, {.device = 0});
  CHECK(bam::current_device() == 1);
  bam::storage s1(dev, {.device = 1});
  CHECK(s0.device() == 0);
  CHECK(s1.device() == 1);
  // One copy of the data: both engines serve the same mapping.
  REQUIRE(bam::emu::gpu_engine_of(s0, 0) != nullptr);
  REQUIRE(bam::emu::gpu_engine_of(s1, 0) != nullptr);
  CHECK(bam::emu::gpu_engine_of(s0, 0)->media_data() == bam::emu::gpu_engine_of(s1, 0)->media_data());
  CHECK(bam::emu::gpu_engine_of(s0, 0)->device() == 0);
  CHECK(bam::emu::gpu_engine_of(s1, 0)->device() == 1);

  bam::page_cache c0({.page_size = page_bytes, .capacity = cache_bytes, .device = 0});
  bam::page_cache c1({.page_size = page_bytes, .capacity = cache_bytes, .device = 1});
  CHECK(bam::current_device() == 1);
  CHECK(c0.device() == 0);
  // A cache serves storages of its own GPU.
  try {
    bam::array<std::uint32_t> wrong(c0, s1, table_words);
    FAIL("a cache on GPU 0 took a storage of GPU 1");
  } catch (const bam::error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::ContainsSubstring("device 1"));
  }

  // An array's own memory (its error record) is made on the current device:
  // each array is built with its GPU current.
  std::optional<bam::array<std::uint32_t>> a0_, a1_;
  {
    const bam::device_scope on(0);
    a0_.emplace(c0, s0, table_words);
  }
  {
    const bam::device_scope on(1);
    a1_.emplace(c1, s1, table_words);
  }
  bam::array<std::uint32_t>& a0 = *a0_;
  bam::array<std::uint32_t>& a1 = *a1_;
  const std::uint64_t half = table_words / 2; // a whole number of pages: no page is in both caches
  static_assert((table_words / 2) % (page_bytes / 4) == 0);
  // Disjoint halves, written by both GPUs at once.
  {
    const bam::device_scope on(0);
    write_table<<<grid_blocks, block_threads>>>(a0.ref(), 0, half, 7);
    BAM_CUDA_TRY(cudaGetLastError());
  }
  {
    const bam::device_scope on(1);
    write_table<<<grid_blocks, block_threads>>>(a1.ref(), half, table_words - half, 7);
    BAM_CUDA_TRY(cudaGetLastError());
  }
  for (int g = 0; g < 2; ++g) {
    const bam::device_scope on(g);
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    (g == 0 ? a0 : a1).check();
  }
  c0.flush();
  c1.flush();
  CHECK(bam::current_device() == 1);

  // Each GPU reads the half the other wrote, both at once.
  std::vector<device_tally> tallies;
  tallies.reserve(2);
  {
    const bam::device_scope on(0);
    tallies.emplace_back();
    check_table<<<grid_blocks, block_threads>>>(a0.ref(), half, table_words - half, 7, tallies[0].buf.get());
    BAM_CUDA_TRY(cudaGetLastError());
  }
  {
    const bam::device_scope on(1);
    tallies.emplace_back();
    check_table<<<grid_blocks, block_threads>>>(a1.ref(), 0, half, 7, tallies[1].buf.get());
    BAM_CUDA_TRY(cudaGetLastError());
  }
  for (int g = 0; g < 2; ++g) {
    const bam::device_scope on(g);
    BAM_CUDA_TRY(cudaDeviceSynchronize());
    (g == 0 ? a0 : a1).check();
    const tally t = tallies[static_cast<std::size_t>(g)].get();
    INFO("GPU " << g << ": first wrong element " << t.first_bad);
    CHECK(t.done == (g == 0 ? table_words - half : half));
    CHECK(t.bad == 0);
  }

  // The medium itself, read on the host: every element, from both halves.
  std::vector<std::uint32_t> words(table_words);
  bam::emu::read_media(s1, 0, 0, words.data(), words.size() * 4);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < table_words; ++i)
    bad += words[i] != table_word(i, 7);
  CHECK(bad == 0);
}
