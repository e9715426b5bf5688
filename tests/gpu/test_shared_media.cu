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

TEST_CASE("several GPUs: an array on GPU 0, its check, gathers, holds and hot set called while GPU 1 is current",
          "[shm][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  scratch_name n;
  const std::string dev = "emu-gpu:shm=" + n.name + ",size=" + std::to_string(media_bytes) + ",unlink";
  cudaStream_t stream = nullptr; // the user's stream, on GPU 0
  {
    const bam::device_scope on(0);
    BAM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  constexpr std::uint64_t row = 1024;                         // one page a row
  const std::vector<std::uint64_t> ids{5, 4095, 17, 2048, 5}; // rows of the table
  bam::device_buffer<std::uint64_t> d_ids;
  bam::device_buffer<std::uint32_t> d_out;
  {
    const bam::device_scope on(0);
    d_ids = bam::device_buffer<std::uint64_t>(ids.size() + 1);
    d_out = bam::device_buffer<std::uint32_t>((ids.size() + 1) * row);
    const std::uint64_t bad_row = table_words / row; // one past the last row
    bam::copy_to_device(d_ids.get(), ids.data(), ids.size());
    bam::copy_to_device(d_ids.get() + ids.size(), &bad_row, 1);
  }
  {
    // Everything below is called with GPU 1 current; the array lives on GPU 0.
    const bam::device_scope start(1);
    bam::storage s0(dev, {.device = 0});
    bam::page_cache c0({.page_size = page_bytes, .capacity = cache_bytes, .device = 0});
    bam::array<std::uint32_t> a(c0, s0, table_words);
    CHECK(a.device() == 0);
    CHECK(bam::current_device() == 1);
    {
      const bam::device_scope on(0);
      write_table<<<grid_blocks, block_threads, 0, stream>>>(a.ref(), 0, table_words, 3);
      BAM_CUDA_TRY(cudaGetLastError());
    }
    a.check(stream);
    CHECK(bam::current_device() == 1);

    // Gathered once (the rows' pages come into the cache), held, gathered again.
    bam::gather_rows(a, d_ids.get(), ids.size(), row, d_out.get(), stream);
    a.check(stream);
    bam::row_holds<std::uint32_t> holds(a);
    holds.hold(d_ids.get(), ids.size(), row, stream);
    const std::uint64_t held = holds.held(stream);
    CHECK(held > 0);
    CHECK(held <= 4); // one page a row, row 5 twice
    BAM_CUDA_TRY(cudaMemsetAsync(d_out.get(), 0, ids.size() * row * 4, stream));
    bam::gather_rows(a, d_ids.get(), ids.size(), row, d_out.get(), stream);
    holds.release(stream);
    a.check(stream);
    std::vector<std::uint32_t> out(ids.size() * row);
    bam::copy_to_host(out.data(), d_out.get(), out.size(), stream);
    std::uint64_t bad = 0;
    for (std::size_t k = 0; k < ids.size(); ++k)
      for (std::uint64_t j = 0; j < row; ++j)
        bad += out[k * row + j] != table_word(ids[k] * row + j, 3);
    CHECK(bad == 0);

    // A bad row is recorded in the array's error record (on GPU 0) and reported.
    bam::gather_rows(a, d_ids.get(), ids.size() + 1, row, d_out.get(), stream);
    CHECK_THROWS_AS(a.check(stream), bam::error);

    // A hot set made while GPU 1 is current serves a gather on GPU 0; one in
    // GPU memory is in GPU 0's, the array's.
    for (const bam::hot_memory where : {bam::hot_memory::host, bam::hot_memory::gpu}) {
      const bam::hot_rows<std::uint32_t> hot(a, row, {17, 2048}, stream, where);
      if (where == bam::hot_memory::gpu) {
        cudaPointerAttributes at{};
        REQUIRE(cudaPointerGetAttributes(&at, hot.ref().data()) == cudaSuccess);
        CHECK(at.type == cudaMemoryTypeDevice);
        CHECK(at.device == 0);
      }
      BAM_CUDA_TRY(cudaMemsetAsync(d_out.get(), 0, ids.size() * row * 4, stream)); // a GPU 0 stream: fine from GPU 1
      bam::gather_rows(a, d_ids.get(), ids.size(), row, d_out.get(), hot, stream);
      a.check(stream);
      bam::copy_to_host(out.data(), d_out.get(), out.size(), stream);
      bad = 0;
      for (std::size_t k = 0; k < ids.size(); ++k)
        for (std::uint64_t j = 0; j < row; ++j)
          bad += out[k * row + j] != table_word(ids[k] * row + j, 3);
      CHECK(bad == 0);
    }
    CHECK(bam::current_device() == 1);
    // The array, cache and storage are destroyed with GPU 1 current.
  }
  BAM_CUDA_TRY(cudaStreamDestroy(stream));
}
