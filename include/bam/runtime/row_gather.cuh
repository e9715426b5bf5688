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
//!    function: row `d_ids[k]` into `d_out + k * row_width` for every k, on
//!    `stream`. Ids may repeat. A warp takes up to 32 rows at a time: its
//!    lanes bring in those rows' pages together (`array_ref::prefetch`), so
//!    that up to 32 misses are in flight per warp, then it copies the rows
//!    one by one (for a short list, one row per warp).
//!
//!  - `bam::hot_rows<T>(a, row_width, ids)`: a hot set: a copy of rows `ids`
//!    (e.g. the most referenced nodes of a graph) in pinned host memory,
//!    which `gather_row(a, id, row_width, out, hot.ref())` and
//!    `gather_rows(a, d_ids, count, row_width, d_out, hot, stream)` read
//!    zero-copy over PCIe instead of through the page cache: those rows
//!    never cost a miss nor take a cache slot. A snapshot, taken when it is
//!    made: for tables that are read, not written.
//!
//!  - `bam::row_holds<T>(a)`: look-ahead holds. `holds.hold(d_ids, count,
//!    row_width, stream)` pins the pages of rows that gathers soon to come
//!    will read, those in the cache at that moment (it loads nothing and
//!    waits for nothing), so that eviction skips them until
//!    `holds.release(stream)`: the misses of the gathers before (on other
//!    streams too) and of their own gather cannot evict them first. At
//!    most half the ways of each cache set are held at once (a page past
//!    that is simply not held), so misses always find a slot.
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

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

//! Device view of a `hot_rows<T>`; the default one holds nothing. Which
//! rows are hot is a bitmap with a running count per 64 rows (3 bytes per 16
//! rows of the table, however few are hot): a row's place in `data` is the
//! count of hot rows before it.
template <class T>
struct hot_rows_ref {
  const std::uint64_t* bits = nullptr; //!< bit r % 64 of word r / 64: row r is hot
  const std::uint32_t* before = nullptr; //!< hot rows before word w
  const T* data = nullptr;               //!< the hot rows in increasing id order (pinned host memory, mapped)
  std::uint64_t rows = 0;                //!< rows the bitmap covers: the table's whole rows
  std::uint64_t row_width = 0;

  //! Row `id` in host memory, or nullptr when it is not hot.
  BAM_DEVICE const T* find(std::uint64_t id) const {
    if (bits == nullptr || id >= rows) return nullptr;
    const std::uint64_t w = bits[id >> 6];
    const std::uint64_t bit = 1ull << (id & 63);
    if ((w & bit) == 0) return nullptr;
    const std::uint64_t k = before[id >> 6] + static_cast<std::uint64_t>(__popcll(w & (bit - 1)));
    return data + k * row_width;
  }
};

//! The whole warp copies row `id` into `out[0..row_width)`: from the hot
//! set's host memory when the row is hot (and `row_width` is the hot set's),
//! else through the page cache as `gather_row` above.
template <class T>
BAM_DEVICE bool gather_row(const array_ref<T>& a, std::uint64_t id, std::uint64_t row_width, T* out,
                           const hot_rows_ref<T>& hot) {
  if (const T* h = row_width == hot.row_width ? hot.find(id) : nullptr; h != nullptr) {
    for (std::uint64_t k = detail::lane_id(); k < row_width; k += 32)
      out[k] = h[k];
    return true;
  }
  return gather_row(a, id, row_width, out);
}

namespace detail {

//! Threads per block of `gather_rows_kernel`.
inline constexpr unsigned gather_block_threads = 256;
//! Blocks of `gather_rows_kernel` at most: warps loop over the rows beyond.
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
  if (want && lane == leader) r = a.cache.pin_slot(slot, key);
  owner = want && lane == leader && r.state == pin_state::hit;
  return {__shfl_sync(full, r.slot, leader), static_cast<pin_state>(__shfl_sync(full, static_cast<unsigned>(r.state), leader))};
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
  const std::uint64_t pages = cold ? (last >> a.elem_shift) - (first >> a.elem_shift) + 1 : 0;
  std::uint32_t s0 = 0, s1 = 0;
  const bool arrived0 = a.prefetch(first, cold, &s0);
  const bool arrived1 = a.prefetch(last, pages > 1, &s1);
  if (!__all_sync(full, pages <= 2)) return false; // wide rows: copy_to reads their pages together itself
  // The slots pin_slot returns carry a dependency on the pin: the page's
  // data is read only after it.
  const pin_result r0 = pin_shared(a, arrived0, s0, a.key_of(first), p.own[0]);
  const pin_result r1 = pin_shared(a, arrived1, s1, a.key_of(last), p.own[1]);
  p.held[0] = arrived0 && r0.state == pin_state::hit;
  p.slot[0] = r0.slot;
  p.held[1] = arrived1 && r1.state == pin_state::hit;
  p.slot[1] = r1.slot;
  if (__all_sync(full, !cold || (p.held[0] && (pages < 2 || p.held[1])))) return true;
  for (int k = 0; k < 2; ++k)
    if (p.own[k]) a.cache.release(p.slot[k]);
  p = row_pins{};
  return false;
}

//! The warp copies the row of `row_width` elements from element `first`
//! on, whose pages are held in `slot0` and (for the rest) `slot1`, into
//! `out`. Returns a dependency token (0) of every value read.
template <class T>
BAM_DEVICE unsigned copy_held_row(const array_ref<T>& a, std::uint64_t first, std::uint64_t row_width,
                                  std::uint32_t slot0, std::uint32_t slot1, T* out, unsigned lane) {
  const std::uint64_t per_page = 1ull << a.elem_shift;
  const std::uint64_t in_first = per_page - (first & (per_page - 1));
  const std::uint64_t n0 = row_width < in_first ? row_width : in_first;
  unsigned token = warp_copy_out(reinterpret_cast<unsigned char*>(out),
                                 reinterpret_cast<const unsigned char*>(a.element(slot0, first)), n0 * sizeof(T),
                                 lane, a.cache.zero);
  if (n0 < row_width)
    token |= warp_copy_out(reinterpret_cast<unsigned char*>(out + n0), a.cache.page_data(slot1),
                           (row_width - n0) * sizeof(T), lane, a.cache.zero);
  return token;
}

template <class T, class Id>
__global__ void __launch_bounds__(gather_block_threads)
    gather_rows_kernel(array_ref<T> a, const Id* ids, std::uint64_t count, std::uint64_t row_width,
                       T* out, hot_rows_ref<T> hot, unsigned group) {
  constexpr unsigned full = 0xffffffffu;
  const std::uint64_t warp =
      (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = lane_id();
  const std::uint64_t rows = row_count(a, row_width);
  // Each warp takes `group` rows at a time (lane k names row k): their
  // pages are brought in together, then the whole warp copies one row
  // after another, from the pages it holds when it could pin them all.
  for (std::uint64_t g = warp * group; g < count; g += warps * group) {
    // A negative id converts to a huge one: out of range.
    const std::uint64_t id = lane < group && g + lane < count ? static_cast<std::uint64_t>(ids[g + lane]) : ~0ull;
    const bool cold = id < rows && (row_width != hot.row_width || hot.find(id) == nullptr);
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
      if (pins.own[k]) a.cache.release_read(pins.slot[k], token);
  }
}

//! Each warp takes 32 rows at a time (lane k row k) and holds every page of
//! them that is in the cache (lanes on one page hold it once), recording
//! the slots in `slots[0..capacity)` (`held` counts them; a hold past
//! `capacity` is dropped at once). Ids past the last whole row hold nothing.
template <class T, class Id>
__global__ void __launch_bounds__(gather_block_threads)
    hold_rows_kernel(array_ref<T> a, const Id* ids, std::uint64_t count, std::uint64_t row_width,
                     std::uint32_t* slots, std::uint64_t capacity, unsigned long long* held) {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  const std::uint64_t rows = row_count(a, row_width);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  // `g` is the same for the 32 lanes of a warp.
  for (std::uint64_t g = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) & ~31ull; g < count;
       g += stride) {
    const std::uint64_t id = g + lane < count ? static_cast<std::uint64_t>(ids[g + lane]) : ~0ull;
    const bool in_range = id < rows;
    const std::uint64_t first = in_range ? (id * row_width) >> a.elem_shift : 0;
    const std::uint64_t pages = in_range ? (((id + 1) * row_width - 1) >> a.elem_shift) - first + 1 : 0;
    for (std::uint64_t p = 0; __any_sync(full, p < pages); ++p) {
      const bool want = p < pages;
      const std::uint64_t key = want ? page_cache_ref::make_key(a.space, a.first_page + first + p) : ~0ull - lane;
      const unsigned peers = __match_any_sync(full, key);
      std::uint32_t slot = 0;
      if (want && lane == static_cast<unsigned>(__ffs(peers) - 1) && a.cache.hold(key, slot)) {
        const unsigned long long at = atomicAdd(held, 1ull);
        if (at < capacity)
          slots[at] = slot;
        else
          a.cache.unhold(slot);
      }
    }
  }
}

//! Drops the holds `slots[0..min(*held, capacity))`.
__global__ inline void unhold_kernel(page_cache_ref c, const std::uint32_t* slots, std::uint64_t capacity,
                                     const unsigned long long* held) {
  const std::uint64_t n = *held < capacity ? *held : capacity;
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    c.unhold(slots[k]);
}

//! Rows per warp at a time: 32 (the most misses in flight) when there are
//! rows enough to keep `gather_target_warps` warps busy, fewer for small
//! gathers (down to one row per warp), which gain more from more warps.
//! The environment variable BAM_GATHER_ROWS_PER_WARP (1 to 32) sets it instead
//! (1: one row per warp, nothing brought in ahead).
inline constexpr std::uint64_t gather_target_warps = 4096;
inline unsigned gather_group(std::uint64_t count) {
  static const unsigned forced = [] {
    const char* e = std::getenv("BAM_GATHER_ROWS_PER_WARP");
    const long v = e != nullptr ? std::strtol(e, nullptr, 10) : 0;
    return v >= 1 && v <= 32 ? static_cast<unsigned>(v) : 0u;
  }();
  if (forced != 0) return forced;
  const std::uint64_t g = (count + gather_target_warps - 1) / gather_target_warps;
  return static_cast<unsigned>(g < 1 ? 1 : g > 32 ? 32 : g);
}

template <class T, class Id>
void launch_gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width, T* d_out,
                        const hot_rows_ref<T>& hot, cudaStream_t stream, unsigned rows_per_warp = 0) {
  static_assert(std::is_integral_v<Id>, "row ids are integers");
  if (row_width == 0 || row_width > a.size())
    throw error("bam::gather_rows: row width " + std::to_string(row_width) + " (1 to the array's " +
                std::to_string(a.size()) + " elements)");
  if (count == 0) return;
  if (rows_per_warp > 32) throw error("bam::gather_rows: " + std::to_string(rows_per_warp) + " rows per warp (1 to 32)");
  const unsigned group = rows_per_warp != 0 ? rows_per_warp : gather_group(count);
  constexpr std::uint64_t warps_per_block = gather_block_threads / 32;
  const std::uint64_t warps = (count + group - 1) / group;
  const std::uint64_t blocks = (warps + warps_per_block - 1) / warps_per_block;
  const unsigned grid = static_cast<unsigned>(blocks < gather_max_blocks ? blocks : gather_max_blocks);
  gather_rows_kernel<T, Id><<<grid, gather_block_threads, 0, stream>>>(a.ref(), d_ids, count, row_width, d_out, hot,
                                                                       group);
  BAM_CUDA_TRY(cudaGetLastError());
}

} // namespace detail

//! A hot set: a copy of some rows of a table in pinned host memory, read by
//! the GPU zero-copy instead of through the page cache (see the top of this
//! file). Owns the host copy and the GPU's bitmap of hot rows (3 bytes per
//! 16 rows of the table).
template <class T>
class hot_rows {
public:
  //! Copies rows `ids` of `a` (rows of `row_width` elements) through the
  //! page cache now (ids in any order). Throws `bam::error` (EINVAL) for an
  //! id past the last whole row, an id given twice, more than 2^32 - 1 rows,
  //! or a bad width; a failed read throws as `a.check` does.
  hot_rows(array<T>& a, std::uint64_t row_width, const std::vector<std::uint64_t>& ids,
           cudaStream_t stream = nullptr)
      : row_width_(row_width), rows_(row_width == 0 ? 0 : a.size() / row_width), table_(a.size()) {
    if (row_width == 0 || row_width > a.size())
      throw error("bam::hot_rows: row width " + std::to_string(row_width) + " (1 to the array's " +
                      std::to_string(a.size()) + " elements)",
                  einval());
    if (ids.size() > 0xffffffffu)
      throw error("bam::hot_rows: " + std::to_string(ids.size()) + " rows, more than 2^32 - 1", einval());
    std::vector<std::uint64_t> sorted(ids);
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t k = 0; k < sorted.size(); ++k) {
      if (sorted[k] >= rows_)
        throw error("bam::hot_rows: row " + std::to_string(sorted[k]) + " is past the table's " +
                        std::to_string(rows_) + " whole rows",
                    einval());
      if (k > 0 && sorted[k] == sorted[k - 1])
        throw error("bam::hot_rows: row " + std::to_string(sorted[k]) + " is given twice", einval());
    }
    if (sorted.empty()) return; // nothing hot: ref() holds nothing, every row goes through the cache
    const std::uint64_t words = (rows_ + 63) / 64;
    std::vector<std::uint64_t> bits(words, 0);
    std::vector<std::uint32_t> before(words, 0);
    for (const std::uint64_t r : sorted)
      bits[r / 64] |= 1ull << (r % 64);
    std::uint32_t running = 0;
    for (std::uint64_t w = 0; w < words; ++w) {
      before[w] = running;
      running += static_cast<std::uint32_t>(__builtin_popcountll(bits[w]));
    }
    bits_ = device_buffer<std::uint64_t>(words);
    before_ = device_buffer<std::uint32_t>(words);
    copy_to_device(bits_.get(), bits.data(), words);
    copy_to_device(before_.get(), before.data(), words);
    data_ = pinned_buffer<T>(sorted.size() * row_width);
    // Through the cache, a bounded number of rows at a time (a GPU buffer of
    // about 64 MiB), straight into the host copy, in increasing id order.
    const std::uint64_t step =
        std::max<std::uint64_t>(1, (std::uint64_t{64} << 20) / (row_width * sizeof(T)));
    const std::uint64_t chunk = std::min<std::uint64_t>(step, sorted.size());
    device_buffer<std::uint64_t> d_ids(chunk);
    device_buffer<T> d_rows(chunk * row_width);
    for (std::uint64_t first = 0; first < sorted.size(); first += step) {
      const std::uint64_t n = std::min<std::uint64_t>(step, sorted.size() - first);
      BAM_CUDA_TRY(cudaMemcpyAsync(d_ids.get(), sorted.data() + first, n * sizeof(std::uint64_t),
                                   cudaMemcpyHostToDevice, stream));
      detail::launch_gather_rows(a, d_ids.get(), n, row_width, d_rows.get(), hot_rows_ref<T>{}, stream);
      BAM_CUDA_TRY(cudaMemcpyAsync(data_.get() + first * row_width, d_rows.get(), n * row_width * sizeof(T),
                                   cudaMemcpyDeviceToHost, stream));
      BAM_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    a.check(stream);
    count_ = sorted.size();
  }
  hot_rows(hot_rows&& o) noexcept { *this = std::move(o); }
  hot_rows& operator=(hot_rows&& o) noexcept {
    // A moved-from hot set holds nothing (and reads nothing).
    row_width_ = std::exchange(o.row_width_, 0);
    rows_ = std::exchange(o.rows_, 0);
    table_ = std::exchange(o.table_, 0);
    count_ = std::exchange(o.count_, 0);
    bits_ = std::move(o.bits_);
    before_ = std::move(o.before_);
    data_ = std::move(o.data_);
    return *this;
  }

  //! The device view; holds nothing for an empty hot set.
  hot_rows_ref<T> ref() const {
    if (count_ == 0) return {};
    return {bits_.get(), before_.get(), data_.get(), rows_, row_width_};
  }
  std::uint64_t size() const { return count_; } //!< hot rows
  std::uint64_t row_width() const { return row_width_; }
  std::uint64_t table_elements() const { return table_; } //!< elements of the array it was made from
  std::uint64_t bytes() const { return count_ * row_width_ * sizeof(T); } //!< pinned host memory they take

private:
  static error_context einval() {
    error_context c;
    c.errnum = EINVAL;
    return c;
  }
  std::uint64_t row_width_ = 0, rows_ = 0, table_ = 0, count_ = 0;
  device_buffer<std::uint64_t> bits_;
  device_buffer<std::uint32_t> before_;
  pinned_buffer<T> data_;
};

//! Look-ahead holds on the pages of rows soon to be gathered (see the top of
//! this file). Holds last until `release` (or the destructor, which waits
//! for the stream of the last call): release them before `flush` or
//! `detach`, which pass over pinned pages. Must not outlive `a`.
//!
//! @code
//!   bam::row_holds<float> holds(feats);
//!   holds.hold(d_next_ids, next_count, dim, stream);   // the next batch's rows, while this one gathers
//!   ...
//!   bam::gather_rows(feats, d_next_ids, next_count, dim, d_rows, stream);
//!   holds.release(stream);
//! @endcode
template <class T>
class row_holds {
public:
  //! Room for as many holds as the cache admits at once (half its slots).
  explicit row_holds(array<T>& a)
      : a_(&a), capacity_(a.ref().cache.nsets * detail::hold_limit(a.ref().cache.ways)),
        slots_(std::max<std::uint64_t>(capacity_, 1)), held_(1) {}
  ~row_holds() {
    if (!used_) return;
    // Errors are logged, not thrown: the pins go with the process at worst.
    detail::unhold_kernel<<<release_grid(), detail::gather_block_threads, 0, stream_>>>(
        a_->ref().cache, slots_.get(), capacity_, held_.get());
    BAM_CUDA_LOG(cudaGetLastError());
    BAM_CUDA_LOG(cudaStreamSynchronize(stream_));
  }
  row_holds(const row_holds&) = delete;
  row_holds& operator=(const row_holds&) = delete;

  //! On `stream`: hold the pages of rows `d_ids[0..count)` (rows of
  //! `row_width` elements) that are in the cache when the kernel reaches
  //! them, in addition to those held already. Ids past the last whole row
  //! hold nothing (the gather reports them). Throws `bam::error` for a row
  //! width of zero or wider than the array.
  template <class Id>
  void hold(const Id* d_ids, std::uint64_t count, std::uint64_t row_width, cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<Id>, "row ids are integers");
    if (row_width == 0 || row_width > a_->size())
      throw error("bam::row_holds: row width " + std::to_string(row_width) + " (1 to the array's " +
                  std::to_string(a_->size()) + " elements)");
    used_ = true;
    stream_ = stream;
    if (count == 0 || capacity_ == 0) return;
    constexpr std::uint64_t warps_per_block = detail::gather_block_threads / 32;
    const std::uint64_t blocks = ((count + 31) / 32 + warps_per_block - 1) / warps_per_block;
    const unsigned grid = static_cast<unsigned>(std::min<std::uint64_t>(blocks, detail::gather_max_blocks));
    detail::hold_rows_kernel<T, Id><<<grid, detail::gather_block_threads, 0, stream>>>(
        a_->ref(), d_ids, count, row_width, slots_.get(), capacity_, held_.get());
    BAM_CUDA_TRY(cudaGetLastError());
  }

  //! On `stream`: drop every hold.
  void release(cudaStream_t stream = nullptr) {
    if (!used_) return;
    detail::unhold_kernel<<<release_grid(), detail::gather_block_threads, 0, stream>>>(a_->ref().cache, slots_.get(),
                                                                                        capacity_, held_.get());
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaMemsetAsync(held_.get(), 0, sizeof(unsigned long long), stream));
    used_ = false;
  }

  //! Pages held now (waits for `stream`).
  std::uint64_t held(cudaStream_t stream = nullptr) const {
    unsigned long long n = 0;
    copy_to_host(&n, held_.get(), 1, stream);
    return std::min<std::uint64_t>(n, capacity_);
  }
  //! The same count into `*dst` (host memory, pinned for an asynchronous
  //! copy), on `stream`, without waiting.
  void held_to(unsigned long long* dst, cudaStream_t stream = nullptr) const {
    BAM_CUDA_TRY(cudaMemcpyAsync(dst, held_.get(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
  }
  //! The most pages it can hold: half the cache's slots.
  std::uint64_t capacity() const { return capacity_; }

private:
  unsigned release_grid() const {
    const std::uint64_t blocks = (capacity_ + detail::gather_block_threads - 1) / detail::gather_block_threads;
    return static_cast<unsigned>(std::clamp<std::uint64_t>(blocks, 1, 1024));
  }

  array<T>* a_;
  std::uint64_t capacity_;
  device_buffer<std::uint32_t> slots_;
  device_buffer<unsigned long long> held_;
  cudaStream_t stream_ = nullptr;
  bool used_ = false;
};

//! Rows `d_ids[0..count)` of `a` (rows of `row_width` elements) into
//! `d_out[k * row_width ..)`, whole warps per row, on `stream` (does not wait
//! for it). `d_ids` and `d_out` are GPU-accessible memory. Bad ids are
//! reported by the next `a.check(stream)`. Throws `bam::error` for a row
//! width of zero or wider than the array.
template <class T, class Id>
void gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width,
                 T* d_out, cudaStream_t stream = nullptr) {
  detail::launch_gather_rows(a, d_ids, count, row_width, d_out, hot_rows_ref<T>{}, stream);
}

//! The same, with the rows of the hot set `hot` read from its host copy.
//! Throws `bam::error` when `hot` was made for another row width.
template <class T, class Id>
void gather_rows(array<T>& a, const Id* d_ids, std::uint64_t count, std::uint64_t row_width,
                 T* d_out, const hot_rows<T>& hot, cudaStream_t stream = nullptr) {
  if (hot.size() != 0 && hot.row_width() != row_width)
    throw error("bam::gather_rows: the hot set holds rows of " + std::to_string(hot.row_width()) +
                " elements, not " + std::to_string(row_width));
  if (hot.size() != 0 && hot.table_elements() != a.size())
    throw error("bam::gather_rows: the hot set was made from a table of " + std::to_string(hot.table_elements()) +
                " elements, this array holds " + std::to_string(a.size()));
  detail::launch_gather_rows(a, d_ids, count, row_width, d_out, hot.ref(), stream);
}

} // namespace bam
