// SPDX-License-Identifier: MIT
// The queue protocol under many concurrent submitters against a peer that
// completes out of order: every command completes exactly once, to the thread
// that submitted it, through queues of depth 2, 8 and 1024 with many
// wrap-arounds; doorbells are batched; a silent peer yields a timeout.
#include "loopback_controller.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <atomic>
#include <thread>
#include <vector>

using namespace bam;

namespace {
constexpr int submitters = 16;
constexpr std::uint32_t commands_total = 100'000;

struct outcome {
  std::vector<std::atomic<std::uint32_t>> seen;
  std::atomic<std::uint64_t> mismatched{0};
  std::atomic<std::uint64_t> failed{0};
  explicit outcome(std::size_t n) : seen(n) {}
};

void submit_all(const nvme::queue_pair_ref& q, outcome& out, int thread, std::uint32_t per_thread, bool async_pairs) {
  for (std::uint32_t i = 0; i < per_thread; i += async_pairs ? 2 : 1) {
    // Each command carries a unique id in CDW12; the peer echoes a token of it.
    const std::uint32_t id = static_cast<std::uint32_t>(thread) * per_thread + i;
    nvme::command c = nvme::make_command(0x80);
    c.cdw12 = id;
    if (!async_pairs) {
      std::uint32_t dw0 = 0;
      const nvme::status st = q.execute(c, &dw0);
      if (!st.ok()) {
        out.failed.fetch_add(1);
        continue;
      }
      if (dw0 != test::echo_token(c)) out.mismatched.fetch_add(1);
      out.seen[id].fetch_add(1);
    } else {
      // Two commands in flight from one thread, waited in reverse order;
      // their completions are delivered to records.
      nvme::command c2 = c;
      c2.cdw12 = id + 1;
      std::uint64_t t1 = 0, t2 = 0;
      nvme::completion_record r1, r2;
      if (!q.submit(c, t1, &r1).ok() || !q.submit(c2, t2, &r2).ok()) {
        out.failed.fetch_add(1);
        continue;
      }
      std::uint32_t d1 = 0, d2 = 0;
      const nvme::status s2 = q.wait(t2, r2, &d2);
      const nvme::status s1 = q.wait(t1, r1, &d1);
      if (!s1.ok() || !s2.ok()) {
        out.failed.fetch_add(1);
        continue;
      }
      if (d1 != test::echo_token(c) || d2 != test::echo_token(c2)) out.mismatched.fetch_add(1);
      out.seen[id].fetch_add(1);
      out.seen[id + 1].fetch_add(1);
    }
  }
}
} // namespace

TEST_CASE("queue protocol: 16 threads, 100,000 commands, every one completed exactly once", "[queue][stress]") {
  const std::uint32_t depth = GENERATE(2u, 8u, 1024u);
  const bool async_pairs = GENERATE(false, true);
  CAPTURE(depth, async_pairs);
  test::loopback_controller peer(depth, depth * 7 + async_pairs);
  auto q = peer.queue();
  q.timeout_ns = 60'000'000'000ull; // generous under ThreadSanitizer on 2 cores
  const std::uint32_t per_thread = commands_total / submitters;
  outcome out(static_cast<std::size_t>(per_thread) * submitters);
  std::vector<std::thread> threads;
  for (int t = 0; t < submitters; ++t)
    threads.emplace_back([&, t] { submit_all(q, out, t, per_thread, async_pairs); });
  for (auto& t : threads)
    t.join();

  CHECK(out.failed.load() == 0);
  CHECK(out.mismatched.load() == 0);
  std::size_t not_once = 0;
  for (auto& s : out.seen)
    not_once += s.load() != 1;
  CHECK(not_once == 0);
  CHECK(peer.completed() == static_cast<std::uint64_t>(per_thread) * submitters);
  CHECK(peer.overruns() == 0);
  const auto* counters = q.counters;
  CHECK(counters->submitted == static_cast<std::uint64_t>(per_thread) * submitters);
  // Wrap-arounds: the SQ was reused thousands of times.
  CHECK(counters->sq_tail / depth >= commands_total / depth - 1);
  CHECK(counters->cq_head == static_cast<std::uint64_t>(per_thread) * submitters);
  CHECK_FALSE(q.broken());
}

TEST_CASE("queue protocol: contiguous ready slots are published with one doorbell write", "[queue]") {
  test::loopback_controller peer(64, 13);
  auto q = peer.queue();
  // Hold the doorbell lock as a slow ringer would, while 10 commands become ready.
  auto* lock = &q.counters->sq_lock;
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device>(*lock).store(1);
  nvme::completion_record rec[10];
  std::uint64_t tickets[10] = {};
  for (std::uint32_t i = 0; i < 10; ++i) {
    nvme::command c = nvme::make_command(0x80);
    c.cdw12 = i;
    REQUIRE(q.submit(c, tickets[i], &rec[i]).ok());
  }
  CHECK(q.counters->submitted == 0); // nothing rung while the lock is held
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_device>(*lock).store(0);
  q.ring();
  CHECK(q.counters->submitted == 10);
  CHECK(q.counters->doorbells == 1);
  for (std::uint32_t i = 0; i < 10; ++i)
    CHECK(q.wait(tickets[i], rec[i]).ok());
}

TEST_CASE("queue protocol: error statuses reach the submitter of that command", "[queue]") {
  test::loopback_controller peer(64, 3);
  peer.fail_tokens_with_bit(1u << 4);
  auto q = peer.queue();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (std::uint32_t i = 0; i < 2000; ++i) {
        nvme::command c = nvme::make_command(0x80);
        c.cdw12 = static_cast<std::uint32_t>(t) * 2000 + i;
        const bool should_fail = (test::echo_token(c) & (1u << 4)) != 0;
        const nvme::status st = q.execute(c);
        const bool failed =
            st.sct() == nvme::status_type::media_error && st.sc() == nvme::media_status::unrecovered_read_error;
        if (failed != should_fail || (!failed && !st.ok())) wrong.fetch_add(1);
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("queue protocol: a peer that stops answering gives a timeout, then a broken queue", "[queue][timeout]") {
  test::loopback_controller peer(8, 5);
  auto q = peer.queue();
  q.timeout_ns = 200'000'000; // 200 ms
  nvme::command c = nvme::make_command(0x80);
  REQUIRE(q.execute(c).ok());
  peer.stop_answering(true);
  const auto t0 = std::chrono::steady_clock::now();
  const nvme::status st = q.execute(c);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(st == nvme::status_timeout);
  CHECK(waited >= std::chrono::milliseconds(200));
  CHECK(waited < std::chrono::seconds(5));
  CHECK(q.broken());
  // Later calls fail at once instead of waiting again.
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(q.execute(c) == nvme::status_queue_broken);
  CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(100));
}

TEST_CASE("queue protocol: many threads time out together without hanging", "[queue][timeout]") {
  test::loopback_controller peer(16, 9);
  peer.stop_answering(true);
  auto q = peer.queue();
  q.timeout_ns = 100'000'000;
  std::atomic<int> non_error{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        const nvme::status st = q.execute(nvme::make_command(0x80));
        if (st.ok()) non_error.fetch_add(1);
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(non_error.load() == 0);
  CHECK(q.broken());
}

TEST_CASE("queue protocol: no ready entry is left unpublished when two submitters race", "[queue][stress]") {
  test::loopback_controller peer(1024, 11);
  auto q = peer.queue();
  constexpr int rounds = 100'000;
  std::atomic<int> arrived{0};
  std::atomic<std::uint64_t> unpublished{0}, failures{0};
  nvme::completion_record rec[2];
  auto body = [&](int me) {
    for (int r = 0; r < rounds; ++r) {
      std::uint64_t ticket = 0;
      nvme::command c = nvme::make_command(0x80);
      c.cdw12 = static_cast<std::uint32_t>(r * 2 + me);
      if (!q.submit(c, ticket, &rec[me]).ok()) failures.fetch_add(1);
      // Both submit() calls have returned: both entries must be rung by now.
      // Two barriers a round; barrier k is passed when `arrived` reaches 2k.
      arrived.fetch_add(1);
      while (arrived.load() < 4 * r + 2)
        std::this_thread::yield();
      if (me == 0) {
        const std::uint64_t tail =
            cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device>(q.counters->sq_tail).load();
        if (tail != static_cast<std::uint64_t>(2 * r + 2)) unpublished.fetch_add(1);
      }
      if (!q.wait(ticket, rec[me]).ok()) failures.fetch_add(1);
      arrived.fetch_add(1);
      while (arrived.load() < 4 * r + 4)
        std::this_thread::yield();
    }
  };
  std::thread other(body, 1);
  body(0);
  other.join();
  CHECK(failures.load() == 0);
  CHECK(unpublished.load() == 0);
}
