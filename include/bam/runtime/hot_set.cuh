// SPDX-License-Identifier: MIT
//! `bam::hot_rows<T>`: a hot set: a copy of some rows of a table (a
//! `bam::array<T>` read as rows of `row_width` elements, see row_gather.cuh),
//! e.g. the most referenced nodes of a graph, which the gathers read instead
//! of going through the page cache: those rows never cost a miss nor take a
//! cache slot. The copy lives in one of two places (`bam::hot_memory`):
//!
//!  - `host` (the default): pinned host memory, read zero-copy over PCIe.
//!    It pays where the cache cannot hold the rows it serves.
//!  - `gpu`: the memory of the array's GPU, read at HBM speed. It pays in
//!    front of a cache spread over several GPUs (`page_cache_config::devices`
//!    or `group`), which keeps one copy of a page on one GPU, so that most
//!    of a GPU's hits come from its peers over NVLink: a hot set of each
//!    GPU's own, made from each GPU's array, keeps the hottest rows local
//!    (a replica per GPU), and the cache the rest (one copy in the node).
//!
//! The interface:
//!
//!  - `bam::hot_rows<T> hot(a, row_width, ids, stream, where)`: copies rows
//!    `ids` through the cache now (ids in any order, each once).
//!  - `bam::gather_rows(a, d_ids, count, row_width, d_out, hot, stream)`
//!    (host) and `bam::gather_row(a, id, row_width, out, hot.ref())` (device,
//!    the whole warp): hot rows from the copy, the others through the cache.
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
//!   // On each GPU of a node-wide cache, its own replica of the hottest rows:
//!   bam::hot_rows<float> local(feats_on_this_gpu, dim, top, stream, bam::hot_memory::gpu);
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

//! Where a hot set keeps its copy of the rows (see the top of this file).
enum class hot_memory {
  host, //!< pinned host memory, read zero-copy over PCIe
  gpu,  //!< the memory of the array's GPU
};

//! Device view of a `hot_rows<T>` (`hot_rows::ref()`); a default-made one
//! holds nothing. Which rows are hot is a bitmap with a running count per 64
//! rows (3 bytes per 16 rows of the table, however few are hot): a row's
//! place in the host copy is the count of hot rows before it.
template <class T>
class hot_rows_ref {
public:
  //! A view that holds no row.
  hot_rows_ref() = default;

  //! Row `id` in the hot set's copy (pinned host memory the GPU reads
  //! zero-copy, or the array's GPU's memory).
  //! @param id a row of the table
  //! @return the row's `row_width()` elements, or nullptr when it is not hot
  BAM_DEVICE const T* find(std::uint64_t id) const;
  //! @return the elements per row (0 for a view that holds nothing)
  BAM_HD std::uint64_t row_width() const { return row_width_; }
  //! @return the copy's first row (the lowest hot id), nullptr for a view
  //! that holds nothing
  BAM_HD const T* data() const { return data_; }

private:
  friend class hot_rows<T>;
  hot_rows_ref(const std::uint64_t* bits, const std::uint32_t* before, const T* data, std::uint64_t rows,
               std::uint64_t row_width)
      : bits_(bits), before_(before), data_(data), rows_(rows), row_width_(row_width) {}

  const std::uint64_t* bits_ = nullptr;   //!< bit r % 64 of word r / 64: row r is hot
  const std::uint32_t* before_ = nullptr; //!< hot rows before word w
  const T* data_ = nullptr;               //!< the hot rows in increasing id order (host, mapped, or GPU memory)
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

//! A hot set: a copy of some rows of a table in pinned host memory or in the
//! array's GPU's memory, read by the GPU instead of through the page cache
//! (see the top of this file). Owns the copy and the GPU's bitmap of hot
//! rows (3 bytes per 16 rows of the table).
template <class T>
class hot_rows {
public:
  //! Copies rows `ids` of `a` (rows of `row_width` elements) through the
  //! page cache now (ids in any order) into `where`: pinned host memory, or
  //! the memory of `a.device()`. Throws `bam::error` (EINVAL) for an id past
  //! the last whole row, an id given twice, more than 2^32 - 1 rows, or a
  //! bad width; a failed read throws as `a.check` does, and a copy that does
  //! not fit throws as CUDA's allocation does.
  hot_rows(array<T>& a, std::uint64_t row_width, const std::vector<std::uint64_t>& ids,
           cuda::stream_ref stream_ref = {}, hot_memory where = hot_memory::host)
      : row_width_(row_width), rows_(row_width == 0 ? 0 : a.size() / row_width), table_(a.size()), where_(where) {
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
    if (sorted.empty()) return;        // nothing hot
    const device_scope on(a.device()); // the bitmap, and a copy in GPU memory, on the array's GPU
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
    // Through the cache, a bounded number of rows at a time, straight into
    // the copy (GPU memory), or through a GPU buffer of about 64 MiB (host
    // memory), in increasing id order.
    const std::uint64_t step = std::max<std::uint64_t>(1, (std::uint64_t{64} << 20) / (row_width * sizeof(T)));
    const std::uint64_t chunk = std::min<std::uint64_t>(step, sorted.size());
    device_buffer<std::uint64_t> d_ids(chunk);
    device_buffer<T> d_rows;
    if (where == hot_memory::gpu)
      gpu_data_ = device_buffer<T>(sorted.size() * row_width);
    else {
      host_data_ = pinned_buffer<T>(sorted.size() * row_width);
      d_rows = device_buffer<T>(chunk * row_width);
    }
    for (std::uint64_t first = 0; first < sorted.size(); first += step) {
      const std::uint64_t n = std::min<std::uint64_t>(step, sorted.size() - first);
      BAM_CUDA_TRY(cudaMemcpyAsync(d_ids.get(), sorted.data() + first, n * sizeof(std::uint64_t),
                                   cudaMemcpyHostToDevice, stream));
      T* const to = where == hot_memory::gpu ? gpu_data_.get() + first * row_width : d_rows.get();
      detail::launch_gather_rows(a, d_ids.get(), n, row_width, to, hot_rows_ref<T>{}, stream);
      if (where == hot_memory::host)
        BAM_CUDA_TRY(cudaMemcpyAsync(host_data_.get() + first * row_width, d_rows.get(), n * row_width * sizeof(T),
                                     cudaMemcpyDeviceToHost, stream));
      BAM_CUDA_TRY(cudaStreamSynchronize(stream)); // the ids' host memory is read before the next step
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
    where_ = std::exchange(o.where_, hot_memory::host);
    bits_ = std::move(o.bits_);
    before_ = std::move(o.before_);
    host_data_ = std::move(o.host_data_);
    gpu_data_ = std::move(o.gpu_data_);
    return *this;
  }

  //! The device view; holds nothing for an empty hot set.
  hot_rows_ref<T> ref() const {
    if (count_ == 0) return {};
    const T* data = where_ == hot_memory::gpu ? gpu_data_.get() : host_data_.get();
    return hot_rows_ref<T>(bits_.get(), before_.get(), data, rows_, row_width_);
  }
  std::uint64_t size() const { return count_; } //!< hot rows
  std::uint64_t row_width() const { return row_width_; }
  std::uint64_t table_elements() const { return table_; }                 //!< elements of the array it was made from
  std::uint64_t bytes() const { return count_ * row_width_ * sizeof(T); } //!< memory the copy takes
  hot_memory memory() const { return where_; }                            //!< where the copy is

private:
  static error_context einval() {
    error_context c;
    c.errnum = EINVAL;
    return c;
  }
  std::uint64_t row_width_ = 0, rows_ = 0, table_ = 0, count_ = 0;
  hot_memory where_ = hot_memory::host;
  device_buffer<std::uint64_t> bits_;
  device_buffer<std::uint32_t> before_;
  pinned_buffer<T> host_data_; // where_ == host
  device_buffer<T> gpu_data_;  // where_ == gpu
};

} // namespace bam
