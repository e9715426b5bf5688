// SPDX-License-Identifier: MIT
#include "file_image.hpp"

#include <bam/file/fs_image.hpp>

#include "../scratch_dir.hpp"

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

//! A scratch directory of this file's tests.
struct scratch : bam_test::scratch_dir {
  scratch() : bam_test::scratch_dir("bam-gpu-files") {}
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

const test_file_set_image& ext4_file_set_image(std::uint32_t lba_size) {
  static scratch s;
  static std::map<std::uint32_t, std::unique_ptr<test_file_set_image>> made;
  auto& img = made[lba_size];
  if (img) return *img;
  img = std::make_unique<test_file_set_image>();
  img->path = (s.dir / ("set-" + std::to_string(lba_size) + ".img")).string();
  const fs::path dir = s.dir / ("set-src-" + std::to_string(lba_size));
  fs::create_directories(dir / "set" / "sub");
  std::vector<std::size_t> sizes{0, 1, 100, 511, 512, 1023, 1024, 1025, 4095, 4096, 4097, 8195, 20000, 65536, 102407};
  std::mt19937_64 rng(77);
  for (int i = 0; i < 40; ++i)
    sizes.push_back(i % 9 == 0 ? 0 : rng() % (12 * 1024));
  std::map<std::string, std::vector<unsigned char>> by_path;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string rel = (i % 3 == 0 ? "set/sub/f" : "set/f") + std::to_string(i);
    std::vector<unsigned char> b(sizes[i]);
    for (auto& c : b)
      c = static_cast<unsigned char>(rng() | 1); // never zero: a zeroed page cannot pass for data
    std::ofstream f(dir / rel, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    REQUIRE(f.good());
    by_path["/" + rel] = std::move(b);
  }
  run("truncate -s 4M " + img->path);
  run("mkfs.ext4 -q -F -b 1024 -N 128 -O ^has_journal -d " + dir.string() + " " + img->path);
  const bam::fs_image fsi(img->path, 0, lba_size);
  img->set = fsi.map_files("/set");
  REQUIRE(img->set.size() == sizes.size());
  for (std::uint64_t i = 0; i < img->set.size(); ++i)
    img->bytes.push_back(by_path.at(img->set.path(i)));
  return *img;
}
