// SPDX-License-Identifier: MIT
// libFuzzer target: the software controller's admin and NVM command handling.
// Each input configures a controller (namespaces, LBA sizes, MDTS, queue
// limits), brings it up as a driver would, and sends it a run of commands
// with random opcodes, fields and PRPs (pointing anywhere: unmapped bus
// addresses, the middle or end of a mapped buffer, PRP lists of random
// entries), three ways: through the admin queue, through an I/O queue, and
// straight into the controller's command processor. Some commands create
// queues in random memory whose doorbells are then rung with random tails.
//
// What must hold: no crash or sanitizer report; every command answered with
// a status within a deadline (only Asynchronous Event Requests are held, by
// design, and are not sent); data read back equals what was written, per a
// model of each namespace kept here.
#include <bam/emu.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/nvme/queue.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace {

using namespace bam;
constexpr std::size_t page = dma_page_size;
constexpr std::size_t arena_pages = 16;
constexpr std::uint64_t deadline_ns = 3'000'000'000ull; // a command not answered by then is a hang
constexpr std::uint16_t harness_qid = 1;                // the I/O queue this harness keeps for itself

[[noreturn]] void fail(const char* what, const nvme::command& c, nvme::status st = {}) {
  std::fprintf(
      stderr,
      "emu fuzz: %s: opcode 0x%02x nsid %u cdw10 0x%x cdw11 0x%x cdw12 0x%x prp1 0x%llx prp2 0x%llx, status %s\n", what,
      c.opcode, c.nsid, c.cdw10, c.cdw11, c.cdw12, static_cast<unsigned long long>(c.prp1),
      static_cast<unsigned long long>(c.prp2), nvme::status_name(st));
  std::abort();
}

struct queue_mem {
  std::unique_ptr<dma_region> rings;
  void* state = nullptr;
  nvme::queue_pair_ref ref;
  ~queue_mem() { std::free(state); }
};

void make_queue(emu::emulated_controller& c, queue_mem& q, std::uint16_t qid, std::uint32_t depth) {
  const std::size_t sq_bytes = transport::round_up(depth * sizeof(nvme::command));
  q.rings = c.alloc(sq_bytes + transport::round_up(depth * sizeof(nvme::completion)));
  const std::size_t state_bytes = (nvme::queue_state_bytes(depth) + 127) / 128 * 128;
  q.state = std::aligned_alloc(128, state_bytes);
  std::memset(q.state, 0, state_bytes);
  q.ref.sq = q.rings->as<nvme::command>();
  q.ref.cq = reinterpret_cast<nvme::completion*>(q.rings->as<unsigned char>() + sq_bytes);
  q.ref.sq_doorbell = c.doorbell(nvme::sq_doorbell_offset(qid, 0));
  q.ref.cq_doorbell = c.doorbell(nvme::cq_doorbell_offset(qid, 0));
  q.ref.sq_depth = depth;
  q.ref.cq_depth = depth;
  q.ref.qid = qid;
  q.ref.timeout_ns = deadline_ns;
  q.ref.attach_state(q.state);
}

struct harness {
  std::vector<std::vector<unsigned char>> shadow; // what each namespace holds
  std::vector<std::uint32_t> lba_size;
  std::unique_ptr<dma_region> arena;                          // PRPs point here (or anywhere)
  std::vector<std::pair<std::uint64_t, std::uint64_t>> rings; // bus ranges the harness's queues live in
  std::shared_ptr<emu::emulated_controller> ctrl;
  queue_mem admin, io;

  bool in_rings(std::uint64_t bus) const {
    for (const auto& [lo, hi] : rings)
      if (bus >= lo && bus < hi) return true;
    return false;
  }
  //! Keep the harness's own queues out of reach: any address inside them goes to the arena.
  std::uint64_t tame(std::uint64_t bus) const { return in_rings(bus) ? arena->bus_address(0) : bus; }

  //! The bytes the PRPs of `cmd` describe for `bytes`, if all of them are in the arena.
  bool modelled = true; // false once queues the input created may change memory behind its back

  //! The bytes the PRPs of `cmd` describe for `bytes`, if all of them (and
  //! the PRP lists) are in the arena; `lists` gets the list bytes read.
  bool arena_segments(const nvme::command& cmd, std::uint64_t bytes,
                      std::vector<std::pair<unsigned char*, std::uint64_t>>& out,
                      std::vector<std::pair<unsigned char*, std::uint64_t>>* lists = nullptr) const {
    out.clear();
    if (lists != nullptr) lists->clear();
    const std::uint64_t base = arena->bus_address(0), end = base + arena->size();
    auto inside = [&](std::uint64_t bus, std::uint64_t len) { return bus >= base && bus < end && len <= end - bus; };
    auto read_list = [&](std::uint64_t bus, std::uint64_t* dst, std::size_t n) {
      if (!inside(bus, n * 8)) return false;
      std::memcpy(dst, arena->as<unsigned char>() + (bus - base), n * 8);
      if (lists != nullptr) lists->emplace_back(arena->as<unsigned char>() + (bus - base), n * 8);
      return true;
    };
    auto segment = [&](std::uint64_t bus, std::uint64_t len) {
      if (!inside(bus, len)) return false;
      out.emplace_back(arena->as<unsigned char>() + (bus - base), len);
      return true;
    };
    return nvme::walk_prp(cmd.prp1, cmd.prp2, bytes, page, read_list, segment).ok();
  }
};

std::uint8_t pick_opcode(FuzzedDataProvider& f, bool admin) {
  static constexpr std::uint8_t admin_ops[] = {0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a};
  static constexpr std::uint8_t nvm_ops[] = {0x00, 0x01, 0x02, 0x08, 0x09};
  if (f.ConsumeIntegralInRange<int>(0, 7) == 0) return f.ConsumeIntegral<std::uint8_t>();
  return admin ? admin_ops[f.ConsumeIntegralInRange<std::size_t>(0, std::size(admin_ops) - 1)]
               : nvm_ops[f.ConsumeIntegralInRange<std::size_t>(0, std::size(nvm_ops) - 1)];
}

std::uint64_t pick_address(FuzzedDataProvider& f, const harness& h) {
  switch (f.ConsumeIntegralInRange<int>(0, 3)) {
  case 0: return f.ConsumeIntegral<std::uint64_t>(); // anywhere
  case 1:
    return h.arena->bus_address(0) +
           f.ConsumeIntegralInRange<std::uint64_t>(0, arena_pages + 2) * page; // page, maybe past the end
  case 2:
    return h.arena->bus_address(0) + f.ConsumeIntegralInRange<std::uint64_t>(0, arena_pages * page + 64); // any byte
  default: return 0;
  }
}

nvme::command make_fuzzed(FuzzedDataProvider& f, harness& h, bool admin) {
  nvme::command c{};
  c.opcode = pick_opcode(f, admin);
  if (admin && c.opcode == static_cast<std::uint8_t>(nvme::admin_opcode::async_event_request)) c.opcode = 0x06;
  c.flags = f.ConsumeIntegralInRange<int>(0, 7) == 0 ? f.ConsumeIntegral<std::uint8_t>() : 0;
  static constexpr std::uint32_t nsids[] = {0, 1, 2, 3, 0xffffffffu};
  c.nsid = f.ConsumeBool() ? nsids[f.ConsumeIntegralInRange<std::size_t>(0, 4)] : f.ConsumeIntegral<std::uint32_t>();
  const bool small = f.ConsumeBool(); // small numbers reach deeper than random ones
  auto dword = [&] {
    return small ? f.ConsumeIntegralInRange<std::uint32_t>(0, 300) : f.ConsumeIntegral<std::uint32_t>();
  };
  c.cdw10 = dword();
  c.cdw11 = dword();
  c.cdw12 = small ? f.ConsumeIntegralInRange<std::uint32_t>(0, 300) | (f.ConsumeBool() ? 1u << 25 : 0)
                  : f.ConsumeIntegral<std::uint32_t>();
  c.cdw13 = f.ConsumeBool() ? 0 : f.ConsumeIntegral<std::uint32_t>();
  c.cdw14 = f.ConsumeBool() ? 0 : f.ConsumeIntegral<std::uint32_t>();
  c.cdw15 = f.ConsumeBool() ? 0 : f.ConsumeIntegral<std::uint32_t>();
  c.prp1 = h.tame(pick_address(f, h));
  if (f.ConsumeBool()) {
    // A PRP list in the arena, entries from the input (kept out of the harness's queues).
    const std::uint64_t list_page = f.ConsumeIntegralInRange<std::uint64_t>(0, arena_pages - 1);
    const std::uint64_t first = f.ConsumeIntegralInRange<std::uint64_t>(0, 511);
    auto* list = reinterpret_cast<std::uint64_t*>(h.arena->as<unsigned char>() + list_page * page);
    const std::size_t entries = f.ConsumeIntegralInRange<std::size_t>(0, 40);
    for (std::size_t i = 0; i < entries && first + i < 512; ++i)
      list[first + i] = h.tame(pick_address(f, h));
    c.prp2 = h.arena->bus_address(list_page * page) + first * 8;
  } else {
    c.prp2 = h.tame(pick_address(f, h));
  }
  if (admin) {
    // The harness's own I/O queue stays: deleting it would stop its commands, not the controller.
    const auto op = static_cast<nvme::admin_opcode>(c.opcode);
    const std::uint16_t qid = c.cdw10 & 0xffff;
    if ((op == nvme::admin_opcode::delete_io_sq || op == nvme::admin_opcode::delete_io_cq ||
         op == nvme::admin_opcode::create_io_sq || op == nvme::admin_opcode::create_io_cq) &&
        qid == harness_qid)
      c.cdw10 = (c.cdw10 & 0xffff0000u) | 2u;
    // A new SQ posting to the harness's CQ would complete commands it never sent.
    if (op == nvme::admin_opcode::create_io_sq && (c.cdw11 >> 16) == harness_qid)
      c.cdw11 = (c.cdw11 & 0xffffu) | (2u << 16);
  }
  return c;
}

bool overlap(const std::pair<unsigned char*, std::uint64_t>& a, const std::pair<unsigned char*, std::uint64_t>& b) {
  return a.first < b.first + b.second && b.first < a.first + a.second;
}

//! A command's data as the model sees it, taken before the command runs.
struct snapshot {
  bool usable = false; // data all in the arena, no page twice, no PRP list overwritten by the data
  std::vector<std::pair<unsigned char*, std::uint64_t>> segs;
  std::vector<unsigned char> dsm; // DSM ranges
};

snapshot before(const harness& h, const nvme::command& c) {
  snapshot s;
  if (!h.modelled || c.nsid == 0 || c.nsid > h.shadow.size()) return s;
  const std::uint32_t lba = h.lba_size[c.nsid - 1];
  const auto op = static_cast<nvme::nvm_opcode>(c.opcode);
  std::vector<std::pair<unsigned char*, std::uint64_t>> lists;
  if (op == nvme::nvm_opcode::write || op == nvme::nvm_opcode::read) {
    if (!h.arena_segments(c, std::uint64_t{nvme::command_nblocks(c)} * lba, s.segs, &lists)) return s;
    for (std::size_t i = 0; i < s.segs.size(); ++i) {
      for (std::size_t k = i + 1; k < s.segs.size(); ++k)
        if (overlap(s.segs[i], s.segs[k])) return s;
      for (const auto& l : lists)
        if (overlap(s.segs[i], l)) return s;
    }
  } else if (op == nvme::nvm_opcode::dataset_management) {
    const std::uint32_t nr = (c.cdw10 & 0xff) + 1;
    if (!h.arena_segments(c, nr * sizeof(nvme::dsm_range), s.segs)) return s;
    for (auto& [p, len] : s.segs)
      s.dsm.insert(s.dsm.end(), p, p + len);
  }
  s.usable = true;
  return s;
}

//! Keep the namespace model in step with a command that completed with `st`.
void after(harness& h, const nvme::command& c, const snapshot& s, nvme::status st) {
  if (!h.modelled || !st.ok() || c.nsid == 0 || c.nsid > h.shadow.size()) return;
  auto& ns = h.shadow[c.nsid - 1];
  const std::uint32_t lba = h.lba_size[c.nsid - 1];
  const auto op = static_cast<nvme::nvm_opcode>(c.opcode);
  const std::uint64_t slba = nvme::command_slba(c), nlb = nvme::command_nblocks(c);
  if (op == nvme::nvm_opcode::write || op == nvme::nvm_opcode::read) {
    if (slba >= ns.size() / lba || nlb > ns.size() / lba - slba)
      fail("a transfer outside the namespace succeeded", c, st);
    if (!s.usable) {
      if (op == nvme::nvm_opcode::write) h.modelled = false; // data from outside the arena: unknown from here on
      return;
    }
    std::uint64_t off = slba * lba;
    for (const auto& [p, len] : s.segs) {
      if (op == nvme::nvm_opcode::write)
        std::memcpy(ns.data() + off, p, len);
      else if (std::memcmp(ns.data() + off, p, len) != 0)
        fail("a read returned data that was never written there", c, st);
      off += len;
    }
  } else if (op == nvme::nvm_opcode::write_zeroes) {
    if (slba >= ns.size() / lba || nlb > ns.size() / lba - slba)
      fail("write zeroes outside the namespace succeeded", c, st);
    std::memset(ns.data() + slba * lba, 0, nlb * lba);
  } else if (op == nvme::nvm_opcode::dataset_management && (c.cdw11 & 4u) != 0) {
    if (!s.usable) {
      h.modelled = false;
      return;
    }
    const std::uint32_t nr = (c.cdw10 & 0xff) + 1;
    for (std::uint32_t i = 0; i < nr; ++i) {
      nvme::dsm_range r;
      std::memcpy(&r, s.dsm.data() + i * sizeof r, sizeof r);
      if (r.nblocks == 0) continue;
      if (r.slba >= ns.size() / lba || r.nblocks > ns.size() / lba - r.slba)
        fail("deallocate outside the namespace succeeded", c, st);
      std::memset(ns.data() + r.slba * lba, 0, std::uint64_t{r.nblocks} * lba);
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider f(data, size);
  harness h;
  emu::controller_config cfg;
  const std::size_t nss = f.ConsumeIntegralInRange<std::size_t>(1, 3);
  for (std::size_t i = 0; i < nss; ++i) {
    const std::uint32_t lba = f.ConsumeBool() ? 512 : 4096;
    const std::uint64_t blocks = f.ConsumeIntegralInRange<std::uint64_t>(1, 64);
    cfg.namespaces.push_back({blocks, lba, nullptr});
    h.shadow.emplace_back(blocks * lba, 0);
    h.lba_size.push_back(lba);
  }
  cfg.mdts = f.ConsumeIntegralInRange<std::uint8_t>(0, 4);
  cfg.max_io_queues = f.ConsumeIntegralInRange<std::uint32_t>(2, 6);
  cfg.max_queue_entries = f.ConsumeIntegralInRange<std::uint32_t>(4, 64);
  cfg.engine_threads = 1;
  cfg.name = "fuzz";
  h.ctrl = emu::make_emulated_controller(cfg);
  auto& c = *h.ctrl;
  h.arena = c.alloc(arena_pages * page);
  {
    const auto fill = f.ConsumeBytes<unsigned char>(f.ConsumeIntegralInRange<std::size_t>(0, 256));
    for (std::size_t i = 0; i < arena_pages * page; ++i)
      h.arena->as<unsigned char>()[i] = fill.empty() ? static_cast<unsigned char>(i * 7) : fill[i % fill.size()];
  }

  // Bring-up by the book, one I/O queue pair for the harness.
  const std::uint32_t depth = 4;
  make_queue(c, h.admin, 0, depth);
  make_queue(c, h.io, harness_qid, depth);
  for (auto* q : {&h.admin, &h.io})
    h.rings.emplace_back(q->rings->bus_address(0), q->rings->bus_address(0) + q->rings->size());
  nvme::aqa_register aqa{};
  aqa.bits.asqs = depth - 1;
  aqa.bits.acqs = depth - 1;
  c.write32(nvme::reg::aqa, aqa.raw);
  c.write64(nvme::reg::asq, h.admin.rings->bus_address(0));
  c.write64(nvme::reg::acq, h.admin.rings->bus_address(transport::round_up(depth * sizeof(nvme::command))));
  nvme::cc_register cc{};
  cc.bits.en = 1;
  cc.bits.iosqes = nvme::sq_entry_log2;
  cc.bits.iocqes = nvme::cq_entry_log2;
  c.write32(nvme::reg::cc, cc.raw);
  const std::uint64_t t0 = bam::detail::now_ns();
  while ((c.read32(nvme::reg::csts) & 1) == 0)
    if (bam::detail::now_ns() - t0 > deadline_ns) fail("CSTS.RDY never rose", {});
  const std::uint64_t cq_bus = h.io.rings->bus_address(transport::round_up(depth * sizeof(nvme::command)));
  nvme::status st = h.admin.ref.execute(nvme::make_create_io_cq(harness_qid, depth, cq_bus));
  if (!st.ok()) fail("creating the harness's CQ failed", {}, st);
  st = h.admin.ref.execute(nvme::make_create_io_sq(harness_qid, depth, h.io.rings->bus_address(0), harness_qid));
  if (!st.ok()) fail("creating the harness's SQ failed", {}, st);

  const int commands = f.ConsumeIntegralInRange<int>(1, 48);
  for (int i = 0; i < commands && f.remaining_bytes() > 0; ++i) {
    const int way = f.ConsumeIntegralInRange<int>(0, 4);
    if (way == 4) {
      // Ring a doorbell of a queue the input created (never the harness's own).
      h.modelled = false; // whatever that queue holds may now read and write anything
      const auto qid = f.ConsumeIntegralInRange<std::uint16_t>(2, static_cast<std::uint16_t>(cfg.max_io_queues));
      const bool sq = f.ConsumeBool();
      *c.doorbell(sq ? nvme::sq_doorbell_offset(qid, 0) : nvme::cq_doorbell_offset(qid, 0)) =
          f.ConsumeIntegralInRange<std::uint32_t>(0, 80);
      continue;
    }
    const bool admin = way == 0 || way == 2;
    nvme::command cmd = make_fuzzed(f, h, admin);
    const snapshot snap = admin ? snapshot{} : before(h, cmd);
    if (way <= 1) {
      // Through a queue, as a driver sends it.
      std::uint32_t dw0 = 0;
      st = (admin ? h.admin.ref : h.io.ref).execute(cmd, &dw0);
      if (st == nvme::status_timeout || st == nvme::status_queue_broken || st == nvme::status_queue_full)
        fail(admin ? "an admin command was never answered" : "an I/O command was never answered", cmd, st);
    } else {
      // Straight into the command processor, from any queue id.
      const auto qid = admin ? std::uint16_t{0} : f.ConsumeIntegralInRange<std::uint16_t>(1, 8);
      const emu::command_outcome out = c.process(cmd, qid);
      if (out.drop) fail("a command was dropped without a fault rule", cmd);
      st = out.status;
    }
    if (!admin) after(h, cmd, snap, st);
  }
  // A last check: the harness's queue still works and namespace 1 holds what the model says.
  auto buf = c.alloc(page);
  const std::uint32_t lba = h.lba_size[0];
  const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::uint64_t>(page / lba, h.shadow[0].size() / lba));
  const nvme::command rd = nvme::make_read(1, 0, n, buf->bus_address(0), 0);
  st = h.io.ref.execute(rd);
  if (!st.ok()) fail("a plain read failed after the run", rd, st);
  if (h.modelled && std::memcmp(buf->data(), h.shadow[0].data(), std::size_t{n} * lba) != 0)
    fail("namespace 1 differs from the model", rd, st);

  c.write32(nvme::reg::cc, 0); // stop the controller before its queue memory goes
  h.ctrl.reset();
  return 0;
}
