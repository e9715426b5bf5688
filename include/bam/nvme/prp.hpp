// SPDX-License-Identifier: MIT
//! Physical Region Page (PRP) lists: building them (host and GPU submitters)
//! and walking them (the software controller). Both sides are unit-tested
//! against each other with fake bus addresses.
//!
//! Rules (NVMe base spec 2.0, 4.1.1): PRP1 points at the first byte and may
//! carry an offset (dword aligned). If the transfer ends within the next
//! page, PRP2 is that page's address; if it spans more, PRP2 points at a PRP
//! list whose entries are page addresses with no offset. When a list fills a
//! page, its last entry points at the next list page.
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/nvme/spec.hpp>

#include <cstddef>
#include <cstdint>

namespace bam::nvme {

struct prp_pair {
  std::uint64_t prp1 = 0;
  std::uint64_t prp2 = 0;
};

//! List pages a caller must provide for a transfer touching `pages` memory pages.
BAM_HD constexpr std::size_t prp_list_pages_needed(std::size_t pages, std::size_t page_size) {
  if (pages <= 2) return 0;
  const std::size_t entries = pages - 1;                        // all but the first page
  const std::size_t per_page = prp_entries_per_page(page_size); // last one may chain
  if (entries <= per_page) return 1;
  // Every full page but the last gives up one entry to the chain pointer.
  return (entries - 1 + (per_page - 1) - 1) / (per_page - 1);
}
static_assert(prp_list_pages_needed(2, 4096) == 0);
static_assert(prp_list_pages_needed(3, 4096) == 1);
static_assert(prp_list_pages_needed(513, 4096) == 1);
static_assert(prp_list_pages_needed(514, 4096) == 2);

//! Build PRP1/PRP2 for `bytes` starting `offset` bytes into a region whose
//! memory pages have bus addresses `page_bus[0..]` (page aligned).
//! `list_virt[i]` / `list_bus[i]` are the CPU/GPU pointer and bus address of
//! list page i. Returns false if the arguments cannot describe the transfer
//! (too few list pages, misaligned offset, zero length).
BAM_HD inline bool build_prp(const std::uint64_t* page_bus, std::uint64_t offset, std::uint64_t bytes,
                             std::uint64_t page_size, std::uint64_t* const* list_virt, const std::uint64_t* list_bus,
                             std::size_t list_pages, prp_pair& out) {
  if (bytes == 0 || !prp_offset_valid(offset)) return false;
  const std::uint64_t first_page = offset / page_size;
  const std::uint64_t in_page = offset % page_size;
  const std::uint64_t pages = prp_pages_spanned(in_page, bytes, page_size);
  out.prp1 = page_bus[first_page] + in_page;
  out.prp2 = 0;
  if (pages == 1) return true;
  if (pages == 2) {
    out.prp2 = page_bus[first_page + 1];
    return true;
  }
  if (prp_list_pages_needed(pages, page_size) > list_pages) return false;
  const std::size_t per_page = prp_entries_per_page(page_size);
  out.prp2 = list_bus[0];
  std::size_t list = 0, slot = 0;
  for (std::uint64_t p = 1; p < pages; ++p) {
    const bool last_entry = (p == pages - 1);
    if (slot == per_page - 1 && !last_entry) {
      list_virt[list][slot] = list_bus[list + 1]; // chain to the next list page
      ++list;
      slot = 0;
    }
    list_virt[list][slot++] = page_bus[first_page + p];
  }
  return true;
}

//! Walk the PRPs of a command moving `bytes`, calling `segment(bus, len)` for
//! each contiguous piece in order. `read_list(bus, dst, count)` must copy
//! `count` list entries at `bus` into `dst` (returns false if it cannot).
//! Returns a status: success, `invalid_prp_offset`, or `data_transfer_error`.
BAM_EXEC_CHECK_DISABLE
template <class ReadList, class Segment>
BAM_HD status walk_prp(std::uint64_t prp1, std::uint64_t prp2, std::uint64_t bytes, std::uint64_t page_size,
                       ReadList&& read_list, Segment&& segment) {
  const status bad_offset{status_type::generic, generic_status::invalid_prp_offset, true};
  const status transfer_error{status_type::generic, generic_status::data_transfer_error, true};
  if (bytes == 0) return status();
  if (!prp_offset_valid(prp1)) return bad_offset;
  const std::uint64_t first_len = page_size - (prp1 % page_size);
  const std::uint64_t len1 = bytes < first_len ? bytes : first_len;
  if (!segment(prp1, len1)) return transfer_error;
  std::uint64_t left = bytes - len1;
  if (left == 0) return status();
  if (left <= page_size) {
    if (prp2 % page_size != 0) return bad_offset;
    return segment(prp2, left) ? status() : transfer_error;
  }
  // PRP2 is a list pointer; it may carry an offset (qword aligned).
  if (prp2 % sizeof(std::uint64_t) != 0) return bad_offset;
  const std::size_t per_page = prp_entries_per_page(page_size);
  std::uint64_t list = prp2;
  constexpr std::size_t chunk = 32;
  std::uint64_t entries[chunk];
  while (left > 0) {
    const std::size_t slots_here = per_page - (list % page_size) / sizeof(std::uint64_t);
    std::size_t idx = 0;
    while (idx < slots_here && left > 0) {
      const std::size_t n = (slots_here - idx) < chunk ? (slots_here - idx) : chunk;
      if (!read_list(list + idx * sizeof(std::uint64_t), entries, n)) return transfer_error;
      for (std::size_t k = 0; k < n && left > 0; ++k, ++idx) {
        const std::uint64_t pages_left = (left + page_size - 1) / page_size;
        if (idx == slots_here - 1 && pages_left > 1) {
          // Last slot of a list page with more than one page to go: a chain pointer.
          if (entries[k] % page_size != 0) return bad_offset;
          list = entries[k];
          goto next_list;
        }
        if (entries[k] % page_size != 0) return bad_offset;
        const std::uint64_t len = left < page_size ? left : page_size;
        if (!segment(entries[k], len)) return transfer_error;
        left -= len;
      }
    }
    break;
  next_list:;
  }
  return left == 0 ? status() : transfer_error;
}

} // namespace bam::nvme
