// SPDX-License-Identifier: MIT
//! Warp-wide copies of the software controller's device code: a whole warp
//! moves one command's data, 16-byte loads, several in flight (PCIe reads of
//! pinned host memory are latency-bound).
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/detail/memory_ops.cuh>

#include <cstdint>

namespace bam::emu::detail {

BAM_DEVICE inline unsigned lane_index() {
  unsigned l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

//! The whole warp (`mask`, converged) copies `len` bytes. Loads and stores
//! bypass L1 (not coherent across SMs): the bytes were written, or will be
//! read, elsewhere. `SrcRewritten`: the source is host memory the host
//! rewrites (staging bytes): loaded with `ld.cv`.
template <bool SrcRewritten = false>
BAM_DEVICE inline void warp_copy(void* dst, const void* src, std::uint64_t len, unsigned mask) {
  const auto load = [](const auto* p) {
    if constexpr (SrcRewritten)
      return bam::detail::ld_cv(p);
    else
      return bam::detail::ld_cg(p);
  };
  const unsigned lanes = __popc(mask);
  const unsigned me = __popc(mask & ((1u << lane_index()) - 1));
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  if (((d | s | len) & 15u) == 0) {
    auto* dv = static_cast<uint4*>(dst);
    const auto* sv = static_cast<const uint4*>(src);
    const std::uint64_t n = len / 16;
    constexpr unsigned in_flight = 8; // PCIe reads from pinned host memory are latency-bound
    std::uint64_t i = me;
    for (; i + (in_flight - 1) * lanes < n; i += in_flight * lanes) {
      uint4 r[in_flight];
#pragma unroll
      for (unsigned k = 0; k < in_flight; ++k)
        r[k] = load(sv + i + k * lanes);
#pragma unroll
      for (unsigned k = 0; k < in_flight; ++k)
        bam::detail::st_cg(dv + i + k * lanes, r[k]);
    }
    for (; i < n; i += lanes)
      bam::detail::st_cg(dv + i, load(sv + i));
  } else {
    // PRP offsets are dword aligned: 4-byte words always work.
    auto* dv = static_cast<unsigned*>(dst);
    const auto* sv = static_cast<const unsigned*>(src);
    for (std::uint64_t i = me; i < len / 4; i += lanes)
      bam::detail::st_cg(dv + i, load(sv + i));
    auto* db = static_cast<unsigned char*>(dst);
    const auto* sb = static_cast<const unsigned char*>(src);
    for (std::uint64_t i = (len & ~3ull) + me; i < len; i += lanes)
      db[i] = load(sb + i);
  }
}

BAM_DEVICE inline void warp_zero(void* dst, std::uint64_t len, unsigned mask) {
  const unsigned lanes = __popc(mask);
  const unsigned me = __popc(mask & ((1u << lane_index()) - 1));
  auto* b = static_cast<unsigned char*>(dst);
  if ((reinterpret_cast<std::uintptr_t>(dst) & 15u) == 0) {
    for (std::uint64_t i = me; i < len / 16; i += lanes)
      bam::detail::st_cg(reinterpret_cast<uint4*>(b) + i, uint4{0, 0, 0, 0});
    for (std::uint64_t i = (len & ~15ull) + me; i < len; i += lanes)
      b[i] = 0;
  } else {
    for (std::uint64_t i = me; i < len; i += lanes)
      b[i] = 0;
  }
}

} // namespace bam::emu::detail
