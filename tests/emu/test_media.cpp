// SPDX-License-Identifier: MIT
// Media of the software controller: RAM, files (O_DIRECT + io_uring, and the
// buffered fallback on tmpfs), block devices when one is offered.
#include "scratch_block_device.hpp"

#include <bam/emu/media.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

//! A unique file path removed at scope exit.
struct temp_path {
  std::string path;
  explicit temp_path(const fs::path& dir) {
    static int serial = 0;
    path = (dir / ("bam-emu-media-" + std::to_string(::getpid()) + "-" + std::to_string(serial++))).string();
  }
  ~temp_path() { ::unlink(path.c_str()); }
};

std::uint8_t pattern(std::uint64_t offset) { return static_cast<std::uint8_t>((offset * 2654435761u) >> 13); }

std::vector<std::uint8_t> pattern_bytes(std::uint64_t offset, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = pattern(offset + i);
  return v;
}

//! Writes at odd offsets and lengths, through several segments, and reads back.
void exercise(bam::emu::media& m) {
  const std::uint64_t size = m.size();
  REQUIRE(size >= (1u << 20));
  // Unaligned offset and length, split into three segments.
  const std::uint64_t off = 4096 * 3 + 100;
  auto data = pattern_bytes(off, 9000);
  iovec w[3] = {{data.data(), 1}, {data.data() + 1, 4999}, {data.data() + 5000, 4000}};
  REQUIRE(m.write(off, {w, 3}) == 0);
  // Neighbours of an unaligned write are untouched (read-modify-write is exact).
  std::vector<std::uint8_t> before(100, 0xee), after(50, 0xee);
  REQUIRE(m.read(off - 100, before.data(), before.size()) == 0);
  REQUIRE(m.read(off + data.size(), after.data(), after.size()) == 0);
  CHECK(before == std::vector<std::uint8_t>(100, 0));
  CHECK(after == std::vector<std::uint8_t>(50, 0));
  std::vector<std::uint8_t> back(data.size());
  iovec r[2] = {{back.data(), 777}, {back.data() + 777, back.size() - 777}};
  REQUIRE(m.read(off, {r, 2}) == 0);
  CHECK(back == data);

  // Aligned whole blocks.
  auto big = pattern_bytes(65536, 65536);
  REQUIRE(m.write(65536, big.data(), big.size()) == 0);
  std::vector<std::uint8_t> big_back(big.size());
  REQUIRE(m.read(65536, big_back.data(), big_back.size()) == 0);
  CHECK(big_back == big);

  // Zeroes and deallocation in the middle of written data, with ragged edges.
  REQUIRE(m.write_zeroes(65536 + 1000, 3000) == 0);
  REQUIRE(m.deallocate(65536 + 8192 + 512, 20000) == 0);
  REQUIRE(m.read(65536, big_back.data(), big_back.size()) == 0);
  for (std::size_t i = 0; i < big.size(); ++i) {
    const bool zeroed = (i >= 1000 && i < 4000) || (i >= 8192 + 512 && i < 8192 + 512 + 20000);
    if (big_back[i] != (zeroed ? 0 : big[i])) {
      FAIL("byte " << i << " is " << int(big_back[i]) << ", expected " << int(zeroed ? 0 : big[i]));
    }
  }
  REQUIRE(m.flush() == 0);

  // The last byte is reachable; one past it is not.
  std::uint8_t one = 0x5a;
  REQUIRE(m.write(size - 1, &one, 1) == 0);
  std::uint8_t got = 0;
  REQUIRE(m.read(size - 1, &got, 1) == 0);
  CHECK(got == 0x5a);
  CHECK(m.read(size - 1, back.data(), 2) == EINVAL);
  CHECK(m.write(size, &one, 1) == EINVAL);
  CHECK(m.write_zeroes(size - 10, 11) == EINVAL);
}

//! Many threads write disjoint 512-byte pieces that share 4 KiB blocks.
void concurrent_neighbours(bam::emu::media& m) {
  constexpr int threads = 4, per_thread = 64;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&m, t] {
      for (int i = 0; i < per_thread; ++i) {
        const std::uint64_t off = (static_cast<std::uint64_t>(i) * threads + t) * 512;
        auto d = pattern_bytes(off, 512);
        if (m.write(off, d.data(), d.size()) != 0) std::abort();
      }
    });
  }
  for (auto& t : ts)
    t.join();
  const std::size_t n = threads * per_thread * 512;
  std::vector<std::uint8_t> back(n);
  REQUIRE(m.read(0, back.data(), n) == 0);
  CHECK(back == pattern_bytes(0, n));
}

} // namespace

TEST_CASE("emu media: RAM", "[emu][media]") {
  auto m = bam::emu::make_ram_media(4 << 20);
  CHECK(m->size() == (4u << 20));
  std::vector<std::uint8_t> z(4096, 0xff);
  REQUIRE(m->read(12345, z.data(), z.size()) == 0);
  CHECK(z == std::vector<std::uint8_t>(4096, 0)); // fresh media reads zeroes
  exercise(*m);
  concurrent_neighbours(*m);
}

TEST_CASE("emu media: RAM whose pages are kept (pinned for a GPU) clears freed ranges in place", "[emu][media]") {
  constexpr std::size_t page = 4096, pages = 64;
  const bool kept = GENERATE(false, true);
  CAPTURE(kept);
  auto m = bam::emu::make_ram_media(pages * page);
  const std::span<std::uint8_t> map = m->mapping();
  REQUIRE(map.size() == pages * page);
  CHECK(m->sparse());
  const std::vector<std::uint8_t> ones(pages * page, 0x11);
  REQUIRE(m->write(0, ones.data(), ones.size()) == 0);
  if (kept) m->keep_pages();
  const std::uint8_t* before = map.data();
  // Pages 8..23 freed, with ragged edges.
  REQUIRE(m->deallocate(8 * page - 100, 16 * page + 200) == 0);
  std::vector<unsigned char> resident(pages);
  REQUIRE(::mincore(map.data(), map.size(), resident.data()) == 0);
  // Kept: every page is still the one a GPU would have pinned. Not kept:
  // whole freed pages went back to the kernel.
  CHECK((resident[12] & 1u) == (kept ? 1u : 0u));
  CHECK((resident[40] & 1u) == 1u);
  CHECK(m->mapping().data() == before);
  std::vector<std::uint8_t> back(pages * page);
  REQUIRE(m->read(0, back.data(), back.size()) == 0);
  for (std::size_t i = 0; i < back.size(); ++i) {
    const bool freed = i >= 8 * page - 100 && i < 24 * page + 100;
    if (back[i] != (freed ? 0 : 0x11)) FAIL("byte " << i << " is " << int(back[i]));
  }
}

TEST_CASE("emu media: RAM of an odd size", "[emu][media]") {
  auto m = bam::emu::make_ram_media((1 << 20) + 512);
  exercise(*m);
  CHECK_THROWS_AS(bam::emu::make_ram_media(0), bam::error);
}

TEST_CASE("emu media: file with O_DIRECT", "[emu][media]") {
  temp_path p(fs::temp_directory_path());
  {
    auto m = bam::emu::make_file_media(p.path, (2 << 20) + 512, true);
    INFO(m->describe());
    CHECK(fs::file_size(p.path) >= (2u << 20) + 512);
    CHECK(m->mapping().empty()); // nothing a GPU could read in place
#if defined(BAM_HAVE_LIBURING)
    // Where O_DIRECT works (ext4, xfs), it is used; say so if this file system refuses it.
    if (m->describe().find("O_DIRECT") == std::string::npos)
      WARN("O_DIRECT refused in " << fs::temp_directory_path() << ": buffered fallback tested instead");
#endif
    exercise(*m);
    concurrent_neighbours(*m);
    auto d = pattern_bytes(1 << 20, 4096);
    REQUIRE(m->write(1 << 20, d.data(), d.size()) == 0);
    REQUIRE(m->flush() == 0);
  }
  // The data is in the file: a new media over it reads it back.
  auto again = bam::emu::make_file_media(p.path, 0, false);
  CHECK(again->size() == fs::file_size(p.path)); // whole file: extended to a 4 KiB multiple
  CHECK(again->size() >= (2u << 20) + 512);
  std::vector<std::uint8_t> back(4096);
  REQUIRE(again->read(1 << 20, back.data(), back.size()) == 0);
  CHECK(back == pattern_bytes(1 << 20, 4096));
}

TEST_CASE("emu media: tmpfs (O_DIRECT refused before Linux 6.6) works either way", "[emu][media]") {
  if (!fs::is_directory("/dev/shm")) SKIP("no /dev/shm on this machine");
  temp_path p("/dev/shm");
  auto m = bam::emu::make_file_media(p.path, 2 << 20, true);
  INFO(m->describe());
  exercise(*m);
  concurrent_neighbours(*m);
}

TEST_CASE("emu media: buffered file I/O (no O_DIRECT)", "[emu][media]") {
  temp_path p(fs::temp_directory_path());
  auto m = bam::emu::make_file_media(p.path, (2 << 20) + 512, true, /*direct=*/false);
  INFO(m->describe());
  CHECK(m->describe().find("buffered") != std::string::npos);
  exercise(*m);
  concurrent_neighbours(*m);
}

TEST_CASE("emu media: missing file without create fails with errno", "[emu][media]") {
  try {
    bam::emu::make_file_media("/nonexistent-dir/bam.img", 1 << 20, false);
    FAIL("opening a missing file succeeded");
  } catch (const bam::error& e) {
    CHECK(e.errnum() == ENOENT);
  }
  CHECK_THROWS_AS(bam::emu::make_block_media("/dev/null"), bam::error); // not a block device
}

TEST_CASE("emu media: a file to create in a directory that is not there says so", "[emu][media]") {
  try {
    bam::emu::make_file_media("/nonexistent-dir/sub/bam.img", 1 << 20, true);
    FAIL("creating a file in a missing directory succeeded");
  } catch (const bam::error& e) {
    CHECK(e.errnum() == ENOENT);
    CHECK(std::string(e.what()).find("there is no directory /nonexistent-dir/sub") != std::string::npos);
  }
}

TEST_CASE("emu media: block device", "[emu][media]") {
  const scratch_block_device dev(64 << 20);
  if (dev.path.empty())
    SKIP("no scratch block device: set BAM_TEST_BLOCK_DEVICE=/dev/... (its data is overwritten) "
         "to test block-device media");
  auto m = bam::emu::make_block_media(dev.path, 64 << 20);
  INFO(m->describe());
  exercise(*m);
  concurrent_neighbours(*m);
}
