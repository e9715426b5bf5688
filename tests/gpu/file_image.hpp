// SPDX-License-Identifier: MIT
// An ext4 image for the GPU file tests, made by mkfs -d and fragmented by
// debugfs, with the extent maps of its files (libext2fs). Built by g++ in
// file_image.cpp: nvcc's front end does not get through libext2fs's headers
// next to Catch2's test macros.
#pragma once

#include <bam/file/extent_map.hpp>
#include <bam/file/file_set.hpp>

#include <cstdint>
#include <string>
#include <vector>

struct test_fs_image {
  std::string path;                      //!< the image file
  std::vector<std::uint32_t> contiguous; //!< /contiguous.bin: not a whole number of pages
  std::vector<std::uint32_t> fragmented; //!< /fragmented.bin: in pieces, written into the gaps of freed files
  std::vector<std::uint32_t> sparse;     //!< /sparse.bin: zero blocks left out by mkfs (holes)
  bam::extent_map contiguous_map, fragmented_map, sparse_map;
};

//! The image (made once per process), its files mapped in blocks of `lba_size` bytes.
const test_fs_image& ext4_test_image(std::uint32_t lba_size);

//! An ext4 image of many files of assorted sizes (empty, under a block, a
//! block, just over a page, ~100 KiB) below /set, as a file set.
struct test_file_set_image {
  std::string path;
  bam::file_set set;                             //!< the files of /set, by index
  std::vector<std::vector<unsigned char>> bytes; //!< file i's bytes, as written
};

//! The image (made once per process and block size), its files mapped in blocks of `lba_size` bytes.
const test_file_set_image& ext4_file_set_image(std::uint32_t lba_size);
