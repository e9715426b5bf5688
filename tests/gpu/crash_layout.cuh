// SPDX-License-Identifier: MIT
// What the crash test and its writer process agree on: a file of guard
// words with an array of uint32 inside it, the pattern flushed before the
// crash and the one written (never flushed) while the writer is killed.
#pragma once

#include <cstdint>
#include <string>

namespace bam_crash {

inline constexpr std::uint32_t lba_size = 512;
inline constexpr std::size_t page_size = 4096;
inline constexpr std::uint64_t array_lba = 2048;               //!< 1 MiB of guard words before the array
inline constexpr std::uint64_t elements = 4ull << 20;          //!< 16 MiB of uint32
inline constexpr std::uint64_t rewritten = elements / 2;       //!< after the flush only [0, rewritten) is written
inline constexpr std::uint64_t trailing_guard_bytes = 1 << 20; //!< after the array
inline constexpr std::uint64_t array_offset = array_lba * lba_size;
inline constexpr std::uint64_t file_bytes = array_offset + elements * 4 + trailing_guard_bytes;
inline constexpr std::size_t cache_bytes = 2 << 20; //!< smaller than the rewritten part: it is evicted and written back

__host__ __device__ inline std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}
//! Word w (byte offset 4w) of the file outside the array.
__host__ __device__ inline std::uint32_t guard_word(std::uint64_t w) { return mix(w ^ 0x6a09e667f3bcc908ull); }
//! Element i as flushed before the crash.
__host__ __device__ inline std::uint32_t flushed_value(std::uint64_t i) { return mix(i * 2 + 1); }
//! Element i as written after the flush (never flushed).
__host__ __device__ inline std::uint32_t unflushed_value(std::uint64_t i) { return mix(i * 2 + 2) | 1u; }

//! The storage over the file, for the writer and for the process after it.
inline std::string device_string(const std::string& path) {
  return "emu:file=" + path + ",queues=16,depth=64,threads=4";
}

//! What the writer says on its pipe.
inline constexpr char flushed_mark = 'F';   //!< the first pattern is written and flushed
inline constexpr char in_flight_mark = 'W'; //!< unflushed writes are being written back by evictions

} // namespace bam_crash
