// SPDX-License-Identifier: MIT
//! Many files read whole by GPU threads, by index: the data loader of an
//! image or document corpus. `bam::file_array` lays the files of a
//! `bam::file_set` end to end (each from a page boundary, `file_set::packed_map`)
//! and reads them through a page cache like any `bam::array` over a file:
//! a miss finds its blocks in the extent map on the GPU and reads them from
//! the storage's controller (holes as zeroes). `file_array_ref` is the device
//! handle: a warp reads file i with `read_file`; `gather_files` reads a batch
//! of files into one buffer, a warp per file.
//!
//! @code
//!   const bam::fs_image img("/data/imagenet.img", 0, storage.lba_size());
//!   bam::file_array files(cache, storage, img.map_files("/train"));
//!   // ids (GPU) of the batch, out_offsets (GPU) where each file's bytes go
//!   files.gather_files(d_ids, batch, d_out, d_out_offsets, stream);
//!   files.check(stream);                     // a failed read or bad id throws here
//!
//!   __global__ void decode(bam::file_array_ref f, ...) {
//!     f.read_file(i, my_buffer);             // whole warp: file i's f.size(i) bytes
//!   }
//! @endcode
#pragma once

#include <bam/cuda.cuh>
#include <bam/file/file_set.hpp>
#include <bam/runtime/array.cuh>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bam {

//! The device handle of a `file_array` (trivially copyable, pass it by value).
class file_array_ref {
public:
  file_array_ref() = default;

  //! Files.
  BAM_HD std::uint64_t files() const { return files_; }
  //! Bytes of file `i` (`i < files()`).
  BAM_HD std::uint64_t size(std::uint64_t i) const { return size_[i]; }

  //! File `i`'s `size(i)` bytes into `out[0..size(i))`, up to 32 pages in
  //! flight at once. A bad `i` or a page that cannot be read is recorded
  //! (the array's `check` reports it: a bad id as an Out of Range element
  //! equal to the id) and returns false; the bytes of a failed page read
  //! as zeroes.
  //! @note Whole-warp, every lane with the same `i` and `out`.
  BAM_DEVICE bool read_file(std::uint64_t i, std::uint8_t* out) const {
    if (i >= files_) {
      if (detail::lane_id() == 0) bytes_.record_failure(nvme::status_out_of_range, failure_site::element(i));
      return false;
    }
    return bytes_.copy_to(offset_[i], size_[i], out);
  }

  //! The bytes of every file, laid end to end (file i at `offset(i)`).
  BAM_HD const array_ref<std::uint8_t>& bytes() const { return bytes_; }
  //! Where file `i` starts in `bytes()`.
  BAM_HD std::uint64_t offset(std::uint64_t i) const { return offset_[i]; }

private:
  friend class file_array;
  file_array_ref(const array_ref<std::uint8_t>& b, const std::uint64_t* offset, const std::uint64_t* size,
                 std::uint64_t files)
      : bytes_(b), offset_(offset), size_(size), files_(files) {}

  array_ref<std::uint8_t> bytes_{};
  const std::uint64_t* offset_ = nullptr; //!< GPU memory, files_ entries
  const std::uint64_t* size_ = nullptr;   //!< GPU memory, files_ entries
  std::uint64_t files_ = 0;
};
static_assert(std::is_trivially_copyable_v<file_array_ref>, "file_array_ref is passed to kernels by value");

namespace detail {

inline constexpr unsigned files_block_threads = 256;
inline constexpr unsigned files_max_blocks = 1u << 15;

//! A warp per file: `ids[k]`'s bytes to `out + offsets[k]`.
template <int = 0>
__global__ void gather_files_kernel(file_array_ref f, const std::uint64_t* ids, std::uint64_t count, std::uint8_t* out,
                                    const std::uint64_t* offsets) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  for (std::uint64_t k = warp; k < count; k += warps)
    f.read_file(ids[k], out + offsets[k]);
}

} // namespace detail

//! The owning host object (see the top of this file): the files' packed
//! extent map, their offsets and sizes in GPU memory, and the array over
//! them. Read-only. Belongs to the cache's GPU, as an array does.
class file_array {
public:
  //! @param cache the page cache that serves the files (its page size aligns each file)
  //! @param s the storage whose one controller holds the files' disk (the set's LBAs are on it)
  //! @param set the files, e.g. `fs_image::map_files` or maps of mounted files on one disk
  //! @param stream the tables are copied and the cache's tables updated on it (waited for)
  //! @throw bam::error as `bam::array` over an extent map does (block size, runs past the storage's end)
  file_array(page_cache& cache, const storage& s, const file_set& set, cuda::stream_ref stream = {})
      : sizes_(set.sizes()), unchanged_(set.unchanged_check()) {
    const device_scope on(cache.device());
    file_set::packed p = set.packed_map(cache.page_size());
    offsets_ = std::move(p.offsets);
    bytes_.emplace(cache, s, p.map, stream);
    const std::uint64_t n = sizes_.size();
    d_offset_ = device_buffer<std::uint64_t>(n == 0 ? 1 : n);
    d_size_ = device_buffer<std::uint64_t>(n == 0 ? 1 : n);
    if (n != 0) {
      copy_to_device(d_offset_.get(), offsets_.data(), n, stream.get());
      copy_to_device(d_size_.get(), sizes_.data(), n, stream.get());
      BAM_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    }
  }

  file_array_ref ref() const { return file_array_ref(bytes_->ref(), d_offset_.get(), d_size_.get(), sizes_.size()); }
  operator file_array_ref() const { return ref(); }

  std::uint64_t files() const { return sizes_.size(); }
  std::uint64_t size(std::uint64_t i) const { return sizes_.at(i); }
  const std::vector<std::uint64_t>& sizes() const { return sizes_; }
  //! The files' bytes laid end to end, as an array (its `source()` names the runs).
  const array<std::uint8_t>& bytes() const { return *bytes_; }
  int device() const { return bytes_->device(); }

  //! Where each of files `ids` goes in one buffer, in order, each from a
  //! 16-byte boundary (where the copies move 16 bytes a lane): `offsets[k]`,
  //! and the buffer's bytes (the return value).
  //! @throw bam::error (EINVAL) for an id that is not a file of the set.
  std::uint64_t packed_offsets(const std::vector<std::uint64_t>& ids, std::vector<std::uint64_t>& offsets) const {
    offsets.resize(ids.size());
    std::uint64_t at = 0;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] >= sizes_.size()) {
        error_context c;
        c.errnum = EINVAL;
        throw error("bam::file_array: file " + std::to_string(ids[k]) + " of a set of " + std::to_string(sizes_.size()),
                    c);
      }
      offsets[k] = at;
      at = (at + sizes_[ids[k]] + 15) & ~std::uint64_t{15};
    }
    return at;
  }

  //! Files `d_ids[0..count)` into `d_out + d_offsets[k]` (whole files, a
  //! warp each), on `stream` (not waited for). `d_ids`, `d_out` and
  //! `d_offsets` are GPU-accessible; the ranges must not overlap. Bad ids and
  //! failed reads are reported by the next `check(stream)`.
  void gather_files(const std::uint64_t* d_ids, std::uint64_t count, std::uint8_t* d_out,
                    const std::uint64_t* d_offsets, cuda::stream_ref stream = {}) const {
    if (count == 0) return;
    const device_scope on(device());
    constexpr std::uint64_t warps_per_block = detail::files_block_threads / 32;
    const std::uint64_t blocks = (count + warps_per_block - 1) / warps_per_block;
    detail::gather_files_kernel<>
        <<<static_cast<unsigned>(std::min<std::uint64_t>(blocks, detail::files_max_blocks)),
           detail::files_block_threads, 0, stream.get()>>>(ref(), d_ids, count, d_out, d_offsets);
    BAM_CUDA_TRY(cudaGetLastError());
  }

  //! Report a failure recorded since the last check (waits for `stream`).
  void check(cuda::stream_ref stream = {}) { bytes_->check(stream); }
  //! Throws bam::error (ESTALE) when a file of the set changed since it was
  //! mapped (`file_set::check_unchanged`): what was read of it may be stale.
  void check_unchanged() const { unchanged_(); }

private:
  std::vector<std::uint64_t> sizes_;
  std::vector<std::uint64_t> offsets_;
  std::function<void()> unchanged_;
  std::optional<array<std::uint8_t>> bytes_;
  device_buffer<std::uint64_t> d_offset_;
  device_buffer<std::uint64_t> d_size_;
};

} // namespace bam
