// SPDX-License-Identifier: MIT
//! Row gathers and scatters over a `bam::array<T>` read as a row-major table
//! of rows of `row_width` elements (row r: elements [r * row_width, (r + 1) *
//! row_width)), e.g. a GNN feature table: one node's features a row.
//!
//!  - `bam::gather_row(a, id, row_width, out)`: device function, whole-warp
//!    (<bam/runtime/array_ref.cuh>: all 32 lanes, converged, same arguments): copies row `id`
//!    into `out[0..row_width)`. Rows may straddle pages; the warp keeps up to
//!    32 pages of the row in flight (`array_ref::copy_to`).
//!  - `bam::gather_rows(a, d_ids, count, row_width, d_out, stream)`: host
//!    function: row `d_ids[k]` into `d_out + k * row_width` for every k, on
//!    `stream`. Ids may repeat. A warp takes up to 32 rows at a time: its
//!    lanes bring in those rows' pages together (`array_ref::prefetch`), so
//!    that up to 32 misses are in flight per warp, then it copies the rows
//!    one by one (for a short list, one row per warp).
//!
//!  - `bam::scatter_row(a, id, row_width, in)` and `bam::scatter_rows(a,
//!    d_ids, count, row_width, d_in, stream)`: the other way: `in[0..row_width)`
//!    (`d_in + k * row_width`) written into row `id` (`d_ids[k]`) through the
//!    page cache, as `a.write(i, v)` writes (the pages pinned for writing and
//!    marked dirty; written back when evicted, on `flush`, on detach), with
//!    the same warps, rows per warp and look-ahead as the gathers. The cache
//!    holds whole pages: a page a row covers only part of is read first.
//!    Rows that share a page, or straddle two, land whole (warps write a
//!    page together, each its own bytes). An id given twice or more: each
//!    element of its row holds that element of one of the rows given for it
//!    (which one is unspecified, and may differ from element to element).
//!    A hot set made before is not updated (it is a snapshot).
//!
//!  - `<bam/runtime/hot_set.cuh>`: `bam::hot_rows<T>`, rows served from a
//!    copy in pinned host memory or GPU memory instead of the cache (`gather_row(a, id, row_width,
//!    out, hot.ref())`, `gather_rows(a, d_ids, count, row_width, d_out, hot,
//!    stream)`).
//!  - `<bam/runtime/row_holds.cuh>`: `bam::row_holds<T>`, look-ahead holds
//!    on the cached pages of rows soon to be gathered.
//!  This header includes both.
//!
//! An id past the last whole row is recorded in the array's error record
//! (index: the element index `id * row_width` of the row's first element,
//! status Out of Range), a gather's output row is set to T{} (a scatter
//! writes nothing), and the next `a.check(stream)` throws `bam::error`:
//! never a silent zero, never a silent drop.
//!
//! @code
//!   bam::array<float> feats(cache, storage, nodes * dim);
//!   bam::gather_rows(feats, d_ids, count, dim, d_rows, stream); // ids: std::int64_t or std::uint64_t
//!   feats.check(stream);                                         // throws for a bad id
//!   bam::scatter_rows(feats, d_ids, count, dim, d_new, stream);  // and back (distinct ids)
//!   feats.flush(stream);                                         // onto the storage
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
#include <bam/defaults.hpp>
#include <bam/runtime/array.cuh>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace bam {

// The hot set, defined in <bam/runtime/hot_set.cuh> (included at the end):
// the gathers take it, the hot set is filled by a gather.
template <class T>
class hot_rows_ref;
template <class T>
class hot_rows;

//! Whole rows of `a` for rows of `row_width` elements.
template <class T>
BAM_HD std::uint64_t row_count(const array_ref<T>& a, std::uint64_t row_width) {
  return row_width == 0 ? 0 : a.size() / row_width;
}

namespace detail {

//! Lane 0 records row `id` (past the last whole row) as Out of Range, at the
//! element index of the row's first element (saturated where it overflows).
template <class T>
BAM_DEVICE void record_bad_row(const array_ref<T>& a, std::uint64_t id, std::uint64_t row_width) {
  device_error_record* const err = ref_access::error_record(a);
  if (lane_id() != 0 || err == nullptr) return;
  constexpr std::uint64_t max = ~std::uint64_t{0};
  const std::uint64_t first = row_width != 0 && id > max / row_width ? max : id * row_width;
  err->record(nvme::status_out_of_range, failure_site::element(first));
}

} // namespace detail

//! The whole warp copies row `id` of `a` (rows of `row_width` elements) into
//! `out[0..row_width)`. Returns false when the row could not be read (an id
//! past the last whole row, or a failed page): the failure is recorded for
//! `array::check` and the affected elements are T{}.
//! @note Whole-warp.
template <class T>
BAM_DEVICE bool gather_row(const array_ref<T>& a, std::uint64_t id, std::uint64_t row_width, T* out) {
  if (id >= row_count(a, row_width)) {
    detail::record_bad_row(a, id, row_width);
    for (std::uint64_t k = detail::lane_id(); k < row_width; k += 32)
      out[k] = T{};
    return false;
  }
  return a.copy_to(id * row_width, row_width, out);
}

//! The whole warp copies row `id` into `out[0..row_width)`: from the hot
//! set's copy when the row is hot (and `row_width` is the hot set's),
//! else through the page cache as `gather_row` above.
//! @note Whole-warp.
template <class T>
BAM_DEVICE bool gather_row(const array_ref<T>& a, std::uint64_t id, std::uint64_t row_width, T* out,
                           const hot_rows_ref<T>& hot) {
  if (const T* h = row_width == hot.row_width() ? hot.find(id) : nullptr; h != nullptr) {
    const std::uint64_t len = row_width * sizeof(T);
    if (len % 4 == 0) // 16 bytes (else 4) a lane where the row and `out` allow it
      (void)detail::warp_copy_out(reinterpret_cast<unsigned char*>(out), reinterpret_cast<const unsigned char*>(h), len,
                                  detail::lane_id(), 0);
    else // element by element, never byte by byte
      for (std::uint64_t k = detail::lane_id(); k < row_width; k += 32)
        out[k] = h[k];
    return true;
  }
  return gather_row(a, id, row_width, out);
}

namespace detail {

//! The whole warp writes `in[0..count)` into elements [begin, begin + count)
//! of `a` (in range), through the page walker of `array_ref::copy_to`: each
//! lane asks for one page of the range for writing (up to 32 in flight), and
//! the warp writes each page's part as it arrives, then the lane lets the
//! page go (after every lane's stores: `release`). Pages are pinned for
//! writing as `array_ref::write` pins them, so marked dirty. Returns false
//! if a page could not be had (recorded, as a read's failure is; nothing
//! written there).
template <class T>
BAM_DEVICE bool scatter_range(const array_ref<T>& a, std::uint64_t begin, std::uint64_t count, const T* in) {
  if (count == 0) return true;
  const unsigned lane = lane_id();
  return ref_access::walk_pages<true>(
      a, begin, count,
      [&](std::uint32_t slot, std::uint64_t lo, std::uint64_t hi) {
        warp_copy_in(ref_access::element(a, slot, lo), in + (lo - begin), hi - lo, lane);
        return 0u;
      },
      [](std::uint64_t, std::uint64_t) {});
}

} // namespace detail

//! The whole warp writes `in[0..row_width)` into row `id` of `a` (rows of
//! `row_width` elements) through the page cache. Returns false when the row
//! could not be written (an id past the last whole row: nothing written; a
//! page that could not be read in: its part not written), the failure
//! recorded for `array::check`.
//! @note Whole-warp.
template <class T>
BAM_DEVICE bool scatter_row(const array_ref<T>& a, std::uint64_t id, std::uint64_t row_width, const T* in) {
  if (id >= row_count(a, row_width)) {
    detail::record_bad_row(a, id, row_width);
    return false;
  }
  return detail::scatter_range(a, id * row_width, row_width, in);
}

namespace detail {

//! Threads per block of `gather_rows_kernel` and `scatter_rows_kernel`.
inline constexpr unsigned gather_block_threads = 256;
//! Blocks of those kernels at most: warps loop over the rows beyond.
inline constexpr unsigned gather_max_blocks = 1u << 15;

//! The pages of a lane's row (see `hold_row_pages`): held, and whether
//! this lane owns the pin (lanes on one page share one, held by the lowest).
struct row_pins {
  std::uint32_t slot[2] = {0, 0};
  bool held[2] = {false, false};
  bool own[2] = {false, false};
};

//! Lanes that `want` page `key` (arrived in `slot`) pin it once, by their
//! lowest lane, so that a warp adds one pin to a page however many of its
//! rows lie there. Every lane of the group gets the pin's result; `owner`
//! says whether this lane holds it (and releases it).
template <class T>
BAM_DEVICE pin_result pin_shared(const array_ref<T>& a, bool want, std::uint32_t slot, std::uint64_t key, bool& owner) {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  // A lane that wants nothing is a group of its own (keys are below 2^41).
  const unsigned peers = __match_any_sync(full, want ? key : ~0ull - lane);
  const unsigned leader = __ffs(peers) - 1;
  pin_result r{0, pin_state::retry};
  if (want && lane == leader) r = ref_access::cache(a).pin_slot(slot, key);
  owner = want && lane == leader && r.state == pin_state::hit;
  return {__shfl_sync(full, r.slot, leader),
          static_cast<pin_state>(__shfl_sync(full, static_cast<unsigned>(r.state), leader))};
}

//! Every lane of the warp brings in the first page of its row (`cold`: a
//! row read through the cache), the warp's misses together, then the last
//! page where the row straddles two, so that the warp has up to 32 misses in
//! flight where one row at a time would have one or two.
//! When every such row lies within those pages, each lane then pins them
//! without waiting; if one pin fails (a page evicted meanwhile), none is
//! held. Returns whether the warp holds every cold row's pages.
template <class T>
BAM_DEVICE bool hold_row_pages(const array_ref<T>& a, std::uint64_t first, std::uint64_t row_width, bool cold,
                               row_pins& p) {
  constexpr unsigned full = 0xffffffffu;
  const std::uint64_t last = cold ? first + row_width - 1 : 0;
  const std::uint32_t shift = ref_access::elem_shift(a);
  const std::uint64_t pages = cold ? (last >> shift) - (first >> shift) + 1 : 0;
  std::uint32_t s0 = 0, s1 = 0;
  const bool arrived0 = a.prefetch(first, cold, &s0);
  const bool arrived1 = a.prefetch(last, pages > 1, &s1);
  if (!__all_sync(full, pages <= 2)) return false; // wide rows: copy_to reads their pages together itself
  // The slots pin_slot returns carry a dependency on the pin: the page's
  // data is read only after it.
  const pin_result r0 = pin_shared(a, arrived0, s0, ref_access::key_of(a, first), p.own[0]);
  const pin_result r1 = pin_shared(a, arrived1, s1, ref_access::key_of(a, last), p.own[1]);
  p.held[0] = arrived0 && r0.state == pin_state::hit;
  p.slot[0] = r0.slot;
  p.held[1] = arrived1 && r1.state == pin_state::hit;
  p.slot[1] = r1.slot;
  if (__all_sync(full, !cold || (p.held[0] && (pages < 2 || p.held[1])))) return true;
  for (int k = 0; k < 2; ++k)
    if (p.own[k]) ref_access::cache(a).release(p.slot[k]);
  p = row_pins{};
  return false;
}

//! The warp copies the row of `row_width` elements from element `first`
//! on, whose pages are held in `slot0` and (for the rest) `slot1`, into
//! `out`. Returns a dependency token (0) of every value read.
template <class T>
BAM_DEVICE unsigned copy_held_row(const array_ref<T>& a, std::uint64_t first, std::uint64_t row_width,
                                  std::uint32_t slot0, std::uint32_t slot1, T* out, unsigned lane) {
  const std::uint64_t per_page = a.elements_per_page();
  const std::uint64_t in_first = per_page - (first & (per_page - 1));
  const std::uint64_t n0 = row_width < in_first ? row_width : in_first;
  const page_cache_ref& cache = ref_access::cache(a);
  unsigned token = warp_copy_out(reinterpret_cast<unsigned char*>(out),
                                 reinterpret_cast<const unsigned char*>(ref_access::element(a, slot0, first)),
                                 n0 * sizeof(T), lane, ref_access::zero(cache));
  if (n0 < row_width)
    token |= warp_copy_out(reinterpret_cast<unsigned char*>(out + n0), cache.page_data(slot1),
                           (row_width - n0) * sizeof(T), lane, ref_access::zero(cache));
  return token;
}

template <class T, class Id>
__global__ void __launch_bounds__(gather_block_threads)
    gather_rows_kernel(array_ref<T> a, const Id* ids, std::uint64_t count, std::uint64_t row_width, T* out,
                       hot_rows_ref<T> hot, unsigned group) {
  constexpr unsigned full = 0xffffffffu;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = lane_id();
  const std::uint64_t rows = row_count(a, row_width);
  // Each warp takes `group` rows at a time (lane k names row k): their
  // pages are brought in together, then the whole warp copies one row
  // after another, from the pages it holds when it could pin them all.
  for (std::uint64_t g = warp * group; g < count; g += warps * group) {
    // A negative id converts to a huge one: out of range.
    const std::uint64_t id = lane < group && g + lane < count ? static_cast<std::uint64_t>(ids[g + lane]) : ~0ull;
    const bool cold = id < rows && (row_width != hot.row_width() || hot.find(id) == nullptr);
    const std::uint64_t first = cold ? id * row_width : 0;
    row_pins pins;
    const bool holding = group > 1 && hold_row_pages(a, first, row_width, cold, pins);
    const unsigned here = count - g < group ? static_cast<unsigned>(count - g) : group;
    unsigned token = 0;
    for (unsigned j = 0; j < here; ++j) {
      T* dst = out + (g + j) * row_width;
      if (holding && __shfl_sync(full, cold ? 1u : 0u, j) != 0)
        token |= copy_held_row(a, __shfl_sync(full, first, j), row_width, __shfl_sync(full, pins.slot[0], j),
                               __shfl_sync(full, pins.slot[1], j), dst, lane);
      else
        gather_row(a, __shfl_sync(full, id, j), row_width, dst, hot);
    }
    // The pins go once every lane's reads of the pages have arrived.
    token = __reduce_or_sync(full, token);
    for (int k = 0; k < 2; ++k)
      if (pins.own[k]) ref_access::cache(a).release_read(pins.slot[k], token);
  }
}

//! The write side of `gather_rows_kernel`: each warp takes `group` rows at
//! a time (lane k names row k), brings in their first and last pages
//! together (the warp's misses in flight at once: a page a row covers only
//! in part must be read before it is written), then writes the rows one
//! after another, each through `scatter_row` (which finds those pages in
//! the cache unless they were evicted meanwhile, and pins them for writing).
template <class T, class Id>
__global__ void __launch_bounds__(gather_block_threads)
    scatter_rows_kernel(array_ref<T> a, const Id* ids, std::uint64_t count, std::uint64_t row_width, const T* in,
                        unsigned group) {
  constexpr unsigned full = 0xffffffffu;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = lane_id();
  const std::uint64_t rows = row_count(a, row_width);
  for (std::uint64_t g = warp * group; g < count; g += warps * group) {
    // A negative id converts to a huge one: out of range.
    const std::uint64_t id = lane < group && g + lane < count ? static_cast<std::uint64_t>(ids[g + lane]) : ~0ull;
    if (group > 1) {
      const bool valid = id < rows;
      const std::uint64_t first = valid ? id * row_width : 0;
      const std::uint64_t last = valid ? first + row_width - 1 : 0;
      (void)a.prefetch(first, valid);
      const std::uint32_t shift = ref_access::elem_shift(a);
      (void)a.prefetch(last, valid && (last >> shift) != (first >> shift));
    }
    const unsigned here = count - g < group ? static_cast<unsigned>(count - g) : group;
    for (unsigned j = 0; j < here; ++j)
      scatter_row(a, __shfl_sync(full, id, j), row_width, in + (g + j) * row_width);
  }
}

//! Rows per warp at a time: 32 (the most misses in flight) when there are
//! rows enough to keep `gather_target_warps` warps busy, fewer for small
//! gathers (down to one row per warp), which gain more from more warps.
//! `bam::defaults::gather_rows_per_warp` (BAM_GATHER_ROWS_PER_WARP) sets it
//! instead (1: one row per warp, nothing brought in ahead). Scatters alike.
inline constexpr std::uint64_t gather_target_warps = 4096;
inline unsigned gather_group(std::uint64_t count) {
  if (const unsigned forced = defaults::gather_rows_per_warp(); forced != 0) return forced;
  const std::uint64_t g = (count + gather_target_warps - 1) / gather_target_warps;
  return static_cast<unsigned>(g < 1 ? 1 : g > 32 ? 32 : g);
}

//! Checks a row width and rows per warp for `what` (a function's name);
//! returns the rows per warp to use (`gather_group` where 0).
template <class T>
unsigned rows_per_warp_for(const char* what, const array<T>& a, std::uint64_t row_width, std::uint64_t count,
                           unsigned rows_per_warp) {
  if (row_width == 0 || row_width > a.size())
    throw error(std::string(what) + ": row width " + std::to_string(row_width) + " (1 to the array's " +
                std::to_string(a.size()) + " elements)");
  if (rows_per_warp > 32)
    throw error(std::string(what) + ": " + std::to_string(rows_per_warp) + " rows per warp (1 to 32)");
  return rows_per_warp != 0 ? rows_per_warp : gather_group(count);
}

//! Blocks of `gather_block_threads` for `count` rows, `group` a warp.
inline unsigned rows_grid(std::uint64_t count, unsigned group) {
  constexpr std::uint64_t warps_per_block = gather_block_threads / 32;
  const std::uint64_t warps = (count + group - 1) / group;
  const std::uint64_t blocks = (warps + warps_per_block - 1) / warps_per_block;
  return static_cast<unsigned>(blocks < gather_max_blocks ? blocks : gather_max_blocks);
}

template <class T, class Id>
void launch_gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width, T* d_out,
                        const hot_rows_ref<T>& hot, cudaStream_t stream, unsigned rows_per_warp = 0) {
  static_assert(std::is_integral_v<Id>, "row ids are integers");
  const unsigned group = rows_per_warp_for("bam::gather_rows", a, row_width, count, rows_per_warp);
  if (count == 0) return;
  const device_scope on(a.device());
  gather_rows_kernel<T, Id><<<rows_grid(count, group), gather_block_threads, 0, stream>>>(a.ref(), d_ids, count,
                                                                                          row_width, d_out, hot, group);
  BAM_CUDA_TRY(cudaGetLastError());
}

template <class T, class Id>
void launch_scatter_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width, const T* d_in,
                         cudaStream_t stream, unsigned rows_per_warp = 0) {
  static_assert(std::is_integral_v<Id>, "row ids are integers");
  const unsigned group = rows_per_warp_for("bam::scatter_rows", a, row_width, count, rows_per_warp);
  if (count == 0) return;
  const device_scope on(a.device());
  scatter_rows_kernel<T, Id>
      <<<rows_grid(count, group), gather_block_threads, 0, stream>>>(a.ref(), d_ids, count, row_width, d_in, group);
  BAM_CUDA_TRY(cudaGetLastError());
}

} // namespace detail

//! Rows `d_ids[0..count)` of `a` (rows of `row_width` elements) into
//! `d_out[k * row_width ..)`, whole warps per row, on `stream` (does not wait
//! for it). `d_ids` and `d_out` are GPU-accessible memory. Bad ids are
//! reported by the next `a.check(stream)`. Throws `bam::error` for a row
//! width of zero or wider than the array.
template <class T, class Id>
void gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width, T* d_out,
                 cuda::stream_ref stream = {}) {
  detail::launch_gather_rows(a, d_ids, count, row_width, d_out, hot_rows_ref<T>{}, stream.get());
}

//! The same, with the rows of the hot set `hot` (<bam/runtime/hot_set.cuh>)
//! read from its copy. Throws `bam::error` when `hot` was made for
//! another row width or another table.
template <class T, class Id>
void gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width, T* d_out,
                 const hot_rows<T>& hot, cuda::stream_ref stream = {}) {
  if (hot.size() != 0 && hot.row_width() != row_width)
    throw error("bam::gather_rows: the hot set holds rows of " + std::to_string(hot.row_width()) + " elements, not " +
                std::to_string(row_width));
  if (hot.size() != 0 && hot.table_elements() != a.size())
    throw error("bam::gather_rows: the hot set was made from a table of " + std::to_string(hot.table_elements()) +
                " elements, this array holds " + std::to_string(a.size()));
  detail::launch_gather_rows(a, d_ids, count, row_width, d_out, hot.ref(), stream.get());
}

//! `d_in[k * row_width ..)` into row `d_ids[k]` of `a` (rows of `row_width`
//! elements) for every k < count, through the page cache (pages marked
//! dirty: on the storage after a write-back, e.g. `a.flush(stream)`), whole
//! warps per row, on `stream` (does not wait for it). `d_ids` and `d_in` are
//! GPU-accessible memory, left unchanged. Ids should be distinct: for an id
//! given more than once, which of its rows lands is unspecified (element by
//! element). Bad ids (nothing written for them) are reported by the next
//! `a.check(stream)`. Throws `bam::error` for a row width of zero or wider
//! than the array.
template <class T, class Id>
void scatter_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width, const T* d_in,
                  cuda::stream_ref stream = {}) {
  detail::launch_scatter_rows(a, d_ids, count, row_width, d_in, stream.get());
}

} // namespace bam

// After the gathers: the hot set is filled by one.
#include <bam/runtime/hot_set.cuh>
#include <bam/runtime/row_holds.cuh>
