// SPDX-License-Identifier: MIT
//! `bam::row_holds<T>`: look-ahead holds on the cached pages of rows that
//! gathers soon to come will read (a `bam::array<T>` read as rows of
//! `row_width` elements; the gathers are in <bam/runtime/row_gather.cuh>,
//! which includes this header).
//!
//!  - `holds.hold(d_ids, count, row_width, stream)` pins the pages of rows
//!    `d_ids[0..count)` that are in the cache at that moment (it loads
//!    nothing and waits for nothing), so that eviction skips them until
//!    `holds.release(stream)`: the misses of the gathers before (on other
//!    streams too) and of their own gather cannot evict them first.
//!  - At most half the ways of each cache set are held at once (a page past
//!    that is simply not held), so misses always find a slot.
//!  - Ids past the last whole row hold nothing (the gather reports them).
//!
//! Release holds before `flush` or `detach`, which pass over pinned pages.
//!
//! @code
//!   bam::row_holds<float> holds(feats);
//!   holds.hold(d_next_ids, next_count, dim, stream);   // the next batch's rows, while this one gathers
//!   ...
//!   bam::gather_rows(feats, d_next_ids, next_count, dim, d_rows, stream);
//!   holds.release(stream);
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/runtime/array.cuh>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace bam {

namespace detail {

//! Threads per block of `hold_rows_kernel` and `release_holds_kernel`.
inline constexpr unsigned holds_block_threads = 256;
//! Blocks of `hold_rows_kernel` at most: warps loop over the rows beyond.
inline constexpr unsigned holds_max_blocks = 1u << 15;

//! Each warp takes 32 rows at a time (lane k row k) and holds every page of
//! them that is in the cache (lanes on one page hold it once), recording
//! the slots in `slots[0..capacity)` (`held` counts them; a hold past
//! `capacity` is dropped at once). Ids past the last whole row hold nothing.
template <class T, class Id>
__global__ void __launch_bounds__(holds_block_threads)
    hold_rows_kernel(array_ref<T> a, const Id* ids, std::uint64_t count, std::uint64_t row_width, std::uint32_t* slots,
                     std::uint64_t capacity, unsigned long long* held) {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = lane_id();
  const std::uint64_t rows = row_width == 0 ? 0 : a.size() / row_width; // whole rows
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  // `g` is the same for the 32 lanes of a warp.
  for (std::uint64_t g = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) & ~31ull; g < count;
       g += stride) {
    const std::uint64_t id = g + lane < count ? static_cast<std::uint64_t>(ids[g + lane]) : ~0ull;
    const bool in_range = id < rows;
    const std::uint32_t shift = ref_access::elem_shift(a);
    const std::uint64_t first = in_range ? (id * row_width) >> shift : 0;
    const std::uint64_t pages = in_range ? (((id + 1) * row_width - 1) >> shift) - first + 1 : 0;
    for (std::uint64_t p = 0; __any_sync(full, p < pages); ++p) {
      const bool want = p < pages;
      const std::uint64_t key = want ? ref_access::key_of_page(a, first + p) : ~0ull - lane;
      const unsigned peers = __match_any_sync(full, key);
      std::uint32_t slot = 0;
      if (want && lane == static_cast<unsigned>(__ffs(peers) - 1) && ref_access::cache(a).hold(key, slot)) {
        const unsigned long long at = atomicAdd(held, 1ull);
        if (at < capacity)
          slots[at] = slot;
        else
          ref_access::cache(a).release_hold(slot);
      }
    }
  }
}

//! Drops the holds `slots[0..min(*held, capacity))`. (A template: a kernel
//! defined in a header, in every translation unit that includes it.)
template <int = 0>
__global__ void release_holds_kernel(page_cache_ref c, const std::uint32_t* slots, std::uint64_t capacity,
                                     const unsigned long long* held) {
  const std::uint64_t n = *held < capacity ? *held : capacity;
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    c.release_hold(slots[k]);
}

} // namespace detail

//! Look-ahead holds on the pages of rows soon to be gathered (see the top of
//! this file). Holds last until `release` (or the destructor, which waits
//! for the stream of the last call): release them before `flush` or
//! `detach`, which pass over pinned pages. Must not outlive `a`.
template <class T>
class row_holds {
public:
  //! Room for as many holds as the cache admits at once (half its slots).
  explicit row_holds(array<T>& a) : a_(&a), capacity_(capacity_of(a.ref())) {
    const device_scope on(a.device()); // the holds live beside the cache
    slots_ = device_buffer<std::uint32_t>(std::max<std::uint64_t>(capacity_, 1));
    held_ = device_buffer<unsigned long long>(1);
  }
  ~row_holds() {
    if (!used_) return;
    device_scope on;
    on.enter_quietly(a_->device());
    // Errors are logged, not thrown: the pins go with the process at worst.
    detail::release_holds_kernel<>
        <<<release_grid(), detail::holds_block_threads, 0, stream_>>>(cache(), slots_.get(), capacity_, held_.get());
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
  void hold(const Id* d_ids, std::uint64_t count, std::uint64_t row_width, cuda::stream_ref stream_ref = {}) {
    static_assert(std::is_integral_v<Id>, "row ids are integers");
    if (row_width == 0 || row_width > a_->size())
      throw error("bam::row_holds: row width " + std::to_string(row_width) + " (1 to the array's " +
                  std::to_string(a_->size()) + " elements)");
    const cudaStream_t stream = stream_ref.get();
    used_ = true;
    stream_ = stream;
    if (count == 0 || capacity_ == 0) return;
    const device_scope on(a_->device());
    constexpr std::uint64_t warps_per_block = detail::holds_block_threads / 32;
    const std::uint64_t blocks = ((count + 31) / 32 + warps_per_block - 1) / warps_per_block;
    const unsigned grid = static_cast<unsigned>(std::min<std::uint64_t>(blocks, detail::holds_max_blocks));
    detail::hold_rows_kernel<T, Id><<<grid, detail::holds_block_threads, 0, stream>>>(
        a_->ref(), d_ids, count, row_width, slots_.get(), capacity_, held_.get());
    BAM_CUDA_TRY(cudaGetLastError());
  }

  //! On `stream`: drop every hold.
  void release(cuda::stream_ref stream_ref = {}) {
    if (!used_) return;
    const device_scope on(a_->device());
    const cudaStream_t stream = stream_ref.get();
    detail::release_holds_kernel<>
        <<<release_grid(), detail::holds_block_threads, 0, stream>>>(cache(), slots_.get(), capacity_, held_.get());
    BAM_CUDA_TRY(cudaGetLastError());
    BAM_CUDA_TRY(cudaMemsetAsync(held_.get(), 0, sizeof(unsigned long long), stream));
    used_ = false;
  }

  //! Pages held now (waits for `stream`).
  std::uint64_t held(cuda::stream_ref stream = {}) const {
    unsigned long long n = 0;
    copy_to_host(&n, held_.get(), 1, stream.get());
    return std::min<std::uint64_t>(n, capacity_);
  }
  //! The same count into `*dst` (host memory, pinned for an asynchronous
  //! copy), on `stream`, without waiting.
  void held_to(unsigned long long* dst, cuda::stream_ref stream = {}) const {
    BAM_CUDA_TRY(cudaMemcpyAsync(dst, held_.get(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream.get()));
  }
  //! The most pages it can hold: half the cache's slots.
  std::uint64_t capacity() const { return capacity_; }

private:
  //! Half the slots of the cache of `a`: as many holds as it admits at once.
  static std::uint64_t capacity_of(const array_ref<T>& a) {
    const page_cache_ref& c = detail::ref_access::cache(a);
    return detail::ref_access::set_count(c) * detail::hold_limit(c.ways());
  }
  //! The device handle of the array's cache.
  page_cache_ref cache() const { return detail::ref_access::cache(a_->ref()); }
  unsigned release_grid() const {
    const std::uint64_t blocks = (capacity_ + detail::holds_block_threads - 1) / detail::holds_block_threads;
    return static_cast<unsigned>(std::clamp<std::uint64_t>(blocks, 1, 1024));
  }

  array<T>* a_;
  std::uint64_t capacity_;
  device_buffer<std::uint32_t> slots_;
  device_buffer<unsigned long long> held_;
  cudaStream_t stream_ = nullptr;
  bool used_ = false;
};

} // namespace bam
