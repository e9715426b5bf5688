// SPDX-License-Identifier: MIT
// bam::fs_image: extent maps of files in ext2/ext4 images made by mkfs -d and
// changed by debugfs (no root, no mount). Every map is checked against the
// bytes: each run read from the image at its offset equals the source file.
#include <bam/file/fs_image.hpp>
#include <bam/file/mapped_file.hpp>
#include <bam/host.hpp>
#include <bam/transport/device_string.hpp>
#include <bam/transport/open.hpp>

#include "../scratch_dir.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

//! A scratch directory of this file's tests.
struct scratch : bam_test::scratch_dir {
  scratch() : bam_test::scratch_dir("bam-fs-image") {}
};

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v)
    b = static_cast<unsigned char>(rng());
  return v;
}

void write_file(const fs::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void run(const std::string& cmd) {
  INFO(cmd);
  REQUIRE(std::system((cmd + " > /dev/null 2>&1").c_str()) == 0);
}

//! `mkfs -t TYPE` of an image of `mib` MiB holding the files of `src`.
void make_image(const fs::path& image, const fs::path& src, const std::string& type, unsigned mib,
                const std::string& extra = "") {
  run("truncate -s " + std::to_string(mib) + "M " + image.string());
  run("mkfs." + type + " -q -F -b 1024 -N 256 " + extra + " -d " + src.string() + " " + image.string());
}

//! Bytes `[offset, offset + n)` of `path`.
std::vector<unsigned char> read_at(const fs::path& path, std::uint64_t offset, std::size_t n) {
  std::vector<unsigned char> v(n);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, v.data(), n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n));
  ::close(fd);
  return v;
}

//! Every byte of the file as the map finds it in the image (holes as zeroes) equals `want`.
void require_map_reads(const bam::extent_map& m, const fs::path& image, const std::vector<unsigned char>& want) {
  REQUIRE(m.file_size() == want.size());
  std::uint64_t covered = 0;
  for (const auto& e : m.extents()) {
    REQUIRE(e.file_offset == covered);
    const std::uint64_t n = std::min<std::uint64_t>(e.length, want.size() - e.file_offset);
    std::vector<unsigned char> got(n, 0);
    if (e.disk_offset != bam::extent_hole) got = read_at(image, e.disk_offset, n);
    INFO("run at file offset " << e.file_offset << ", image offset " << e.disk_offset << ", " << n << " bytes");
    REQUIRE(std::equal(got.begin(), got.end(), want.begin() + static_cast<std::ptrdiff_t>(e.file_offset)));
    covered += e.length;
  }
  REQUIRE(covered >= want.size());
}

} // namespace

TEST_CASE("files of an ext4 image written whole, in pieces and empty: the map reads back their bytes", "[fs_image]") {
  scratch s;
  const auto contiguous = random_bytes(300 * 1024 + 123, 1);
  write_file(s.dir / "src" / "contiguous.bin", contiguous);
  write_file(s.dir / "src" / "empty.bin", {});
  for (int i = 0; i < 100; ++i)
    write_file(s.dir / "src" / ("filler" + std::to_string(i)), random_bytes(32 * 1024, 100 + i));
  const fs::path image = s.dir / "ext4.img";
  make_image(image, s.dir / "src", "ext4", 5, "-O ^has_journal");
  // Free every other filler, then write a file larger than any gap: it lands in pieces.
  const auto fragmented = random_bytes(400 * 1024, 2);
  write_file(s.dir / "fragmented.src", fragmented);
  {
    std::ofstream cmds(s.dir / "cmds");
    for (int i = 0; i < 100; i += 2)
      cmds << "rm /filler" << i << "\n";
    cmds << "write " << (s.dir / "fragmented.src").string() << " /fragmented.bin\n";
  }
  run("debugfs -w -f " + (s.dir / "cmds").string() + " " + image.string());

  bam::fs_image img(image.string());
  CHECK(img.block_size() == 1024);
  const bam::extent_map c = img.map("/contiguous.bin"); // mkfs -d may still cut it in a few runs
  require_map_reads(c, image, contiguous);
  const bam::extent_map f = img.map("/fragmented.bin");
  CHECK(f.runs() > 4); // more than an inode holds: the extent tree has an index level
  CHECK(f.runs() > c.runs());
  require_map_reads(f, image, fragmented);
  const bam::extent_map e = img.map("/empty.bin");
  CHECK(e.file_size() == 0);
  CHECK(e.runs() == 0);
  // Fillers that stayed are there, byte for byte.
  require_map_reads(img.map("/filler1"), image, random_bytes(32 * 1024, 101));
  // The file system's own reading of the files gives the same bytes.
  std::vector<unsigned char> via_fs;
  img.read("/fragmented.bin", [&](const unsigned char* p, std::size_t n) { via_fs.insert(via_fs.end(), p, p + n); });
  CHECK(via_fs == fragmented);
}

TEST_CASE("an ext2 image (files mapped by blocks, indirect blocks in between) reads back", "[fs_image]") {
  scratch s;
  const auto big = random_bytes(700 * 1024 + 5, 3); // past the 12 direct blocks: indirect and double-indirect
  write_file(s.dir / "src" / "big.bin", big);
  const fs::path image = s.dir / "ext2.img";
  make_image(image, s.dir / "src", "ext2", 4);
  bam::fs_image img(image.string());
  const bam::extent_map m = img.map("/big.bin");
  CHECK(m.runs() > 1); // the indirect blocks sit between runs of data
  require_map_reads(m, image, big);
}

TEST_CASE("holes are refused unless allowed, then read as zeroes", "[fs_image]") {
  scratch s;
  auto sparse = random_bytes(256 * 1024, 4);
  std::fill(sparse.begin() + 64 * 1024, sparse.begin() + 192 * 1024, 0); // mkfs -d leaves zero blocks out
  write_file(s.dir / "src" / "sparse.bin", sparse);
  const fs::path image = s.dir / "sparse.img";
  make_image(image, s.dir / "src", "ext4", 4, "-O ^has_journal");
  bam::fs_image img(image.string());
  try {
    (void)img.map("/sparse.bin");
    FAIL("a file with holes was mapped without allow_holes");
  } catch (const bam::error& e) {
    CHECK_THAT(std::string(e.what()), ContainsSubstring("hole"));
    CHECK_THAT(std::string(e.what()), ContainsSubstring("sparse.bin"));
  }
  const bam::extent_map m = img.map("/sparse.bin", {.allow_holes = true});
  CHECK(m.has_holes());
  require_map_reads(m, image, sparse);
  std::vector<unsigned char> via_fs;
  img.read("/sparse.bin", [&](const unsigned char* p, std::size_t n) { via_fs.insert(via_fs.end(), p, p + n); });
  CHECK(via_fs == sparse);
}

TEST_CASE("data kept in the inode, directories and missing paths are refused with the reason", "[fs_image]") {
  scratch s;
  write_file(s.dir / "src" / "tiny.txt", random_bytes(40, 5));
  fs::create_directories(s.dir / "src" / "sub");
  const fs::path image = s.dir / "inline.img";
  make_image(image, s.dir / "src", "ext4", 4, "-O ^has_journal,inline_data");
  bam::fs_image img(image.string());
  CHECK_THROWS_WITH(img.map("/tiny.txt"), ContainsSubstring("packed with other metadata"));
  std::vector<unsigned char> tiny;
  img.read("/tiny.txt", [&](const unsigned char* p, std::size_t n) { tiny.insert(tiny.end(), p, p + n); });
  CHECK(tiny == random_bytes(40, 5)); // inline data reads through the file system
  CHECK_THROWS_WITH(img.read("/sub", [](const unsigned char*, std::size_t) {}), ContainsSubstring("not a regular"));
  try {
    (void)img.map("/sub");
    FAIL("a directory was mapped");
  } catch (const bam::error& e) {
    CHECK_THAT(std::string(e.what()), ContainsSubstring("not a regular file"));
    CHECK(e.context().errnum == EINVAL);
  }
  try {
    (void)img.map("/nothing/here.bin");
    FAIL("a missing path was mapped");
  } catch (const bam::error& e) {
    CHECK_THAT(std::string(e.what()), ContainsSubstring("no such file"));
    CHECK(e.context().errnum == ENOENT);
  }
}

TEST_CASE("a file system that starts inside the image (a partition): offsets count from the image's start",
          "[fs_image]") {
  scratch s;
  const auto data = random_bytes(97 * 1024 + 100, 6); // 98 blocks of 1 KiB: not whole 4 KiB blocks
  write_file(s.dir / "src" / "data.bin", data);
  const fs::path fsimg = s.dir / "fs.img";
  make_image(fsimg, s.dir / "src", "ext4", 4, "-O ^has_journal");
  const fs::path disk = s.dir / "disk.img";
  constexpr std::uint64_t start = 1 << 20;
  run("truncate -s 1M " + disk.string());
  run("sh -c 'cat " + fsimg.string() + " >> " + disk.string() + "'");
  bam::fs_image img(disk.string(), start);
  const bam::extent_map m = img.map("/data.bin");
  for (const auto& e : m.extents())
    CHECK(e.disk_offset >= start);
  require_map_reads(m, disk, data);
  // 4 KiB logical blocks: the map's LBAs are in those.
  bam::fs_image img4k(disk.string(), start, 4096);
  CHECK_THROWS_WITH(img4k.map("/data.bin"), ContainsSubstring("whole 4096-byte logical blocks"));
}

TEST_CASE("what is not an ext2/3/4 file system is refused", "[fs_image]") {
  scratch s;
  const fs::path junk = s.dir / "junk.img";
  write_file(junk, random_bytes(1 << 20, 7));
  CHECK_THROWS_WITH(bam::fs_image(junk.string()), ContainsSubstring("as an ext2/3/4 file system"));
  CHECK_THROWS_WITH(bam::fs_image((s.dir / "missing.img").string()), ContainsSubstring("missing.img"));
}

namespace {

//! Bytes [begin, begin + n) of the file `f` maps (`begin` a whole block), read through its lookups.
std::vector<unsigned char> read_range(const bam::extent_map_ref& f, std::uint64_t begin, std::uint64_t n,
                                      const fs::path& image) {
  const std::uint64_t lbs = std::uint64_t{1} << f.lba_shift;
  REQUIRE(begin % lbs == 0);
  std::vector<unsigned char> out;
  for (std::uint64_t block = begin / lbs; out.size() < n;) {
    const bam::extent_map_ref::where w = f.find(block);
    REQUIRE(w.blocks != 0);
    const std::uint64_t take = std::min<std::uint64_t>(w.blocks * lbs, n - out.size());
    if (w.lba == bam::extent_hole) {
      out.insert(out.end(), take, 0);
    } else {
      const auto got = read_at(image, w.lba * lbs, take);
      out.insert(out.end(), got.begin(), got.end());
    }
    block += w.blocks;
  }
  return out;
}

//! File i of `set` read through its `file_set_ref` lookups, as a GPU thread would.
std::vector<unsigned char> read_through(const bam::file_set_ref& r, std::uint64_t i, const fs::path& image) {
  const bam::extent_map_ref f = r.file(i);
  CHECK(f.find(f.blocks()).blocks == 0); // past the end
  return read_range(f, 0, r.file_size(i), image);
}

} // namespace

TEST_CASE("a file set: every file below a directory of an image, by index, read through its lookups", "[fs_image]") {
  scratch s;
  std::vector<std::pair<std::string, std::vector<unsigned char>>> made;
  std::mt19937_64 rng(9);
  auto add = [&](const std::string& rel, std::size_t bytes) {
    const fs::path p = s.dir / "src" / rel;
    fs::create_directories(p.parent_path());
    made.push_back({"/" + rel, random_bytes(bytes, made.size() + 1000)});
    write_file(p, made.back().second);
  };
  for (int i = 0; i < 40; ++i)
    add("a/img" + std::to_string(i) + ".jpg", i % 10 == 0 ? 0 : rng() % (24 * 1024)); // empty ones too
  for (int i = 0; i < 25; ++i)
    add("b/c/doc" + std::to_string(i) + ".txt", 1 + rng() % (9 * 1024));
  add("top.bin", 200 * 1024);
  const fs::path image = s.dir / "set.img";
  make_image(image, s.dir / "src", "ext4", 8, "-O ^has_journal");
  bam::fs_image img(image.string());

  std::vector<std::string> want;
  for (const auto& m : made)
    want.push_back(m.first);
  std::sort(want.begin(), want.end());
  CHECK(img.files() == want);
  const std::vector<std::string> under_a = img.files("/a/");
  CHECK(under_a.size() == 40);
  for (const auto& p : under_a)
    CHECK(p.rfind("/a/", 0) == 0);

  const bam::file_set set = img.map_files("/");
  REQUIRE(set.size() == made.size());
  std::uint64_t total = 0;
  const bam::file_set_ref r = set.ref();
  for (std::uint64_t i = 0; i < set.size(); ++i) {
    const auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == set.path(i); });
    REQUIRE(it != made.end());
    INFO(set.path(i));
    CHECK(set.file_size(i) == it->second.size());
    CHECK(read_through(r, i, image) == it->second);
    if (it->second.empty()) CHECK(r.file(i).runs == 0);
    total += it->second.size();
  }
  CHECK(set.total_bytes() == total);

  // Packed end to end, each file from a 4 KiB boundary: the same bytes at its offset, holes between.
  const bam::file_set::packed p = set.packed_map(4096);
  REQUIRE(p.offsets.size() == set.size());
  const bam::extent_map_ref pr = p.map.ref();
  for (std::uint64_t i = 0; i < set.size(); ++i) {
    INFO(set.path(i) << " at " << p.offsets[i]);
    CHECK(p.offsets[i] % 4096 == 0);
    if (i > 0) CHECK(p.offsets[i] >= p.offsets[i - 1] + set.file_size(i - 1));
    CHECK(read_range(pr, p.offsets[i], set.file_size(i), image) == read_through(r, i, image));
    const std::uint64_t end = p.offsets[i] + set.file_size(i);
    const std::uint64_t lbs = set.lba_size();
    const std::uint64_t gap_block = (end + lbs - 1) / lbs; // the first whole block after the file
    if (i + 1 < set.size() && gap_block * lbs < p.offsets[i + 1]) CHECK(pr.find(gap_block).lba == bam::extent_hole);
  }
  CHECK(p.map.file_size() == p.offsets.back() + set.file_size(set.size() - 1));
  CHECK(p.map.lba_size() == set.lba_size());
  CHECK_THROWS_WITH(set.packed_map(1000), ContainsSubstring("not a power of two"));
  CHECK_THROWS_WITH(set.packed_map(set.lba_size() / 2), ContainsSubstring("multiple of"));
  CHECK(set.runs() >= set.size() - 4); // one run or more per non-empty file
  CHECK(set.table_bytes() == (set.firsts().size() + set.starts().size() + set.lbas().size() + set.sizes().size()) * 8);

  CHECK_THROWS_WITH(img.files("/top.bin"), ContainsSubstring("not a directory"));
  CHECK_THROWS_WITH(img.files("/nope"), ContainsSubstring("no such directory"));
  // A set is of one disk, in one block size.
  bam::fs_image img4k(image.string(), 0, 1024);
  std::vector<bam::file_set::named_map> mixed;
  mixed.push_back({"/top.bin", img.map("/top.bin")});
  mixed.push_back({"/top.bin", img4k.map("/top.bin")});
  CHECK_THROWS_WITH(bam::file_set(std::move(mixed)), ContainsSubstring("on one disk"));
}

TEST_CASE("maps of an image's files fail (ESTALE) once a file changes, alone and in a set", "[fs_image]") {
  scratch s;
  fs::create_directories(s.dir / "src" / "d");
  write_file(s.dir / "src" / "d" / "a.bin", random_bytes(20 * 1024, 1));
  write_file(s.dir / "src" / "d" / "b.bin", random_bytes(30 * 1024, 2));
  write_file(s.dir / "src" / "d" / "c.bin", random_bytes(5 * 1024, 3));
  const fs::path image = s.dir / "stale.img";
  make_image(image, s.dir / "src", "ext4", 8, "-O ^has_journal");
  auto debugfs = [&](const std::string& commands) {
    {
      std::ofstream cmds(s.dir / "cmds");
      cmds << commands;
    }
    run("debugfs -w -f " + (s.dir / "cmds").string() + " " + image.string());
  };
  auto stale_message = [](auto&& check) -> std::string {
    try {
      check();
    } catch (const bam::error& e) {
      CHECK(e.context().errnum == ESTALE);
      return e.what();
    }
    return "";
  };

  std::optional<bam::extent_map> a, c;
  std::optional<bam::file_set> set;
  {
    const bam::fs_image img(image.string());
    a.emplace(img.map("/d/a.bin"));
    c.emplace(img.map("/d/c.bin"));
    set.emplace(img.map_files("/d"));
  } // the maps outlive the image they came from
  CHECK_NOTHROW(a->check_unchanged());
  CHECK_NOTHROW(set->check_unchanged());
  // The check as a callable that outlives the set (what a file_array keeps),
  // and a set made by hand from maps, checked map by map.
  const std::function<void()> kept = set->unchanged_check();
  std::optional<bam::file_set> by_hand;
  {
    std::vector<bam::file_set::named_map> maps;
    maps.push_back({"/d/b.bin", bam::fs_image(image.string()).map("/d/b.bin")});
    by_hand.emplace(std::move(maps));
  }
  const std::function<void()> kept_by_hand = by_hand->unchanged_check();
  by_hand.reset();
  CHECK_NOTHROW(kept());
  CHECK_NOTHROW(kept_by_hand());

  // Another file of the image rewritten (other size, other blocks): the set
  // names it; the map of a file that did not change still holds.
  write_file(s.dir / "b2.src", random_bytes(45 * 1024, 4));
  debugfs("rm /d/b.bin\nwrite " + (s.dir / "b2.src").string() + " /d/b.bin\n");
  CHECK_NOTHROW(a->check_unchanged());
  const std::string set_msg = stale_message([&] { set->check_unchanged(); });
  CHECK_THAT(set_msg, ContainsSubstring("/d/b.bin"));
  CHECK_THAT(set_msg, ContainsSubstring("map it again"));
  CHECK_THAT(stale_message(kept), ContainsSubstring("/d/b.bin"));
  CHECK_THAT(stale_message(kept_by_hand), ContainsSubstring("/d/b.bin"));

  // The file itself: its size changed.
  debugfs("sif /d/a.bin size 1000\n");
  CHECK_THAT(stale_message([&] { a->check_unchanged(); }), ContainsSubstring("size went from 20480 to 1000"));
  // Removed.
  debugfs("rm /d/c.bin\n");
  CHECK_THAT(stale_message([&] { c->check_unchanged(); }), ContainsSubstring("no longer a regular file"));

  // A map made again is good until the next change; an image replaced by
  // another file fails every map of it.
  bam::extent_map again = bam::fs_image(image.string()).map("/d/a.bin");
  CHECK_NOTHROW(again.check_unchanged());
  fs::copy_file(image, s.dir / "copy.img");
  fs::rename(s.dir / "copy.img", image);
  CHECK_THAT(stale_message([&] { again.check_unchanged(); }), ContainsSubstring("another file"));
}

namespace {

//! Adds `count` empty regular files `<prefix><k>` to the directory `dir` of
//! the ext4 image (an indexed one: each is added in a few block reads), as a
//! program writing a data set would, through libext2fs.
void add_empty_files(const fs::path& image, const std::string& dir, const std::string& prefix, std::uint64_t count) {
  ext2_filsys fs = nullptr;
  REQUIRE(ext2fs_open(image.c_str(), EXT2_FLAG_RW | EXT2_FLAG_64BITS, 0, 0, unix_io_manager, &fs) == 0);
  REQUIRE(ext2fs_read_bitmaps(fs) == 0);
  ext2_ino_t parent = 0;
  REQUIRE(ext2fs_namei(fs, EXT2_ROOT_INO, EXT2_ROOT_INO, dir.c_str(), &parent) == 0);
  auto fail_at = [](const std::string& name, const char* step, errcode_t e) {
    FAIL(name << ": " << step << ": " << ::error_message(e));
  };
  for (std::uint64_t k = 0; k < count; ++k) { // no assertion per file: a million of them would take long
    const std::string name = prefix + std::to_string(k);
    ext2_ino_t ino = 0;
    if (const errcode_t e = ext2fs_new_inode(fs, parent, LINUX_S_IFREG | 0644, nullptr, &ino); e != 0)
      fail_at(name, "new inode", e);
    ext2_inode inode{};
    inode.i_mode = LINUX_S_IFREG | 0644;
    inode.i_links_count = 1;
    if (const errcode_t e = ext2fs_write_new_inode(fs, ino, &inode); e != 0) fail_at(name, "writing the inode", e);
    ext2fs_inode_alloc_stats2(fs, ino, +1, 0);
    errcode_t e = ext2fs_link(fs, parent, name.c_str(), ino, EXT2_FT_REG_FILE);
    if (e == EXT2_ET_DIR_NO_SPACE) {
      if (const errcode_t x = ext2fs_expand_dir(fs, parent); x != 0) fail_at(name, "expanding the directory", x);
      e = ext2fs_link(fs, parent, name.c_str(), ino, EXT2_FT_REG_FILE);
    }
    if (e != 0) fail_at(name, "linking it", e);
  }
  REQUIRE(ext2fs_close_free(&fs) == 0);
}

} // namespace

TEST_CASE("a directory of a million files: listed, mapped as one set and checked, each directory read once",
          "[fs_image]") {
  scratch s;
  // 2,000 files made by mkfs (every tenth with data, sizes up to 3 blocks),
  // the directory indexed by e2fsck -D, then 998,000 empty files added.
  constexpr std::uint64_t made = 2000, added = 998'000;
  std::vector<std::pair<std::string, std::vector<unsigned char>>> with_data;
  fs::create_directories(s.dir / "src" / "flat");
  for (std::uint64_t k = 0; k < made; ++k) {
    const std::string name = "made-" + std::to_string(k);
    std::vector<unsigned char> bytes;
    if (k % 10 == 0) bytes = random_bytes(1 + (k * 7919) % (3 * 4096), k + 77);
    write_file(s.dir / "src" / "flat" / name, bytes);
    if (!bytes.empty()) with_data.push_back({"/flat/" + name, std::move(bytes)});
  }
  const fs::path image = s.dir / "million.img";
  run("truncate -s 1G " + image.string());
  run("mkfs.ext4 -q -F -b 4096 -N 1050000 -O ^has_journal -d " + (s.dir / "src").string() + " " + image.string());
  // Exit status 1: e2fsck changed something (it indexed the directory).
  const int fsck = std::system(("e2fsck -fyD " + image.string() + " > /dev/null 2>&1").c_str());
  REQUIRE((fsck == 0 || WEXITSTATUS(fsck) == 1));
  add_empty_files(image, "/flat", "e", added);

  const bam::fs_image img(image.string());
  const std::vector<std::string> names = img.files("/flat");
  REQUIRE(names.size() == made + added);
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::binary_search(names.begin(), names.end(), "/flat/e997999"));
  CHECK(std::binary_search(names.begin(), names.end(), "/flat/made-1999"));

  const bam::file_set set = img.map_files("/flat");
  REQUIRE(set.size() == made + added);
  CHECK(set.runs() == with_data.size()); // each file with data in one run, the empty ones in none
  std::uint64_t bytes = 0;
  const bam::file_set_ref r = set.ref();
  for (const auto& [path, want] : with_data) {
    const auto i = static_cast<std::uint64_t>(std::lower_bound(names.begin(), names.end(), path) - names.begin());
    REQUIRE(i < set.size());
    INFO(path);
    REQUIRE(set.path(i) == path);
    CHECK(set.file_size(i) == want.size());
    CHECK(read_through(r, i, image) == want);
    bytes += want.size();
  }
  CHECK(set.total_bytes() == bytes);
  for (const std::uint64_t i : {std::uint64_t{0}, std::uint64_t{123'456}, set.size() - 1})
    if (set.path(i).rfind("/flat/e", 0) == 0) CHECK(set.file_size(i) == 0);
  CHECK_NOTHROW(set.check_unchanged());

  // One of the million removed: the set's check names it.
  {
    std::ofstream cmds(s.dir / "cmds");
    cmds << "rm /flat/e654321\n";
  }
  run("debugfs -w -f " + (s.dir / "cmds").string() + " " + image.string());
  try {
    set.check_unchanged();
    FAIL("the set's check missed a removed file");
  } catch (const bam::error& e) {
    CHECK(e.context().errnum == ESTALE);
    CHECK_THAT(std::string(e.what()), ContainsSubstring("/flat/e654321"));
    CHECK_THAT(std::string(e.what()), ContainsSubstring("no longer a regular file"));
  }
}

TEST_CASE("a file system read through a controller's namespace: the same maps, bytes and checks as its image",
          "[fs_image][controller]") {
  // The SSD of a bam user is bound to bam's driver, so the kernel cannot mount
  // it: the file system is read with NVMe commands. Here the namespace is a
  // software controller over the image file.
  scratch s;
  fs::create_directories(s.dir / "src" / "d");
  const auto big = random_bytes(700 * 1024 + 5, 21);
  const auto small = random_bytes(5 * 1024 + 3, 22);
  write_file(s.dir / "src" / "big.bin", big);
  write_file(s.dir / "src" / "d" / "small.bin", small);
  const fs::path image = s.dir / "ns.img";
  make_image(image, s.dir / "src", "ext4", 8, "-O ^has_journal");
  bam::controller ctrl(bam::open_host_transports(bam::parse_device("emu:file=" + image.string() + ",queues=2")).at(0));

  const bam::fs_medium medium = bam::fs_medium_of(ctrl, 1, 1);
  CHECK(medium.bytes == fs::file_size(image));
  CHECK(medium.lba_size == 512);
  const bam::fs_image on_ns(medium);
  const bam::fs_image in_file(image.string());
  CHECK(on_ns.block_size() == in_file.block_size());
  CHECK(on_ns.files("/") == in_file.files("/"));
  for (const auto& [path, want] : {std::pair{"/big.bin", &big}, std::pair{"/d/small.bin", &small}}) {
    INFO(path);
    const bam::extent_map m = on_ns.map(path);
    const bam::extent_map f = in_file.map(path);
    const auto me = m.extents(), fe = f.extents();
    REQUIRE(me.size() == fe.size());
    REQUIRE(me.size() > 0);
    for (std::size_t i = 0; i < me.size(); ++i) {
      CHECK(me[i].file_offset == fe[i].file_offset);
      CHECK(me[i].disk_offset == fe[i].disk_offset);
      CHECK(me[i].length == fe[i].length);
    }
    CHECK(m.lba_size() == 512);
    CHECK_THAT(m.path(), ContainsSubstring(ctrl.name()));
    require_map_reads(m, image, *want);
    // The file's bytes by block reads on the same namespace, and the change check through it.
    std::vector<unsigned char> got(want->size());
    bam::read_mapped(ctrl, 1, m, 0, got.data(), got.size());
    CHECK(got == *want);
  }
  const bam::file_set set = on_ns.map_files("/");
  CHECK(set.size() == 2);
  CHECK_NOTHROW(set.check_unchanged());

  // A change written to the namespace's file system fails the maps (ESTALE).
  const bam::extent_map kept = on_ns.map("/d/small.bin");
  write_file(s.dir / "other.src", random_bytes(9 * 1024, 23));
  {
    std::ofstream cmds(s.dir / "cmds");
    cmds << "rm /d/small.bin\nwrite " << (s.dir / "other.src").string() << " /d/small.bin\n";
  }
  run("debugfs -w -f " + (s.dir / "cmds").string() + " " + image.string());
  try {
    kept.check_unchanged();
    FAIL("the map of a replaced file passed its check");
  } catch (const bam::error& e) {
    CHECK(e.context().errnum == ESTALE);
  }

  // A namespace without a file system, and a reader that fails, are refused with the reason.
  bam::controller blank(bam::open_host_transports(bam::parse_device("emu:ram=4M")).at(0));
  CHECK_THROWS_WITH(bam::fs_image(bam::fs_medium_of(blank, 1)),
                    ContainsSubstring("namespace 1") && ContainsSubstring("as an ext2/3/4 file system"));
  bam::fs_medium failing = medium;
  failing.read = [](std::uint64_t, void*, std::size_t) { throw std::runtime_error("the medium stopped answering"); };
  CHECK_THROWS_WITH(bam::fs_image(failing), ContainsSubstring("the medium stopped answering"));
}
