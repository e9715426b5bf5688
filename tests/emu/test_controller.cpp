// SPDX-License-Identifier: MIT
// The software NVMe controller driven by hand, as a driver would drive an SSD:
// register writes, the admin queue through bam::nvme::queue_pair_ref, I/O
// queues, PRPs, every error status, back-pressure, faults and resets.
#include "scratch_block_device.hpp"

#include <bam/emu.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>

#include <catch2/catch_test_macros.hpp>

#include <nvme/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace bam;
using nvme::status;
using nvme::status_type;

constexpr std::uint32_t page = dma_page_size;
constexpr std::uint64_t short_timeout_ns = 50'000'000; // 50 ms: "no completion" in fault tests
constexpr std::uint64_t ready_wait_ns = 2'000'000'000;

status generic(std::uint8_t sc) { return {status_type::generic, sc}; }
status specific(std::uint8_t sc) { return {status_type::command_specific, sc}; }

//! Zeroed memory with the alignment queue state needs.
struct state_block {
  void* p = nullptr;
  explicit state_block(std::size_t bytes) {
    p = std::aligned_alloc(128, (bytes + 127) / 128 * 128);
    std::memset(p, 0, (bytes + 127) / 128 * 128);
  }
  ~state_block() { std::free(p); }
  state_block(const state_block&) = delete;
  state_block& operator=(const state_block&) = delete;
};

struct host_queue {
  std::unique_ptr<dma_region> sq, cq;
  std::unique_ptr<state_block> state;
  nvme::queue_pair_ref ref;
};

std::uint32_t cc_enable_value() {
  nvme::cc_register cc{};
  cc.bits.en = 1;
  cc.bits.iosqes = nvme::sq_entry_log2;
  cc.bits.iocqes = nvme::cq_entry_log2;
  return cc.raw;
}

//! LBA-derived pattern: every 8-byte word names its LBA and position.
//! Completion dword 3 (cid, phase, status), loaded the way a host must: acquire.
std::uint32_t cqe_dw3(const nvme::completion& c) {
  auto* w = reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(const_cast<nvme::completion*>(&c)) + 12);
  return std::atomic_ref<std::uint32_t>(*w).load(std::memory_order_acquire);
}
bool cqe_phase(const nvme::completion& c) { return (cqe_dw3(c) >> 16) & 1; }

std::uint64_t word_of(std::uint64_t lba, std::uint32_t i, std::uint64_t salt) {
  return (lba << 20) ^ (std::uint64_t{i} << 2) ^ salt;
}
void fill_lbas(void* buf, std::uint64_t slba, std::uint32_t nblocks, std::uint32_t lba_size, std::uint64_t salt) {
  auto* w = static_cast<std::uint64_t*>(buf);
  for (std::uint32_t b = 0; b < nblocks; ++b)
    for (std::uint32_t i = 0; i < lba_size / 8; ++i)
      w[b * (lba_size / 8) + i] = word_of(slba + b, i, salt);
}
//! Number of 8-byte words that differ from the pattern.
std::size_t check_lbas(const void* buf, std::uint64_t slba, std::uint32_t nblocks, std::uint32_t lba_size,
                       std::uint64_t salt) {
  const auto* w = static_cast<const std::uint64_t*>(buf);
  std::size_t bad = 0;
  for (std::uint32_t b = 0; b < nblocks; ++b)
    for (std::uint32_t i = 0; i < lba_size / 8; ++i)
      bad += w[b * (lba_size / 8) + i] != word_of(slba + b, i, salt);
  return bad;
}

bool wait_for(const std::function<bool()>& cond, std::uint64_t timeout_ns) {
  const auto deadline = detail::now_ns() + timeout_ns;
  while (!cond()) {
    if (detail::now_ns() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

emu::controller_config ram_config(std::uint64_t blocks = 1 << 14, std::uint32_t lba_size = 512) {
  emu::controller_config cfg;
  cfg.namespaces.push_back({blocks, lba_size, nullptr});
  return cfg;
}

//! A controller brought up by hand, with helpers for commands and buffers.
struct harness {
  std::shared_ptr<emu::emulated_controller> ctrl;
  std::uint32_t dstrd;
  host_queue admin;
  std::map<std::uint16_t, host_queue> io;
  std::unique_ptr<dma_region> scratch; // 16 pages for identify, logs and small I/O

  explicit harness(emu::controller_config cfg, bool bring_up = true)
      : ctrl(emu::make_emulated_controller(std::move(cfg))), dstrd(ctrl->config().dstrd) {
    scratch = ctrl->alloc(16 * page);
    if (bring_up) enable();
  }
  ~harness() {
    // As a driver does: disable the controller before freeing queue memory.
    ctrl->write32(nvme::reg::cc, 0);
    io.clear();
    admin = {};
  }

  host_queue make_queue(std::uint16_t qid, std::uint32_t sq_depth, std::uint32_t cq_depth) {
    host_queue q;
    q.sq = ctrl->alloc(sq_depth * sizeof(nvme::command));
    q.cq = ctrl->alloc(cq_depth * sizeof(nvme::completion));
    q.state = std::make_unique<state_block>(nvme::queue_state_bytes(sq_depth));
    q.ref.sq = q.sq->as<nvme::command>();
    q.ref.cq = q.cq->as<nvme::completion>();
    q.ref.sq_doorbell = ctrl->doorbell(nvme::sq_doorbell_offset(qid, dstrd));
    q.ref.cq_doorbell = ctrl->doorbell(nvme::cq_doorbell_offset(qid, dstrd));
    q.ref.sq_depth = sq_depth;
    q.ref.cq_depth = cq_depth;
    q.ref.qid = qid;
    q.ref.attach_state(q.state->p);
    return q;
  }

  void enable(std::uint32_t admin_depth = 32) {
    ctrl->write32(nvme::reg::cc, 0);
    REQUIRE(wait_for([&] { return (ctrl->read32(nvme::reg::csts) & 1) == 0; }, ready_wait_ns));
    admin = make_queue(0, admin_depth, admin_depth);
    nvme::aqa_register aqa{};
    aqa.bits.asqs = admin_depth - 1;
    aqa.bits.acqs = admin_depth - 1;
    ctrl->write32(nvme::reg::aqa, aqa.raw);
    ctrl->write64(nvme::reg::asq, admin.sq->bus_address(0));
    ctrl->write64(nvme::reg::acq, admin.cq->bus_address(0));
    ctrl->write32(nvme::reg::cc, cc_enable_value());
    REQUIRE(wait_for([&] { return (ctrl->read32(nvme::reg::csts) & 1) == 1; }, ready_wait_ns));
    nvme::csts_register csts{ctrl->read32(nvme::reg::csts)};
    REQUIRE(csts.bits.cfs == 0);
  }

  status admin_exec(const nvme::command& c, std::uint32_t* dw0 = nullptr) { return admin.ref.execute(c, dw0); }

  host_queue& create_io(std::uint16_t qid, std::uint32_t depth, std::uint32_t cq_depth = 0) {
    if (cq_depth == 0) cq_depth = depth;
    host_queue q = make_queue(qid, depth, cq_depth);
    REQUIRE(admin_exec(nvme::make_create_io_cq(qid, cq_depth, q.cq->bus_address(0))) == nvme::status_success);
    REQUIRE(admin_exec(nvme::make_create_io_sq(qid, depth, q.sq->bus_address(0), qid)) == nvme::status_success);
    return io[qid] = std::move(q);
  }

  //! Read/write `nblocks` at `slba` through `buf` (at offset `off` of it), PRPs built for the
  //! region.
  status rw(nvme::nvm_opcode op, std::uint16_t qid, std::uint64_t slba, std::uint32_t nblocks, const dma_region& buf,
            std::size_t off, std::uint32_t nsid = 1) {
    const std::uint32_t lba_size = ctrl->config().namespaces.at(nsid - 1).lba_size;
    const std::uint64_t bytes = std::uint64_t{nblocks} * lba_size;
    const std::uint64_t pages = nvme::prp_pages_spanned(off % page, bytes, page);
    const std::size_t lists = nvme::prp_list_pages_needed(pages, page);
    std::unique_ptr<dma_region> list_mem;
    std::vector<std::uint64_t*> list_virt;
    std::vector<std::uint64_t> list_bus;
    if (lists != 0) {
      list_mem = ctrl->alloc(lists * page);
      for (std::size_t i = 0; i < lists; ++i) {
        list_virt.push_back(reinterpret_cast<std::uint64_t*>(list_mem->as<unsigned char>() + i * page));
        list_bus.push_back(list_mem->bus_address(i * page));
      }
    }
    nvme::prp_pair prp;
    // No REQUIRE here: this runs on test threads too.
    if (!nvme::build_prp(buf.page_bus().data(), off, bytes, page, list_virt.data(), list_bus.data(), lists, prp))
      return nvme::status_out_of_range;
    return io.at(qid).ref.execute(nvme::make_rw(op, nsid, slba, nblocks, prp.prp1, prp.prp2));
  }
};

nvme_id_ctrl identify_controller(harness& h) {
  REQUIRE(h.admin_exec(nvme::make_identify(nvme::identify_cns::controller, 0, h.scratch->bus_address(0))) ==
          nvme::status_success);
  nvme_id_ctrl id;
  std::memcpy(&id, h.scratch->data(), sizeof id);
  return id;
}

} // namespace

// ---------------------------------------------------------------------------
// Registers and bring-up
// ---------------------------------------------------------------------------

TEST_CASE("emu: capability and version registers", "[emu][regs]") {
  auto cfg = ram_config();
  cfg.max_queue_entries = 1024;
  cfg.dstrd = 2;
  cfg.cap_to = 7;
  harness h(cfg, false);
  nvme::cap_register cap{h.ctrl->read64(nvme::reg::cap)};
  CHECK(cap.bits.mqes == 1023);
  CHECK(cap.bits.cqr == 1);
  CHECK(cap.bits.to == 7);
  CHECK(cap.bits.dstrd == 2);
  CHECK((cap.bits.css & 1) == 1);
  CHECK(cap.bits.mpsmin == 0);
  CHECK(h.ctrl->read32(nvme::reg::vs) == 0x00010400u);
  CHECK(h.ctrl->read32(nvme::reg::csts) == 0);
  CHECK(h.ctrl->name() == "emu");
  // Doorbells honour the stride: SQ1 tail at 0x1000 + 2 * 16.
  auto* db = h.ctrl->doorbell(nvme::sq_doorbell_offset(1, 2));
  h.ctrl->write32(0x1000 + 2 * 16, 5);
  CHECK(*db == 5);
  CHECK_THROWS_AS(h.ctrl->doorbell(nvme::reg::cc), bam::error);
  CHECK_THROWS_AS(h.ctrl->read32(0x1002), bam::error);
  CHECK_THROWS_AS(h.ctrl->read32(0x10000000), bam::error);
  // With dstrd 2 the stride-2 harness brings the controller up too.
  h.enable();
  CHECK(identify_controller(h).sqes == 0x66);
}

TEST_CASE("emu: invalid configurations are refused", "[emu][regs]") {
  auto bad = [](auto edit) {
    auto cfg = ram_config();
    edit(cfg);
    CHECK_THROWS_AS(emu::make_emulated_controller(cfg), bam::error);
  };
  bad([](emu::controller_config& c) { c.max_queue_entries = 1; });
  bad([](emu::controller_config& c) { c.max_io_queues = 0; });
  bad([](emu::controller_config& c) { c.namespaces[0].lba_size = 1000; });
  bad([](emu::controller_config& c) { c.namespaces[0].blocks = 0; });
  bad([](emu::controller_config& c) { c.namespaces[0].backing = emu::make_ram_media(4096); });
}

TEST_CASE("emu: CSTS.RDY rises after the ready delay", "[emu][regs]") {
  auto cfg = ram_config();
  cfg.ready_delay_ns = 30'000'000;
  harness h(cfg, false);
  auto q = h.make_queue(0, 4, 4);
  h.ctrl->write32(nvme::reg::aqa, 3 | (3u << 16));
  h.ctrl->write64(nvme::reg::asq, q.sq->bus_address(0));
  h.ctrl->write64(nvme::reg::acq, q.cq->bus_address(0));
  const auto t0 = detail::now_ns();
  h.ctrl->write32(nvme::reg::cc, cc_enable_value());
  CHECK((h.ctrl->read32(nvme::reg::csts) & 1) == 0);
  REQUIRE(wait_for([&] { return (h.ctrl->read32(nvme::reg::csts) & 1) == 1; }, ready_wait_ns));
  CHECK(detail::now_ns() - t0 >= cfg.ready_delay_ns);
  CHECK((h.ctrl->read32(nvme::reg::cc) & 1) == 1);
}

TEST_CASE("emu: a bad configuration at CC.EN sets CSTS.CFS until reset", "[emu][regs]") {
  harness h(ram_config(), false);
  auto q = h.make_queue(0, 4, 4);
  h.ctrl->write32(nvme::reg::aqa, 3 | (3u << 16));
  h.ctrl->write64(nvme::reg::asq, q.sq->bus_address(0));
  h.ctrl->write64(nvme::reg::acq, q.cq->bus_address(0));
  auto expect_cfs = [&](std::uint32_t cc) {
    h.ctrl->write32(nvme::reg::cc, cc);
    nvme::csts_register csts{h.ctrl->read32(nvme::reg::csts)};
    CHECK(csts.bits.cfs == 1);
    CHECK(csts.bits.rdy == 0);
    h.ctrl->write32(nvme::reg::cc, 0);
    CHECK(h.ctrl->read32(nvme::reg::csts) == 0);
  };
  SECTION("wrong IOSQES") { expect_cfs(cc_enable_value() & ~(0xfu << 16)); }
  SECTION("wrong IOCQES") { expect_cfs((cc_enable_value() & ~(0xfu << 20)) | (6u << 20)); }
  SECTION("MPS other than 4 KiB") { expect_cfs(cc_enable_value() | (1u << 7)); }
  SECTION("admin queue of one entry") {
    h.ctrl->write32(nvme::reg::aqa, 0);
    expect_cfs(cc_enable_value());
  }
  SECTION("admin SQ at an unmapped (virtual) address") {
    h.ctrl->write64(nvme::reg::asq, reinterpret_cast<std::uint64_t>(q.sq->data()));
    expect_cfs(cc_enable_value());
  }
}

// ---------------------------------------------------------------------------
// Identify and features
// ---------------------------------------------------------------------------

TEST_CASE("emu: identify controller, namespace and namespace list", "[emu][admin]") {
  auto cfg = ram_config(1 << 12, 4096);
  cfg.namespaces.push_back({1000, 512, nullptr});
  cfg.namespaces.push_back({77, 1024, nullptr});
  cfg.mdts = 6;
  cfg.name = "idtest";
  harness h(cfg);

  const nvme_id_ctrl id = identify_controller(h);
  CHECK(std::string(id.mn, sizeof id.mn).rfind("bam software NVMe controller", 0) == 0);
  CHECK(std::string(id.mn, sizeof id.mn).back() == ' '); // space padded, not NUL
  CHECK(std::string(id.sn, sizeof id.sn).find("idtest") != std::string::npos);
  CHECK(id.vid != 0);
  CHECK(id.mdts == 6);
  CHECK(id.nn == 3);
  CHECK(id.sqes == 0x66);
  CHECK(id.cqes == 0x44);
  CHECK(id.ver == 0x00010400u);
  CHECK((id.oncs & NVME_CTRL_ONCS_WRITE_ZEROES) != 0);
  CHECK((id.oncs & NVME_CTRL_ONCS_DSM) != 0);
  CHECK((id.vwc & NVME_CTRL_VWC_PRESENT) != 0);

  auto ns = [&](std::uint32_t nsid) {
    std::memset(h.scratch->data(), 0xff, page);
    REQUIRE(h.admin_exec(nvme::make_identify(nvme::identify_cns::ns, nsid, h.scratch->bus_address(0))) ==
            nvme::status_success);
    nvme_id_ns n;
    std::memcpy(&n, h.scratch->data(), sizeof n);
    return n;
  };
  const nvme_id_ns n1 = ns(1), n2 = ns(2), n3 = ns(3);
  CHECK(n1.nsze == (1u << 12));
  CHECK(n1.ncap == (1u << 12));
  CHECK(n1.nuse == (1u << 12));
  CHECK(n1.nlbaf == 0);
  CHECK(n1.flbas == 0);
  CHECK(n1.lbaf[0].ds == 12);
  CHECK(n2.nsze == 1000);
  CHECK(n2.lbaf[0].ds == 9);
  CHECK(n3.nsze == 77);
  CHECK(n3.lbaf[0].ds == 10);

  auto list = [&](std::uint32_t after) {
    REQUIRE(h.admin_exec(nvme::make_identify(nvme::identify_cns::active_ns_list, after, h.scratch->bus_address(0))) ==
            nvme::status_success);
    std::vector<std::uint32_t> ids;
    for (const auto* p = h.scratch->as<std::uint32_t>(); *p != 0; ++p)
      ids.push_back(*p);
    return ids;
  };
  CHECK(list(0) == std::vector<std::uint32_t>{1, 2, 3});
  CHECK(list(2) == std::vector<std::uint32_t>{3});
  CHECK(list(3).empty());

  CHECK(h.admin_exec(nvme::make_identify(nvme::identify_cns::ns, 4, h.scratch->bus_address(0))) ==
        generic(nvme::generic_status::invalid_namespace));
  CHECK(h.admin_exec(nvme::make_identify(nvme::identify_cns::ns, 0, h.scratch->bus_address(0))) ==
        generic(nvme::generic_status::invalid_namespace));
  auto bad_cns = nvme::make_identify(nvme::identify_cns::controller, 0, h.scratch->bus_address(0));
  bad_cns.cdw10 = 0x55;
  CHECK(h.admin_exec(bad_cns) == generic(nvme::generic_status::invalid_field));
  // Identify data spanning two pages (PRP1 with an offset, PRP2 the next page).
  std::memset(h.scratch->data(), 0, 2 * page);
  REQUIRE(h.admin_exec(nvme::make_identify(nvme::identify_cns::controller, 0, h.scratch->bus_address(512),
                                           h.scratch->bus_address(page))) == nvme::status_success);
  nvme_id_ctrl shifted;
  std::memcpy(&shifted, h.scratch->as<unsigned char>() + 512, sizeof shifted);
  CHECK(std::memcmp(&shifted, &id, sizeof id) == 0);
}

TEST_CASE("emu: features", "[emu][admin]") {
  auto cfg = ram_config();
  cfg.max_io_queues = 8;
  harness h(cfg);
  std::uint32_t dw0 = 0;
  REQUIRE(h.admin_exec(nvme::make_set_num_queues(1000, 3), &dw0) == nvme::status_success);
  CHECK((dw0 & 0xffff) == 7); // capped at max_io_queues, 0-based
  CHECK((dw0 >> 16) == 2);
  REQUIRE(h.admin_exec(nvme::make_get_features(nvme::feature_id::number_of_queues), &dw0) == nvme::status_success);
  CHECK(dw0 == (7u | (2u << 16)));
  auto bad = nvme::make_set_num_queues(1, 1);
  bad.cdw11 = 0xffff;
  CHECK(h.admin_exec(bad) == generic(nvme::generic_status::invalid_field));

  REQUIRE(h.admin_exec(nvme::make_get_features(nvme::feature_id::volatile_write_cache), &dw0) == nvme::status_success);
  CHECK(dw0 == 1);
  auto vwc_off = nvme::make_get_features(nvme::feature_id::volatile_write_cache);
  vwc_off.opcode = static_cast<std::uint8_t>(nvme::admin_opcode::set_features);
  vwc_off.cdw11 = 0;
  REQUIRE(h.admin_exec(vwc_off) == nvme::status_success);
  REQUIRE(h.admin_exec(nvme::make_get_features(nvme::feature_id::volatile_write_cache), &dw0) == nvme::status_success);
  CHECK(dw0 == 0);
  CHECK(h.admin_exec(nvme::make_get_features(nvme::feature_id::arbitration)) ==
        generic(nvme::generic_status::invalid_field));
  // After allocating 3 SQs / 3 CQs... (0-based 7 SQs, 2 CQs): CQ 4 is beyond the allocation.
  auto q = h.make_queue(4, 8, 8);
  CHECK(h.admin_exec(nvme::make_create_io_cq(4, 8, q.cq->bus_address(0))) ==
        specific(nvme::command_specific_status::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_create_io_cq(3, 8, q.cq->bus_address(0))) == nvme::status_success);
}

TEST_CASE("emu: unknown admin opcode, abort, and admin commands with fused bits", "[emu][admin]") {
  harness h(ram_config());
  CHECK(h.admin_exec(nvme::make_command(0x7f)) == generic(nvme::generic_status::invalid_opcode));
  std::uint32_t dw0 = 0;
  REQUIRE(h.admin_exec(nvme::make_abort(1, 3), &dw0) == nvme::status_success);
  CHECK((dw0 & 1) == 1); // not aborted
  auto fused = nvme::make_get_features(nvme::feature_id::number_of_queues);
  fused.flags = 1;
  CHECK(h.admin_exec(fused) == generic(nvme::generic_status::invalid_field));
}

// ---------------------------------------------------------------------------
// Queue creation and deletion
// ---------------------------------------------------------------------------

TEST_CASE("emu: create and delete I/O queues: every check", "[emu][admin][queues]") {
  auto cfg = ram_config();
  cfg.max_io_queues = 4;
  cfg.max_queue_entries = 64;
  harness h(cfg);
  auto mem = h.make_queue(1, 64, 64);
  const std::uint64_t sq_bus = mem.sq->bus_address(0), cq_bus = mem.cq->bus_address(0);
  namespace css = nvme::command_specific_status;

  CHECK(h.admin_exec(nvme::make_create_io_cq(0, 16, cq_bus)) == specific(css::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_create_io_cq(5, 16, cq_bus)) == specific(css::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_create_io_cq(1, 1, cq_bus)) == specific(css::invalid_queue_size));
  CHECK(h.admin_exec(nvme::make_create_io_cq(1, 65, cq_bus)) == specific(css::invalid_queue_size));
  auto not_contiguous = nvme::make_create_io_cq(1, 16, cq_bus);
  not_contiguous.cdw11 = 0;
  CHECK(h.admin_exec(not_contiguous) == generic(nvme::generic_status::invalid_field));
  CHECK(h.admin_exec(nvme::make_create_io_cq(1, 16, reinterpret_cast<std::uint64_t>(mem.cq->data()))) ==
        generic(nvme::generic_status::data_transfer_error)); // a virtual address
  REQUIRE(h.admin_exec(nvme::make_create_io_cq(1, 64, cq_bus)) == nvme::status_success);
  CHECK(h.admin_exec(nvme::make_create_io_cq(1, 16, cq_bus)) == specific(css::invalid_queue_identifier));

  CHECK(h.admin_exec(nvme::make_create_io_sq(0, 16, sq_bus, 1)) == specific(css::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_create_io_sq(5, 16, sq_bus, 1)) == specific(css::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_create_io_sq(1, 1, sq_bus, 1)) == specific(css::invalid_queue_size));
  CHECK(h.admin_exec(nvme::make_create_io_sq(1, 65, sq_bus, 1)) == specific(css::invalid_queue_size));
  auto sq_not_contiguous = nvme::make_create_io_sq(1, 16, sq_bus, 1);
  sq_not_contiguous.cdw11 &= ~1u;
  CHECK(h.admin_exec(sq_not_contiguous) == generic(nvme::generic_status::invalid_field));
  CHECK(h.admin_exec(nvme::make_create_io_sq(1, 16, sq_bus, 2)) == specific(css::invalid_completion_queue));
  CHECK(h.admin_exec(nvme::make_create_io_sq(1, 16, sq_bus, 0)) == specific(css::invalid_completion_queue));
  REQUIRE(h.admin_exec(nvme::make_create_io_sq(1, 64, sq_bus, 1)) == nvme::status_success);
  CHECK(h.admin_exec(nvme::make_create_io_sq(1, 64, sq_bus, 1)) == specific(css::invalid_queue_identifier));

  CHECK(h.admin_exec(nvme::make_delete_io_cq(1)) == specific(css::invalid_queue_deletion));
  CHECK(h.admin_exec(nvme::make_delete_io_sq(2)) == specific(css::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_delete_io_sq(0)) == specific(css::invalid_queue_identifier));
  REQUIRE(h.admin_exec(nvme::make_delete_io_sq(1)) == nvme::status_success);
  CHECK(h.admin_exec(nvme::make_delete_io_sq(1)) == specific(css::invalid_queue_identifier));
  REQUIRE(h.admin_exec(nvme::make_delete_io_cq(1)) == nvme::status_success);
  CHECK(h.admin_exec(nvme::make_delete_io_cq(1)) == specific(css::invalid_queue_identifier));
  CHECK(h.admin_exec(nvme::make_delete_io_cq(0)) == specific(css::invalid_queue_identifier));

  // The queue id is free again and I/O works on the recreated pair.
  h.create_io(1, 16);
  auto buf = h.ctrl->alloc(page);
  fill_lbas(buf->data(), 5, 8, 512, 1);
  CHECK(h.rw(nvme::nvm_opcode::write, 1, 5, 8, *buf, 0) == nvme::status_success);
}

TEST_CASE("emu: several SQs share one CQ", "[emu][queues]") {
  harness h(ram_config());
  auto& q1 = h.create_io(1, 32);
  // SQ 2 completes into CQ 1 (its own queue_pair_ref watches CQ 1's memory).
  host_queue sq2 = h.make_queue(2, 32, 32);
  REQUIRE(h.admin_exec(nvme::make_create_io_sq(2, 32, sq2.sq->bus_address(0), 1)) == nvme::status_success);
  auto buf = h.ctrl->alloc(page);
  // Commands on SQ 2 complete on CQ 1 with sq_id 2.
  auto* sq = sq2.sq->as<nvme::command>();
  sq[0] = nvme::make_flush(1);
  sq[0].cid = 42;
  h.ctrl->write32(nvme::sq_doorbell_offset(2, 0), 1);
  REQUIRE(wait_for([&] { return cqe_phase(q1.ref.cq[0]); }, ready_wait_ns));
  const nvme::completion c = q1.ref.cq[0];
  CHECK(c.sq_id == 2);
  CHECK(c.cid == 42);
  CHECK(c.sq_head == 1);
  CHECK(c.status().ok());
  (void)buf;
}

// ---------------------------------------------------------------------------
// I/O
// ---------------------------------------------------------------------------

TEST_CASE("emu: write then read back LBA patterns on RAM from many threads", "[emu][io]") {
  auto cfg = ram_config(1 << 15, 512);
  cfg.engine_threads = 2;
  harness h(cfg);
  constexpr int queues = 3, threads_per_queue = 2, ops = 40;
  for (std::uint16_t q = 1; q <= queues; ++q)
    h.create_io(q, 16);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < queues * threads_per_queue; ++t) {
    ts.emplace_back([&, t] {
      const std::uint16_t qid = static_cast<std::uint16_t>(1 + t % queues);
      auto buf = h.ctrl->alloc(4 * page);
      for (int i = 0; i < ops; ++i) {
        const std::uint32_t n = 1 + (i * 7 + t) % 16; // 1..16 blocks, up to 2 pages
        const std::uint64_t slba = (static_cast<std::uint64_t>(t) * ops + i) * 16;
        const std::size_t off = (i % 4) * 512;
        fill_lbas(buf->as<unsigned char>() + off, slba, n, 512, 99);
        if (!h.rw(nvme::nvm_opcode::write, qid, slba, n, *buf, off).ok()) ++failures;
      }
      for (int i = 0; i < ops; ++i) {
        const std::uint32_t n = 1 + (i * 7 + t) % 16;
        const std::uint64_t slba = (static_cast<std::uint64_t>(t) * ops + i) * 16;
        std::memset(buf->data(), 0, 4 * page);
        if (!h.rw(nvme::nvm_opcode::read, qid, slba, n, *buf, page).ok()) ++failures;
        if (check_lbas(buf->as<unsigned char>() + page, slba, n, 512, 99) != 0) ++failures;
      }
    });
  }
  for (auto& t : ts)
    t.join();
  CHECK(failures == 0);
  std::uint64_t io_cmds = 0;
  for (std::uint16_t q = 1; q <= queues; ++q)
    io_cmds += h.ctrl->commands_processed(q);
  CHECK(io_cmds == static_cast<std::uint64_t>(queues * threads_per_queue * ops * 2));
  CHECK(h.ctrl->commands_processed() == io_cmds + h.ctrl->commands_processed(0));
  const auto c = h.ctrl->counters();
  CHECK(c.host_writes == queues * threads_per_queue * ops);
  CHECK(c.host_reads == queues * threads_per_queue * ops);
}

TEST_CASE("emu: file-backed namespace keeps its data across controllers", "[emu][io]") {
  const auto path =
      (std::filesystem::temp_directory_path() / ("bam-emu-ns-" + std::to_string(::getpid()) + ".img")).string();
  struct cleanup {
    std::string p;
    ~cleanup() { ::unlink(p.c_str()); }
  } rm{path};
  constexpr std::uint64_t blocks = 4096;
  {
    auto cfg = ram_config();
    cfg.namespaces[0] = {blocks, 512, emu::make_file_media(path, blocks * 512, true)};
    harness h(cfg);
    h.create_io(1, 8);
    auto buf = h.ctrl->alloc(8 * page);
    fill_lbas(buf->data(), 100, 64, 512, 7); // 32 KiB, PRP list
    REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 100, 64, *buf, 0) == nvme::status_success);
    fill_lbas(buf->data(), 3, 1, 512, 7); // one unaligned 512-byte block
    REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 3, 1, *buf, 0) == nvme::status_success);
    REQUIRE(h.io.at(1).ref.execute(nvme::make_flush(1)) == nvme::status_success);
  }
  auto cfg = ram_config();
  cfg.namespaces[0] = {blocks, 512, emu::make_file_media(path, 0, false)};
  harness h(cfg);
  h.create_io(1, 8);
  auto buf = h.ctrl->alloc(8 * page);
  REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 100, 64, *buf, 0) == nvme::status_success);
  CHECK(check_lbas(buf->data(), 100, 64, 512, 7) == 0);
  REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 2, 3, *buf, 0) == nvme::status_success);
  CHECK(check_lbas(buf->as<unsigned char>() + 512, 3, 1, 512, 7) == 0);
  CHECK(std::all_of(buf->as<unsigned char>(), buf->as<unsigned char>() + 512,
                    [](unsigned char b) { return b == 0; })); // LBA 2 untouched
}

TEST_CASE("emu: block-device namespace", "[emu][io]") {
  const scratch_block_device dev(16 << 20);
  if (dev.path.empty())
    SKIP("no scratch block device: set BAM_TEST_BLOCK_DEVICE=/dev/... (its data is overwritten) "
         "to run the controller on block-device media");
  auto m = emu::make_block_media(dev.path, 16 << 20);
  auto cfg = ram_config();
  cfg.namespaces[0] = {m->size() / 512, 512, m};
  harness h(cfg);
  h.create_io(1, 8);
  auto buf = h.ctrl->alloc(8 * page);
  fill_lbas(buf->data(), 8, 64, 512, 3);
  REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 8, 64, *buf, 0) == nvme::status_success);
  std::memset(buf->data(), 0, 8 * page);
  REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 8, 64, *buf, 0) == nvme::status_success);
  CHECK(check_lbas(buf->data(), 8, 64, 512, 3) == 0);
}

TEST_CASE("emu: PRP lists, offsets and chained list pages", "[emu][io][prp]") {
  SECTION("4 KiB blocks, PRP1 offset, lists of one page (MDTS 5)") {
    auto cfg = ram_config(1 << 12, 4096);
    harness h(cfg);
    h.create_io(1, 8);
    auto buf = h.ctrl->alloc(40 * page);
    for (std::uint32_t n : {1u, 2u, 3u, 17u, 32u}) {
      fill_lbas(buf->data(), 10 * n, n, 4096, n);
      REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 10 * n, n, *buf, 0) == nvme::status_success);
    }
    for (std::uint32_t n : {1u, 2u, 3u, 17u, 32u}) {
      std::memset(buf->data(), 0, 40 * page);
      REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 10 * n, n, *buf, 0) == nvme::status_success);
      CHECK(check_lbas(buf->data(), 10 * n, n, 4096, n) == 0);
    }
  }
  SECTION("512 B blocks at a 512-byte offset: the transfer spans one page more") {
    harness h(ram_config(1 << 14, 512));
    h.create_io(1, 8);
    auto buf = h.ctrl->alloc(10 * page);
    fill_lbas(buf->as<unsigned char>() + 512, 40, 64, 512, 5); // 32 KiB over 9 pages
    REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 40, 64, *buf, 512) == nvme::status_success);
    std::memset(buf->data(), 0, 10 * page);
    REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 40, 64, *buf, 3 * 512) == nvme::status_success);
    CHECK(check_lbas(buf->as<unsigned char>() + 3 * 512, 40, 64, 512, 5) == 0);
  }
  SECTION("chained PRP list pages with MDTS 0 (no limit)") {
    auto cfg = ram_config(1 << 12, 4096);
    cfg.mdts = 0;
    harness h(cfg);
    h.create_io(1, 4);
    constexpr std::uint32_t n = 1100; // 1099 list entries: three list pages chained
    REQUIRE(nvme::prp_list_pages_needed(n, page) == 3);
    auto buf = h.ctrl->alloc(n * page);
    fill_lbas(buf->data(), 1000, n, 4096, 11);
    REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 1000, n, *buf, 0) == nvme::status_success);
    std::memset(buf->data(), 0, n * page);
    REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 1000, n, *buf, 0) == nvme::status_success);
    CHECK(check_lbas(buf->data(), 1000, n, 4096, 11) == 0);
  }
  SECTION("a large MDTS still limits the transfer") {
    auto cfg = ram_config(1 << 12, 4096);
    cfg.mdts = 10; // 4 MiB
    harness h(cfg);
    h.create_io(1, 4);
    auto buf = h.ctrl->alloc(1025 * page);
    fill_lbas(buf->data(), 0, 1024, 4096, 13);
    REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 0, 1024, *buf, 0) == nvme::status_success);
    std::memset(buf->data(), 0, 1024 * page);
    REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 0, 1024, *buf, 0) == nvme::status_success);
    CHECK(check_lbas(buf->data(), 0, 1024, 4096, 13) == 0);
    CHECK(h.rw(nvme::nvm_opcode::read, 1, 0, 1025, *buf, 0) == generic(nvme::generic_status::invalid_field));
  }
}

TEST_CASE("emu: NVM command errors surface with the right status", "[emu][io][errors]") {
  auto cfg = ram_config(1000, 512);
  cfg.mdts = 1; // 8 KiB
  harness h(cfg);
  auto& q = h.create_io(1, 8);
  auto buf = h.ctrl->alloc(4 * page);
  const std::uint64_t b0 = buf->bus_address(0), b1 = buf->bus_address(page);

  CHECK(q.ref.execute(nvme::make_read(1, 999, 1, b0, 0)) == nvme::status_success);
  CHECK(q.ref.execute(nvme::make_read(1, 999, 2, b0, 0)) == generic(nvme::generic_status::lba_out_of_range));
  CHECK(q.ref.execute(nvme::make_write(1, 1000, 1, b0, 0)) == generic(nvme::generic_status::lba_out_of_range));
  CHECK(q.ref.execute(nvme::make_read(1, ~0ull - 1, 4, b0, 0)) == generic(nvme::generic_status::lba_out_of_range));
  CHECK(q.ref.execute(nvme::make_read(2, 0, 1, b0, 0)) == generic(nvme::generic_status::invalid_namespace));
  CHECK(q.ref.execute(nvme::make_read(0, 0, 1, b0, 0)) == generic(nvme::generic_status::invalid_namespace));
  CHECK(q.ref.execute(nvme::make_flush(7)) == generic(nvme::generic_status::invalid_namespace));
  CHECK(q.ref.execute(nvme::make_flush(0xffffffffu)) == nvme::status_success);
  CHECK(q.ref.execute(nvme::make_read(1, 0, 17, b0, b1)) == generic(nvme::generic_status::invalid_field)); // > MDTS
  CHECK(q.ref.execute(nvme::make_read(1, 0, 16, b0, b1)) == nvme::status_success);
  CHECK(q.ref.execute(nvme::make_command(0x7e, 1)) == generic(nvme::generic_status::invalid_opcode));
  auto sgl = nvme::make_read(1, 0, 1, b0, 0);
  sgl.flags = 0x40; // PSDT: SGL
  CHECK(q.ref.execute(sgl) == generic(nvme::generic_status::invalid_field));
  // PRPs: a virtual address, an unmapped bus address, a misaligned one.
  CHECK(q.ref.execute(nvme::make_read(1, 0, 1, reinterpret_cast<std::uint64_t>(buf->data()), 0)) ==
        generic(nvme::generic_status::data_transfer_error));
  CHECK(q.ref.execute(nvme::make_write(1, 0, 8, b0 + 4 * page, 0)) ==
        generic(nvme::generic_status::data_transfer_error)); // one past the region: a guard page
  CHECK(q.ref.execute(nvme::make_read(1, 0, 1, b0 + 2, 0)) == generic(nvme::generic_status::invalid_prp_offset));
  CHECK(q.ref.execute(nvme::make_read(1, 0, 16, b0, b1 + 8)) == generic(nvme::generic_status::invalid_prp_offset));
  // The region is destroyed: its bus addresses stop translating.
  const std::uint64_t gone = [&] {
    auto tmp = h.ctrl->alloc(page);
    return tmp->bus_address(0);
  }();
  CHECK(q.ref.execute(nvme::make_read(1, 0, 1, gone, 0)) == generic(nvme::generic_status::data_transfer_error));
  // The queue is still healthy.
  CHECK(q.ref.execute(nvme::make_write(1, 0, 8, b0, 0)) == nvme::status_success);
  CHECK(!q.ref.broken());
}

TEST_CASE("emu: media errors become Unrecovered Read Error and Write Fault", "[emu][io][errors]") {
  struct failing_media final : emu::media {
    std::shared_ptr<emu::media> inner = emu::make_ram_media(1 << 20);
    std::uint64_t size() const override { return inner->size(); }
    std::string describe() const override { return "failing"; }
    int read(std::uint64_t o, std::span<const iovec> s) override { return o == 0 ? EIO : inner->read(o, s); }
    int write(std::uint64_t o, std::span<const iovec> s) override { return o == 0 ? ENOSPC : inner->write(o, s); }
    int flush() override { return EIO; }
    int write_zeroes(std::uint64_t o, std::uint64_t l) override { return inner->write_zeroes(o, l); }
  };
  auto cfg = ram_config();
  cfg.namespaces[0] = {2048, 512, std::make_shared<failing_media>()};
  harness h(cfg);
  auto& q = h.create_io(1, 8);
  auto buf = h.ctrl->alloc(page);
  CHECK(q.ref.execute(nvme::make_read(1, 0, 1, buf->bus_address(0), 0)) ==
        status(status_type::media_error, nvme::media_status::unrecovered_read_error));
  CHECK(q.ref.execute(nvme::make_write(1, 0, 1, buf->bus_address(0), 0)) ==
        status(status_type::media_error, nvme::media_status::write_fault));
  CHECK(q.ref.execute(nvme::make_flush(1)) == status(status_type::media_error, nvme::media_status::write_fault));
  CHECK(q.ref.execute(nvme::make_read(1, 1, 1, buf->bus_address(0), 0)) == nvme::status_success);
  CHECK(h.ctrl->counters().media_errors == 3);
}

TEST_CASE("emu: write zeroes and dataset management deallocate", "[emu][io]") {
  for (bool file : {false, true}) {
    DYNAMIC_SECTION((file ? "file" : "ram")) {
      const auto path =
          (std::filesystem::temp_directory_path() / ("bam-emu-wz-" + std::to_string(::getpid()) + ".img")).string();
      struct cleanup {
        std::string p;
        ~cleanup() { ::unlink(p.c_str()); }
      } rm{path};
      auto cfg = ram_config(4096, 512);
      if (file) cfg.namespaces[0].backing = emu::make_file_media(path, 4096 * 512, true);
      harness h(cfg);
      auto& q = h.create_io(1, 8);
      auto buf = h.ctrl->alloc(16 * page);
      fill_lbas(buf->data(), 0, 128, 512, 21);
      REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 0, 128, *buf, 0) == nvme::status_success);
      REQUIRE(q.ref.execute(nvme::make_write_zeroes(1, 3, 5)) == nvme::status_success);
      CHECK(q.ref.execute(nvme::make_write_zeroes(1, 4090, 7)) == generic(nvme::generic_status::lba_out_of_range));
      // Deallocate LBAs 20..29 and 64..95 (two ranges), then read everything back.
      auto* ranges = h.scratch->as<nvme::dsm_range>();
      ranges[0] = {0, 10, 20};
      ranges[1] = {0, 32, 64};
      REQUIRE(q.ref.execute(nvme::make_dsm_deallocate(1, 2, h.scratch->bus_address(0))) == nvme::status_success);
      ranges[0] = {0, 10, 4090};
      CHECK(q.ref.execute(nvme::make_dsm_deallocate(1, 1, h.scratch->bus_address(0))) ==
            generic(nvme::generic_status::lba_out_of_range));
      std::memset(buf->data(), 0xaa, 16 * page);
      REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 0, 128, *buf, 0) == nvme::status_success);
      for (std::uint32_t lba = 0; lba < 128; ++lba) {
        const bool zero = (lba >= 3 && lba < 8) || (lba >= 20 && lba < 30) || (lba >= 64 && lba < 96);
        const unsigned char* p = buf->as<unsigned char>() + lba * 512;
        if (zero) {
          INFO("LBA " << lba);
          CHECK(std::all_of(p, p + 512, [](unsigned char b) { return b == 0; }));
        } else {
          INFO("LBA " << lba);
          CHECK(check_lbas(p, lba, 1, 512, 21) == 0);
        }
      }
    }
  }
}

TEST_CASE("emu: log pages", "[emu][admin][log]") {
  harness h(ram_config(1 << 14, 512));
  auto& q = h.create_io(1, 8);
  auto buf = h.ctrl->alloc(8 * page);
  for (int i = 0; i < 3; ++i)
    REQUIRE(h.rw(nvme::nvm_opcode::write, 1, i * 64, 64, *buf, 0) == nvme::status_success); // 32 KiB each
  for (int i = 0; i < 5; ++i)
    REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 0, 8, *buf, 0) == nvme::status_success);
  REQUIRE(q.ref.execute(nvme::make_read(1, 1 << 20, 1, buf->bus_address(0), 0)) ==
          generic(nvme::generic_status::lba_out_of_range));

  REQUIRE(h.admin_exec(nvme::make_get_log_page(nvme::log_page_id::smart_health, 0xffffffffu, 512,
                                               h.scratch->bus_address(0))) == nvme::status_success);
  nvme_smart_log smart;
  std::memcpy(&smart, h.scratch->data(), sizeof smart);
  auto u64 = [](const std::uint8_t* f) {
    std::uint64_t v;
    std::memcpy(&v, f, 8);
    return v;
  };
  CHECK(u64(smart.host_writes) == 3);
  CHECK(u64(smart.host_reads) == 5);
  CHECK(u64(smart.data_units_written) == 1); // 192 units of 512 B, in thousands, rounded up
  CHECK(u64(smart.data_units_read) == 1);
  CHECK(u64(smart.num_err_log_entries) == 1);
  CHECK(smart.avail_spare == 100);

  REQUIRE(h.admin_exec(nvme::make_get_log_page(nvme::log_page_id::error_information, 0, 64,
                                               h.scratch->bus_address(0))) == nvme::status_success);
  nvme_error_log_page err;
  std::memcpy(&err, h.scratch->data(), sizeof err);
  CHECK(err.error_count == 1);
  CHECK(err.sqid == 1);
  CHECK(err.lba == (1u << 20));
  CHECK(((err.status_field >> 1) & 0x7ff) == generic(nvme::generic_status::lba_out_of_range).code());

  REQUIRE(h.admin_exec(nvme::make_get_log_page(nvme::log_page_id::firmware_slot, 0, 512, h.scratch->bus_address(0))) ==
          nvme::status_success);
  nvme_firmware_slot fw;
  std::memcpy(&fw, h.scratch->data(), sizeof fw);
  CHECK(fw.afi == 1);
  CHECK(std::string(fw.frs[0], 5) == "0.1.0");

  CHECK(
      h.admin_exec(nvme::make_get_log_page(static_cast<nvme::log_page_id>(0x70), 0, 512, h.scratch->bus_address(0))) ==
      specific(nvme::command_specific_status::invalid_log_page));
  auto past_end = nvme::make_get_log_page(nvme::log_page_id::smart_health, 0, 512, h.scratch->bus_address(0));
  past_end.cdw12 = 4096;
  CHECK(h.admin_exec(past_end) == generic(nvme::generic_status::invalid_field));
}

TEST_CASE("emu: a log read past the log's end gets zeroes, one past MDTS is refused", "[emu][admin][log]") {
  emu::controller_config cfg = ram_config(1 << 14, 512);
  cfg.mdts = 1; // 8 KiB
  harness h(cfg);
  std::memset(h.scratch->data(), 0xab, 16 * page);
  // 8 KiB of a 512-byte log: the log, then zeroes over everything the host had there.
  REQUIRE(h.admin_exec(nvme::make_get_log_page(nvme::log_page_id::smart_health, 0xffffffffu, 2 * page,
                                               h.scratch->bus_address(0), h.scratch->bus_address(page))) ==
          nvme::status_success);
  const auto* b = h.scratch->as<unsigned char>();
  CHECK(b[0] == 0);   // critical warning: none
  CHECK(b[3] == 100); // available spare
  CHECK(std::all_of(b + 512, b + 2 * page, [](unsigned char x) { return x == 0; }));
  CHECK(b[2 * page] == 0xab); // nothing past the transfer

  // 12 KiB through a PRP list: more than MDTS allows. NUMD reaches 16 GiB, so
  // a controller that staged the whole request would be at the host's mercy.
  std::memset(h.scratch->data(), 0xab, 16 * page);
  auto* list = reinterpret_cast<std::uint64_t*>(h.scratch->as<unsigned char>() + 8 * page);
  list[0] = h.scratch->bus_address(page);
  list[1] = h.scratch->bus_address(2 * page);
  CHECK(h.admin_exec(nvme::make_get_log_page(nvme::log_page_id::smart_health, 0xffffffffu, 3 * page,
                                             h.scratch->bus_address(0), h.scratch->bus_address(8 * page))) ==
        generic(nvme::generic_status::invalid_field));
  CHECK(b[0] == 0xab); // refused before any byte moved
  auto huge = nvme::make_get_log_page(nvme::log_page_id::smart_health, 0xffffffffu, 4, h.scratch->bus_address(0));
  huge.cdw10 |= 0xffffu << 16; // NUMDL
  huge.cdw11 |= 0xffffu;       // NUMDU: 2^32 dwords
  CHECK(h.admin_exec(huge) == generic(nvme::generic_status::invalid_field));
}

// ---------------------------------------------------------------------------
// Completion queue protocol details, driven through raw rings
// ---------------------------------------------------------------------------

TEST_CASE("emu: a full CQ holds completions back until the head doorbell moves", "[emu][queues]") {
  harness h(ram_config());
  constexpr std::uint32_t sq_depth = 16, cq_depth = 4;
  auto sq = h.ctrl->alloc(sq_depth * sizeof(nvme::command));
  auto cq = h.ctrl->alloc(page);
  REQUIRE(h.admin_exec(nvme::make_create_io_cq(1, cq_depth, cq->bus_address(0))) == nvme::status_success);
  REQUIRE(h.admin_exec(nvme::make_create_io_sq(1, sq_depth, sq->bus_address(0), 1)) == nvme::status_success);
  auto* cmds = sq->as<nvme::command>();
  auto* cqes = cq->as<nvme::completion>();
  volatile std::uint32_t* sq_db = h.ctrl->doorbell(nvme::sq_doorbell_offset(1, 0));
  volatile std::uint32_t* cq_db = h.ctrl->doorbell(nvme::cq_doorbell_offset(1, 0));
  auto phase_of = [&](std::uint32_t slot) { return cqe_phase(cqes[slot]) ? 1u : 0u; };
  constexpr std::uint32_t total = 10;
  for (std::uint32_t i = 0; i < total; ++i) {
    cmds[i] = nvme::make_flush(1);
    cmds[i].cid = static_cast<std::uint16_t>(100 + i);
  }
  nvme::detail::doorbell_write(sq_db, total, nvme::memory_scope::system);

  std::uint32_t head = 0, phase = 1, seen = 0;
  while (seen < total) {
    // Wait until the controller has filled every slot it may (depth - 1), or finished.
    const std::uint32_t expect = std::min(cq_depth - 1, total - seen);
    REQUIRE(wait_for(
        [&] {
          std::uint32_t n = 0;
          for (std::uint32_t k = 0, s = head, p = phase; k < cq_depth; ++k) {
            if (phase_of(s) != p) break;
            ++n;
            if (++s == cq_depth) {
              s = 0;
              p ^= 1;
            }
          }
          return n >= expect;
        },
        ready_wait_ns));
    std::this_thread::sleep_for(std::chrono::milliseconds(5)); // give it time to overrun, if it would
    std::uint32_t got = 0;
    for (std::uint32_t s = head, p = phase; phase_of(s) == p && got < cq_depth; ++got) {
      if (++s == cq_depth) {
        s = 0;
        p ^= 1;
      }
    }
    CHECK(got == expect); // never more than depth - 1: the slot at the head stays free
    for (std::uint32_t k = 0; k < got; ++k) {
      CHECK(cqes[head].cid == 100 + seen);
      CHECK(cqes[head].sq_id == 1);
      CHECK(cqes[head].status().ok());
      ++seen;
      if (++head == cq_depth) {
        head = 0;
        phase ^= 1;
      }
    }
    nvme::detail::doorbell_write(cq_db, head, nvme::memory_scope::system);
  }
  CHECK(h.ctrl->commands_processed(1) == total);
}

TEST_CASE("emu: completions report the SQ head and wrap the SQ", "[emu][queues]") {
  harness h(ram_config());
  constexpr std::uint32_t depth = 4;
  auto sq = h.ctrl->alloc(page);
  auto cq = h.ctrl->alloc(page);
  REQUIRE(h.admin_exec(nvme::make_create_io_cq(1, 64, cq->bus_address(0))) == nvme::status_success);
  REQUIRE(h.admin_exec(nvme::make_create_io_sq(1, depth, sq->bus_address(0), 1)) == nvme::status_success);
  auto* cmds = sq->as<nvme::command>();
  auto* cqes = cq->as<nvme::completion>();
  volatile std::uint32_t* sq_db = h.ctrl->doorbell(nvme::sq_doorbell_offset(1, 0));
  std::uint32_t tail = 0;
  for (std::uint32_t i = 0; i < 9; ++i) {
    cmds[tail] = nvme::make_flush(1);
    cmds[tail].cid = static_cast<std::uint16_t>(i);
    tail = (tail + 1) % depth;
    nvme::detail::doorbell_write(sq_db, tail, nvme::memory_scope::system);
    REQUIRE(wait_for([&] { return cqe_phase(cqes[i]); }, ready_wait_ns));
    CHECK(cqes[i].cid == i);
    CHECK(cqes[i].sq_head == tail);
  }
}

// ---------------------------------------------------------------------------
// Fault injection
// ---------------------------------------------------------------------------

TEST_CASE("emu: fault rules complete chosen commands with a chosen status", "[emu][faults]") {
  harness h(ram_config());
  auto& q = h.create_io(1, 8);
  h.create_io(2, 8);
  auto buf = h.ctrl->alloc(page);
  const std::uint64_t b = buf->bus_address(0);
  const status unrecovered(status_type::media_error, nvme::media_status::unrecovered_read_error);

  emu::fault_rule r;
  r.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::read);
  r.lba_first = 100;
  r.lba_last = 199;
  r.skip = 1;
  r.count = 2;
  r.status = unrecovered;
  const auto id = h.ctrl->faults().add(r);

  CHECK(q.ref.execute(nvme::make_read(1, 50, 8, b, 0)) == nvme::status_success);   // outside the range
  CHECK(q.ref.execute(nvme::make_write(1, 100, 1, b, 0)) == nvme::status_success); // not a read
  CHECK(q.ref.execute(nvme::make_read(1, 96, 8, b, 0)) == nvme::status_success);   // skipped (1st match)
  CHECK(q.ref.execute(nvme::make_read(1, 199, 1, b, 0)) == unrecovered);           // fires
  CHECK(h.ctrl->faults().fired(id) == 1);
  CHECK(h.io.at(2).ref.execute(nvme::make_read(1, 150, 1, b, 0)) == unrecovered); // fires (any queue)
  CHECK(q.ref.execute(nvme::make_read(1, 150, 1, b, 0)) == nvme::status_success); // count used up
  CHECK(h.ctrl->faults().fired(id) == 2);
  CHECK(h.ctrl->faults().remove(id));
  CHECK_FALSE(h.ctrl->faults().remove(id));

  // Queue filter, forever.
  emu::fault_rule on_q2;
  on_q2.qid = 2;
  on_q2.count = 0;
  on_q2.status = generic(nvme::generic_status::internal_error);
  h.ctrl->faults().add(on_q2);
  for (int i = 0; i < 3; ++i) {
    CHECK(h.io.at(2).ref.execute(nvme::make_flush(1)) == generic(nvme::generic_status::internal_error));
    CHECK(q.ref.execute(nvme::make_flush(1)) == nvme::status_success);
  }
  h.ctrl->faults().clear();
  CHECK(h.io.at(2).ref.execute(nvme::make_flush(1)) == nvme::status_success);

  // Admin commands: a failing Identify.
  emu::fault_rule adm;
  adm.admin = true;
  adm.opcode = static_cast<std::uint8_t>(nvme::admin_opcode::identify);
  adm.status = generic(nvme::generic_status::internal_error);
  h.ctrl->faults().add(adm);
  CHECK(h.admin_exec(nvme::make_identify(nvme::identify_cns::controller, 0, h.scratch->bus_address(0))) ==
        generic(nvme::generic_status::internal_error));
  CHECK(h.admin_exec(nvme::make_identify(nvme::identify_cns::controller, 0, h.scratch->bus_address(0))) ==
        nvme::status_success);
  // A failed fault-injected write did not touch the media.
  emu::fault_rule wr;
  wr.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::write);
  h.ctrl->faults().add(wr);
  fill_lbas(buf->data(), 500, 8, 512, 4);
  CHECK(q.ref.execute(nvme::make_write(1, 500, 8, b, 0)) == generic(nvme::generic_status::internal_error));
  REQUIRE(q.ref.execute(nvme::make_read(1, 500, 8, b, 0)) == nvme::status_success);
  CHECK(std::all_of(buf->as<unsigned char>(), buf->as<unsigned char>() + page, [](unsigned char c) { return c == 0; }));
}

TEST_CASE("emu: fault latency delays completions without blocking other commands", "[emu][faults]") {
  harness h(ram_config());
  auto& q = h.create_io(1, 8);
  auto buf = h.ctrl->alloc(page);
  emu::fault_rule slow;
  slow.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::write);
  slow.action = emu::fault_action::delay;
  slow.latency_ns = 40'000'000;
  h.ctrl->faults().add(slow);
  fill_lbas(buf->data(), 7, 8, 512, 8);

  const auto t0 = detail::now_ns();
  std::uint64_t slow_ticket = 0, fast_ticket = 0;
  REQUIRE(q.ref.submit(nvme::make_write(1, 7, 8, buf->bus_address(0), 0), slow_ticket).ok());
  REQUIRE(q.ref.submit(nvme::make_flush(1), fast_ticket).ok());
  CHECK(q.ref.wait(fast_ticket) == nvme::status_success);
  CHECK(detail::now_ns() - t0 < 40'000'000); // the flush overtook the delayed write
  CHECK(q.ref.wait(slow_ticket) == nvme::status_success);
  CHECK(detail::now_ns() - t0 >= 40'000'000);

  h.ctrl->faults().clear();
  h.ctrl->faults().set_global_latency_ns(15'000'000);
  const auto t1 = detail::now_ns();
  CHECK(q.ref.execute(nvme::make_read(1, 7, 8, buf->bus_address(0), 0)) == nvme::status_success);
  CHECK(detail::now_ns() - t1 >= 15'000'000);
  CHECK(check_lbas(buf->data(), 7, 8, 512, 8) == 0);
  h.ctrl->faults().set_global_latency_ns(0);
}

TEST_CASE("emu: a dropped command times out the waiter", "[emu][faults]") {
  harness h(ram_config());
  auto& q = h.create_io(1, 8);
  emu::fault_rule drop;
  drop.opcode = static_cast<std::uint8_t>(nvme::nvm_opcode::flush);
  drop.action = emu::fault_action::drop;
  const auto id = h.ctrl->faults().add(drop);
  q.ref.timeout_ns = short_timeout_ns;
  CHECK(q.ref.execute(nvme::make_flush(1)) == nvme::status_timeout);
  CHECK(q.ref.broken());
  CHECK(q.ref.execute(nvme::make_flush(1)) == nvme::status_queue_broken);
  CHECK(h.ctrl->faults().fired(id) == 1);
  CHECK(h.ctrl->commands_processed(1) == 1);
  // Other queues and the admin queue go on.
  auto& q2 = h.create_io(2, 8);
  CHECK(q2.ref.execute(nvme::make_flush(1)) == nvme::status_success);
}

TEST_CASE("emu: stop_answering freezes the controller, registers still read", "[emu][faults]") {
  harness h(ram_config());
  auto& q = h.create_io(1, 8);
  h.ctrl->stop_answering(true);
  CHECK_FALSE(h.ctrl->answering());
  CHECK((h.ctrl->read32(nvme::reg::csts) & 1) == 1);
  const auto before = h.ctrl->commands_processed();
  std::uint64_t ticket = 0;
  q.ref.timeout_ns = short_timeout_ns;
  REQUIRE(q.ref.submit(nvme::make_flush(1), ticket).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(h.ctrl->commands_processed() == before); // not even fetched
  h.admin.ref.timeout_ns = short_timeout_ns;
  CHECK(h.admin_exec(nvme::make_get_features(nvme::feature_id::number_of_queues)) == nvme::status_timeout);
  // Answering again: the command that waited is served.
  h.ctrl->stop_answering(false);
  q.ref.timeout_ns = nvme::default_queue_timeout_ns;
  CHECK(q.ref.wait(ticket) == nvme::status_success);
}

// ---------------------------------------------------------------------------
// Reset, shutdown, DMA mapping, engines
// ---------------------------------------------------------------------------

TEST_CASE("emu: CC.EN 1 -> 0 resets every queue", "[emu][regs]") {
  harness h(ram_config());
  h.create_io(1, 8);
  auto buf = h.ctrl->alloc(page);
  fill_lbas(buf->data(), 0, 8, 512, 77);
  REQUIRE(h.rw(nvme::nvm_opcode::write, 1, 0, 8, *buf, 0) == nvme::status_success);
  h.ctrl->write32(nvme::reg::cc, 0);
  CHECK((h.ctrl->read32(nvme::reg::csts) & 1) == 0);
  CHECK(*h.ctrl->doorbell(nvme::sq_doorbell_offset(1, 0)) == 0);
  CHECK(*h.ctrl->doorbell(nvme::cq_doorbell_offset(0, 0)) == 0);
  h.io.clear();
  // Bring it up again: queue 1 does not exist any more, so it can be created; data persists.
  h.enable();
  CHECK(h.admin_exec(nvme::make_delete_io_sq(1)) == specific(nvme::command_specific_status::invalid_queue_identifier));
  h.create_io(1, 8);
  std::memset(buf->data(), 0, page);
  REQUIRE(h.rw(nvme::nvm_opcode::read, 1, 0, 8, *buf, 0) == nvme::status_success);
  CHECK(check_lbas(buf->data(), 0, 8, 512, 77) == 0);
}

TEST_CASE("emu: shutdown notification completes with SHST", "[emu][regs]") {
  for (auto shn : {nvme::shutdown_notification::normal, nvme::shutdown_notification::abrupt}) {
    harness h(ram_config());
    h.create_io(1, 8);
    nvme::cc_register cc{h.ctrl->read32(nvme::reg::cc)};
    cc.bits.shn = static_cast<std::uint32_t>(shn);
    h.ctrl->write32(nvme::reg::cc, cc.raw);
    nvme::csts_register csts{h.ctrl->read32(nvme::reg::csts)};
    CHECK(csts.bits.shst == static_cast<std::uint32_t>(nvme::shutdown_status::complete));
    h.io.clear();
    h.ctrl->write32(nvme::reg::cc, 0);
    CHECK(h.ctrl->read32(nvme::reg::csts) == 0);
  }
}

TEST_CASE("emu: DMA mapping", "[emu][dma]") {
  harness h(ram_config(), false);
  void* mem = std::aligned_alloc(page, 4 * page);
  {
    auto r = h.ctrl->map(mem, 4 * page, memory_kind::host);
    CHECK(r->bus_address(0) != reinterpret_cast<std::uint64_t>(mem));
    CHECK(r->bus_address(0) % page == 0);
    CHECK(r->page_bus().size() == 4);
    CHECK(r->bus_address(page + 12) == r->page_bus()[1] + 12);
    CHECK(h.ctrl->translate(r->bus_address(100), 200) == static_cast<char*>(mem) + 100);
    CHECK(h.ctrl->translate(r->bus_address(4 * page - 8), 16) == nullptr); // runs off the end
    auto r2 = h.ctrl->map(mem, page, memory_kind::host);                   // the same memory twice is fine
    CHECK(r2->bus_address(0) != r->bus_address(0));
  }
  CHECK_THROWS_AS(h.ctrl->map(static_cast<char*>(mem) + 8, page, memory_kind::host), bam::error);
  CHECK_THROWS_AS(h.ctrl->map(mem, 100, memory_kind::host), bam::error);
  CHECK_THROWS_AS(h.ctrl->map(mem, page, memory_kind::device), bam::error);
  std::free(mem);

  auto cfg = ram_config();
  cfg.identity_dma = true;
  harness id(cfg);
  auto buf = id.ctrl->alloc(2 * page);
  CHECK(buf->bus_address(0) == reinterpret_cast<std::uint64_t>(buf->data()));
  id.create_io(1, 8);
  fill_lbas(buf->data(), 9, 8, 512, 2);
  REQUIRE(id.rw(nvme::nvm_opcode::write, 1, 9, 8, *buf, 0) == nvme::status_success);
  std::memset(buf->data(), 0, page);
  REQUIRE(id.rw(nvme::nvm_opcode::read, 1, 9, 8, *buf, 0) == nvme::status_success);
  CHECK(check_lbas(buf->data(), 9, 8, 512, 2) == 0);
  // Unmapped memory is refused even when bus == virtual.
  std::vector<std::uint8_t> stray(page * 2);
  const std::uint64_t stray_page =
      (reinterpret_cast<std::uint64_t>(stray.data()) + page - 1) & ~std::uint64_t{page - 1};
  CHECK(id.io.at(1).ref.execute(nvme::make_read(1, 0, 1, stray_page, 0)) ==
        generic(nvme::generic_status::data_transfer_error));
}

TEST_CASE("emu: another I/O engine plugs in through the config", "[emu][engine]") {
  struct counting_engine final : emu::io_engine {
    emu::cpu_engine inner{1, "plug"};
    std::atomic<int> created{0}, deleted{0}, resets{0}, bad{0};
    nvme::status queue_created(const emu::queue_info& q) override {
      ++created;
      if (q.qid == 0 || q.cq == nullptr || q.sq == nullptr || !q.process) ++bad; // no CHECK off the test thread
      return inner.queue_created(q);
    }
    void queue_deleted(std::uint16_t sqid) override {
      ++deleted;
      inner.queue_deleted(sqid);
    }
    void reset() override {
      ++resets;
      inner.reset();
    }
  };
  auto engine = std::make_shared<counting_engine>();
  auto cfg = ram_config();
  cfg.io_engine = engine;
  {
    harness h(cfg);
    h.create_io(1, 8);
    h.create_io(2, 8);
    auto buf = h.ctrl->alloc(page);
    fill_lbas(buf->data(), 1, 8, 512, 6);
    REQUIRE(h.rw(nvme::nvm_opcode::write, 2, 1, 8, *buf, 0) == nvme::status_success);
    REQUIRE(h.admin_exec(nvme::make_delete_io_sq(1)) == nvme::status_success);
    CHECK(engine->created == 2);
    CHECK(engine->deleted == 1);
    CHECK(engine->bad == 0);
    // The engine executes through the controller: counters and translation apply.
    CHECK(h.ctrl->commands_processed(2) == 1);
    nvme::command direct = nvme::make_read(1, 1, 8, buf->bus_address(0), 0);
    std::memset(buf->data(), 0, page);
    CHECK(h.ctrl->process(direct, 2).status == nvme::status_success);
    CHECK(check_lbas(buf->data(), 1, 8, 512, 6) == 0);
  }
  CHECK(engine->resets >= 1); // the controller's destructor lets go of the queues
}

TEST_CASE("emu: many submitters on a small queue with CPU engine threads", "[emu][io][stress]") {
  auto cfg = ram_config(1 << 12, 4096);
  cfg.engine_threads = 2;
  harness h(cfg);
  auto& q = h.create_io(1, 4); // 3 commands in flight at most
  constexpr int threads = 6, ops = 60;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      auto buf = h.ctrl->alloc(page);
      for (int i = 0; i < ops; ++i) {
        const std::uint64_t lba = t * ops + i;
        fill_lbas(buf->data(), lba, 1, 4096, 31);
        if (q.ref.execute(nvme::make_write(1, lba, 1, buf->bus_address(0), 0)) != nvme::status_success) ++failures;
        std::memset(buf->data(), 0, page);
        if (q.ref.execute(nvme::make_read(1, lba, 1, buf->bus_address(0), 0)) != nvme::status_success) ++failures;
        if (check_lbas(buf->data(), lba, 1, 4096, 31) != 0) ++failures;
      }
    });
  }
  for (auto& t : ts)
    t.join();
  CHECK(failures == 0);
  CHECK(h.ctrl->commands_processed(1) == threads * ops * 2);
}
