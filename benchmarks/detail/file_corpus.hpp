// SPDX-License-Identifier: MIT
// A corpus of many files for file_bench: made in a directory, packed into an
// ext4 image by mkfs.ext4 -d, its files mapped with libext2fs. Built by the
// host compiler (file_corpus.cpp): nvcc's front end is kept away from
// libext2fs's headers.
#pragma once

#include <bam/detail/macros.hpp>
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

} // namespace bench
