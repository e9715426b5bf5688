// SPDX-License-Identifier: MIT
// A busy host makes the software controller slow, never failed: a wait gives
// up on a command only once the threads serving the controller have run for
// a whole timeout without completing it. A controller that runs but does not
// answer (paused) still times out.
#include <bam/emu.hpp>
#include <bam/host.hpp>

#include <catch2/catch_test_macros.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

using namespace bam;

namespace {

constexpr std::uint64_t short_timeout_ns = 100'000'000; // 100 ms

struct rig {
  std::shared_ptr<emu::emulated_controller> emu = emu::make_ram_emulated_controller(16 << 20);
  std::unique_ptr<controller> ctrl;
  std::unique_ptr<dma_region> buf;
  explicit rig(std::uint64_t timeout_ns = short_timeout_ns) {
    controller_options opts;
    opts.io_queues = 2;
    opts.io_timeout_ns = timeout_ns;
    ctrl = std::make_unique<controller>(emu, opts);
    buf = ctrl->transport().alloc(4096);
  }
  nvme::status rw(nvme::nvm_opcode op, std::uint64_t lba, std::uint32_t q = 0) {
    return ctrl->io_queue(q).execute(nvme::make_rw(op, 1, lba, 8, buf->bus_address(0), 0));
  }
};

} // namespace

TEST_CASE("Busy host: threads kept off the CPU for many timeouts make a command late, not failed", "[emu][busy]") {
  rig r;
  std::memset(r.buf->data(), 0x42, 4096);
  REQUIRE(r.rw(nvme::nvm_opcode::write, 64) == nvme::status_success);
  // The engine has been running for several timeouts when it is stalled: a
  // wait must see that it does not run now, not that it ran before.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  r.emu->faults().set_stalled(true);
  std::atomic<bool> done{false};
  nvme::status st;
  std::thread reader([&] {
    st = r.rw(nvme::nvm_opcode::read, 64);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800)); // 8 timeouts
  CHECK_FALSE(done.load());
  r.emu->faults().set_stalled(false);
  reader.join();
  CHECK(st == nvme::status_success);
  CHECK(r.buf->as<unsigned char>()[7] == 0x42);
  CHECK_FALSE(r.ctrl->io_queue(0).broken());
}

TEST_CASE("Busy host: a controller that runs but does not answer still times out", "[emu][busy]") {
  rig r;
  r.emu->faults().set_paused(true);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(r.rw(nvme::nvm_opcode::read, 64) == nvme::status_timeout);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < std::chrono::seconds(5));
  CHECK(r.ctrl->io_queue(0).broken());
  r.emu->faults().set_paused(false);
}

TEST_CASE("Busy host: I/O beside more busy threads than cores, with a short timeout, never fails", "[emu][busy]") {
  rig r(50'000'000); // 50 ms: shorter than a busy host keeps a thread waiting
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  const unsigned n = 4 * std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < n; ++i)
    hogs.emplace_back([&] {
      volatile std::uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed))
        x = x + 1;
    });
  std::atomic<std::uint64_t> failed{0}, ok{0};
  std::vector<std::thread> io;
  for (std::uint32_t q = 0; q < 2; ++q)
    io.emplace_back([&, q] {
      auto buf = r.ctrl->transport().alloc(4096);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      for (std::uint64_t k = 0; std::chrono::steady_clock::now() < end; ++k) {
        const auto op = k % 2 ? nvme::nvm_opcode::read : nvme::nvm_opcode::write;
        const nvme::status st =
            r.ctrl->io_queue(q).execute(nvme::make_rw(op, 1, (q * 1000 + k % 512) * 8, 8, buf->bus_address(0), 0));
        (st.ok() ? ok : failed)++;
      }
    });
  for (auto& t : io)
    t.join();
  stop = true;
  for (auto& t : hogs)
    t.join();
  INFO(ok.load() << " commands completed, " << failed.load() << " failed");
  CHECK(failed.load() == 0);
  CHECK(ok.load() > 0);
}
