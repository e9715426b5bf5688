// SPDX-License-Identifier: MIT
// Host-side cost of the queue protocol and of the software controller's CPU
// engine, with Google Benchmark:
//   - queue_protocol: commands through one queue pair to a minimal peer thread
//     (no data): tickets, ready marks, doorbells, completion matching
//   - emu_ram_read:   4 KiB reads through bam::controller from host threads,
//     software controller with RAM media (CPU engine)
// Items/s is commands per second. Run: host_io --benchmark_format=json
#include "../tests/cpu/loopback_controller.hpp"

#include <bam/host.hpp>
#include <bam/emu.hpp>

#include <benchmark/benchmark.h>

#include <random>

namespace {

void queue_protocol(benchmark::State& state) {
  static std::unique_ptr<bam::test::loopback_controller> peer;
  const auto depth = static_cast<std::uint32_t>(state.range(0));
  if (state.thread_index() == 0) peer = std::make_unique<bam::test::loopback_controller>(depth, 1);
  // Google Benchmark starts all threads together after this setup.
  for (auto _ : state) {
    auto q = peer->queue();
    bam::nvme::command c = bam::nvme::make_command(0x80);
    c.cdw12 = static_cast<std::uint32_t>(state.thread_index());
    const auto st = q.execute(c);
    if (!st.ok()) state.SkipWithError("command failed");
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    state.counters["doorbells_per_cmd"] =
        static_cast<double>(peer->queue().counters->doorbells) /
        static_cast<double>(std::max<std::uint64_t>(peer->queue().counters->submitted, 1));
  }
}
BENCHMARK(queue_protocol)->Arg(64)->Arg(1024)->ThreadRange(1, 8)->UseRealTime();

struct emu_fixture {
  std::shared_ptr<bam::emu::emulated_controller> emu;
  std::unique_ptr<bam::controller> ctrl;
  emu_fixture() {
    bam::emu::controller_config cfg;
    cfg.namespaces = {bam::emu::namespace_config{(256u << 20) / 4096, 4096, nullptr}};
    cfg.engine_threads = 2;
    emu = bam::emu::make_emulated_controller(cfg);
    bam::controller_options o;
    o.io_queues = 8;
    o.queue_depth = 256;
    ctrl = std::make_unique<bam::controller>(emu, o);
  }
};

void emu_ram_read(benchmark::State& state) {
  static std::unique_ptr<emu_fixture> f;
  if (state.thread_index() == 0 && !f) f = std::make_unique<emu_fixture>();
  // Per-thread buffer and queue; the fixture is built before the timed loop starts.
  std::unique_ptr<bam::dma_region> buf;
  std::mt19937_64 rng(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    if (!buf) buf = f->ctrl->transport().alloc(4096);
    const std::uint64_t lba = rng() % f->ctrl->ns(1).blocks;
    f->ctrl->read(1, lba, 1, *buf, 0, static_cast<std::uint32_t>(state.thread_index()) % 8);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * 4096);
}
BENCHMARK(emu_ram_read)->ThreadRange(1, 8)->UseRealTime();

} // namespace

BENCHMARK_MAIN();
