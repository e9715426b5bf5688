// SPDX-License-Identifier: MIT
// PRP building and walking against fake bus addresses: no controller, no memory.
#include <bam/nvme/prp.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cstdint>
#include <map>
#include <vector>

using namespace bam::nvme;

namespace {
constexpr std::uint64_t page = 4096;

// A buffer whose pages are scattered: page i lives at a bus address that no
// arithmetic on i predicts.
std::vector<std::uint64_t> scattered_pages(std::size_t n) {
  std::vector<std::uint64_t> bus(n);
  for (std::size_t i = 0; i < n; ++i)
    bus[i] = (0x7000'0000ull + (i * 7919 % 100003) * 2) * page;
  return bus;
}

struct list_pages {
  std::vector<std::vector<std::uint64_t>> mem;
  std::vector<std::uint64_t*> virt;
  std::vector<std::uint64_t> bus;
  std::map<std::uint64_t, std::uint64_t*> by_bus;
  explicit list_pages(std::size_t n) : mem(n, std::vector<std::uint64_t>(page / 8, 0xdeadbeef)) {
    for (std::size_t i = 0; i < n; ++i) {
      virt.push_back(mem[i].data());
      bus.push_back(0x9000'0000'0000ull + i * 3 * page);
      by_bus[bus.back()] = mem[i].data();
    }
  }
  bool read(std::uint64_t addr, std::uint64_t* dst, std::size_t count) const {
    const std::uint64_t base = addr & ~(page - 1);
    auto it = by_bus.find(base);
    if (it == by_bus.end()) return false;
    const std::size_t first = (addr - base) / 8;
    if (first + count > page / 8) return false;
    for (std::size_t k = 0; k < count; ++k)
      dst[k] = it->second[first + k];
    return true;
  }
};

// Expected segments: what a transfer of `bytes` at `offset` into the scattered buffer touches.
std::vector<std::pair<std::uint64_t, std::uint64_t>> expected_segments(const std::vector<std::uint64_t>& bus,
                                                                       std::uint64_t offset, std::uint64_t bytes) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::uint64_t pos = offset;
  const std::uint64_t end = offset + bytes;
  while (pos < end) {
    const std::uint64_t in_page = pos % page;
    const std::uint64_t len = std::min(page - in_page, end - pos);
    out.emplace_back(bus[pos / page] + in_page, len);
    pos += len;
  }
  return out;
}
} // namespace

TEST_CASE("PRP list pages needed, including chained lists", "[prp]") {
  CHECK(prp_list_pages_needed(1, page) == 0);
  CHECK(prp_list_pages_needed(2, page) == 0);
  CHECK(prp_list_pages_needed(3, page) == 1);
  CHECK(prp_list_pages_needed(513, page) == 1);  // 512 entries fill one page exactly
  CHECK(prp_list_pages_needed(514, page) == 2);  // 513 entries: 511 + chain, then 2
  CHECK(prp_list_pages_needed(1024, page) == 2); // 1023 entries: 511 + chain, then 512
  CHECK(prp_list_pages_needed(1025, page) == 3); // 1024 entries: 511 + 511 + 2
}

TEST_CASE("one and two page transfers use PRP1/PRP2 directly", "[prp]") {
  const auto bus = scattered_pages(4);
  list_pages lists(0);
  prp_pair p;
  REQUIRE(build_prp(bus.data(), 0, 4096, page, nullptr, nullptr, 0, p));
  CHECK(p.prp1 == bus[0]);
  CHECK(p.prp2 == 0);
  REQUIRE(build_prp(bus.data(), 512, 4096, page, nullptr, nullptr, 0, p));
  CHECK(p.prp1 == bus[0] + 512);
  CHECK(p.prp2 == bus[1]);
  REQUIRE(build_prp(bus.data(), 8192, 8192, page, nullptr, nullptr, 0, p));
  CHECK(p.prp1 == bus[2]);
  CHECK(p.prp2 == bus[3]);
  // three pages need a list
  CHECK_FALSE(build_prp(bus.data(), 0, 8193, page, nullptr, nullptr, 0, p));
  // offsets must be dword aligned, length non-zero
  CHECK_FALSE(build_prp(bus.data(), 2, 512, page, nullptr, nullptr, 0, p));
  CHECK_FALSE(build_prp(bus.data(), 0, 0, page, nullptr, nullptr, 0, p));
}

TEST_CASE("built PRP lists walk back to the same segments", "[prp]") {
  const std::uint64_t pages_in_buffer = 1200;
  const auto bus = scattered_pages(pages_in_buffer);
  const std::uint64_t offset = GENERATE(0ull, 4ull, 512ull, 4092ull, 8192ull + 1024ull);
  const std::uint64_t bytes =
      GENERATE(4ull, 4096ull, 8192ull, 12288ull + 512ull, 512ull * 4096ull, 513ull * 4096ull, 1100ull * 4096ull);
  const std::uint64_t pages = prp_pages_spanned(offset % page, bytes, page);
  list_pages lists(prp_list_pages_needed(pages, page));
  prp_pair p;
  REQUIRE(build_prp(bus.data(), offset, bytes, page, lists.virt.data(), lists.bus.data(), lists.virt.size(), p));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> got;
  const status st = walk_prp(
      p.prp1, p.prp2, bytes, page,
      [&](std::uint64_t a, std::uint64_t* d, std::size_t n) { return lists.read(a, d, n); },
      [&](std::uint64_t a, std::uint64_t len) {
        got.emplace_back(a, len);
        return true;
      });
  REQUIRE(st.ok());
  CHECK(got == expected_segments(bus, offset, bytes));
}

TEST_CASE("too few list pages is refused, not overrun", "[prp]") {
  const auto bus = scattered_pages(600);
  list_pages lists(1);
  prp_pair p;
  CHECK_FALSE(build_prp(bus.data(), 0, 520 * page, page, lists.virt.data(), lists.bus.data(), 1, p));
  // Untouched beyond what was refused: the page still holds its fill pattern.
  CHECK(lists.mem[0][0] == 0xdeadbeef);
}

TEST_CASE("walk_prp rejects bad PRPs as a controller would", "[prp]") {
  auto no_list = [](std::uint64_t, std::uint64_t*, std::size_t) { return false; };
  auto any = [](std::uint64_t, std::uint64_t) { return true; };
  // PRP1 not dword aligned
  CHECK(walk_prp(0x1002, 0, 512, page, no_list, any).sc() == generic_status::invalid_prp_offset);
  // PRP2 with an offset for a two-page transfer
  CHECK(walk_prp(0x1000, 0x2200, 8192, page, no_list, any).sc() == generic_status::invalid_prp_offset);
  // list that cannot be read
  CHECK(walk_prp(0x1000, 0x5000, 3 * page, page, no_list, any).sc() == generic_status::data_transfer_error);
  // a segment the memory model refuses
  auto refuse = [](std::uint64_t, std::uint64_t) { return false; };
  CHECK(walk_prp(0x1000, 0, 512, page, no_list, refuse).sc() == generic_status::data_transfer_error);
  // list entry with an offset
  list_pages lists(1);
  lists.mem[0][0] = 0x3000;
  lists.mem[0][1] = 0x4010;
  CHECK(walk_prp(
            0x1000, lists.bus[0], 3 * page, page,
            [&](std::uint64_t a, std::uint64_t* d, std::size_t n) { return lists.read(a, d, n); }, any)
            .sc() == generic_status::invalid_prp_offset);
}
