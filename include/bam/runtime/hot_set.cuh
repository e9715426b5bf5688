// SPDX-License-Identifier: MIT
//! `bam::hot_rows<T>`: a hot set: a copy of some rows of a table (a
//! `bam::array<T>` read as rows of `row_width` elements, see row_gather.cuh),
//! e.g. the most referenced nodes of a graph, in pinned host memory, which
//! the gathers read zero-copy over PCIe instead of through the page cache:
//! those rows never cost a miss nor take a cache slot.
//!
//!  - `bam::hot_rows<T> hot(a, row_width, ids, stream)`: copies rows `ids`
//!    through the cache now (ids in any order, each once).
//!  - `bam::gather_rows(a, d_ids, count, row_width, d_out, hot, stream)`
//!    (host) and `bam::gather_row(a, id, row_width, out, hot.ref())` (device,
//!    the whole warp): hot rows from the host copy, the others through the
//!    cache.
//!  - `hot.ref()`: the device view, `bam::hot_rows_ref<T>` (the default one
//!    holds nothing).
//!
//! A snapshot, taken when it is made: for tables that are read, not
//! written (`scatter_rows`, `a.write` do not update it).
//!
//! @code
//!   std::vector<std::uint64_t> top = most_referenced(graph, nodes / 100);
//!   bam::hot_rows<float> hot(feats, dim, top, stream);                // 1% of the rows in host memory
//!   bam::gather_rows(feats, d_ids, count, dim, d_rows, hot, stream);  // hot rows over PCIe, the rest cached
//!   feats.check(stream);
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/runtime/array.cuh>
// The gathers that read a hot set, one of which fills it (and which
// include this header back, at their end).
#include <bam/runtime/row_gather.cuh>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace bam {

//! Device view of a `hot_rows<T>` (`hot_rows::ref()`); a default-made one
//! holds nothing. Which rows are hot is a bitmap with a running count per 64
//! rows (3 bytes per 16 rows of the table, however few are hot): a row's
//! place in the host copy is the count of hot rows before it.
template <class T>
class hot_rows_ref {
public:
  //! A view that holds no row.
  hot_rows_ref() = default;

  //! Row `id` in host memory (pinned, mapped: the GPU reads it zero-copy).
  //! @param id a row of the table
  //! @return the row's `row_width()` elements, or nullptr when it is not hot
  BAM_DEVICE const T* find(std::uint64_t id) const;
  //! @return the elements per row (0 for a view that holds nothing)
  BAM_HD std::uint64_t row_width() const { return row_width_; }

private:
  friend class hot_rows<T>;
  hot_rows_ref(const std::uint64_t* bits, const std::uint32_t* before, const T* data, std::uint64_t rows,
               std::uint64_t row_width)
      : bits_(bits), before_(before), data_(data), rows_(rows), row_width_(row_width) {}

  const std::uint64_t* bits_ = nullptr;   //!< bit r % 64 of word r / 64: row r is hot
  const std::uint32_t* before_ = nullptr; //!< hot rows before word w
  const T* data_ = nullptr;               //!< the hot rows in increasing id order (pinned host memory, mapped)
  std::uint64_t rows_ = 0;                //!< rows the bitmap covers: the table's whole rows
  std::uint64_t row_width_ = 0;
};

template <class T>
BAM_DEVICE const T* hot_rows_ref<T>::find(std::uint64_t id) const {
  if (bits_ == nullptr || id >= rows_) return nullptr;
  const std::uint64_t w = bits_[id >> 6];
  const std::uint64_t bit = 1ull << (id & 63);
  if ((w & bit) == 0) return nullptr;
  const std::uint64_t k = before_[id >> 6] + static_cast<std::uint64_t>(__popcll(w & (bit - 1)));
  return data_ + k * row_width_;
}
static_assert(std::is_trivially_copyable_v<hot_rows_ref<float>>, "hot_rows_ref is passed to kernels by value");

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
           cuda::stream_ref stream_ref = {})
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
    const cudaStream_t stream = stream_ref.get();
    if (sorted.empty()) return; // nothing hot
    const device_scope on(
        a.device()); // the tables beside the array's cache: ref() holds nothing, every row goes through the cache
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
    copy_to_device(bits_.get(), bits.data(), words, stream); // waited for below
    copy_to_device(before_.get(), before.data(), words, stream);
    data_ = pinned_buffer<T>(sorted.size() * row_width);
    // Through the cache, a bounded number of rows at a time (a GPU buffer of
    // about 64 MiB), straight into the host copy, in increasing id order.
    const std::uint64_t step = std::max<std::uint64_t>(1, (std::uint64_t{64} << 20) / (row_width * sizeof(T)));
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
    return hot_rows_ref<T>(bits_.get(), before_.get(), data_.get(), rows_, row_width_);
  }
  std::uint64_t size() const { return count_; } //!< hot rows
  std::uint64_t row_width() const { return row_width_; }
  std::uint64_t table_elements() const { return table_; }                 //!< elements of the array it was made from
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

} // namespace bam
