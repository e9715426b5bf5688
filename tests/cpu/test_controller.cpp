// SPDX-License-Identifier: MIT
// The controller driver against the software NVMe controller: bring-up by the
// spec, identify, data integrity across queue pairs and threads on RAM and file
// media, every error path surfacing as bam::error, timeouts instead of hangs.
#include <bam/host.hpp>
#include <bam/emu.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>
#include <unistd.h>

using namespace bam;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr std::uint32_t lba_size = 512;

// The reference: byte k of block `lba` written in generation `gen`.
std::uint8_t pattern(std::uint64_t lba, std::uint32_t gen, std::uint32_t k) {
  std::uint64_t x = (lba + 1) * 0x9e37'79b9'7f4a'7c15ull ^ (static_cast<std::uint64_t>(gen) << 32) ^ (k / 8);
  x ^= x >> 29;
  x *= 0xbf58'476d'1ce4'e5b9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x >> ((k % 8) * 8));
}

std::shared_ptr<emu::emulated_controller> ram_controller(std::uint64_t blocks, emu::controller_config cfg = {}) {
  cfg.namespaces = {emu::namespace_config{blocks, lba_size, nullptr}};
  return emu::make_emulated_controller(cfg);
}

struct temp_file {
  std::string path;
  temp_file() {
    char tmpl[] = "/tmp/bam-test-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
  }
  ~temp_file() { std::remove(path.c_str()); }
};

// Random multi-block writes from several threads over several queues, then a
// full read-back compared with the reference of which generation each block holds.
void integrity_run(controller& ctrl, std::uint64_t blocks, int threads, int ops_per_thread) {
  std::vector<std::atomic<std::uint32_t>> gen(blocks);
  // Each thread owns the blocks lba % threads == t, so the reference is exact.
  auto worker = [&](int t) {
    std::mt19937_64 rng(1234 + t);
    auto buf = ctrl.transport().alloc(300 * lba_size);
    const std::uint32_t queue = static_cast<std::uint32_t>(t) % ctrl.io_queue_count();
    for (int op = 0; op < ops_per_thread; ++op) {
      // A run of blocks: 1 to 300 (over MDTS and over two pages: PRP lists, splitting)
      const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % (op % 4 == 0 ? 300 : 8));
      const std::uint64_t first = rng() % (blocks - n);
      // Write only owned blocks, one contiguous owned run at a time.
      std::uint32_t run = 0;
      std::uint64_t run_start = 0;
      auto flush_run = [&]() {
        if (run == 0) return;
        auto* p = buf->as<std::uint8_t>();
        for (std::uint32_t b = 0; b < run; ++b)
          for (std::uint32_t k = 0; k < lba_size; ++k)
            p[b * lba_size + k] = pattern(run_start + b, gen[run_start + b].load() + 1, k);
        ctrl.write(1, run_start, run, *buf, 0, queue);
        for (std::uint32_t b = 0; b < run; ++b)
          gen[run_start + b].fetch_add(1);
        run = 0;
      };
      if (threads == 1) {
        run_start = first;
        run = n;
        flush_run();
      } else {
        for (std::uint32_t b = 0; b < n; ++b) {
          const std::uint64_t lba = first + b;
          if (lba % threads == static_cast<std::uint64_t>(t)) {
            if (run == 0) run_start = lba;
            if (run_start + run != lba) flush_run(), run_start = lba;
            ++run;
          }
        }
        flush_run();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back(worker, t);
  for (auto& th : pool)
    th.join();

  // Read everything back in 256-block pieces spread over all queues.
  auto buf = ctrl.transport().alloc(256 * lba_size);
  std::uint64_t bad_blocks = 0, written = 0;
  for (std::uint64_t lba = 0; lba < blocks; lba += 256) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(256, blocks - lba));
    ctrl.read(1, lba, n, *buf, 0, static_cast<std::uint32_t>(lba / 256) % ctrl.io_queue_count());
    const auto* p = buf->as<std::uint8_t>();
    for (std::uint32_t b = 0; b < n; ++b) {
      const std::uint32_t g = gen[lba + b].load();
      written += g != 0;
      for (std::uint32_t k = 0; k < lba_size; ++k) {
        const std::uint8_t want = g == 0 ? 0 : pattern(lba + b, g, k);
        if (p[b * lba_size + k] != want) {
          ++bad_blocks;
          break;
        }
      }
    }
  }
  CHECK(bad_blocks == 0);
  CHECK(written > blocks / 8); // the run really wrote a good part of the namespace
}

} // namespace

TEST_CASE("bring-up, identify and queue creation by the spec", "[controller]") {
  emu::controller_config cfg;
  cfg.max_queue_entries = 512;
  cfg.max_io_queues = 6;
  cfg.dstrd = 1;
  cfg.ready_delay_ns = 5'000'000; // CSTS.RDY rises 5 ms after CC.EN
  auto emu_ctrl = ram_controller(1 << 16, cfg);
  controller_options opts;
  opts.io_queues = 8;      // more than offered: the driver takes what it gets
  opts.queue_depth = 4096; // more than CAP.MQES+1: clamped
  controller ctrl(emu_ctrl, opts);
  CHECK(ctrl.state() == controller_state::ready);
  CHECK(ctrl.model() == "bam software NVMe controller");
  CHECK_FALSE(ctrl.serial().empty());
  CHECK(ctrl.cap().bits.dstrd == 1);
  REQUIRE(ctrl.namespaces().size() == 1);
  CHECK(ctrl.ns(1).blocks == (1u << 16));
  CHECK(ctrl.ns(1).lba_size == lba_size);
  CHECK(ctrl.io_queue_count() == 6);
  CHECK(ctrl.io_queue_depth() == 512);
  CHECK(ctrl.max_transfer_bytes() == (4096u << 5)); // MDTS 5
  for (std::uint32_t i = 0; i < ctrl.io_queue_count(); ++i)
    CHECK(ctrl.io_queue(i).qid == i + 1);
  CHECK_THROWS_AS(ctrl.io_queue(6), bam::error);
  CHECK_THROWS_WITH(ctrl.ns(2), ContainsSubstring("no active namespace 2"));
  // The driver reads back the SMART log through Get Log Page.
  auto page = ctrl.transport().alloc(4096);
  ctrl.get_log_page(nvme::log_page_id::smart_health, 0xffffffffu, *page, 512);
}

TEST_CASE("several namespaces with different block sizes", "[controller]") {
  emu::controller_config cfg;
  cfg.namespaces = {emu::namespace_config{1000, 512, nullptr}, emu::namespace_config{300, 4096, nullptr}};
  controller ctrl(emu::make_emulated_controller(cfg), {});
  REQUIRE(ctrl.namespaces().size() == 2);
  CHECK(ctrl.ns(2).lba_size == 4096);
  CHECK(ctrl.ns(2).blocks == 300);
  auto buf = ctrl.transport().alloc(3 * 4096);
  std::memset(buf->data(), 0xab, 3 * 4096);
  ctrl.write(2, 297, 3, *buf);
  std::memset(buf->data(), 0, 3 * 4096);
  ctrl.read(2, 297, 3, *buf);
  CHECK(buf->as<std::uint8_t>()[3 * 4096 - 1] == 0xab);
  CHECK_THROWS_AS(ctrl.read(2, 298, 3, *buf), bam::error); // past the end of namespace 2
}

TEST_CASE("data integrity: random writes then reads across 4 queue pairs and 8 threads", "[controller][integrity]") {
  const bool on_file = GENERATE(false, true);
  CAPTURE(on_file);
  const std::uint64_t blocks = 1 << 15; // 16 MiB
  temp_file file;
  emu::controller_config cfg;
  cfg.namespaces = {emu::namespace_config{
      blocks, lba_size, on_file ? emu::make_file_media(file.path, blocks * lba_size, true) : nullptr}};
  controller_options opts;
  opts.io_queues = 4;
  opts.queue_depth = 64;
  controller ctrl(emu::make_emulated_controller(cfg), opts);
  REQUIRE(ctrl.io_queue_count() == 4);
  integrity_run(ctrl, blocks, 8, 150);
}

TEST_CASE("flush, write zeroes and deallocate", "[controller]") {
  temp_file file;
  emu::controller_config cfg;
  cfg.namespaces = {emu::namespace_config{4096, lba_size, emu::make_file_media(file.path, 4096 * lba_size, true)}};
  controller ctrl(emu::make_emulated_controller(cfg), {});
  auto buf = ctrl.transport().alloc(64 * lba_size);
  std::memset(buf->data(), 0x5c, 64 * lba_size);
  ctrl.write(1, 100, 64, *buf);
  ctrl.flush(1);
  ctrl.write_zeroes(1, 110, 10);
  ctrl.deallocate(1, 130, 4);
  std::memset(buf->data(), 0xff, 64 * lba_size);
  ctrl.read(1, 100, 64, *buf);
  const auto* p = buf->as<std::uint8_t>();
  auto block_is = [&](std::uint32_t b, std::uint8_t v) {
    for (std::uint32_t k = 0; k < lba_size; ++k)
      if (p[b * lba_size + k] != v) return false;
    return true;
  };
  CHECK(block_is(0, 0x5c));
  CHECK(block_is(9, 0x5c));
  CHECK(block_is(10, 0));
  CHECK(block_is(19, 0));
  CHECK(block_is(20, 0x5c));
  CHECK(block_is(30, 0));
  CHECK(block_is(33, 0));
  CHECK(block_is(34, 0x5c));
}

TEST_CASE("every error status of a command surfaces as bam::error", "[controller][errors]") {
  auto emu_ctrl = ram_controller(4096);
  controller ctrl(emu_ctrl, {});
  auto buf = ctrl.transport().alloc(8 * lba_size);
  const nvme::status statuses[] = {
      {nvme::status_type::media_error, nvme::media_status::unrecovered_read_error},
      {nvme::status_type::media_error, nvme::media_status::write_fault},
      {nvme::status_type::generic, nvme::generic_status::internal_error},
      {nvme::status_type::generic, nvme::generic_status::data_transfer_error},
      {nvme::status_type::generic, nvme::generic_status::namespace_not_ready},
      {nvme::status_type::media_error, nvme::media_status::access_denied},
  };
  for (const auto st : statuses) {
    emu::fault_rule r;
    r.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::read);
    r.lba_first = 40;
    r.lba_last = 40;
    r.action = emu::fault_action::fail;
    r.status = st;
    const auto id = emu_ctrl->faults().add(r);
    try {
      ctrl.read(1, 36, 8, *buf, 0, 0);
      FAIL("read over an injected error did not throw");
    } catch (const bam::error& e) {
      REQUIRE(e.status().has_value());
      CHECK(*e.status() == st);
      CHECK_THAT(e.what(), ContainsSubstring(nvme::status_name(st)));
      CHECK_THAT(e.what(), ContainsSubstring("LBA 36"));
      CHECK_THAT(e.what(), ContainsSubstring("queue 1"));
    }
    CHECK(emu_ctrl->faults().fired(id) == 1);
    emu_ctrl->faults().remove(id);
  }
  // And the queue still works afterwards.
  ctrl.read(1, 36, 8, *buf);
}

TEST_CASE("statuses the controller itself decides reach the caller", "[controller][errors]") {
  auto emu_ctrl = ram_controller(1024);
  controller ctrl(emu_ctrl, {});
  auto buf = ctrl.transport().alloc(4096);
  auto q = ctrl.io_queue(0);
  // LBA out of range, bypassing the driver's own range check.
  const auto r = nvme::make_read(1, 1020, 8, buf->bus_address(0), 0);
  CHECK(q.execute(r).sc() == nvme::generic_status::lba_out_of_range);
  // Invalid namespace.
  CHECK(q.execute(nvme::make_read(7, 0, 1, buf->bus_address(0), 0)).sc() == nvme::generic_status::invalid_namespace);
  // Invalid opcode, through the driver's admin path: a bam::error naming it.
  CHECK_THROWS_WITH(ctrl.admin(nvme::make_command(0x7f)), ContainsSubstring("Invalid Command Opcode"));
  // Invalid queue identifier: creating a queue that exists.
  CHECK_THROWS_WITH(ctrl.admin(nvme::make_create_io_cq(1, 16, buf->bus_address(0))),
                    ContainsSubstring("Invalid Queue Identifier"));
  // A virtual address where a bus address belongs: Data Transfer Error.
  CHECK(q.execute(nvme::make_read(1, 0, 1, reinterpret_cast<std::uintptr_t>(buf->data()), 0)).sc() ==
        nvme::generic_status::data_transfer_error);
  // The driver refuses what it can see is wrong before sending anything.
  CHECK_THROWS_WITH(ctrl.read(1, 1024, 1, *buf), ContainsSubstring("outside namespace 1"));
  CHECK_THROWS_WITH(ctrl.read(1, 0, 9, *buf), ContainsSubstring("cannot take"));
  CHECK_THROWS_WITH(ctrl.read(1, 0, 1, *buf, 2), ContainsSubstring("dword-aligned"));
  CHECK_THROWS_AS(ctrl.read(1, 0, 0, *buf), bam::error);
}

TEST_CASE("a controller that stops answering gives a timeout error, not a hang", "[controller][timeout]") {
  auto emu_ctrl = ram_controller(1024);
  controller_options opts;
  opts.io_timeout_ns = 300'000'000;
  opts.admin_timeout_ns = 300'000'000;
  auto buf = emu_ctrl->alloc(4096);
  {
    controller ctrl(emu_ctrl, opts);
    ctrl.read(1, 0, 8, *buf);
    emu_ctrl->stop_answering(true);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      ctrl.read(1, 0, 8, *buf, 0, 1);
      FAIL("read from a silent controller returned");
    } catch (const bam::error& e) {
      REQUIRE(e.status().has_value());
      CHECK(*e.status() == nvme::status_timeout);
      CHECK_THAT(e.what(), ContainsSubstring("Timeout"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    // The queue is now broken: later calls fail at once.
    CHECK_THROWS_WITH(ctrl.read(1, 0, 8, *buf, 0, 1), ContainsSubstring("Broken"));
    // Other queues, and the destructor, also return (timeouts, no hang).
  }
  emu_ctrl->stop_answering(false);
}

TEST_CASE("a dropped command times out while others complete", "[controller][timeout]") {
  auto emu_ctrl = ram_controller(1024);
  controller_options opts;
  opts.io_timeout_ns = 300'000'000;
  controller ctrl(emu_ctrl, opts);
  emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::write);
  r.action = emu::fault_action::drop;
  emu_ctrl->faults().add(r);
  auto buf = ctrl.transport().alloc(4096);
  ctrl.read(1, 0, 8, *buf, 0, 0);
  CHECK_THROWS_WITH(ctrl.write(1, 0, 8, *buf, 0, 0), ContainsSubstring("Timeout"));
  ctrl.read(1, 0, 8, *buf, 0, 1); // another queue is unaffected
}

TEST_CASE("bring-up fails clearly when CSTS.RDY never rises within CAP.TO", "[controller][errors]") {
  emu::controller_config cfg;
  cfg.cap_to = 1;                     // 500 ms
  cfg.ready_delay_ns = 3'000'000'000; // longer than CAP.TO
  auto emu_ctrl = ram_controller(64, cfg);
  CHECK_THROWS_WITH(controller(emu_ctrl, {}), ContainsSubstring("wait for CSTS.RDY=1") && ContainsSubstring("CAP.TO"));
}

namespace {
// A transport whose device has gone away: every register reads all ones.
class gone_transport final : public transport {
public:
  std::string name() const override { return "gone"; }
  std::uint32_t read32(std::uint32_t) override { return nvme::register_gone; }
  void write32(std::uint32_t, std::uint32_t) override {}
  volatile std::uint32_t* doorbell(std::uint32_t) override { return &sink_; }
  std::unique_ptr<dma_region> map(void* p, std::size_t n, memory_kind k) override {
    check_map_args(p, n);
    return std::make_unique<dma_region>(p, n, k, std::vector<std::uint64_t>(n / dma_page_size, 0));
  }

private:
  std::uint32_t sink_ = 0;
};
} // namespace

TEST_CASE("a controller that is gone is reported, not waited for", "[controller][errors]") {
  CHECK_THROWS_WITH(controller(std::make_shared<gone_transport>(), {}), ContainsSubstring("not responding"));
}

TEST_CASE("destroying the driver deletes its queues and shuts the controller down", "[controller]") {
  auto emu_ctrl = ram_controller(64);
  { controller ctrl(emu_ctrl, {}); }
  nvme::csts_register csts{emu_ctrl->read32(nvme::reg::csts)};
  CHECK(csts.bits.shst == static_cast<std::uint32_t>(nvme::shutdown_status::complete));
  // A new driver brings the same controller up again from that state.
  controller again(emu_ctrl, {});
  CHECK(again.state() == controller_state::ready);
}

TEST_CASE("queue memory that is not contiguous in bus address space is refused", "[controller][errors]") {
  auto emu_ctrl = ram_controller(1024);
  controller_options opts;
  opts.queue_depth = 256; // 16 KiB of SQ: four pages
  // A ring allocator that maps the ring's pages in reverse order, as scattered
  // pinned pages would be without an IOMMU.
  struct scattered final : dma_region {
    std::unique_ptr<dma_region> inner;
    static std::vector<std::uint64_t> reversed(const dma_region& r) {
      auto bus = r.page_bus();
      std::reverse(bus.begin(), bus.end());
      return bus;
    }
    explicit scattered(std::unique_ptr<dma_region> r)
        : dma_region(r->data(), r->size(), r->kind(), reversed(*r)), inner(std::move(r)) {}
  };
  opts.ring_alloc = [](transport& t, std::size_t bytes) -> std::unique_ptr<dma_region> {
    return std::make_unique<scattered>(t.alloc(bytes));
  };
  CHECK_THROWS_WITH(controller(emu_ctrl, opts), ContainsSubstring("not contiguous"));
}

TEST_CASE("many threads of multi-command transfers share the PRP list pool without deadlock", "[controller][stress]") {
  emu::controller_config cfg;
  cfg.mdts = 1; // 8 KiB per command: a 128 KiB read is 16 commands
  auto emu_ctrl = ram_controller(1 << 14, cfg);
  emu_ctrl->faults().set_global_latency_ns(200'000);
  controller_options opts;
  opts.io_queues = 4;
  opts.io_timeout_ns = 20'000'000'000ull;
  controller ctrl(emu_ctrl, opts);
  std::atomic<int> done{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 16; ++t)
    pool.emplace_back([&, t] {
      auto buf = ctrl.transport().alloc(256 * lba_size);
      for (int i = 0; i < 4; ++i)
        ctrl.read(1, static_cast<std::uint64_t>(t) * 512, 256, *buf, 0, t % 4);
      done.fetch_add(1);
    });
  for (auto& th : pool)
    th.join();
  CHECK(done.load() == 16);
}

TEST_CASE("a completion that arrives after its timeout lands in memory still reserved for it",
          "[controller][timeout]") {
  // Run under AddressSanitizer in CI (bam_test_controller_asan): a late
  // completion written into freed memory would be reported there.
  auto emu_ctrl = ram_controller(1 << 12);
  controller_options opts;
  opts.io_timeout_ns = 100'000'000;
  controller ctrl(emu_ctrl, opts);
  emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::read);
  r.action = emu::fault_action::delay;
  r.latency_ns = 400'000'000; // completes 4x later than the deadline
  r.count = 0;
  emu_ctrl->faults().add(r);
  auto buf = ctrl.transport().alloc(512 * lba_size);
  CHECK_THROWS_WITH(ctrl.read(1, 0, 512, *buf), ContainsSubstring("Timeout"));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  // The late completions are consumed by the next caller's poll.
  CHECK_THROWS_WITH(ctrl.read(1, 0, 8, *buf), ContainsSubstring("Broken"));
}

namespace {
// A transport in front of a software controller that logs, in order, when
// the controller is reset (CC.EN 1 -> 0) and when each region it allocated
// is freed. At the reset it first lets the controller answer again and
// finish what it fetched — the worst moment for memory to be gone already.
class reset_witness final : public transport {
public:
  explicit reset_witness(std::shared_ptr<emu::emulated_controller> c) : c_(std::move(c)) {}
  std::string name() const override { return c_->name(); }
  std::uint32_t read32(std::uint32_t o) override { return c_->read32(o); }
  void write32(std::uint32_t o, std::uint32_t v) override {
    if (o == nvme::reg::cc) {
      const nvme::cc_register prev{c_->read32(nvme::reg::cc)}, next{v};
      if (prev.bits.en && !next.bits.en) {
        c_->stop_answering(false);
        std::this_thread::sleep_for(std::chrono::milliseconds(50)); // late commands run now
        log("reset");
      }
    }
    c_->write32(o, v);
  }
  volatile std::uint32_t* doorbell(std::uint32_t o) override { return c_->doorbell(o); }
  std::unique_ptr<dma_region> map(void* p, std::size_t n, memory_kind k) override { return c_->map(p, n, k); }
  std::unique_ptr<dma_region> alloc(std::size_t size) override {
    struct logged final : dma_region {
      std::unique_ptr<dma_region> inner;
      reset_witness* w;
      logged(std::unique_ptr<dma_region> r, reset_witness* o)
          : dma_region(r->data(), r->size(), r->kind(), r->page_bus()), inner(std::move(r)), w(o) {}
      ~logged() override { w->log("free"); }
    };
    return std::make_unique<logged>(c_->alloc(size), this);
  }
  std::vector<std::string> events() {
    std::lock_guard lock(m_);
    return events_;
  }

private:
  void log(const char* e) {
    std::lock_guard lock(m_);
    events_.emplace_back(e);
  }
  std::shared_ptr<emu::emulated_controller> c_;
  std::mutex m_;
  std::vector<std::string> events_;
};
} // namespace

TEST_CASE("an admin command that times out keeps its buffer until the controller is reset", "[controller][timeout]") {
  auto emu_ctrl = ram_controller(1024);
  auto witness = std::make_shared<reset_witness>(emu_ctrl);
  emu_ctrl->stop_answering(true); // registers answer, commands do not: identify times out
  controller_options opts;
  opts.admin_timeout_ns = 100'000'000;
  CHECK_THROWS_WITH(controller(witness, opts), ContainsSubstring("identify controller"));
  const auto ev = witness->events();
  const auto reset = std::find(ev.begin(), ev.end(), "reset");
  REQUIRE(reset != ev.end());
  // Nothing the timed-out identify may still write into (its data page, the
  // admin rings) was freed before the reset.
  CHECK(std::count(ev.begin(), reset, std::string("free")) == 0);
  CHECK(std::count(reset, ev.end(), std::string("free")) >= 2);
}

TEST_CASE("a teardown that fails is reported, not swallowed", "[controller][errors]") {
  auto emu_ctrl = ram_controller(1024);
  std::vector<std::string> warnings;
  set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  {
    controller ctrl(emu_ctrl, {});
    emu::fault_rule r;
    r.admin = true;
    r.opcode = static_cast<std::uint8_t>(nvme::admin_opcode::delete_io_sq);
    r.status = {nvme::status_type::generic, nvme::generic_status::internal_error};
    emu_ctrl->faults().add(r);
  }
  set_warning_handler(nullptr);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], ContainsSubstring("teardown failed") && ContainsSubstring("Internal Error"));
  // It was reset instead: a new driver brings it up again.
  emu_ctrl->faults().clear();
  controller again(emu_ctrl, {});
  CHECK(again.state() == controller_state::ready);
}

TEST_CASE("a PRP list wait with a timeout past the clock's range waits instead of failing", "[controller][errors]") {
  auto emu_ctrl = ram_controller(1024);
  bam::detail::prp_pool pool;
  pool.setup(*emu_ctrl, 1 << 20);
  std::vector<std::uint32_t> taken;
  while (const auto e = pool.try_acquire())
    taken.push_back(*e);
  REQUIRE(taken.size() == bam::detail::prp_pool::entries);
  // One entry comes back 100 ms later; a timeout that overflowed std::chrono
  // (2^64 - 1 ns as a signed count: -1) ended the wait at once with an error.
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pool.release(taken.back());
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::uint32_t got = ~0u;
  CHECK_NOTHROW(got = pool.acquire(~std::uint64_t{0}, "test"));
  const auto waited = std::chrono::steady_clock::now() - t0;
  back.join();
  CHECK(got == taken.back());
  CHECK(waited >= std::chrono::milliseconds(50));
}
