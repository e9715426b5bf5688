// SPDX-License-Identifier: MIT
// What the hostile-controller fuzzer (tests/fuzz/fuzz_driver_hostile.cpp)
// found, kept as tests: a controller that reports impossible registers, and
// completion entries for commands that are not in flight.
#include "loopback_controller.hpp"

#include <bam/host.hpp>
#include <bam/emu.hpp>

#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace bam;

//! The software controller with CAP changed on its way to the driver.
class cap_override final : public transport {
public:
  cap_override(std::shared_ptr<transport> inner, std::uint64_t and_mask, std::uint64_t or_bits)
      : inner_(std::move(inner)), and_(and_mask), or_(or_bits) {}
  std::string name() const override { return "cap-override"; }
  std::uint32_t read32(std::uint32_t off) override {
    const std::uint64_t cap = (inner_->read64(nvme::reg::cap) & and_) | or_;
    if (off == nvme::reg::cap) return static_cast<std::uint32_t>(cap);
    if (off == nvme::reg::cap + 4) return static_cast<std::uint32_t>(cap >> 32);
    return inner_->read32(off);
  }
  void write32(std::uint32_t off, std::uint32_t v) override { inner_->write32(off, v); }
  volatile std::uint32_t* doorbell(std::uint32_t off) override { return inner_->doorbell(off); }
  std::unique_ptr<dma_region> map(void* p, std::size_t n, memory_kind k) override { return inner_->map(p, n, k); }

private:
  std::shared_ptr<transport> inner_;
  std::uint64_t and_, or_;
};

std::string bring_up_error(std::shared_ptr<transport> t) {
  try {
    controller c(std::move(t), {});
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

} // namespace

TEST_CASE("a controller reporting CAP.MQES = 0 is refused, not divided by", "[controller][hostile]") {
  nvme::cap_register mask{};
  mask.raw = ~0ull;
  mask.bits.mqes = 0;
  auto t = std::make_shared<cap_override>(emu::make_ram_emulated_controller(1 << 20), mask.raw, 0);
  const std::string e = bring_up_error(t);
  CHECK(e.find("CAP.MQES is 0") != std::string::npos);
  CHECK(e.find("state 'disable'") != std::string::npos);
}

TEST_CASE("a doorbell stride that puts doorbells outside the registers fails bring-up cleanly",
          "[controller][hostile]") {
  // CAP.DSTRD = 15: the admin doorbells sit 128 KiB into a register file
  // that is a few pages long. The transport refuses the offset; the queue
  // memory allocated before must be given back (the ASan copy of this test
  // reports a leak otherwise).
  nvme::cap_register bits{};
  bits.bits.dstrd = 15;
  nvme::cap_register mask{};
  mask.raw = ~0ull;
  mask.bits.dstrd = 0;
  auto t = std::make_shared<cap_override>(emu::make_ram_emulated_controller(1 << 20), mask.raw, bits.raw);
  const std::string e = bring_up_error(t);
  CHECK(e.find("outside the register file") != std::string::npos);
}

namespace {

//! A queue pair over plain memory whose completions the test writes by hand.
struct hand_queue {
  static constexpr std::uint32_t depth = 8;
  std::vector<nvme::command> sq = std::vector<nvme::command>(depth);
  std::vector<nvme::completion> cq = std::vector<nvme::completion>(depth);
  std::uint32_t sq_db = 0, cq_db = 0;
  void* state;
  nvme::queue_pair_ref q;
  std::uint64_t posted = 0;
  hand_queue() {
    const std::size_t bytes = (nvme::queue_state_bytes(depth) + 127) / 128 * 128;
    state = std::aligned_alloc(128, bytes);
    std::memset(state, 0, bytes);
    q.sq = sq.data();
    q.cq = cq.data();
    q.sq_doorbell = &sq_db;
    q.cq_doorbell = &cq_db;
    q.sq_depth = depth;
    q.cq_depth = depth;
    q.qid = 3;
    q.timeout_ns = 50'000'000; // 50 ms: "no completion"
    q.attach_state(state);
  }
  ~hand_queue() { std::free(state); }
  //! Two flushes submitted: tickets `a` and `b`.
  void submit_flushes(std::uint64_t& a, std::uint64_t& b) {
    REQUIRE(q.submit(nvme::make_flush(1), a) == nvme::status_success);
    REQUIRE(q.submit(nvme::make_flush(1), b) == nvme::status_success);
  }
  void post(std::uint16_t cid, std::uint16_t sq_id, std::uint16_t sq_head, std::uint32_t dw0 = 0) {
    emu::write_completion(cq.data(), depth, posted++, sq_head, sq_id, cid, nvme::status_success, dw0,
                          nvme::memory_scope::system);
  }
};

} // namespace

TEST_CASE("a completion for a command id with nothing in flight never completes a later command", "[queue][hostile]") {
  hand_queue h;
  // A stray completion for cid 2 before anything was submitted: consumed, dropped.
  h.post(2, h.q.qid, 0);
  CHECK(h.q.poll() == 1);
  // Tickets 0..2: the third one uses cid 2.
  std::uint64_t t[3];
  for (auto& x : t)
    REQUIRE(h.q.submit(nvme::make_flush(1), x) == nvme::status_success);
  REQUIRE(h.q.cid_of(t[2]) == 2);
  h.post(0, h.q.qid, 3);
  h.post(1, h.q.qid, 3);
  CHECK(h.q.wait(t[0]) == nvme::status_success);
  CHECK(h.q.wait(t[1]) == nvme::status_success);
  // Before the fix the stray entry had been filed under cid 2 and completed
  // ticket 2 at once; now it waits for its own completion and times out.
  CHECK(h.q.wait(t[2]) == nvme::status_timeout);
}

TEST_CASE("a queue timeout too large to add to the clock means no deadline", "[queue][hostile]") {
  hand_queue h;
  h.q.timeout_ns = ~std::uint64_t{0};
  std::uint64_t t = 0;
  REQUIRE(h.q.submit(nvme::make_flush(1), t) == nvme::status_success);
  // The completion comes 100 ms later; a deadline that wrapped around the
  // clock would have ended the wait at once with a timeout.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    h.post(h.q.cid_of(t), h.q.qid, 1);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const nvme::status st = h.q.wait(t);
  const auto waited = std::chrono::steady_clock::now() - t0;
  late.join();
  CHECK(st == nvme::status_success);
  CHECK(waited >= std::chrono::milliseconds(50));
}

TEST_CASE("a duplicate completion and one naming another SQ are dropped", "[queue][hostile]") {
  hand_queue h;
  std::uint64_t a = 0;
  REQUIRE(h.q.submit(nvme::make_flush(1), a) == nvme::status_success);
  h.post(h.q.cid_of(a), h.q.qid, 1);
  CHECK(h.q.wait(a) == nvme::status_success);
  h.post(h.q.cid_of(a), h.q.qid, 1); // the same completion again
  CHECK(h.q.poll() == 1);
  // The next user of that id (one full turn later) is not completed by it.
  std::uint64_t b = 0;
  for (std::uint32_t i = 0; i < h.q.ncids; ++i) {
    REQUIRE(h.q.submit(nvme::make_flush(1), b) == nvme::status_success);
    if (h.q.cid_of(b) == h.q.cid_of(a)) break;
    h.post(h.q.cid_of(b), h.q.qid, static_cast<std::uint16_t>((b + 1) % hand_queue::depth));
    REQUIRE(h.q.wait(b) == nvme::status_success);
  }
  REQUIRE(h.q.cid_of(b) == h.q.cid_of(a));
  h.post(h.q.cid_of(b), static_cast<std::uint16_t>(h.q.qid + 1), 0); // right id, wrong SQ
  CHECK(h.q.wait(b) == nvme::status_timeout);
}

TEST_CASE("in one batch of completions: a repeat after the real one is dropped, the real one after a stray is filed",
          "[queue][hostile]") {
  hand_queue h;
  std::uint64_t a = 0, b = 0;
  h.submit_flushes(a, b);
  // Posted before anyone polls, so one poll consumes them together.
  h.post(h.q.cid_of(a), h.q.qid, 2, 111);                                 // a's completion
  h.post(h.q.cid_of(a), h.q.qid, 2, 222);                                 // the same again
  h.post(h.q.cid_of(b), static_cast<std::uint16_t>(h.q.qid + 1), 2, 333); // b's id, wrong SQ
  h.post(h.q.cid_of(b), h.q.qid, 2, 444);                                 // b's completion
  CHECK(h.q.poll() == 4);
  std::uint32_t dw0 = 0;
  CHECK(h.q.wait(a, &dw0) == nvme::status_success);
  CHECK(dw0 == 111u);
  CHECK(h.q.wait(b, &dw0) == nvme::status_success);
  CHECK(dw0 == 444u);
}

TEST_CASE("a completion whose SQ head says its command was never fetched is dropped", "[queue][hostile]") {
  hand_queue h;
  std::uint64_t a = 0, b = 0;
  h.submit_flushes(a, b);
  // The controller claims b done while reporting that it fetched only a's slot.
  h.post(h.q.cid_of(b), h.q.qid, 1, 0xbad);
  h.post(h.q.cid_of(a), h.q.qid, 1, 0xa);
  std::uint32_t dw0 = 0;
  CHECK(h.q.wait(a, &dw0) == nvme::status_success);
  CHECK(dw0 == 0xa);
  h.post(h.q.cid_of(b), h.q.qid, 2, 0xb); // fetched now
  CHECK(h.q.wait(b, &dw0) == nvme::status_success);
  CHECK(dw0 == 0xb);
}

TEST_CASE("a completion reporting an SQ head outside the queue is dropped", "[queue][hostile]") {
  hand_queue h;
  std::uint64_t a = 0;
  REQUIRE(h.q.submit(nvme::make_flush(1), a) == nvme::status_success);
  h.post(h.q.cid_of(a), h.q.qid, 596, 0xbad); // no slot 596 in a queue of 8
  h.post(h.q.cid_of(a), h.q.qid, 1, 0xa);
  std::uint32_t dw0 = 0;
  CHECK(h.q.wait(a, &dw0) == nvme::status_success);
  CHECK(dw0 == 0xa);
}

TEST_CASE("a controller that reports a lower bound of its SQ head completes commands out of fetch order",
          "[queue][hostile]") {
  // The GPU engine posts completions out of fetch order and reports the count
  // of CQ entries as the SQ head; its queues say so (sq_head_exact = false).
  hand_queue h;
  h.q.sq_head_exact = false;
  std::uint64_t a = 0, b = 0;
  REQUIRE(h.q.submit(nvme::make_flush(1), a) == nvme::status_success);
  REQUIRE(h.q.submit(nvme::make_flush(1), b) == nvme::status_success);
  h.post(h.q.cid_of(b), h.q.qid, 1, 0xb); // b first, with a head that covers one entry
  h.post(h.q.cid_of(a), h.q.qid, 2, 0xa);
  std::uint32_t dw0 = 0;
  CHECK(h.q.wait(b, &dw0) == nvme::status_success);
  CHECK(dw0 == 0xb);
  CHECK(h.q.wait(a, &dw0) == nvme::status_success);
  CHECK(dw0 == 0xa);
  // Duplicates and other SQs are still dropped.
  std::uint64_t c = 0;
  REQUIRE(h.q.submit(nvme::make_flush(1), c) == nvme::status_success);
  h.post(h.q.cid_of(c), static_cast<std::uint16_t>(h.q.qid + 1), 3, 0xbad);
  h.post(h.q.cid_of(c), h.q.qid, 3, 0xc);
  h.post(h.q.cid_of(c), h.q.qid, 3, 0xbad); // the same completion again, before it is collected
  CHECK(h.q.poll() == 3);
  CHECK(h.q.wait(c, &dw0) == nvme::status_success);
  CHECK(dw0 == 0xc);
}

TEST_CASE("the CPU engine reports its fetch position as the SQ head", "[queue][hostile]") {
  CHECK(emu::make_ram_emulated_controller(1 << 20)->exact_sq_head());
}
