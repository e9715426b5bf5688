// SPDX-License-Identifier: MIT
//! Many files on one disk as one table: a data set of images or documents
//! read whole, file by file, by index. `bam::file_set` holds the extent maps
//! of its files (from `fs_image::map_files` for a file system image, or any
//! list of `extent_map`s of one disk) in three arrays; `bam::file_set_ref` is
//! the trivially copyable view host and device code both read: file i's size
//! and its runs, as an `extent_map_ref`.
//!
//! @code
//!   bam::file_set set = image.map_files("/train");        // every regular file below /train
//!   const bam::file_set_ref r = set.ref();                 // host arrays (copy them for a GPU view)
//!   bam::extent_map_ref f = r.file(42);                    // file 42: size and runs
//!   auto w = f.find(0);                                    // LBA of its first block
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/error.hpp>
#include <bam/file/extent_map.hpp>
#include <bam/file/extent_map_ref.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace bam {

//! Files of a `file_set`, by index. File i's runs are `lba[first[i] ..
//! first[i + 1])`; their starts (file blocks) are `start[first[i] + i ..
//! first[i + 1] + i]`, one more entry than runs (where the file's blocks end).
struct file_set_ref {
  const std::uint64_t* first = nullptr; //!< files + 1 entries
  const std::uint64_t* start = nullptr; //!< runs + files entries
  const std::uint64_t* lba = nullptr;   //!< runs entries: disk LBA, or extent_hole
  const std::uint64_t* size = nullptr;  //!< files entries: bytes
  std::uint64_t files = 0;
  std::uint32_t lba_shift = 9; //!< log2 of the disk's logical block size

  BAM_HD std::uint64_t file_size(std::uint64_t i) const { return size[i]; }
  //! File i as an extent map (`i < files`).
  BAM_HD extent_map_ref file(std::uint64_t i) const {
    extent_map_ref m;
    m.start = start + first[i] + i;
    m.lba = lba + first[i];
    m.runs = first[i + 1] - first[i];
    m.file_size = size[i];
    m.lba_shift = lba_shift;
    return m;
  }
};
static_assert(std::is_trivially_copyable_v<file_set_ref>, "file_set_ref is passed to kernels by value");

//! The owning host object (see the top of this file).
class file_set {
public:
  struct named_map {
    std::string path;
    extent_map map;
  };

  file_set() = default;
  //! @throw bam::error (EINVAL) when the maps are not all of one disk with one logical block size.
  explicit file_set(std::vector<named_map> files) : files_(std::move(files)) {
    first_.reserve(files_.size() + 1); // holds the 0 it starts with
    size_.reserve(files_.size());
    for (const named_map& f : files_) {
      const extent_map& m = f.map;
      if (&f != &files_.front()) {
        const extent_map& a = files_.front().map;
        if (m.lba_size() != a.lba_size() || m.device().disk_node != a.device().disk_node) {
          error_context c;
          c.errnum = EINVAL;
          throw error("bam::file_set: " + f.path + " is on " + m.device().disk_node + " (" +
                          std::to_string(m.lba_size()) + "-byte blocks), " + files_.front().path + " on " +
                          a.device().disk_node + " (" + std::to_string(a.lba_size()) +
                          "-byte blocks): a set's files are on one disk",
                      c);
        }
      }
      const auto& starts = m.run_starts();
      const auto& lbas = m.run_lbas();
      lba_.insert(lba_.end(), lbas.begin(), lbas.end());
      if (lbas.empty())
        start_.push_back(0); // an empty file: only where its (no) blocks end
      else
        start_.insert(start_.end(), starts.begin(), starts.end());
      first_.push_back(lba_.size());
      size_.push_back(m.file_size());
      total_ += m.file_size();
    }
    if (!files_.empty()) lba_shift_ = static_cast<std::uint32_t>(__builtin_ctz(files_.front().map.lba_size()));
  }

  std::uint64_t size() const { return files_.size(); } //!< files
  const std::string& path(std::uint64_t i) const { return files_.at(i).path; }
  std::uint64_t file_size(std::uint64_t i) const { return size_.at(i); }
  const extent_map& map(std::uint64_t i) const { return files_.at(i).map; }
  std::uint64_t total_bytes() const { return total_; } //!< of all files
  std::uint64_t runs() const { return lba_.size(); }
  std::uint32_t lba_size() const { return 1u << lba_shift_; }
  //! Host bytes of the arrays `ref()` views.
  std::uint64_t table_bytes() const {
    return (first_.size() + start_.size() + lba_.size() + size_.size()) * sizeof(std::uint64_t);
  }
  //! The arrays `ref()` views, in its order (copy each for a GPU view).
  const std::vector<std::uint64_t>& firsts() const { return first_; }
  const std::vector<std::uint64_t>& starts() const { return start_; }
  const std::vector<std::uint64_t>& lbas() const { return lba_; }
  const std::vector<std::uint64_t>& sizes() const { return size_; }

  //! A view of the host arrays.
  file_set_ref ref() const {
    file_set_ref r;
    r.first = first_.data();
    r.start = start_.data();
    r.lba = lba_.data();
    r.size = size_.data();
    r.files = files_.size();
    r.lba_shift = lba_shift_;
    return r;
  }

  //! Every file of the set laid end to end as one file, each starting at a
  //! multiple of `align` bytes (e.g. a page cache's page size: no page holds
  //! two files), with holes between: the map of that file, and the byte
  //! offset of each file in it. An array over `map` reads file i's bytes at
  //! [offsets[i], offsets[i] + file_size(i)) (`bam::file_array` does).
  struct packed {
    extent_map map;
    std::vector<std::uint64_t> offsets; //!< files entries
  };
  //! @throw bam::error (EINVAL) if `align` is not a power of two multiple of the block size.
  packed packed_map(std::uint64_t align) const {
    const std::uint64_t lbs = lba_size();
    if (align < lbs || (align & (align - 1)) != 0) {
      error_context c;
      c.errnum = EINVAL;
      throw error("bam::file_set::packed_map: alignment " + std::to_string(align) +
                      " is not a power of two multiple of the " + std::to_string(lbs) + "-byte block",
                  c);
    }
    packed p;
    p.offsets.reserve(files_.size());
    std::vector<raw_extent> raw;
    raw.reserve(lba_.size());
    std::uint64_t at = 0; // where the next file starts
    std::uint64_t end = 0;
    for (std::uint64_t i = 0; i < files_.size(); ++i) {
      p.offsets.push_back(at);
      const std::uint64_t* starts = start_.data() + first_[i] + i;
      for (std::uint64_t r = first_[i]; r < first_[i + 1]; ++r, ++starts)
        if (lba_[r] != extent_hole)
          raw.push_back({at + starts[0] * lbs, lba_[r] * lbs, (starts[1] - starts[0]) * lbs, 0});
      end = at + size_[i];
      at = (end + align - 1) & ~(align - 1);
    }
    // The set's disk, its LBAs counted from the disk's start (the files' maps already are).
    block_device_info dev = files_.empty() ? block_device_info{} : files_.front().map.device();
    dev.partition.clear();
    dev.partition_start = 0;
    dev.lba_size = static_cast<std::uint32_t>(lbs);
    extent_map_options o;
    o.allow_holes = true; // the gaps between files
    o.sync = false;
    p.map = extent_map::from_extents("the " + std::to_string(files_.size()) + " files of a file set", std::move(raw),
                                     end == 0 ? align : end, dev, o);
    return p;
  }

  //! What tells whether the set's files changed, all at once: it returns
  //! what changed ("" if nothing) and sets its argument to the file's name.
  using change_check = std::function<std::string(std::string&)>;
  //! Check the set's files with `check` instead of one by one
  //! (`fs_image::map_files` sets one). Copies of the set share it.
  void set_change_check(change_check check) { check_ = std::make_shared<change_check>(std::move(check)); }

  //! `check_unchanged` as a callable that outlives the set (it keeps what
  //! the check needs: the set's change check, else copies of the maps).
  std::function<void()> unchanged_check() const {
    if (check_)
      return [check = check_] {
        std::string file;
        if (const std::string what = (*check)(file); !what.empty()) detail::throw_stale(file, what);
      };
    auto maps = std::make_shared<std::vector<extent_map>>();
    for (const named_map& f : files_)
      maps->push_back(f.map);
    return [maps] {
      for (const extent_map& m : *maps)
        m.check_unchanged();
    };
  }

  //! Throws bam::error (ESTALE) for the first file whose map no longer
  //! describes it (see `extent_map::check_unchanged`).
  void check_unchanged() const {
    if (check_) {
      std::string file;
      if (const std::string what = (*check_)(file); !what.empty()) detail::throw_stale(file, what);
      return;
    }
    for (const named_map& f : files_)
      f.map.check_unchanged();
  }

private:
  std::vector<named_map> files_;
  std::vector<std::uint64_t> first_{0};
  std::vector<std::uint64_t> start_;
  std::vector<std::uint64_t> lba_;
  std::vector<std::uint64_t> size_;
  std::uint64_t total_ = 0;
  std::uint32_t lba_shift_ = 9;
  std::shared_ptr<change_check> check_; //!< all files at once, if set
};

} // namespace bam
