// SPDX-License-Identifier: MIT
//! Moving a data set between a file (or any byte source) and a namespace of an
//! NVMe controller: `load_dataset` writes it onto the device, `dump_dataset`
//! reads it back. Both run over any transport the controller driver drives
//! (the software controller, a controller bound to bam's kernel module), keep
//! several chunks in flight on several I/O queues, and report an XXH3-128
//! checksum of the bytes moved, the value `xxhsum -H2 FILE` prints for the
//! same bytes, so a load and a later dump can be compared with each other and
//! with the source.
//!
//! A load is resumable. It records, in a small state file, each chunk that
//! reached the device (only after an NVMe Flush covered it) with the chunk's
//! checksum; an interrupted load (Ctrl-C, a killed process, a failed command)
//! run again with the same source, device, offset and chunk size skips every
//! recorded chunk whose source bytes still hash the same and writes the rest.
//! The state file is removed when the load completes.
//!
//! @code
//!   bam::controller
//!   ctrl(bam::open_host_transports(bam::parse_device("emu:file=/tmp/d.img")).at(0));
//!   bam::dataset_options o;
//!   o.offset = 1 << 20;                        // bytes; a multiple of the LBA size
//!   o.verify = true;                           // read every chunk back
//!   auto r = bam::load_dataset(ctrl, "features.bin", o);
//!   std::printf("%llu bytes, %s\n", (unsigned long long)r.bytes, r.checksum.c_str());
//!   auto back = bam::dump_dataset(ctrl, "copy.bin", r.bytes, o);   // back.checksum == r.checksum
//! @endcode
#pragma once

#include <bam/driver/controller.hpp>
#include <bam/error.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace bam {

//! How far a transfer is, reported after each chunk (from the calling thread).
struct transfer_progress {
  std::uint64_t bytes_done = 0; //!< including chunks skipped on resume
  std::uint64_t bytes_total = 0;
  std::uint64_t chunks_done = 0;
  std::uint64_t chunks_total = 0;
  double seconds = 0; //!< since the transfer started
};

struct dataset_options {
  std::uint32_t nsid = 1;
  std::uint64_t offset = 0;                               //!< byte offset on the namespace (a multiple of its LBA size)
  std::uint64_t chunk_bytes = 1ull << 20;                 //!< bytes per chunk (a multiple of the LBA size)
  std::uint32_t queues = 0;                               //!< I/O queues to use (0: the controller's, at most 8)
  std::uint32_t in_flight = 0;                            //!< chunks in flight (0: two per queue, at most 16)
  std::uint64_t max_bytes_per_second = 0;                 //!< throttle (0: none)
  bool verify = false;                                    //!< load: read every chunk back and compare checksums
  std::string state_path;                                 //!< load: state file (default: the source path + ".bam-load")
  bool resume = true;                                     //!< load: false ignores (and replaces) a state file
  std::uint64_t state_interval_ms = 1000;                 //!< load: flush the device and record chunks this often
  std::function<void(const transfer_progress&)> progress; //!< may be empty
  const std::atomic<bool>* cancel = nullptr;              //!< set it (e.g. from SIGINT) to stop cleanly
};

struct dataset_result {
  std::uint64_t bytes = 0; //!< data set size
  std::uint64_t chunks = 0;
  std::uint64_t resumed_chunks = 0;  //!< load: chunks already on the device from an earlier run
  std::uint64_t verified_chunks = 0; //!< load with verify: chunks read back and found equal
  std::string checksum;              //!< "xxh128:" + 32 hex digits, as `xxhsum -H2` prints it
  double seconds = 0;
  std::string state_path; //!< load: the state file used
};

//! A source of bytes for `load_dataset`: `size` bytes, `read(offset, dst, len)`
//! fills `dst` (throws on failure). `identity` names it in the state file.
struct data_source {
  std::uint64_t size = 0;
  std::string identity;
  std::function<void(std::uint64_t offset, void* dst, std::size_t len)> read;
};

//! Write `src` to namespace `o.nsid` of `c` starting at byte `o.offset`. The
//! tail of the last block beyond the data is written as zeroes. Throws
//! `bam::error` saying what failed (a device error names the LBA and status);
//! what reached the device before stays recorded for a resume.
inline dataset_result load_dataset(controller& c, const data_source& src, const dataset_options& o = {});
//! `load_dataset` from a file.
inline dataset_result load_dataset(controller& c, const std::string& path, const dataset_options& o = {});

//! Read `length` bytes from namespace `o.nsid` of `c` at byte `o.offset` into
//! the file `path` (created or truncated; "-" is standard output).
inline dataset_result dump_dataset(controller& c, const std::string& path, std::uint64_t length,
                                   const dataset_options& o = {});

//! XXH3-128 of a whole file in the form the results use ("xxh128:...").
inline std::string file_checksum(const std::string& path);

} // namespace bam

#include <bam/host/detail/dataset_impl.hpp>
