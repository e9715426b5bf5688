// SPDX-License-Identifier: MIT
//! Where the blocks of a file lie on its disk, in a form host and device code
//! both read: two arrays of runs, searched by bisection. Built by
//! `bam::extent_map` (extent_map.hpp) from the file system's own mapping.
//!
//! Run i covers the file's logical blocks [start[i], start[i+1]) and begins at
//! the disk's logical block lba[i], or is a hole (`extent_hole`: reads as
//! zeroes). Blocks are the disk's logical blocks (1 << lba_shift bytes), so a
//! lookup gives the LBA a read command names directly. 16 bytes per run: a
//! file of a million fragments costs 16 MB wherever the map lives.
//!
//! @code
//!   const bam::extent_map_ref m = map.ref();
//!   bam::extent_map_ref::where w = m.find(file_offset >> m.lba_shift);
//!   // w.blocks == 0: past the end; w.lba == bam::extent_hole: zeroes;
//!   // else blocks [w.lba, w.lba + w.blocks) of the disk hold the file from there on.
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>

#include <cstdint>

namespace bam {

//! The disk LBA of a run that is not on the disk (a hole, or an unwritten
//! extent when the map allows them): reads as zeroes.
inline constexpr std::uint64_t extent_hole = ~std::uint64_t{0};

struct extent_map_ref {
  const std::uint64_t* start =
      nullptr;                        //!< runs + 1 entries: first file block of each run; start[runs] = blocks covered
  const std::uint64_t* lba = nullptr; //!< runs entries: disk LBA of each run's first block, or extent_hole
  std::uint64_t runs = 0;
  std::uint64_t file_size = 0; //!< bytes; the last block may be partly past it
  std::uint32_t lba_shift = 9; //!< log2 of the disk's logical block size

  //! A run of file blocks that are contiguous on the disk (or all a hole).
  struct where {
    std::uint64_t lba = extent_hole; //!< disk LBA of the block asked for, or extent_hole
    std::uint64_t blocks = 0;        //!< blocks from there to the end of the run; 0: past the end of the file
  };

  BAM_HD std::uint64_t blocks() const { return runs == 0 ? 0 : start[runs]; }

  //! The run that holds file block `block` (O(log runs)).
  BAM_HD where find(std::uint64_t block) const {
    if (runs == 0 || block >= start[runs]) return {};
    std::uint64_t lo = 0, hi = runs; // start[lo] <= block < start[hi]
    while (hi - lo > 1) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      if (start[mid] <= block)
        lo = mid;
      else
        hi = mid;
    }
    const std::uint64_t into = block - start[lo];
    return {lba[lo] == extent_hole ? extent_hole : lba[lo] + into, start[lo + 1] - block};
  }
};

} // namespace bam
