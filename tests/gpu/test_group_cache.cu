// SPDX-License-Identifier: MIT
// One page cache shared by several processes (`page_cache_config::group`),
// as under torchrun: this process is rank 0, bam_test_group_peer
// (group_peer.cu) rank 1, on the second GPU when there is one, else on the
// same GPU. Pages one process wrote are hits for the other, dirty pages of
// one are evicted and written back by the other, a flush writes back
// everyone's pages (checked through a cache of its own), and a group whose
// ranks differ, or lack one, fails with a clear error.
#include "peer_process.hpp"
#include "shm_table.cuh"

#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <string>

#ifndef BAM_TEST_GROUP_PEER
#error "BAM_TEST_GROUP_PEER must name the peer executable"
#endif

namespace {

using namespace bam_shm_test;
using bam_test::peer;

//! The peer process of these tests.
peer start_peer(const std::string& device, const std::string& group, int gpu, std::size_t page, std::size_t capacity) {
  return peer({BAM_TEST_GROUP_PEER, device, group, "1", "2", std::to_string(gpu), std::to_string(page),
               std::to_string(capacity)});
}

std::string group_name() {
  static int serial = 0;
  return "test-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
}

int peer_gpu() { return gpu_count() >= 2 ? 1 : 0; }

bam::page_cache_config group_config(const std::string& name, int rank, int size, std::size_t page,
                                    std::size_t capacity) {
  bam::page_cache_config cfg;
  cfg.page_size = page;
  cfg.capacity = capacity;
  cfg.device = 0;
  cfg.group.name = name;
  cfg.group.rank = rank;
  cfg.group.size = size;
  cfg.group.timeout_ms = 20000;
  return cfg;
}

void write_range(bam::array<std::uint32_t>& a, std::uint64_t first, std::uint64_t count, std::uint32_t salt) {
  write_table<<<grid_blocks, block_threads>>>(a.ref(), first, count, salt);
  BAM_CUDA_TRY(cudaGetLastError());
  a.check();
}

//! What the medium holds, read through a cache of this process alone.
void check_medium(bam::storage& s, std::uint32_t salt_low, std::uint32_t salt_high) {
  bam::page_cache own({.page_size = page_bytes, .capacity = cache_bytes});
  bam::array<std::uint32_t> a(own, s, table_words);
  const tally lo = check_range(a, 0, table_words / 2, salt_low);
  const tally hi = check_range(a, table_words / 2, table_words / 2, salt_high);
  INFO("first wrong element " << lo.first_bad << " / " << hi.first_bad);
  CHECK(lo.done + hi.done == table_words);
  CHECK(lo.bad == 0);
  CHECK(hi.bad == 0);
}

//! The message of the bam::error `f` throws ("" if none).
template <class F>
std::string failure(F&& f) {
  try {
    f();
  } catch (const bam::error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("two processes share one cache: pages one writes are hits for the other, one flush writes back both") {
  const bam::device_scope on(0);
  scratch_name n;
  bam::storage s("emu-gpu:shm=" + n.name + ",size=" + std::to_string(media_bytes));
  const std::string g = group_name();
  // 512-byte pages: runs of 8 MiB (a 64th of a process's 512 MiB), 128 of
  // them, 64 on each process's GPU; sets enough that no page of the table
  // is evicted.
  constexpr std::size_t page = 512, capacity = 1ull << 30;
  peer p = start_peer("emu-gpu:shm=" + n.name, g, peer_gpu(), page, capacity);
  bam::page_cache cache(group_config(g, 0, 2, page, capacity));
  REQUIRE(p.line() == "ready");
  REQUIRE(cache.config().group.size == 2);
  std::uint64_t mine = 0;
  for (std::uint64_t k = 0; k < cache.slot_count(); ++k)
    mine += cache.slot_part(k) == 0 ? 1 : 0;
  CHECK(cache.run_slots() * page == 8u << 20);
  CHECK(mine == cache.slot_count() / 2);
  CHECK(cache.slot_device(0) == 0);
  CHECK(cache.slot_device(cache.slot_count() - 1) == -1); // the last run is rank 1's
  bam::array<std::uint32_t> a(cache, s, table_words);

  // The peer writes the table into the cache (not flushed: the medium holds zeroes).
  REQUIRE(p.ask("write 0 " + std::to_string(table_words) + " 5") == "ok");
  const std::uint64_t peer_loads = p.check(0, 0, 0).misses;
  CHECK(peer_loads == table_words * 4 / page);
  {
    const tally t = check_range(a, 0, table_words, 5);
    INFO("first wrong element " << t.first_bad);
    CHECK(t.done == table_words);
    CHECK(t.bad == 0);
    CHECK(cache.counters().misses == 0); // every page was there, in either process's GPU memory
  }
  // And the other way round: this process's writes are the peer's hits.
  write_range(a, table_words / 2, table_words / 2, 6);
  const peer::checked hi = p.check(table_words / 2, table_words / 2, 6);
  CHECK(hi.done == table_words / 2);
  CHECK(hi.bad == 0);
  CHECK(hi.misses == peer_loads);
  const peer::checked lo = p.check(0, table_words / 2, 5);
  CHECK(lo.bad == 0);
  // One flush, here, writes back every dirty page, the peer's too.
  cache.flush();
  CHECK(cache.counters().writebacks == table_words * 4 / page);
  CHECK(p.ask("quit").empty());
  CHECK(p.finish() == 0);
  check_medium(s, 5, 6);
}

TEST_CASE("a cache smaller than the table: each process evicts and writes back the other's dirty pages") {
  const bam::device_scope on(0);
  scratch_name n;
  bam::storage s("emu-gpu:shm=" + n.name + ",size=" + std::to_string(media_bytes));
  const std::string g = group_name();
  // 16 MiB of 4 KiB pages: one run, on rank 0's GPU; the table is 64 MiB.
  peer p = start_peer("emu-gpu:shm=" + n.name, g, peer_gpu(), page_bytes, cache_bytes);
  bam::page_cache cache(group_config(g, 0, 2, page_bytes, cache_bytes));
  REQUIRE(p.line() == "ready");
  bam::array<std::uint32_t> a(cache, s, table_words);
  REQUIRE(p.ask("write 0 " + std::to_string(table_words / 2) + " 7") == "ok");
  write_range(a, table_words / 2, table_words / 2, 8);
  const peer::checked lo = p.check(0, table_words / 2, 7);
  const peer::checked hi = p.check(table_words / 2, table_words / 2, 8);
  CHECK(lo.done + hi.done == table_words);
  CHECK(lo.bad == 0);
  CHECK(hi.bad == 0);
  const tally t = check_range(a, 0, table_words / 2, 7);
  CHECK(t.bad == 0);
  CHECK(cache.counters().writebacks > 0); // the peer's dirty pages, evicted here
  REQUIRE(p.ask("flush") == "ok");
  cache.flush();
  CHECK(p.ask("quit").empty());
  CHECK(p.finish() == 0);
  check_medium(s, 7, 8);
}

TEST_CASE("ranks that build different caches fail, each naming both configurations") {
  const bam::device_scope on(0);
  scratch_name n;
  bam::storage s("emu-gpu:shm=" + n.name + ",size=" + std::to_string(media_bytes));
  const std::string g = group_name();
  peer p = start_peer("emu-gpu:shm=" + n.name, g, peer_gpu(), 4096, cache_bytes);
  const std::string mine = failure([&] { bam::page_cache c(group_config(g, 0, 2, 512, cache_bytes)); });
  CHECK(contains(mine, "pages of 512 B"));
  CHECK(contains(mine, "pages of 4096 B"));
  const std::string said = p.line();
  CHECK(said.rfind("error", 0) == 0);
  CHECK(contains(said, "pages of 512 B"));
  CHECK(contains(said, "pages of 4096 B"));
  CHECK(p.finish() == 3);
}

TEST_CASE("a group whose other rank never comes fails after its timeout, naming the rank") {
  const bam::device_scope on(0);
  auto cfg = group_config(group_name(), 0, 2, 4096, cache_bytes);
  cfg.group.timeout_ms = 500;
  const std::string why = failure([&] { bam::page_cache c(cfg); });
  CHECK(contains(why, "rank 1 of page cache group"));
  CHECK(contains(why, "did not appear"));
}

TEST_CASE("a group's cache refuses a storage on a medium of this process alone, and devices given twice") {
  const bam::device_scope on(0);
  bam::page_cache cache(group_config(group_name(), 0, 1, 4096, cache_bytes));
  bam::storage ram("emu-gpu:ram=64M");
  CHECK(contains(failure([&] { bam::array<std::uint32_t> a(cache, ram, 1024); }), "shared medium"));
  auto both = group_config(group_name(), 0, 1, 4096, cache_bytes);
  both.devices = {0, 0};
  CHECK(contains(failure([&] { bam::page_cache c(both); }), "not `devices`"));
}
