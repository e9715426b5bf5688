// SPDX-License-Identifier: MIT
//! Row gathers over a `bam::array<T>` read as a row-major table of rows of
//! `row_width` elements (row r: elements [r * row_width, (r + 1) * row_width)),
//! e.g. a GNN feature table: one node's features a row.
//!
//!  - `bam::gather_row(a, id, row_width, out)`: device function, called by a
//!    whole warp (converged, all 32 lanes, same arguments): copies row `id`
//!    into `out[0..row_width)`. Rows may straddle pages; the warp keeps up to
//!    32 pages of the row in flight (`array_ref::copy_to`).
//!  - `bam::gather_rows(a, d_ids, count, row_width, d_out, stream)`: host
//!    function: row `d_ids[k]` into `d_out + k * row_width` for every k, one
//!    warp per row, on `stream`. Ids may repeat.
//!
//! An id past the last whole row is recorded in the array's error record
//! (index: the element index `id * row_width` of the row's first element,
//! status Out of Range), its output row is set to T{}, and the next
//! `a.check(stream)` throws `bam::error`: never a silent zero.
//!
//! @code
//!   bam::array<float> feats(cache, storage, nodes * dim);
//!   bam::gather_rows(feats, d_ids, count, dim, d_rows, stream); // ids: std::int64_t or std::uint64_t
//!   feats.check(stream);                                         // throws for a bad id
//!
//!   __global__ void mean_of_rows(bam::array_ref<float> f, const std::uint64_t* ids, std::uint32_t dim,
//!                                float* tmp) {
//!     const std::uint64_t warp = (blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x) / 32;
//!     bam::gather_row(f, ids[warp], dim, tmp + warp * dim); // the whole warp
//!     ...
//!   }
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/runtime/array.cuh>

#include <cstdint>
#include <string>
#include <type_traits>

namespace bam {

//! Whole rows of `a` for rows of `row_width` elements.
template <class T>
BAM_HD std::uint64_t row_count(const array_ref<T>& a, std::uint64_t row_width) {
  return row_width == 0 ? 0 : a.size() / row_width;
}

//! The whole warp copies row `id` of `a` (rows of `row_width` elements) into
//! `out[0..row_width)`. Returns false when the row could not be read (an id
//! past the last whole row, or a failed page): the failure is recorded for
//! `array::check` and the affected elements are T{}.
template <class T>
BAM_DEVICE bool gather_row(const array_ref<T>& a, std::uint64_t id, std::uint64_t row_width,
                           T* out) {
  if (id >= row_count(a, row_width)) {
    if (detail::lane_id() == 0) {
      // The element index of the row's first element (saturated where it overflows).
      constexpr std::uint64_t max = ~std::uint64_t{0};
      const std::uint64_t first = row_width != 0 && id > max / row_width ? max : id * row_width;
      if (a.err != nullptr) a.err->record(nvme::status_out_of_range, true, first, false, 0, 0);
    }
    for (std::uint64_t k = detail::lane_id(); k < row_width; k += 32)
      out[k] = T{};
    return false;
  }
  return a.copy_to(id * row_width, row_width, out);
}

namespace detail {

//! Threads per block of `gather_rows_kernel`.
inline constexpr unsigned gather_block_threads = 256;
//! Blocks of `gather_rows_kernel` at most: warps loop over the rows beyond.
inline constexpr unsigned gather_max_blocks = 1u << 15;

template <class T, class Id>
__global__ void __launch_bounds__(gather_block_threads)
    gather_rows_kernel(array_ref<T> a, const Id* ids, std::uint64_t count, std::uint64_t row_width,
                       T* out) {
  const std::uint64_t warp =
      (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  for (std::uint64_t r = warp; r < count; r += warps) {
    // A negative id converts to a huge one: out of range.
    const auto id = static_cast<std::uint64_t>(ids[r]);
    gather_row(a, id, row_width, out + r * row_width);
  }
}

} // namespace detail

//! Rows `d_ids[0..count)` of `a` (rows of `row_width` elements) into
//! `d_out[k * row_width ..)`, one warp per row, on `stream` (does not wait
//! for it). `d_ids` and `d_out` are GPU-accessible memory. Bad ids are
//! reported by the next `a.check(stream)`. Throws `bam::error` for a row
//! width of zero or wider than the array.
template <class T, class Id>
void gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width,
                 T* d_out, cudaStream_t stream = nullptr) {
  static_assert(std::is_integral_v<Id>, "row ids are integers");
  if (row_width == 0 || row_width > a.size())
    throw error("bam::gather_rows: row width " + std::to_string(row_width) + " (1 to the array's " +
                std::to_string(a.size()) + " elements)");
  if (count == 0) return;
  constexpr std::uint64_t warps_per_block = detail::gather_block_threads / 32;
  const std::uint64_t blocks = (count + warps_per_block - 1) / warps_per_block;
  const unsigned grid = static_cast<unsigned>(
      blocks < detail::gather_max_blocks ? blocks : detail::gather_max_blocks);
  detail::gather_rows_kernel<T, Id>
      <<<grid, detail::gather_block_threads, 0, stream>>>(a.ref(), d_ids, count, row_width, d_out);
  BAM_CUDA_TRY(cudaGetLastError());
}

} // namespace bam
