// SPDX-License-Identifier: MIT
#include "file_corpus.hpp"

#include <bam/file/fs_image.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>

namespace bench {

namespace fs = std::filesystem;

corpus make_corpus(const corpus_options& o, std::uint32_t lba_size) {
  corpus c;
  const fs::path src = fs::path(o.dir) / "src";
  fs::create_directories(src);
  std::mt19937_64 rng(o.seed);
  std::lognormal_distribution<double> size_of(std::log(static_cast<double>(o.mean_bytes)) - 0.125, 0.5);
  std::map<std::string, std::uint64_t> id_of;
  std::uint64_t total = 0;
  std::vector<unsigned char> buf;
  for (std::uint64_t i = 0; i < o.files; ++i) {
    const auto bytes =
        static_cast<std::uint64_t>(std::clamp(size_of(rng), 512.0, 16.0 * static_cast<double>(o.mean_bytes)));
    const std::string rel = "d" + std::to_string(i % 100) + "/f" + std::to_string(i);
    fs::create_directories(src / ("d" + std::to_string(i % 100)));
    buf.resize(bytes);
    for (std::uint64_t k = 0; k < bytes; ++k)
      buf[k] = corpus_byte(i, k);
    std::ofstream f(src / rel, std::ios::binary);
    f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(bytes));
    if (!f) throw std::runtime_error("writing " + (src / rel).string());
    id_of["/" + rel] = i;
    total += (bytes + 4095) / 4096 * 4096;
  }
  c.image = (fs::path(o.dir) / "corpus.img").string();
  c.image_bytes = (total + total / 8 + (64ull << 20) + (1ull << 20) - 1) / (1ull << 20) * (1ull << 20);
  const std::string mk = "PATH=/usr/sbin:/sbin:$PATH mkfs.ext4 -q -F -b 4096 -N " + std::to_string(o.files + 256) +
                         " -O ^has_journal -d " + src.string() + " " + c.image + " " +
                         std::to_string(c.image_bytes / 1024) + "k > /dev/null 2>&1";
  if (std::system(mk.c_str()) != 0) throw std::runtime_error("mkfs.ext4 -d failed: " + mk);
  const bam::fs_image img(c.image, 0, lba_size);
  c.set = img.map_files("/");
  for (std::uint64_t i = 0; i < c.set.size(); ++i) {
    c.paths.push_back((src / c.set.path(i).substr(1)).string());
    c.file_ids.push_back(id_of.at(c.set.path(i)));
  }
  return c;
}

large_file make_large_file(const std::string& dir, std::uint64_t bytes, std::uint32_t lba_size) {
  if (bytes == 0 || bytes % 4096 != 0)
    throw std::runtime_error("the large file must be a whole number of 4 KiB blocks");
  large_file f;
  const fs::path src = fs::path(dir) / "large";
  fs::create_directories(src);
  f.path = (src / "data.bin").string();
  {
    std::ofstream out(f.path, std::ios::binary);
    std::vector<std::uint32_t> chunk(1u << 20);
    for (std::uint64_t w = 0; w < bytes / 4;) {
      const std::uint64_t take = std::min<std::uint64_t>(chunk.size(), bytes / 4 - w);
      for (std::uint64_t k = 0; k < take; ++k)
        chunk[k] = large_file_word(w + k);
      out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(take * 4));
      w += take;
    }
    if (!out) throw std::runtime_error("writing " + f.path);
  }
  f.image = (fs::path(dir) / "large.img").string();
  f.image_bytes = (bytes + bytes / 16 + (64ull << 20) + (1ull << 20) - 1) / (1ull << 20) * (1ull << 20);
  const std::string mk = "PATH=/usr/sbin:/sbin:$PATH mkfs.ext4 -q -F -b 4096 -O ^has_journal -d " + src.string() + " " +
                         f.image + " " + std::to_string(f.image_bytes / 1024) + "k > /dev/null 2>&1";
  if (std::system(mk.c_str()) != 0) throw std::runtime_error("mkfs.ext4 -d failed: " + mk);
  const bam::fs_image img(f.image, 0, lba_size);
  f.map = img.map("/data.bin");
  return f;
}

} // namespace bench
