// SPDX-License-Identifier: MIT
// The page cache's hard cases: failed write-backs (of a neighbour, on
// detach), failed loads that must not stick, arrays that overlap.
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>

using bam_test::counters;
using bam_test::device_counters;
using bam_test::layout;
using Catch::Matchers::ContainsSubstring;

namespace {

__device__ std::uint32_t value_of(std::uint64_t i, std::uint32_t salt) {
  return static_cast<std::uint32_t>(bam_test::rnd(i * 977 + salt));
}

// One thread walks the given pages in order (writes or reads their first element).
__global__ void pages_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t first_page, std::uint64_t pages,
                             std::uint32_t per_page, bool write, std::uint32_t salt, layout l, counters* c) {
  for (std::uint64_t p = first_page; p < first_page + pages; ++p) {
    const std::uint64_t i = p * per_page;
    if (write) {
      a.write(i, value_of(i, salt));
    } else {
      const std::uint32_t v = a[i];
      c->bad += v != l.expected(i);
      c->done += 1;
    }
  }
}

__global__ void write_range(bam::array_ref<std::uint32_t> a, std::uint64_t n, std::uint32_t salt) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, value_of(i, salt));
}
__global__ void check_range(bam::array_ref<std::uint32_t> a, std::uint64_t offset, std::uint64_t n, std::uint32_t salt,
                            counters* c) {
  unsigned long long bad = 0;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    bad += a[i] != value_of(i + offset, salt);
  if (bad) atomicAdd(&c->bad, bad);
}

// c->done counts the elements of [from, to) equal to value_of(i, salt).
__global__ void count_equal(bam::array_ref<std::uint32_t> a, std::uint64_t from, std::uint64_t to, std::uint32_t salt,
                            counters* c) {
  unsigned long long same = 0;
  for (std::uint64_t i = from + blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < to;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    same += a[i] == value_of(i, salt);
  if (same) atomicAdd(&c->done, same);
}

bam::emu::fault_rule failing_writes(std::uint64_t lo, std::uint64_t hi) {
  bam::emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::write);
  r.lba_first = lo;
  r.lba_last = hi;
  r.count = 0; // every time
  r.status = {bam::nvme::status_type::media_error, bam::nvme::media_status::write_fault};
  return r;
}

//! The slot of element `i`'s page (brought in), to `out`.
__global__ void slot_of_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t i, std::uint32_t* out) {
  std::uint32_t slot = ~0u;
  const bool arrived = a.prefetch(i, true, &slot);
  if (threadIdx.x == 0) *out = arrived ? slot : ~0u;
}

//! Adds `delta` (two's complement) to the state word of `slot` and returns
//! the word as it was.
__global__ void add_to_slot_kernel(bam::page_cache_ref c, std::uint32_t slot, std::uint64_t delta,
                                   unsigned long long* before) {
  *before = atomicAdd(reinterpret_cast<unsigned long long*>(&bam::detail::ref_access::slots(c)[slot]),
                      static_cast<unsigned long long>(delta));
}

//! Every thread pins the page of `key` in `slot` and keeps what it gets:
//! even threads by a lookup (`pin`), odd ones by the slot (`pin_slot`).
//! done: pins taken; errors: outcomes other than a pin or a refusal.
__global__ void pin_crowd_kernel(bam::page_cache_ref c, std::uint32_t slot, std::uint64_t key, counters* out) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const bam::pin_result r = tid % 2 == 0 ? c.pin(key, false) : c.pin_slot(slot, key);
  if (r.state == bam::pin_state::hit && r.slot == slot)
    atomicAdd(&out->done, 1ull);
  else if (r.state != bam::pin_state::retry)
    atomicAdd(&out->errors, 1ull);
}

} // namespace

TEST_CASE("a neighbour's failed write-back does not fail a read, and is reported", "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  // One set of four slots: every new page needs a victim from the same four.
  bam::page_cache cache({.page_size = 4096, .capacity = 4 * 4096, .ways = 4});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  auto& faults = bam::emu::software_controller(s, 0).faults();
  const auto rule = faults.add(failing_writes(0, 7)); // page 0's write-back fails, the others' succeed
  device_counters c;
  pages_kernel<<<1, 1>>>(a.ref(), 0, 4, 1024, true, 1, l, c.ptr()); // four dirty pages
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  pages_kernel<<<1, 1>>>(a.ref(), 4, 12, 1024, false, 1, l, c.ptr()); // each read evicts a dirty page
  BAM_TEST_SYNC();
  CHECK(c.get().done == 12);
  CHECK(c.get().bad == 0); // every read returned its data
  CHECK(faults.fired(rule) >= 1);
  // The failed write-back is reported, with the page that could not be written.
  try {
    a.check();
    FAIL("the failed write-back was not reported");
  } catch (const bam::error& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), ContainsSubstring("write-back"));
    REQUIRE(e.context().lba.has_value());
    CHECK(*e.context().lba == 0);
  }
  // Once the fault is gone, a flush writes the page.
  faults.clear();
  REQUIRE_NOTHROW(cache.flush());
  std::uint32_t first = 0;
  bam::emu::read_media(s, 0, 0, &first, 4);
  std::uint32_t want = static_cast<std::uint32_t>(bam_test::rnd(0 * 977 + 1));
  CHECK(first == want);
}

TEST_CASE("a failed load does not stick: the retry after the fault is gone succeeds", "[gpu][cache][sanitize]") {
  bam::storage s("emu-gpu:hbm=4M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 << 10});
  bam::array<std::uint32_t> a(cache, s, (4ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  bam::emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::read);
  r.lba_first = 800;
  r.lba_last = 807;
  r.count = 1; // a transient error
  r.status = {bam::nvme::status_type::media_error, bam::nvme::media_status::unrecovered_read_error};
  bam::emu::software_controller(s, 0).faults().add(r);
  device_counters c;
  pages_kernel<<<1, 1>>>(a.ref(), 100, 1, 1024, false, 0, l, c.ptr());
  BAM_TEST_SYNC();
  CHECK_THROWS_WITH(a.check(), ContainsSubstring("Unrecovered Read Error"));
  c.reset();
  pages_kernel<<<1, 1>>>(a.ref(), 100, 1, 1024, false, 0, l, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().done == 1);
  CHECK(c.get().bad == 0);
}

namespace {

// Warp w reads page first_page + w.
__global__ void page_per_warp_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t first_page,
                                     std::uint32_t per_page) {
  const std::uint64_t w = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  volatile std::uint32_t sink = a[(first_page + w) * per_page + threadIdx.x % 32];
  (void)sink;
}

// Seconds from `launch` until the GPU has finished what it started.
template <class Launch>
double seconds_of(Launch&& launch) {
  const auto t0 = std::chrono::steady_clock::now();
  launch();
  BAM_TEST_SYNC();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A fault rule that drops every command of `op` (the controller never answers them).
bam::emu::fault_rule drop_all(bam::nvme::nvm_opcode op) {
  bam::emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(op);
  r.count = 0;
  r.action = bam::emu::fault_action::drop;
  return r;
}

// `op` throws a bam::error whose status is a timeout (`none`: what it means if it does not throw).
template <class Op>
void require_timeout_from(Op&& op, const char* none) {
  try {
    op();
    FAIL(none);
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == bam::nvme::status_timeout);
  }
}

// check() reports the failures, the first of them a timeout.
void require_timeout_reported(bam::array<std::uint32_t>& a) {
  require_timeout_from([&] { a.check(); }, "the failures were not reported");
}

// flush() reports a write-back it cannot vouch for: a timeout.
void require_flush_reports_timeout(bam::page_cache& cache) {
  require_timeout_from([&] { cache.flush(); }, "flush() reported nothing");
}

} // namespace

TEST_CASE("a set whose slots a timed-out load may still land in fails later misses at once, not a deadline each",
          "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16,timeout=200ms");
  bam_test::fill_pattern(s);
  // One slot. A load into it that is never answered times out; the command
  // may still land, so the slot stays out of use.
  bam::page_cache cache({.page_size = 4096, .capacity = 4096, .ways = 1, .timeout_ns = 200'000'000ull});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  auto& faults = bam::emu::software_controller(s, 0).faults();
  faults.add(drop_all(bam::nvme::nvm_opcode::read));
  device_counters c;
  pages_kernel<<<1, 1>>>(a.ref(), 0, 1, 1024, false, 0, l, c.ptr());
  BAM_TEST_SYNC();
  CHECK_THROWS(a.check());
  faults.clear();
  // 128 warps miss on that set. Each used to hold the set's turn for a whole
  // deadline before failing (128 x 200 ms); now each fails at once.
  const double seconds = seconds_of([&] { page_per_warp_kernel<<<32, 128>>>(a.ref(), 1, 1024); });
  INFO("128 misses on a lost set took " << seconds << " s");
  CHECK(seconds < 10.0);
  require_timeout_reported(a);
  // One miss alone (the kernel loaded now): it used to wait out the whole
  // deadline (200 ms) for a slot that never frees; now it fails at once.
  const double one = seconds_of([&] { page_per_warp_kernel<<<1, 32>>>(a.ref(), 200, 1024); });
  INFO("one miss on a lost set took " << one * 1e3 << " ms");
  CHECK(one < 0.1);
  CHECK_THROWS(a.check());
}

TEST_CASE("a page whose flush timed out stays out of use, and misses on its set fail at once instead of "
          "waiting for it",
          "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16,timeout=200ms");
  bam_test::fill_pattern(s);
  // One slot, holding a dirty page.
  bam::page_cache cache({.page_size = 4096, .capacity = 4096, .ways = 1, .timeout_ns = 200'000'000ull});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  device_counters c;
  pages_kernel<<<1, 1>>>(a.ref(), 0, 1, 1024, true, 5, l, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  // Its write-back is never answered: the flush times out, and the write may
  // still read the slot, so the slot stays busy for good.
  auto& faults = bam::emu::software_controller(s, 0).faults();
  faults.add(drop_all(bam::nvme::nvm_opcode::write));
  CHECK_THROWS(cache.flush());
  faults.clear();
  // A miss on that set used to wait a whole deadline (200 ms) for the slot.
  page_per_warp_kernel<<<1, 32>>>(a.ref(), 100, 1024); // the kernel loaded
  BAM_TEST_SYNC();
  CHECK_THROWS(a.check());
  const double one = seconds_of([&] { page_per_warp_kernel<<<1, 32>>>(a.ref(), 200, 1024); });
  INFO("one miss on the set took " << one * 1e3 << " ms");
  CHECK(one < 0.1);
  require_timeout_reported(a);
  // The page can be written back no more, and no flush can tell whether the
  // late write reached the storage: every flush says so, not only the first.
  require_flush_reports_timeout(cache);
  require_flush_reports_timeout(cache);
}

namespace {

// Block 0 pins page `held` (as a reader does while it reads it) and keeps the
// pin until block 1 is done; block 1, one warp, reads page `missed` meanwhile
// and says how long that took. Each wait is bounded, so that a broken cache
// fails the test instead of hanging it.
__global__ void miss_beside_held_pin_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t held, std::uint64_t missed,
                                            unsigned* flags, unsigned* held_state, unsigned long long* took_ns) {
  using flag = cuda::atomic_ref<unsigned, cuda::thread_scope_device>;
  const std::uint64_t give_up = bam::detail::now_ns() + 2'000'000'000ull;
  if (blockIdx.x == 0) {
    if (threadIdx.x != 0) return;
    const bam::page_cache_ref& cache = bam::detail::ref_access::cache(a);
    const bam::pin_result p = cache.pin(bam::detail::ref_access::key_of(a, held * 1024), false);
    *held_state = static_cast<unsigned>(p.state);
    flag(flags[0]).store(1, cuda::memory_order_release);
    if (p.state != bam::pin_state::hit) return;
    while (flag(flags[1]).load(cuda::memory_order_acquire) == 0 && bam::detail::now_ns() < give_up) {
    }
    cache.release_read(p.slot, 0);
    return;
  }
  while (flag(flags[0]).load(cuda::memory_order_acquire) == 0 && bam::detail::now_ns() < give_up) {
  }
  const std::uint64_t t0 = bam::detail::now_ns();
  volatile std::uint32_t sink = a[missed * 1024 + threadIdx.x];
  (void)sink;
  __syncwarp();
  if (threadIdx.x == 0) {
    *took_ns = bam::detail::now_ns() - t0;
    flag(flags[1]).store(1, cuda::memory_order_release);
  }
}

} // namespace

TEST_CASE("a write-back that times out during a miss keeps its slot out of use, and each flush reports the page",
          "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16,timeout=200ms");
  bam_test::fill_pattern(s);
  // One slot, holding a dirty page (page 0).
  bam::page_cache cache({.page_size = 4096, .capacity = 4096, .ways = 1, .timeout_ns = 200'000'000ull});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  const layout l{0, 4096, 512, 1};
  device_counters c;
  pages_kernel<<<1, 1>>>(a.ref(), 0, 1, 1024, true, 5, l, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  // A miss on page 1 writes page 0 back first; that write is never answered.
  auto& faults = bam::emu::software_controller(s, 0).faults();
  faults.add(drop_all(bam::nvme::nvm_opcode::write));
  pages_kernel<<<1, 1>>>(a.ref(), 1, 1, 1024, false, 0, l, c.ptr());
  BAM_TEST_SYNC();
  require_timeout_reported(a); // the read of page 1
  CHECK_THROWS(a.check());     // the write-back of page 0
  REQUIRE_NOTHROW(a.check());
  faults.clear();
  // The write may still read the slot, so the slot was not freed: no later
  // flush writes it again and calls that a success, and no miss reuses it.
  require_flush_reports_timeout(cache);
  require_flush_reports_timeout(cache);
  const double one = seconds_of([&] { page_per_warp_kernel<<<1, 32>>>(a.ref(), 2, 1024); });
  INFO("one miss on the set took " << one * 1e3 << " ms");
  CHECK(one < 0.1);
  require_timeout_reported(a);
  // The lost page stays readable. A reader that holds it pinned frees
  // nothing: a miss on its set still fails at once, not after a deadline.
  bam::device_buffer<unsigned> flags(2);
  bam::device_buffer<unsigned> held_state(1);
  bam::device_buffer<unsigned long long> took(1);
  BAM_CUDA_TRY(cudaMemset(flags.get(), 0, 2 * sizeof(unsigned)));
  miss_beside_held_pin_kernel<<<2, 32>>>(a.ref(), 0, 3, flags.get(), held_state.get(), took.get());
  BAM_TEST_SYNC();
  unsigned state = 0;
  unsigned long long ns = 0;
  bam::copy_to_host(&state, held_state.get(), 1);
  bam::copy_to_host(&ns, took.get(), 1);
  REQUIRE(state == static_cast<unsigned>(bam::pin_state::hit));
  INFO("a miss beside the pinned lost page took " << ns / 1e6 << " ms");
  CHECK(ns < 100'000'000ull);
  require_timeout_reported(a);
}

namespace {

// Warps 1-6 read one page each at once; warp 7 reads page 0 a little later
// (its load queues behind theirs); warps 8-15 read page 0 later still, and
// so wait for warp 7's load. Lane 0 of each reads; the waiters say how long
// they took.
__global__ void wait_for_queued_load_kernel(bam::array_ref<std::uint32_t> a, layout l, counters* c,
                                            unsigned long long* waited_ns) {
  const unsigned warp = blockIdx.x; // one warp per block
  if (threadIdx.x != 0 || warp == 0) return;
  const std::uint64_t page = warp <= 6 ? 10 + warp : 0;
  const std::uint64_t start = bam::detail::now_ns() + (warp <= 6 ? 0 : warp == 7 ? 20'000'000ull : 50'000'000ull);
  while (bam::detail::now_ns() < start) {
  }
  const std::uint64_t t0 = bam::detail::now_ns();
  const std::uint64_t i = page * 1024 + 3;
  const std::uint32_t v = a[i];
  if (warp >= 8) atomicMax(waited_ns, static_cast<unsigned long long>(bam::detail::now_ns() - t0));
  atomicAdd(&c->bad, v != l.expected(i) ? 1ull : 0ull);
  atomicAdd(&c->done, 1ull);
}

//! Runs `wait_for_queued_load_kernel` over `device` through a cache with
//! deadline `timeout_ns`: how long the waiters took, the kernel's counts,
//! and what `check()` threw ("" if nothing).
void run_queued_waits(const char* device, std::uint64_t timeout_ns, unsigned long long& waited_ns, counters& r,
                      std::string& check_error) {
  bam::storage s(device);
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20, .timeout_ns = timeout_ns});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  device_counters c;
  bam::device_buffer<unsigned long long> waited(1);
  BAM_CUDA_TRY(cudaMemset(waited.get(), 0, sizeof(unsigned long long)));
  wait_for_queued_load_kernel<<<16, 32>>>(a.ref(), layout{0, 4096, 512, 1}, c.ptr(), waited.get());
  BAM_TEST_SYNC();
  bam::copy_to_host(&waited_ns, waited.get(), 1);
  r = c.get();
  check_error.clear();
  try {
    a.check();
  } catch (const std::exception& e) {
    check_error = e.what();
  }
}

} // namespace

TEST_CASE("a miss that waits for another warp's load waits as long as the load does, also past a deadline",
          "[gpu][cache]") {
  // One queue with room for one command, served at 10 commands per second:
  // it completes one every 100 ms (half a deadline), and a load queued
  // behind six others waits about 600 ms without ever timing out.
  unsigned long long ns = 0;
  counters r{};
  std::string error;
  run_queued_waits("emu-gpu:hbm=8M,queues=1,depth=2,timeout=200ms,iops=10", 200'000'000ull, ns, r, error);
  INFO("the warps that waited for the queued load took up to " << ns / 1e6 << " ms");
  // They did wait longer than a deadline (else this proves nothing) ...
  CHECK(ns > 300'000'000ull);
  // ... and the load they waited for ended it, not their own deadline.
  CHECK(error == "");
  CHECK(r.done == 15);
  CHECK(r.bad == 0);
}

TEST_CASE("a deadline too large to add to the clock means no deadline", "[gpu][cache]") {
  // The same waits, on a cache whose deadline is the largest value: every
  // wait must last as long as its command does, none end at once.
  unsigned long long ns = 0;
  counters r{};
  std::string error;
  run_queued_waits("emu-gpu:hbm=8M,queues=1,depth=2,iops=100", ~0ull, ns, r, error);
  CHECK(error == "");
  CHECK(r.done == 15);
  CHECK(r.bad == 0);
}

namespace {

// Warp 0's first lane reads page `dropped`, and says how long that took;
// every other warp keeps missing on other pages for `busy_ns`.
__global__ void dropped_beside_busy_kernel(bam::array_ref<std::uint32_t> a, std::uint64_t dropped, std::uint64_t pages,
                                           std::uint64_t busy_ns, unsigned long long* took_ns) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (warp == 0) {
    if (lane == 0) {
      const std::uint64_t t0 = bam::detail::now_ns();
      volatile std::uint32_t sink = a[dropped * 1024];
      (void)sink;
      *took_ns = bam::detail::now_ns() - t0;
    }
    return;
  }
  const std::uint64_t end = bam::detail::now_ns() + busy_ns;
  std::uint64_t k = warp * 0x9e3779b97f4a7c15ull;
  while (bam::detail::now_ns() < end) {
    k = k * 6364136223846793005ull + 1442695040888963407ull;
    const std::uint64_t p = (k >> 33) % pages;
    if (p == dropped) continue;
    volatile std::uint32_t sink = a[p * 1024 + lane];
    (void)sink;
  }
}

} // namespace

TEST_CASE("a lane whose command is dropped times out after one deadline while other warps keep its queue busy",
          "[gpu][cache]") {
  // One queue: every warp's commands share it, and its completions keep coming.
  bam::storage s("emu-gpu:hbm=64M,queues=1,depth=64,timeout=200ms");
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20, .timeout_ns = 200'000'000ull});
  const std::uint64_t pages = (64ull << 20) / 4096;
  bam::array<std::uint32_t> a(cache, s, pages * 1024);
  const std::uint64_t dropped = 777;
  bam::emu::fault_rule drop = drop_all(bam::nvme::nvm_opcode::read);
  drop.lba_first = dropped * 8;
  drop.lba_last = dropped * 8 + 7;
  bam::emu::software_controller(s, 0).faults().add(drop);
  bam::device_buffer<unsigned long long> took(1);
  // The others keep missing for 3 s (15 deadlines): their completions on the
  // same queue must not keep the dropped read waiting.
  dropped_beside_busy_kernel<<<16, 256>>>(a.ref(), dropped, pages, 3'000'000'000ull, took.get());
  BAM_TEST_SYNC();
  unsigned long long ns = 0;
  bam::copy_to_host(&ns, took.get(), 1);
  INFO("the dropped read took " << ns / 1e6 << " ms");
  CHECK(ns >= 150'000'000ull);  // it did wait out a deadline
  CHECK(ns < 1'000'000'000ull); // and not the others' 3 s
  // Its failure is reported (with the failures of the others whose commands
  // were on the queue it broke).
  CHECK_THROWS(a.check());
}

TEST_CASE("a failed write-back on detach loses nothing: the pages stay, and a later array sees them", "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  auto& faults = bam::emu::software_controller(s, 0).faults();
  const std::uint64_t n = (256ull << 10) / 4; // 256 KiB: all of it stays in the cache
  {
    bam::array<std::uint32_t> a(cache, s, n, 0);
    write_range<<<64, 256>>>(a.ref(), n, 9);
    BAM_TEST_SYNC();
    REQUIRE_NOTHROW(a.check());
    faults.add(failing_writes(0, ~0ull));
    CHECK_THROWS_WITH(a.detach(), ContainsSubstring("write-back on detach failed"));
  }
  // A new array over the same blocks reads what the first one wrote (from the cache).
  bam::array<std::uint32_t> b(cache, s, n, 0);
  device_counters c;
  check_range<<<64, 256>>>(b.ref(), 0, n, 9, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(b.check());
  CHECK(c.get().bad == 0);
  // An array that cannot share those pages (not page aligned) is refused while they are dirty.
  CHECK_THROWS_WITH(bam::array<std::uint32_t>(cache, s, n, 3), ContainsSubstring("page boundary"));
  // The fault goes away: a flush writes everything.
  faults.clear();
  REQUIRE_NOTHROW(cache.flush());
  std::vector<std::uint32_t> media(n);
  bam::emu::read_media(s, 0, 0, media.data(), n * 4);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    bad += media[i] != static_cast<std::uint32_t>(bam_test::rnd(i * 977 + 9));
  CHECK(bad == 0);
}

TEST_CASE("arrays that overlap share pages when both are page aligned, and are refused otherwise", "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=16M,ssds=2,queues=8,depth=32");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 65536, .capacity = 4 << 20});
  const std::uint64_t n = (4ull << 20) / 4;
  bam::array<std::uint32_t> a(cache, s, n, 0);
  // Half a 64 KiB page (64 blocks) into a's blocks: the pages would not line up.
  try {
    bam::array<std::uint32_t> b(cache, s, n, 64);
    FAIL("an overlap by half a page was accepted");
  } catch (const bam::error& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), ContainsSubstring("overlaps") && ContainsSubstring("page boundary"));
  }
  // One page (128 blocks) in, on both controllers: b's page 0 is a's page 2.
  bam::array<std::uint32_t> b(cache, s, n, 128);
  write_range<<<128, 256>>>(a.ref(), n, 4);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  device_counters c;
  const std::uint64_t shift = 2 * 65536 / 4; // b's element 0 is a's element 32768
  check_range<<<128, 256>>>(b.ref(), shift, n - shift, 4, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(b.check());
  CHECK(c.get().bad == 0);
}

TEST_CASE("a page pinned up to the limit refuses more pins and its count never reaches the state bits",
          "[gpu][cache]") {
  using bam::detail::slot_pin_limit;
  using bam::detail::slot_pin_mask;
  bam::storage s("emu-gpu:hbm=4M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 64 * 4096});
  bam::array<std::uint32_t> a(cache, s, (4ull << 20) / 4);
  bam::device_buffer<std::uint32_t> d_slot(1);
  slot_of_kernel<<<1, 32>>>(a.ref(), 5000, d_slot.get());
  BAM_TEST_SYNC();
  std::uint32_t slot = 0;
  bam::copy_to_host(&slot, d_slot.get(), 1);
  REQUIRE(slot < cache.ref().slot_count());
  // 40 pins short of the limit; then 4096 threads ask for one each at once.
  constexpr std::uint64_t room = 40;
  bam::device_buffer<unsigned long long> d_word(1);
  add_to_slot_kernel<<<1, 1>>>(cache.ref(), slot, slot_pin_limit - room, d_word.get());
  BAM_TEST_SYNC();
  unsigned long long start = 0;
  bam::copy_to_host(&start, d_word.get(), 1);
  REQUIRE((start & slot_pin_mask) == 0); // nothing held it
  device_counters c;
  const std::uint64_t key = bam::detail::ref_access::key_of(a.ref(), 5000);
  pin_crowd_kernel<<<32, 128>>>(cache.ref(), slot, key, c.ptr());
  BAM_TEST_SYNC();
  const counters got = c.get();
  CHECK(got.errors == 0); // nobody saw the page loading or gone
  CHECK(got.done >= 1);
  CHECK(got.done <= room);
  // Take every pin back: the word was as it should be, its state bits untouched.
  add_to_slot_kernel<<<1, 1>>>(cache.ref(), slot, 0 - (slot_pin_limit - room + got.done), d_word.get());
  BAM_TEST_SYNC();
  unsigned long long held = 0;
  bam::copy_to_host(&held, d_word.get(), 1);
  CHECK((held & slot_pin_mask) == slot_pin_limit - room + got.done);
  constexpr unsigned long long moving = slot_pin_mask | bam::detail::slot_referenced;
  CHECK((held & ~moving) == (start & ~moving));
  // And the page still reads right.
  device_counters r;
  pages_kernel<<<1, 1>>>(a.ref(), 4, 1, 1024, false, 0, layout{0, 4096, s.lba_size(), 1}, r.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(r.get().done == 1);
  CHECK(r.get().bad == 0);
}

TEST_CASE("invalidate writes a storage's dirty pages back and drops its pages: bytes written around the cache are "
          "read next, other storages' pages stay",
          "[gpu][cache][sanitize]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16");
  bam::storage other("emu-gpu:hbm=8M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam_test::fill_pattern(other);
  bam::page_cache cache({.page_size = 4096, .capacity = 4 << 20}); // 1,024 slots: 128 pages fit
  const std::uint64_t n = (256ull << 10) / 4;                      // 64 pages per array
  const std::uint64_t half = n / 2;
  bam::array<std::uint32_t> a(cache, s, n, 0);
  bam::array<std::uint32_t> b(cache, other, n, 0);
  // a's first half written through the cache (dirty), every page of a and b read in.
  write_range<<<64, 256>>>(a.ref(), half, 9);
  device_counters c;
  count_equal<<<64, 256>>>(a.ref(), half, n, 5, c.ptr());
  count_equal<<<64, 256>>>(b.ref(), 0, n, 5, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(b.check());
  // a's second half rewritten around the cache: the cache still serves the old bytes.
  std::vector<std::uint32_t> fresh(half);
  for (std::uint64_t k = 0; k < half; ++k)
    fresh[k] = static_cast<std::uint32_t>(bam_test::rnd((half + k) * 977 + 5));
  bam::emu::write_media(s, 0, half * 4, fresh.data(), half * 4);
  c.reset();
  count_equal<<<64, 256>>>(a.ref(), half, n, 5, c.ptr());
  BAM_TEST_SYNC();
  CHECK(c.get().done == 0);

  const std::uint64_t misses = cache.counters().misses;
  REQUIRE_NOTHROW(cache.invalidate(s));
  // The dirty half reached the medium.
  std::vector<std::uint32_t> media(half);
  bam::emu::read_media(s, 0, 0, media.data(), half * 4);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < half; ++i)
    bad += media[i] != static_cast<std::uint32_t>(bam_test::rnd(i * 977 + 9));
  CHECK(bad == 0);
  // a reads both halves anew (64 misses); b's pages stayed (no miss).
  c.reset();
  count_equal<<<64, 256>>>(a.ref(), 0, half, 9, c.ptr());
  count_equal<<<64, 256>>>(a.ref(), half, n, 5, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().done == n);
  c.reset();
  count_equal<<<64, 256>>>(b.ref(), 0, n, 5, c.ptr());
  BAM_TEST_SYNC();
  CHECK(cache.counters().misses - misses == n * 4 / 4096);
  // Nothing dirty is left to undo the write: a flush leaves the medium as it is.
  REQUIRE_NOTHROW(cache.flush());
  std::vector<std::uint32_t> second(half);
  bam::emu::read_media(s, 0, half * 4, second.data(), half * 4);
  CHECK(second == fresh);
}

TEST_CASE("write_back writes a storage's dirty pages back and keeps them; invalidate throws while a page is held",
          "[gpu][cache]") {
  bam::storage s("emu-gpu:hbm=8M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 4 << 20});
  const std::uint64_t n = (256ull << 10) / 4; // 64 pages
  bam::array<std::uint32_t> a(cache, s, n, 0);
  write_range<<<64, 256>>>(a.ref(), n, 3);
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  const std::uint64_t misses = cache.counters().misses;
  REQUIRE_NOTHROW(cache.write_back(s));
  CHECK(cache.counters().writebacks == n * 4 / 4096);
  std::vector<std::uint32_t> media(n);
  bam::emu::read_media(s, 0, 0, media.data(), n * 4);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    bad += media[i] != static_cast<std::uint32_t>(bam_test::rnd(i * 977 + 3));
  CHECK(bad == 0);
  // The pages stayed: reading them again takes no miss.
  device_counters c;
  count_equal<<<64, 256>>>(a.ref(), 0, n, 3, c.ptr());
  BAM_TEST_SYNC();
  CHECK(c.get().done == n);
  CHECK(cache.counters().misses == misses);

  // One pin on page 4, as a kernel's page handle holds it: that page stays, and invalidate says so.
  bam::device_buffer<std::uint32_t> d_slot(1);
  slot_of_kernel<<<1, 32>>>(a.ref(), 4 * 1024, d_slot.get());
  BAM_TEST_SYNC();
  std::uint32_t slot = 0;
  bam::copy_to_host(&slot, d_slot.get(), 1);
  REQUIRE(slot < cache.ref().slot_count());
  bam::device_buffer<unsigned long long> d_word(1);
  add_to_slot_kernel<<<1, 1>>>(cache.ref(), slot, 1, d_word.get());
  BAM_TEST_SYNC();
  CHECK_THROWS_WITH(cache.invalidate(s), ContainsSubstring("1 page(s)") && ContainsSubstring("stay in the cache"));
  add_to_slot_kernel<<<1, 1>>>(cache.ref(), slot, 0 - std::uint64_t{1}, d_word.get());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(cache.invalidate(s));
  c.reset();
  count_equal<<<64, 256>>>(a.ref(), 0, n, 3, c.ptr());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  CHECK(c.get().done == n);
  CHECK(cache.counters().misses == misses + n * 4 / 4096); // every page read anew
}
