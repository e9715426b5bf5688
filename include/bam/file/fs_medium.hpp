// SPDX-License-Identifier: MIT
//! `bam::fs_medium`: bytes of a medium that holds a file system, read on
//! request. `bam::fs_image` reads a file system through one when the file
//! system is not in a file or block device of this machine: an SSD bound to
//! bam's driver, which the kernel cannot mount, or a software controller's
//! media (`bam::fs_medium_of(controller, nsid)` in bam/file/mapped_file.hpp
//! reads a namespace with NVMe read commands).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace bam {

struct fs_medium {
  std::string name;             //!< for messages and the maps' device (e.g. "/dev/bam-nvme1 namespace 1")
  std::uint64_t bytes = 0;      //!< its size
  std::uint32_t lba_size = 512; //!< its logical block: maps of its files count in these
  //! `n` bytes at byte `offset` into `dst`; throws on failure.
  std::function<void(std::uint64_t offset, void* dst, std::size_t n)> read;
};

} // namespace bam
