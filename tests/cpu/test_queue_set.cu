// SPDX-License-Identifier: MIT
// The GPU I/O path's request checks and PRP building run on the host too:
// a request that PRPs cannot describe is refused before any ticket is taken
// (never a command with PRP1 = 0), and accepted ones get the PRPs the spec
// asks for. No GPU needed.
#include <bam/runtime/queue_set.cuh>

#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <vector>

namespace {

struct fixture {
  std::vector<std::uint64_t> lists = std::vector<std::uint64_t>(4 * 15 * 16, 0);
  std::vector<std::uint64_t> list_bus;
  bam::queue_set_layout l;
  bam::queue_set_ref q;
  fixture() {
    // 4 queues of 16 entries (15 command ids), 16 list entries per id (64 KiB).
    l.nqueues = 4;
    l.lba_size = 512;
    l.lba_shift = 9;
    l.nblocks = 1 << 20;
    l.list_entries = 16;
    l.cids_per_queue = 15;
    l.max_transfer_bytes = 64 * 1024;
    l.prp_lists = lists.data();
    for (std::size_t i = 0; i < lists.size() * 8 / 4096; ++i)
      list_bus.push_back(0x7000'0000ull + i * 4096);
    l.prp_list_bus = list_bus.data();
    q = bam::queue_set_ref(l);
  }
};

} // namespace

TEST_CASE("GPU I/O requests that PRPs cannot describe are refused before submission", "[queue_set]") {
  fixture f;
  CHECK(f.q.check_rw(0, 8, 0).ok());
  CHECK(f.q.check_rw(0, 8, 512).ok()); // a 512-byte offset: PRP1 carries it
  CHECK(!f.q.check_rw(0, 8, 2).ok());  // not dword aligned
  CHECK(!f.q.check_rw(0, 8, 4096 + 6).ok());
  CHECK(!f.q.check_rw(0, 0, 0).ok());             // nothing to move
  CHECK(!f.q.check_rw((1 << 20) - 4, 8, 0).ok()); // past the namespace
  CHECK(!f.q.check_rw(0, 129, 0).ok());           // over the largest transfer
  CHECK(f.q.check_rw(0, 128, 0).ok());            // 64 KiB page aligned: 16 pages
  CHECK(f.q.check_rw(0, 128, 512).ok());          // 17 pages: PRP1 and 16 list entries
  f.l.list_entries = 8;                           // lists of 8 entries: 9 pages at most
  f.q = bam::queue_set_ref(f.l);
  CHECK(!f.q.check_rw(0, 128, 0).ok());
  CHECK(f.q.check_rw(0, 72, 0).ok());
  CHECK(!f.q.check_rw(0, 72, 512).ok());
}

TEST_CASE("GPU I/O builds PRPs in the list of its command id", "[queue_set]") {
  fixture f;
  std::vector<std::uint64_t> page_bus;
  for (int i = 0; i < 32; ++i)
    page_bus.push_back(0x1000'0000ull + 0x10'0000ull * i); // scattered pages
  // One page at an offset: PRP1 only.
  auto c = f.q.build_rw(bam::nvme::nvm_opcode::read, 10, 1, page_bus.data(), 4096 + 512, 0, 0);
  CHECK(c.prp1 == page_bus[1] + 512);
  CHECK(c.prp2 == 0);
  CHECK(bam::nvme::command_slba(c) == 10);
  // Two pages: PRP2 is the second page.
  c = f.q.build_rw(bam::nvme::nvm_opcode::write, 10, 8, page_bus.data(), 2048, 1, 3);
  CHECK(c.prp1 == page_bus[0] + 2048);
  CHECK(c.prp2 == page_bus[1]);
  // Sixteen pages: PRP2 is the list of (queue 2, cid 5); its entries are pages 1..15.
  c = f.q.build_rw(bam::nvme::nvm_opcode::read, 0, 128, page_bus.data(), 0, 2, 5);
  const std::size_t list = (2 * 15 + 5) * 16;
  CHECK(c.prp2 == f.list_bus[list * 8 / 4096] + list * 8 % 4096);
  for (int k = 0; k < 15; ++k)
    CHECK(f.lists[list + k] == page_bus[1 + k]);
}
