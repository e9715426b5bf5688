// SPDX-License-Identifier: MIT
// The CPU engine for GPU clients, with no GPU: a host thread moves its data
// tasks as the GPU threads waiting on its queues do ("GPU memory" is host
// memory here). The commands come from host threads through the same queues
// GPU threads use.
#include <bam/host.hpp>
#include <bam/emu.hpp>
#include <bam/emu/client_dma.hpp>
#include <bam/emu/client_engine.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

using namespace bam;

namespace {

constexpr std::uint32_t lba_size = 512;
constexpr std::uint64_t blocks = 4096;
constexpr std::uint32_t max_qid = 4;

//! Stands in for the GPU threads that wait on the queues: serves the
//! engine's data tasks with host copies ("GPU memory" is host memory here).
//! While `hold` is set it serves nothing; `corrupt_prp` makes the next task's
//! PRP offset invalid (the status a bad PRP list gets on a GPU).
struct host_mover {
  emu::client_dma_ref ref;
  std::atomic<bool> hold{false};
  std::atomic<bool> stop{false};
  std::thread thread;
  explicit host_mover(emu::client_dma_ref r) : ref(r) {
    thread = std::thread([this] {
      while (!stop.load()) {
        unsigned n = 0;
        if (!hold.load())
          for (std::uint16_t q = 1; q <= ref.max_qid; ++q)
            n += emu::serve_client_dma_host(ref, q);
        if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }
  ~host_mover() {
    stop = true;
    thread.join();
  }
};

std::uint8_t pattern(std::uint64_t lba, std::uint32_t k) { return static_cast<std::uint8_t>(lba * 131 + k * 7 + 1); }

struct rig {
  std::vector<std::uint32_t> doorbells = std::vector<std::uint32_t>(2 * (max_qid + 1), 0);
  std::vector<emu::client_dma_lane> lanes = std::vector<emu::client_dma_lane>(max_qid + 1);
  std::vector<emu::client_dma_claim> claim = std::vector<emu::client_dma_claim>(max_qid + 1);
  std::shared_ptr<emu::media> media = emu::make_ram_media(blocks * lba_size);
  std::shared_ptr<emu::client_engine> engine;
  std::unique_ptr<host_mover> mover;
  std::shared_ptr<emu::emulated_controller> emu_ctrl;
  std::unique_ptr<controller> ctrl;

  //! `in_place`: the "GPU threads" read the media's own bytes (host memory
  //! here, as pinned media are on a GPU).
  explicit rig(bool in_place = false) {
    std::memset(static_cast<void*>(lanes.data()), 0, lanes.size() * sizeof(emu::client_dma_lane));
    emu::client_in_place where;
    if (in_place) where = {reinterpret_cast<std::uint64_t>(media->mapping().data()), media->mapping().size()};
    engine = std::make_shared<emu::client_engine>(media, max_qid, 1, std::span<std::uint32_t>(doorbells),
                                                  emu::client_dma_ref{lanes.data(), claim.data(), max_qid}, nullptr,
                                                  nullptr, where);
    mover = std::make_unique<host_mover>(engine->dma());
    emu::controller_config cfg;
    cfg.namespaces = {emu::namespace_config{blocks, lba_size, media}};
    cfg.identity_dma = true;
    cfg.mdts = 5; // the engine's bounce buffers
    cfg.max_io_queues = max_qid;
    cfg.io_engine = engine;
    emu_ctrl = emu::make_emulated_controller(cfg);
    controller_options opts;
    opts.io_queues = 1;
    opts.queue_depth = 32;
    opts.device_doorbells = true; // the engine's doorbell words, as GPU threads get them
    opts.io_timeout_ns = 2'000'000'000;
    ctrl = std::make_unique<controller>(emu_ctrl, opts);
  }
  ~rig() {
    ctrl.reset();
    mover.reset();
  }

  nvme::status rw(nvme::nvm_opcode op, std::uint64_t lba, std::uint32_t n, const dma_region& buf) {
    return ctrl->io_queue(0).execute(nvme::make_rw(op, 1, lba, n, buf.bus_address(0), 0));
  }
  std::vector<std::uint8_t> media_bytes(std::uint64_t lba, std::uint32_t n) {
    std::vector<std::uint8_t> out(std::size_t{n} * lba_size);
    REQUIRE(media->read(lba * lba_size, out.data(), out.size()) == 0);
    return out;
  }
};

} // namespace

TEST_CASE("CPU engine for GPU clients: writes reach the media, reads come back", "[emu][client]") {
  const bool in_place = GENERATE(false, true);
  CAPTURE(in_place);
  rig r(in_place);
  auto buf = r.ctrl->transport().alloc(8 * lba_size);
  for (std::uint32_t k = 0; k < 8 * lba_size; ++k)
    buf->as<std::uint8_t>()[k] = pattern(100 + k / lba_size, k % lba_size);
  REQUIRE(r.rw(nvme::nvm_opcode::write, 100, 8, *buf) == nvme::status_success);
  const auto m = r.media_bytes(100, 8);
  CHECK(std::memcmp(m.data(), buf->data(), m.size()) == 0);
  std::memset(buf->data(), 0, 8 * lba_size);
  REQUIRE(r.rw(nvme::nvm_opcode::read, 100, 8, *buf) == nvme::status_success);
  CHECK(std::memcmp(m.data(), buf->data(), m.size()) == 0);
  // The one executor's checks apply: out of range, over the transfer limit.
  CHECK(r.rw(nvme::nvm_opcode::read, blocks - 4, 8, *buf) ==
        nvme::status(nvme::status_type::generic, nvme::generic_status::lba_out_of_range));
  CHECK(r.emu_ctrl->counters().host_writes == 1);
  CHECK(r.emu_ctrl->counters().host_reads == 1);
}

TEST_CASE("CPU engine for GPU clients: a bad PRP found while moving the data fails the command and changes nothing",
          "[emu][client]") {
  const bool in_place = GENERATE(false, true);
  CAPTURE(in_place);
  rig r(in_place);
  auto buf = r.ctrl->transport().alloc(8 * lba_size);
  std::memset(buf->data(), 0xab, 8 * lba_size);
  const auto before = r.media_bytes(200, 8);
  const nvme::status bad_offset{nvme::status_type::generic, nvme::generic_status::invalid_prp_offset};
  // 8 blocks of 512 bytes from a misaligned PRP1 span two pages; PRP2 is not
  // page aligned: the mover refuses it and the media keeps its old bytes.
  auto cmd = nvme::make_rw(nvme::nvm_opcode::write, 1, 200, 8, buf->bus_address(0) + 512, buf->bus_address(0) + 8);
  CHECK(r.ctrl->io_queue(0).execute(cmd) == bad_offset);
  CHECK(r.media_bytes(200, 8) == before);
  // A read with the same PRPs completes with the same status.
  cmd.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::read);
  CHECK(r.ctrl->io_queue(0).execute(cmd) == bad_offset);
  // The queue works on.
  CHECK(r.rw(nvme::nvm_opcode::write, 200, 8, *buf) == nvme::status_success);
  CHECK(r.media_bytes(200, 8)[5] == 0xab);
}

TEST_CASE("CPU engine for GPU clients: nothing completes before its data moved, however late the GPU threads come",
          "[emu][client]") {
  rig r;
  auto buf = r.ctrl->transport().alloc(8 * lba_size);
  std::memset(buf->data(), 0x5c, 8 * lba_size);
  r.mover->hold = true; // no thread waits on the queue for now
  std::atomic<int> done{0};
  nvme::status st;
  std::thread writer([&] {
    st = r.rw(nvme::nvm_opcode::write, 300, 8, *buf);
    done = 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(done.load() == 0);                 // not completed
  CHECK(r.media_bytes(300, 8)[0] != 0x5c); // and the media not written: the data never left "GPU memory"
  r.mover->hold = false;
  writer.join();
  CHECK(st == nvme::status_success);
  CHECK(r.media_bytes(300, 8)[0] == 0x5c);
}

TEST_CASE("CPU engine for GPU clients: media in memory are read in place, no staging copy, and always current",
          "[emu][client]") {
  rig r(/*in_place=*/true);
  REQUIRE(r.engine->reads_in_place());
  auto buf = r.ctrl->transport().alloc(8 * lba_size);
  std::vector<std::uint8_t> bytes(8 * lba_size);
  for (std::uint32_t k = 0; k < bytes.size(); ++k)
    bytes[k] = pattern(500 + k / lba_size, k % lba_size);
  REQUIRE(r.media->write(500 * lba_size, bytes.data(), bytes.size()) == 0);
  REQUIRE(r.rw(nvme::nvm_opcode::read, 500, 8, *buf) == nvme::status_success);
  CHECK(std::memcmp(buf->data(), bytes.data(), bytes.size()) == 0);
  // The read's task pointed the movers at the media's own bytes.
  const emu::client_dma_lane& lane = r.lanes[1];
  const std::uint64_t posted = lane.posted;
  REQUIRE(posted >= 1);
  const emu::client_dma_task& t = lane.task[(posted - 1) % emu::client_dma_lane::ring];
  CHECK(t.staging == reinterpret_cast<std::uint64_t>(r.media->mapping().data()) + 500 * lba_size);
  CHECK(t.bytes == 8 * lba_size);
  // A later host write to the media is what the next read returns.
  bytes[3] ^= 0xff;
  REQUIRE(r.media->write(500 * lba_size, bytes.data(), bytes.size()) == 0);
  REQUIRE(r.rw(nvme::nvm_opcode::read, 500, 8, *buf) == nvme::status_success);
  CHECK(std::memcmp(buf->data(), bytes.data(), bytes.size()) == 0);
  // Writes still go through the staging bytes, and so reach the media only
  // once their data left "GPU memory".
  std::memset(buf->data(), 0x3c, 8 * lba_size);
  REQUIRE(r.rw(nvme::nvm_opcode::write, 500, 8, *buf) == nvme::status_success);
  CHECK(r.media_bytes(500, 8) == std::vector<std::uint8_t>(8 * lba_size, 0x3c));
  const emu::client_dma_task& w = lane.task[(lane.posted - 1) % emu::client_dma_lane::ring];
  const auto media_first = reinterpret_cast<std::uint64_t>(r.media->mapping().data());
  CHECK((w.staging < media_first || w.staging >= media_first + r.media->mapping().size()));
  // A read is not complete before it moved, here too.
  r.mover->hold = true;
  std::atomic<int> done{0};
  std::thread reader([&] {
    CHECK(r.rw(nvme::nvm_opcode::read, 500, 8, *buf) == nvme::status_success);
    done = 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(done.load() == 0);
  r.mover->hold = false;
  reader.join();
  CHECK(done.load() == 1);
}

TEST_CASE("CPU engine for GPU clients: Dataset Management reads its range list through the GPU threads",
          "[emu][client]") {
  const bool in_place = GENERATE(false, true);
  CAPTURE(in_place);
  rig r(in_place);
  auto buf = r.ctrl->transport().alloc(8 * lba_size);
  std::memset(buf->data(), 0x77, 8 * lba_size);
  REQUIRE(r.rw(nvme::nvm_opcode::write, 40, 8, *buf) == nvme::status_success);
  auto ranges = r.ctrl->transport().alloc(dma_page_size);
  auto* rr = ranges->as<nvme::dsm_range>();
  rr[0] = nvme::dsm_range{};
  rr[0].slba = 40;
  rr[0].nblocks = 8;
  REQUIRE(r.ctrl->io_queue(0).execute(nvme::make_dsm_deallocate(1, 1, ranges->bus_address(0))) == nvme::status_success);
  CHECK(r.media_bytes(40, 8) == std::vector<std::uint8_t>(8 * lba_size, 0));
}

TEST_CASE("CPU engine for GPU clients: fault rules apply to its commands", "[emu][client]") {
  const bool in_place = GENERATE(false, true);
  CAPTURE(in_place);
  rig r(in_place);
  auto buf = r.ctrl->transport().alloc(lba_size);
  emu::fault_rule f;
  f.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::read);
  f.lba_first = 7;
  f.lba_last = 7;
  f.status = {nvme::status_type::media_error, nvme::media_status::unrecovered_read_error};
  const auto id = r.emu_ctrl->faults().add(f);
  CHECK(r.rw(nvme::nvm_opcode::read, 7, 1, *buf) == f.status);
  CHECK(r.rw(nvme::nvm_opcode::read, 8, 1, *buf) == nvme::status_success);
  CHECK(r.emu_ctrl->faults().fired(id) == 1);
}

TEST_CASE("CPU engine for GPU clients: completions wait for CQ room, however long, and none is lost", "[emu][client]") {
  rig r;
  transport& t = r.ctrl->transport();
  // A second queue pair by hand: an SQ of 32 entries on a CQ of 4.
  constexpr std::uint16_t qid = 2;
  constexpr std::uint32_t sq_depth = 32, cq_depth = 4, total = 12;
  r.ctrl->admin(nvme::make_set_num_queues(2, 2));
  auto cq = t.alloc(dma_page_size);
  auto sq = t.alloc(sq_depth * sizeof(nvme::command));
  r.ctrl->admin(nvme::make_create_io_cq(qid, cq_depth, cq->bus_address(0)));
  r.ctrl->admin(nvme::make_create_io_sq(qid, sq_depth, sq->bus_address(0), qid));
  volatile std::uint32_t* sq_db = t.device_doorbell(nvme::sq_doorbell_offset(qid, 0));
  volatile std::uint32_t* cq_db = t.device_doorbell(nvme::cq_doorbell_offset(qid, 0));
  auto* cmds = sq->as<nvme::command>();
  auto* cqes = cq->as<nvme::completion>();
  for (std::uint32_t i = 0; i < total; ++i) {
    cmds[i] = nvme::make_flush(1);
    cmds[i].cid = static_cast<std::uint16_t>(100 + i);
  }
  nvme::detail::doorbell_write(sq_db, total, nvme::memory_scope::system);
  // The consumer stalls for longer than any internal limit a producer might
  // have; three completions fit, nine wait for room.
  std::this_thread::sleep_for(std::chrono::seconds(11));
  std::set<std::uint32_t> cids;
  std::uint32_t head = 0, phase = 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (cids.size() < total && std::chrono::steady_clock::now() < deadline) {
    const nvme::cqe_dw3 w{std::atomic_ref<std::uint32_t>(reinterpret_cast<std::uint32_t*>(&cqes[head])[3])
                              .load(std::memory_order_acquire)};
    if (w.phase_tag() != phase) {
      std::this_thread::yield();
      continue;
    }
    CHECK(w.status().ok());
    cids.insert(w.command_id());
    if (++head == cq_depth) {
      head = 0;
      phase ^= 1;
    }
    nvme::detail::doorbell_write(cq_db, head, nvme::memory_scope::system);
  }
  CHECK(cids.size() == total);
  CHECK(*cids.begin() == 100);
  CHECK(*cids.rbegin() == 100 + total - 1);
  r.ctrl->admin(nvme::make_delete_io_sq(qid));
  r.ctrl->admin(nvme::make_delete_io_cq(qid));
}
