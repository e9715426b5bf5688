// SPDX-License-Identifier: MIT
#include "file_image.hpp"

#include <bam/file/fs_image.hpp>

#include <catch2/catch_test_macros.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>

namespace fs = std::filesystem;

namespace {

std::vector<std::uint32_t> random_words(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& w : v)
    w = static_cast<std::uint32_t>(rng()) | 1u; // never zero: a zeroed page cannot pass for data
  return v;
}

void write_words(const fs::path& p, const std::vector<std::uint32_t>& w) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
  REQUIRE(f.good());
}

void run(const std::string& cmd) {
  INFO(cmd);
  REQUIRE(std::system(("PATH=/usr/sbin:/sbin:$PATH " + cmd + " > /dev/null 2>&1").c_str()) == 0);
}

//! A scratch directory, removed at exit.
struct scratch {
  fs::path dir;
  scratch() {
    std::string t = (fs::temp_directory_path() / "bam-gpu-files-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    dir = t;
    fs::create_directories(dir / "src");
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

} // namespace

const test_fs_image& ext4_test_image(std::uint32_t lba_size) {
  static scratch s;
  static std::map<std::uint32_t, std::unique_ptr<test_fs_image>> made;
  auto& img = made[lba_size];
  if (img) return *img;
  img = std::make_unique<test_fs_image>();
  img->path = (s.dir / ("ext4-" + std::to_string(lba_size) + ".img")).string();
  img->contiguous = random_words(300 * 1024 / 4 + 37, 1);
  img->fragmented = random_words(400 * 1024 / 4, 2);
  img->sparse = random_words(256 * 1024 / 4, 3);
  std::fill(img->sparse.begin() + 16 * 1024, img->sparse.begin() + 48 * 1024, 0u); // mkfs -d leaves them out
  write_words(s.dir / "src" / "contiguous.bin", img->contiguous);
  write_words(s.dir / "src" / "sparse.bin", img->sparse);
  for (int i = 0; i < 100; ++i)
    write_words(s.dir / "src" / ("filler" + std::to_string(i)), random_words(32 * 1024 / 4, 100 + i));
  run("truncate -s 6M " + img->path);
  run("mkfs.ext4 -q -F -b 1024 -N 256 -O ^has_journal -d " + (s.dir / "src").string() + " " + img->path);
  // Free every other filler, then write a file larger than any gap: it lands in pieces.
  write_words(s.dir / "fragmented.src", img->fragmented);
  {
    std::ofstream cmds(s.dir / "cmds");
    for (int i = 0; i < 100; i += 2)
      cmds << "rm /filler" << i << "\n";
    cmds << "write " << (s.dir / "fragmented.src").string() << " /fragmented.bin\n";
  }
  run("debugfs -w -f " + (s.dir / "cmds").string() + " " + img->path);
  const bam::fs_image fsi(img->path, 0, lba_size);
  img->contiguous_map = fsi.map("/contiguous.bin");
  img->fragmented_map = fsi.map("/fragmented.bin");
  bam::extent_map_options holes;
  holes.allow_holes = true;
  img->sparse_map = fsi.map("/sparse.bin", holes);
  return *img;
}
