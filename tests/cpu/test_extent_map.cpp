// SPDX-License-Identifier: MIT
// Extent maps: the layout rules on made-up FIEMAP answers, then real files on
// this machine's own file system read through a software controller over
// the raw block device that holds them (where that device can be opened),
// and files on tmpfs, which fall back to the software controller reading the
// file itself.
#include <bam/host.hpp>
#include <bam/transport/device_string.hpp>
#include <bam/file/mapped_file.hpp>
#include <bam/transport/open.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;

bam::block_device_info disk(std::uint32_t lbs = 512, std::uint64_t part_start = 0) {
  bam::block_device_info d;
  d.disk = "nvme9n1";
  d.disk_node = "/dev/nvme9n1";
  d.partition = part_start ? "nvme9n1p1" : "";
  d.partition_start = part_start;
  d.lba_size = lbs;
  d.disk_bytes = 1ull << 40;
  return d;
}

constexpr std::uint32_t last = FIEMAP_EXTENT_LAST;

//! The error a call throws, or "" if it throws none.
template <class F>
std::pair<std::string, int> thrown(F&& f) {
  try {
    f();
  } catch (const bam::error& e) {
    return {e.what(), e.errnum()};
  }
  return {"", 0};
}

} // namespace

TEST_CASE("extent map: runs in the disk's blocks, the partition's start added", "[extent]") {
  // 3 pieces of a 40 KiB file; the first two are adjacent on the disk.
  const std::vector<bam::raw_extent> raw = {
      {0, 1 << 20, 8192, 0}, {8192, (1 << 20) + 8192, 8192, 0}, {16384, 5 << 20, 24576, last}};
  const auto m = bam::extent_map::from_extents("f", raw, 40960, disk(512, 2048 * 512));
  REQUIRE(m.runs() == 2);
  const auto x = m.extents();
  CHECK(x[0].file_offset == 0);
  CHECK(x[0].disk_offset == (1 << 20) + 2048 * 512);
  CHECK(x[0].length == 16384);
  CHECK(x[1].file_offset == 16384);
  CHECK(x[1].disk_offset == (5 << 20) + 2048 * 512);
  CHECK(x[1].length == 24576);
  const bam::extent_map_ref r = m.ref();
  CHECK(r.blocks() == 80);
  auto w = r.find(0);
  CHECK(w.lba == ((1 << 20) + 2048 * 512) / 512);
  CHECK(w.blocks == 32);
  w = r.find(31);
  CHECK(w.lba == ((1 << 20) + 2048 * 512) / 512 + 31);
  CHECK(w.blocks == 1);
  w = r.find(32);
  CHECK(w.lba == ((5 << 20) + 2048 * 512) / 512);
  CHECK(w.blocks == 48);
  CHECK(r.find(80).blocks == 0); // past the end
  CHECK(m.bytes() == 3 * 8 + 2 * 8);
  // Pages never straddle the break at 16 KiB: at most 16 KiB.
  CHECK(m.max_page_size() == 16384);
  CHECK(bam::extent_map::from_extents("c", {{0, 1 << 20, 1 << 22, last}}, 1 << 22, disk()).max_page_size(1 << 16) ==
        1 << 16);
  CHECK(bam::extent_map::from_extents("c", {{0, 1 << 20, 4096, 0}, {4096, 1 << 22, 8192, last}}, 12288, disk())
            .max_page_size() == 4096);
}

TEST_CASE("extent map: holes are refused unless allowed, then read as holes", "[extent]") {
  // data, a 4 KiB gap, data, and the file goes on 8 KiB past the last piece.
  const std::vector<bam::raw_extent> raw = {{0, 4096, 4096, 0}, {8192, 65536, 4096, last}};
  auto [msg, err] = thrown([&] { bam::extent_map::from_extents("sparse", raw, 20480, disk()); });
  CHECK(err == EINVAL);
  CHECK_THAT(msg, ContainsSubstring("a hole of 4096 bytes at file offset 4096"));
  CHECK_THAT(msg, ContainsSubstring("allow holes"));
  bam::extent_map_options o;
  o.allow_holes = true;
  const auto m = bam::extent_map::from_extents("sparse", raw, 20480, disk(), o);
  REQUIRE(m.runs() == 4);
  CHECK(m.has_holes());
  const auto r = m.ref();
  CHECK(r.find(8).lba == bam::extent_hole);
  CHECK(r.find(8).blocks == 8);
  CHECK(r.find(16).lba == 65536 / 512);
  CHECK(r.find(24).lba == bam::extent_hole); // the tail past the last piece
  CHECK(r.find(39).blocks == 1);
  CHECK(r.find(40).blocks == 0);
  o.for_writing = true;
  std::tie(msg, err) = thrown([&] { bam::extent_map::from_extents("sparse", raw, 20480, disk(), o); });
  CHECK_THAT(msg, ContainsSubstring("writes need blocks the file system allocated"));
}

TEST_CASE("extent map: what raw blocks cannot return is refused, saying why", "[extent]") {
  struct refusal {
    std::uint32_t flags;
    int err;
    const char* says;
  };
  const refusal cases[] = {
      {FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_UNKNOWN, EAGAIN, "sync the file"},
      {FIEMAP_EXTENT_UNKNOWN, EAGAIN, "not yet on the disk"},
      {FIEMAP_EXTENT_ENCODED, EINVAL, "compressed or encrypted"},
      {FIEMAP_EXTENT_DATA_ENCRYPTED, EINVAL, "compressed or encrypted"},
      {FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_NOT_ALIGNED, EINVAL, "packed with other metadata"},
      {FIEMAP_EXTENT_DATA_TAIL, EINVAL, "packed with other metadata"},
      {FIEMAP_EXTENT_UNWRITTEN, EINVAL, "preallocated, never written"},
  };
  for (const auto& c : cases) {
    INFO(c.says);
    const std::vector<bam::raw_extent> raw = {{0, 4096, 4096, 0}, {4096, 8192, 4096, c.flags | last}};
    auto [msg, err] = thrown([&] { bam::extent_map::from_extents("f", raw, 8192, disk()); });
    CHECK(err == c.err);
    CHECK_THAT(msg, ContainsSubstring(c.says));
    CHECK_THAT(msg, ContainsSubstring("at file offset 4096"));
  }
  // Unwritten extents read as zeroes when holes are allowed.
  bam::extent_map_options o;
  o.allow_holes = true;
  const auto m = bam::extent_map::from_extents(
      "f", {{0, 4096, 4096, 0}, {4096, 8192, 4096, FIEMAP_EXTENT_UNWRITTEN | last}}, 8192, disk(), o);
  CHECK(m.ref().find(8).lba == bam::extent_hole);
  // Shared blocks: fine to read, refused for writing.
  const std::vector<bam::raw_extent> shared = {{0, 4096, 8192, FIEMAP_EXTENT_SHARED | last}};
  CHECK(bam::extent_map::from_extents("f", shared, 8192, disk()).runs() == 1);
  o = {};
  o.for_writing = true;
  CHECK_THAT(thrown([&] { bam::extent_map::from_extents("f", shared, 8192, disk(), o); }).first,
             ContainsSubstring("shared with other files"));
}

TEST_CASE("extent map: the disk's logical block size is respected", "[extent]") {
  // A 4 KiB-sector disk: a piece at a 512-byte-aligned disk offset cannot be read.
  auto [msg, err] = thrown([] { bam::extent_map::from_extents("f", {{0, 4608, 4096, last}}, 4096, disk(4096)); });
  CHECK(err == EINVAL);
  CHECK_THAT(msg, ContainsSubstring("not in whole 4096-byte logical blocks"));
  // A partition that does not start on a logical block.
  std::tie(msg, err) = thrown([] {
    bam::extent_map::from_extents("f", {{0, 0, 4096, last}}, 4096, disk(4096, 63 * 512));
  });
  CHECK_THAT(msg, ContainsSubstring("partition nvme9n1p1 starts at byte 32256"));
  // On 4 KiB blocks, LBAs count 4 KiB units; a file's last block may be partial.
  const auto m = bam::extent_map::from_extents("f", {{0, 1 << 20, 8192, last}}, 5000, disk(4096, 1 << 20));
  CHECK(m.ref().blocks() == 2);
  CHECK(m.ref().find(0).lba == (2u << 20) / 4096);
  CHECK(m.ref().find(1).blocks == 1);
  // A piece past the disk's end (a disk smaller than the layout says) is refused.
  auto small = disk();
  small.disk_bytes = 1 << 20;
  CHECK_THAT(thrown([&] {
               bam::extent_map::from_extents("f", {{0, 1 << 20, 4096, last}}, 4096, small);
             }).first,
             ContainsSubstring("past the end of nvme9n1"));
  // Preallocated past the end of the file: not part of the map.
  const auto pre = bam::extent_map::from_extents(
      "f", {{0, 4096, 4096, 0}, {4096, 1 << 20, 1 << 20, FIEMAP_EXTENT_UNWRITTEN | last}}, 4096, disk());
  CHECK(pre.runs() == 1);
  CHECK(!pre.has_holes());
}

TEST_CASE("extent map: a million fragments, looked up by bisection", "[extent]") {
  // Every other 4 KiB block of the disk, so no two pieces merge.
  constexpr std::uint64_t n = 1'000'000;
  std::vector<bam::raw_extent> raw(n);
  for (std::uint64_t i = 0; i < n; ++i)
    raw[i] = {i * 4096, (1ull << 30) + i * 8192, 4096, i + 1 == n ? last : 0u};
  std::shuffle(raw.begin(), raw.end(), std::mt19937_64(7)); // the map sorts them
  const auto m = bam::extent_map::from_extents("big", raw, n * 4096, disk());
  REQUIRE(m.runs() == n);
  CHECK(m.bytes() == (2 * n + 1) * 8);
  const auto r = m.ref();
  std::mt19937_64 rng(11);
  for (int k = 0; k < 100000; ++k) {
    const std::uint64_t block = rng() % (n * 8);
    const auto w = r.find(block);
    // Independent model: block b of the file is 512-byte block b%8 of 4 KiB piece b/8.
    const std::uint64_t want = ((1ull << 30) + (block / 8) * 8192) / 512 + block % 8;
    REQUIRE(w.lba == want);
    REQUIRE(w.blocks == 8 - block % 8);
  }
}

TEST_CASE("extent map: NVMe identifiers as sysfs prints them", "[extent]") {
  std::array<std::uint8_t, 16> nguid{};
  REQUIRE(bam::detail::parse_hex_id(std::string("00112233-4455-6677-8899-aabbccddeeff"), nguid));
  CHECK(nguid[0] == 0x00);
  CHECK(nguid[5] == 0x55);
  CHECK(nguid[15] == 0xff);
  std::array<std::uint8_t, 8> eui{};
  REQUIRE(bam::detail::parse_hex_id(std::string("52 54 00 12 34 56 78 9a"), eui));
  CHECK(eui[7] == 0x9a);
  CHECK(!bam::detail::parse_hex_id(std::string("52 54 00"), eui));
  CHECK(!bam::detail::parse_hex_id(std::string(""), eui));
}

TEST_CASE("extent map: the namespace check compares what the disk's sysfs tells", "[extent]") {
  bam::controller ctrl(bam::open_host_transports(bam::parse_device("emu:ram=4M")).at(0));
  const nvme_id_ctrl& id = ctrl.identify_data();
  auto hex = [](const std::string& s) {
    std::string h;
    char b[3];
    for (unsigned char c : s) {
      std::snprintf(b, sizeof b, "%02x", c);
      h += b;
    }
    return h;
  };
  const std::string serial = bam::detail::trim_id_field(id.sn, sizeof id.sn);
  const std::string model = bam::detail::trim_id_field(id.mn, sizeof id.mn);
  REQUIRE(!serial.empty());
  char vid[8];
  std::snprintf(vid, sizeof vid, "%04x", id.vid);
  auto d = disk(512);
  d.disk_bytes = ctrl.ns(1).blocks * 512;
  auto map_on = [&](const bam::block_device_info& dev) {
    return bam::extent_map::from_extents("f", {{0, 0, 4096, last}}, 4096, dev);
  };
  d.wwid = "nvme." + std::string(vid) + "-" + hex(serial) + "-" + hex(model) + "-00000001";
  const auto w = bam::detail::parse_nvme_wwid(d.wwid);
  REQUIRE(w);
  CHECK(w->serial == serial);
  CHECK(w->nsid == 1);
  CHECK_NOTHROW(bam::check_same_namespace(ctrl, 1, map_on(d)));
  auto refused = [&](const bam::block_device_info& dev, const char* says) {
    auto [msg, err] = thrown([&] { bam::check_same_namespace(ctrl, 1, map_on(dev)); });
    CHECK(err == ENXIO);
    CHECK_THAT(msg, ContainsSubstring(says));
  };
  auto other = d;
  other.wwid = "nvme." + std::string(vid) + "-" + hex(serial + "X") + "-" + hex(model) + "-00000001";
  refused(other, "serial");
  other.wwid = "nvme." + std::string(vid) + "-" + hex(serial) + "-" + hex(model) + "-00000002";
  refused(other, "the disk is namespace 2");
  other = d;
  other.disk_bytes += 4096;
  refused(other, "it holds");
  other = d;
  other.lba_size = 4096;
  refused(other, "its logical blocks are 512 bytes");
  CHECK(!bam::detail::parse_nvme_wwid("eui.0011223344556677"));
  CHECK(!bam::detail::parse_nvme_wwid("nvme.1b36-6g-00-00000001"));
  CHECK(!bam::detail::parse_nvme_wwid("nvme.1b36-00-00"));
}

// ---------------------------------------------------------------------------
// Real files
// ---------------------------------------------------------------------------

namespace {

std::vector<unsigned char> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  return v;
}

void write_file(const std::string& path, const std::vector<unsigned char>& data, std::uint64_t at = 0,
                bool truncate = true) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, data.data(), data.size(), static_cast<off_t>(at)) == static_cast<ssize_t>(data.size()));
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
}

//! Equality as one bool, so that a failure does not print megabytes.
bool same(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) { return a == b; }

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

//! A directory on the file system this test runs from (a disk, in CI), removed at the end.
struct scratch_dir {
  std::filesystem::path dir;
  explicit scratch_dir(const std::filesystem::path& base) {
    dir = base / ("bam-extent-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const char* name) const { return (dir / name).string(); }
};

//! A controller over the raw disk `m` lies on, read-only; skips the test (saying why) if it cannot be opened.
std::unique_ptr<bam::controller> raw_disk_controller(const bam::extent_map& m) {
  const int fd = ::open(m.device().disk_node.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) SKIP(m.device().disk_node << " cannot be opened here (" << std::strerror(errno) << ")");
  ::close(fd);
  const std::string dev = "emu:file=" + m.device().disk_node + ",ro,lba=" + std::to_string(m.lba_size()) + ",queues=2";
  return std::make_unique<bam::controller>(bam::open_host_transports(bam::parse_device(dev)).at(0));
}

//! A map of `path`; skips the test (saying why) when this file system keeps files on no single disk.
std::optional<bam::extent_map> map_or_skip(const std::string& path, const bam::extent_map_options& o = {}) {
  try {
    return bam::extent_map::of_file(path, o);
  } catch (const bam::error& e) {
    if (e.errnum() != ENODEV && e.errnum() != EOPNOTSUPP && e.errnum() != ENOTTY) throw;
    SKIP(e.what());
  }
  return std::nullopt; // not reached: SKIP throws
}

//! Files made in `dir` read through a read-only software controller over
//! the raw disk under them, compared with read().
void check_files_in(const std::filesystem::path& where) {
  scratch_dir d(where);
  const std::string contiguous = d.file("contiguous.bin");
  const auto data = pattern((3 << 20) + 123, 1); // past any MDTS, a partial last block
  write_file(contiguous, data);
  auto m = map_or_skip(contiguous);
  auto ctrl = raw_disk_controller(*m);
  INFO(m->path() << " on " << m->device().disk_node << " partition '" << m->device().partition << "' at "
                 << m->device().partition_start << ", " << m->runs() << " runs");
  const std::uint32_t nsid = 1;
  bam::check_same_namespace(*ctrl, nsid, *m);
  std::vector<unsigned char> got(data.size());
  bam::read_mapped(*ctrl, nsid, *m, 0, got.data(), got.size());
  CHECK(same(got, data));
  // Unaligned pieces, across block and run boundaries.
  for (auto [off, len] : {std::pair<std::uint64_t, std::size_t>{1, 1},
                          {511, 2},
                          {4095, 8193},
                          {(1 << 20) - 3, 700001},
                          {data.size() - 5, 5}}) {
    std::vector<unsigned char> part(len);
    bam::read_mapped(*ctrl, nsid, *m, off, part.data(), len);
    CHECK(std::equal(part.begin(), part.end(), data.begin() + static_cast<std::ptrdiff_t>(off)));
  }
  // Past the end: refused.
  CHECK(thrown([&] { bam::read_mapped(*ctrl, nsid, *m, data.size() - 1, got.data(), 2); }).second == EINVAL);
  // The raw controller is read-only: a write (to this file's own first
  // block, had it gone through) is refused by the controller itself.
  auto buf = ctrl->transport().alloc(4096);
  try {
    ctrl->write(nsid, m->ref().find(0).lba, 1, *buf);
    FAIL("a write through a read-only controller succeeded");
  } catch (const bam::error& e) {
    REQUIRE(e.status());
    CHECK(e.status()->sc() == bam::nvme::generic_status::namespace_write_protected);
  }
  CHECK(same(read_file(contiguous), data)); // and the file is as it was

  // A file written in interleaved pieces: fragmented.
  const std::string a = d.file("a.bin"), b = d.file("b.bin");
  const auto pa = pattern(64 * 4096, 2), pb = pattern(64 * 4096, 3);
  for (int i = 0; i < 64; ++i) {
    write_file(a, {pa.begin() + i * 4096, pa.begin() + (i + 1) * 4096}, i * 4096ull, false);
    write_file(b, {pb.begin() + i * 4096, pb.begin() + (i + 1) * 4096}, i * 4096ull, false);
  }
  const auto ma = bam::extent_map::of_file(a);
  std::vector<unsigned char> ga(pa.size());
  bam::read_mapped(*ctrl, nsid, ma, 0, ga.data(), ga.size());
  CHECK(same(ga, pa));
  UNSCOPED_INFO(a << ": " << ma.raw_extents() << " extents from the file system, " << ma.runs() << " runs");

  // The same files as namespaces of their own (emu:extents=): byte x of
  // namespace 1 is byte x of the file, read from the raw disk.
  for (const auto& [file, want] : {std::pair{contiguous, data}, std::pair{a, pa}}) {
    bam::controller fc(bam::open_host_transports(bam::parse_device("emu:extents=" + file)).at(0));
    // The file, then zeroes up to a multiple of 64 KiB (cache pages of any size fit).
    REQUIRE(fc.ns(1).blocks == (want.size() + 65535) / 65536 * 128);
    auto all = fc.transport().alloc(fc.ns(1).blocks * 512);
    fc.read(1, 0, static_cast<std::uint32_t>(fc.ns(1).blocks), *all);
    CHECK(std::equal(want.begin(), want.end(), all->as<unsigned char>()));
    CHECK(std::all_of(all->as<unsigned char>() + want.size(), all->as<unsigned char>() + fc.ns(1).blocks * 512,
                      [](unsigned char b) { return b == 0; }));
    // An unaligned namespace range within the file: one block across a run boundary.
    fc.read(1, 7, 2, *all);
    CHECK(std::equal(want.begin() + 7 * 512, want.begin() + 9 * 512, all->as<unsigned char>()));
    CHECK_THAT(thrown([&] { fc.write(1, 0, 1, *all); }).first, ContainsSubstring("Write Protected"));
  }

  // A sparse file: refused, or zeroes in the holes when allowed.
  const std::string sp = d.file("sparse.bin");
  write_file(sp, pattern(8192, 4));
  write_file(sp, pattern(4096, 5), 1 << 20, false); // a hole of 1 MiB - 8 KiB
  auto [msg, err] = thrown([&] { bam::extent_map::of_file(sp); });
  CHECK(err == EINVAL);
  CHECK_THAT(msg, ContainsSubstring("a hole of"));
  bam::extent_map_options o;
  o.allow_holes = true;
  const auto ms = bam::extent_map::of_file(sp, o);
  CHECK(ms.has_holes());
  std::vector<unsigned char> gs(ms.file_size());
  bam::read_mapped(*ctrl, nsid, ms, 0, gs.data(), gs.size());
  CHECK(same(gs, read_file(sp)));
  CHECK_THAT(thrown([&] { bam::open_host_transports(bam::parse_device("emu:extents=" + sp)); }).first,
             ContainsSubstring("a hole of"));
  {
    bam::controller hc(bam::open_host_transports(bam::parse_device("emu:extents=" + sp + ",holes")).at(0));
    auto all = hc.transport().alloc(hc.ns(1).blocks * 512);
    hc.read(1, 0, static_cast<std::uint32_t>(hc.ns(1).blocks), *all);
    CHECK(std::equal(gs.begin(), gs.end(), all->as<unsigned char>()));
  }

  // A file that changes after mapping is not read stale: not by read_mapped,
  // and not by a controller over its extents (within its check interval).
  bam::controller watched(bam::open_host_transports(bam::parse_device("emu:extents=" + contiguous)).at(0));
  std::vector<std::string> warnings;
  bam::set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  write_file(contiguous, pattern(4096, 6), data.size(), false); // appended
  ::usleep(150000);
  auto wb = watched.transport().alloc(4096);
  CHECK_THAT(thrown([&] { watched.read(1, 0, 8, *wb); }).first, ContainsSubstring("Unrecovered Read Error"));
  bam::set_warning_handler({});
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], ContainsSubstring("changed after it was mapped"));
  std::vector<unsigned char> g(4096);
  std::tie(msg, err) = thrown([&] { bam::read_mapped(*ctrl, nsid, *m, 0, g.data(), g.size()); });
  CHECK(err == ESTALE);
  CHECK_THAT(msg, ContainsSubstring("changed after it was mapped"));
  CHECK_THAT(msg, ContainsSubstring("size went from"));
  // Rewritten in place, same size: the modification time tells.
  const auto m2 = bam::extent_map::of_file(contiguous);
  ::usleep(20000);
  write_file(contiguous, pattern(4096, 7), 0, false);
  CHECK_THAT(thrown([&] { m2.check_unchanged(); }).first, ContainsSubstring("it was modified"));
}

//! An ext4 file system in an image file on a loop device, mounted; empty
//! (and says why) where this process may not do that.
struct loop_ext4 {
  std::filesystem::path image, mnt;
  std::string loop;
  bool mounted = false;
  std::string why_not;

  static std::string run(const std::string& cmd) {
    std::string out;
    if (FILE* p = ::popen((cmd + " 2>&1").c_str(), "r")) {
      char buf[256];
      while (std::fgets(buf, sizeof buf, p))
        out += buf;
      if (::pclose(p) != 0) throw std::runtime_error(cmd + ": " + out);
    }
    while (!out.empty() && out.back() == '\n')
      out.pop_back();
    return out;
  }
  loop_ext4() {
    if (::geteuid() != 0) {
      why_not = "not root (loop devices and mounts need it)";
      return;
    }
    const auto base = std::filesystem::current_path() / ("bam-loop-" + std::to_string(::getpid()));
    image = base.string() + ".img";
    mnt = base.string() + ".mnt";
    try {
      std::filesystem::create_directories(mnt);
      std::ofstream(image).close();
      std::filesystem::resize_file(image, 96ull << 20);
      run("mkfs.ext4 -q -F -b 4096 " + image.string());
      loop = run("losetup --find --show " + image.string());
      run("mount -t ext4 " + loop + " " + mnt.string());
      mounted = true;
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  }
  ~loop_ext4() {
    try {
      if (mounted) run("umount " + mnt.string());
      if (!loop.empty()) run("losetup -d " + loop);
    } catch (...) {
    }
    std::error_code ec;
    std::filesystem::remove(image, ec);
    std::filesystem::remove(mnt, ec);
  }
};

} // namespace

TEST_CASE("extent map: files on this machine's disk read through raw blocks equal read()", "[extent][file]") {
  check_files_in(std::filesystem::current_path());
}

TEST_CASE("extent map: files on ext4 on a loop device read through raw blocks equal read()", "[extent][file]") {
  loop_ext4 fs;
  if (!fs.mounted) SKIP("no ext4 on a loop device here: " << fs.why_not);
  check_files_in(fs.mnt);
  // Here the disk can be opened: the direct path is the one chosen.
  scratch_dir d(fs.mnt);
  write_file(d.file("plan.bin"), pattern(65536, 9));
  const bam::file_access a = bam::plan_file_access(d.file("plan.bin"));
  CHECK(a.kind == bam::file_access::path::direct);
  CHECK(a.device == "emu:extents=" + d.file("plan.bin"));
  CHECK_THAT(a.reason, ContainsSubstring("1 run(s) of raw blocks of " + fs.loop));
}

TEST_CASE("extent map: writes through raw blocks land in the file's own blocks, never elsewhere", "[extent][file]") {
  loop_ext4 fs;
  if (!fs.mounted) SKIP("no ext4 on a loop device here: " << fs.why_not);
  scratch_dir d(fs.mnt);
  const std::string path = d.file("w.bin"), neighbour = d.file("n.bin");
  auto model = pattern((3 << 20) + 123, 20);
  const auto other = pattern(1 << 20, 21);
  write_file(path, model);
  write_file(neighbour, other);
  // Read-write here: the disk is this test's own image.
  bam::controller ctrl(bam::open_host_transports(bam::parse_device("emu:file=" + fs.loop + ",queues=2")).at(0));
  CHECK_THAT(thrown([&] {
               const auto ro = bam::extent_map::of_file(path);
               bam::write_mapped(ctrl, 1, ro, 0, model.data(), 1);
             }).first,
             ContainsSubstring("needs a map made for writing"));
  bam::extent_map_options o;
  o.for_writing = true;
  const auto m = bam::extent_map::of_file(path, o);
  for (auto [off, len, seed] : {std::tuple<std::uint64_t, std::size_t, std::uint32_t>{4095, 1000, 30},
                                {8192, 1 << 20, 31},
                                {model.size() - 5, 5, 32},
                                {0, 1, 33},
                                {777, 2 * 4096 + 3, 34}}) {
    const auto bytes = pattern(len, seed);
    bam::write_mapped(ctrl, 1, m, off, bytes.data(), len);
    std::copy(bytes.begin(), bytes.end(), model.begin() + static_cast<std::ptrdiff_t>(off));
  }
  CHECK(thrown([&] { bam::write_mapped(ctrl, 1, m, model.size() - 1, model.data(), 2); }).second == EINVAL);
  // What the file system reads once its cached copy is dropped.
  for (const std::string& f : {path, neighbour}) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    ::close(fd);
  }
  CHECK(same(read_file(path), model));
  CHECK(same(read_file(neighbour), other));
  // A sparse file cannot be mapped for writing.
  const std::string sp = d.file("sparse.bin");
  write_file(sp, pattern(4096, 22));
  write_file(sp, pattern(4096, 23), 1 << 20, false);
  CHECK_THAT(thrown([&] { bam::extent_map::of_file(sp, o); }).first,
             ContainsSubstring("writes need blocks the file system allocated"));
}

TEST_CASE("extent map: a file on tmpfs falls back to the software controller reading the file", "[extent][file]") {
  if (!std::filesystem::is_directory("/dev/shm")) SKIP("no /dev/shm");
  scratch_dir d("/dev/shm");
  const std::string path = d.file("features.bin");
  const auto data = pattern(100000, 8); // not a multiple of any block size
  write_file(path, data);
  struct stat st {};
  REQUIRE(::stat("/dev/shm", &st) == 0);
  if (major(st.st_dev) != 0) SKIP("/dev/shm is on a block device here");
  const bam::file_access a = bam::plan_file_access(path);
  CHECK(a.kind == bam::file_access::path::via_file);
  CHECK(a.device == "emu:file=" + path + ",ro");
  CHECK_THAT(a.reason, ContainsSubstring("software controller's CPU engine"));
  CHECK_THAT(a.reason, ContainsSubstring("on no block device"));
  // The device string it names reads the file, its last partial block padded with zeroes.
  bam::controller ctrl(bam::open_host_transports(bam::parse_device(a.device)).at(0));
  const std::uint64_t blocks = (data.size() + 511) / 512;
  REQUIRE(ctrl.ns(1).blocks >= blocks);
  auto buf = ctrl.transport().alloc(blocks * 512);
  ctrl.read(1, 0, static_cast<std::uint32_t>(blocks), *buf);
  CHECK(std::equal(data.begin(), data.end(), buf->as<unsigned char>()));
  CHECK(buf->as<unsigned char>()[data.size()] == 0);
  CHECK(thrown([&] { ctrl.write(1, 0, 1, *buf); }).first.find("Write Protected") != std::string::npos);
  CHECK(same(read_file(path), data));
}

TEST_CASE("extent map: the direct path is chosen when the file's disk can be opened", "[extent][file]") {
  scratch_dir d(std::filesystem::current_path());
  const std::string path = d.file("plan.bin");
  write_file(path, pattern(65536, 9));
  auto m = map_or_skip(path);
  const bam::file_access a = bam::plan_file_access(path);
  const int fd = ::open(m->device().disk_node.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  if (fd < 0) {
    CHECK(a.kind == bam::file_access::path::via_file);
    CHECK_THAT(a.reason, ContainsSubstring("cannot be opened here"));
    return;
  }
  CHECK(a.kind == bam::file_access::path::direct);
  CHECK(a.device == "emu:extents=" + path);
  REQUIRE(a.map);
  CHECK(a.map->runs() == m->runs());
  CHECK_THAT(a.reason, ContainsSubstring(m->device().disk_node));
}
