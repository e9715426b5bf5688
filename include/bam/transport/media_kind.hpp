// SPDX-License-Identifier: MIT
//! Where a software controller keeps its blocks: the media kinds device
//! strings name (`emu-gpu:hbm=4G`, `emu:file=...`, `emu-gpu:shm=NAME,size=64G`)
//! and the engines serve.
#pragma once

namespace bam {

enum class media_kind {
  ram,  //!< host RAM (the GPU engine: pinned and mapped into the GPU, PCIe-bound like an SSD array)
  hbm,  //!< GPU memory (GPU engine only)
  null, //!< no data: reads leave the target alone, writes are dropped (GPU engine only)
  file, //!< a file or block device (CPU engines only)
  shm,  //!< POSIX shared memory: one copy of the blocks for every process and GPU that opens its name
};

inline const char* media_name(media_kind m) {
  switch (m) {
  case media_kind::ram: return "ram";
  case media_kind::hbm: return "hbm";
  case media_kind::null: return "null";
  case media_kind::file: return "file";
  case media_kind::shm: return "shm";
  }
  return "?";
}

} // namespace bam
