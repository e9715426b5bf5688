// SPDX-License-Identifier: MIT
// An open storage with nothing to do costs little CPU, and wakes up when
// commands come: the software controller's engine threads back off to
// sleeps while idle.
#include <bam/emu.hpp>
#include <bam/emu/client_dma.hpp>
#include <bam/emu/client_engine.hpp>
#include <bam/host.hpp>

#include <catch2/catch_test_macros.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace {

//! CPU seconds this process used (all threads).
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

//! Cores this process keeps busy over `window` of doing nothing.
double idle_cores(std::chrono::milliseconds window) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50)); // the engines settle into their sleeps
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(window);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return (cpu_seconds() - c0) / wall;
}

} // namespace

TEST_CASE("Idle: an open emu: storage (CPU engine, 4 threads, 8 queues) uses under 5 % of a core", "[emu][idle]") {
  auto transports = bam::open_host_transports(bam::parse_device("emu:ram=64M,threads=4"));
  bam::controller_options opts;
  opts.io_queues = 8;
  bam::controller ctrl(transports.at(0), opts);
  auto buf = ctrl.transport().alloc(4096);
  std::memset(buf->data(), 0x3c, 4096);
  ctrl.write(1, 0, 8, *buf, 0, 0);
  const double cores = idle_cores(std::chrono::milliseconds(1000));
  INFO("cores busy while idle: " << cores);
  CHECK(cores < 0.05);
  // And it answers at once afterwards.
  std::memset(buf->data(), 0, 4096);
  const auto t0 = std::chrono::steady_clock::now();
  ctrl.read(1, 0, 8, *buf, 0, 0);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  CHECK(buf->as<unsigned char>()[100] == 0x3c);
}

TEST_CASE("Idle: the CPU engine for GPU clients (4 threads) uses under 5 % of a core", "[emu][idle]") {
  constexpr std::uint32_t max_qid = 8;
  std::vector<std::uint32_t> doorbells(2 * (max_qid + 1), 0);
  std::vector<bam::emu::client_dma_lane> lanes(max_qid + 1);
  std::memset(static_cast<void*>(lanes.data()), 0, lanes.size() * sizeof(bam::emu::client_dma_lane));
  std::vector<bam::emu::client_dma_claim> claim(max_qid + 1);
  auto media = bam::emu::make_ram_media(1 << 20);
  bam::emu::client_engine engine(media, max_qid, 4, std::span<std::uint32_t>(doorbells),
                                 bam::emu::client_dma_ref{lanes.data(), claim.data(), max_qid});
  const double cores = idle_cores(std::chrono::milliseconds(1000));
  INFO("cores busy while idle: " << cores);
  CHECK(cores < 0.05);
}
