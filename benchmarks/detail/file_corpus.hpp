// SPDX-License-Identifier: MIT
// A corpus of many files for file_bench: made in a directory, packed into an
// ext4 image by mkfs.ext4 -d, its files mapped with libext2fs. Built by the
// host compiler (file_corpus.cpp): nvcc's front end is kept away from
// libext2fs's headers.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/file/extent_map.hpp>
#include <bam/file/file_set.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

//! Byte `off` of file `i` of the corpus (what the GPU checks after reading).
BAM_HD inline unsigned char corpus_byte(std::uint64_t i, std::uint64_t off) {
  std::uint64_t x = (i << 40) ^ (off >> 3) ^ 0x9e3779b97f4a7c15ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x >> ((off & 7) * 8));
}

struct corpus_options {
  std::uint64_t files = 10000;
  std::uint64_t mean_bytes = 110 * 1024; //!< ImageNet's JPEGs: about 110 KiB on average
  std::uint64_t seed = 1;
  std::string dir; //!< where the files and the image go (made; removed by the caller)
};

struct corpus {
  std::string image;                   //!< the ext4 image
  std::vector<std::string> paths;      //!< file i's path in `dir` (for the CPU loader)
  std::vector<std::uint64_t> file_ids; //!< file i's id in corpus_byte
  bam::file_set set;                   //!< the image's files, mapped in blocks of lba_size
  std::uint64_t image_bytes = 0;
};

//! Writes the files, makes the image and maps it in blocks of `lba_size`.
corpus make_corpus(const corpus_options& o, std::uint32_t lba_size);

//! 4-byte word `w` of the one large file of make_large_file.
BAM_HD inline std::uint32_t large_file_word(std::uint64_t w) {
  std::uint64_t x = w ^ 0x2545f4914f6cdd1dull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

struct large_file {
  std::string image;   //!< the ext4 image (4 KiB blocks)
  std::string path;    //!< the file in the directory the image was made from
  bam::extent_map map; //!< its extent map in the image, in blocks of lba_size
  std::uint64_t image_bytes = 0;
};

//! One file of `bytes` (a multiple of 4 KiB) of large_file_word in `dir`,
//! packed into an ext4 image by mkfs.ext4 -d and mapped in blocks of `lba_size`.
large_file make_large_file(const std::string& dir, std::uint64_t bytes, std::uint32_t lba_size);

} // namespace bench
