// SPDX-License-Identifier: MIT
//! PRP list pages for host-submitted transfers, shared by all I/O queues of
//! one controller: a fixed set of entries, each enough list pages for the
//! largest transfer the driver issues.
#pragma once

#include <bam/error.hpp>
#include <bam/nvme/prp.hpp>
#include <bam/transport/transport.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bam::detail {

class prp_pool {
public:
  //! Entries in the pool: how many host transfers may be in flight at once.
  static constexpr std::uint32_t entries = 64;
  //! List pages one entry can hand to `build_prp` at most.
  static constexpr std::size_t max_pages_per_entry = 64;

  prp_pool() = default;
  //! Set up for transfers of up to `max_transfer` bytes.
  void setup(transport& t, std::size_t max_transfer) {
    const std::size_t pages = max_transfer / dma_page_size + 1;
    pages_per_entry_ = std::max<std::size_t>(1, nvme::prp_list_pages_needed(pages, dma_page_size));
    if (pages_per_entry_ > max_pages_per_entry) pages_per_entry_ = max_pages_per_entry;
    pages_ = t.alloc(entries * pages_per_entry_ * dma_page_size);
    free_.clear();
    for (std::uint32_t i = 0; i < entries; ++i)
      free_.push_back(i);
  }

  std::size_t pages_per_entry() const { return pages_per_entry_; }
  //! CPU pointer and bus address of list page `i` of entry `e`.
  std::uint64_t* page(std::uint32_t e, std::size_t i) const {
    return reinterpret_cast<std::uint64_t*>(pages_->as<unsigned char>() + offset(e, i));
  }
  std::uint64_t page_bus(std::uint32_t e, std::size_t i) const { return pages_->bus_address(offset(e, i)); }

  std::optional<std::uint32_t> try_acquire() {
    std::lock_guard<std::mutex> lock(m_);
    if (free_.empty()) return std::nullopt;
    const std::uint32_t e = free_.back();
    free_.pop_back();
    return e;
  }
  //! Wait for an entry, holding none; bounded like every wait.
  std::uint32_t acquire(std::uint64_t timeout_ns, const std::string& controller) {
    std::unique_lock<std::mutex> lock(m_);
    // A timeout past what the clock can add (about 146 years) waits that long.
    constexpr std::uint64_t longest = std::uint64_t{1} << 62;
    const auto wait = std::chrono::nanoseconds(static_cast<std::int64_t>(std::min(timeout_ns, longest)));
    if (!cv_.wait_for(lock, wait, [&] { return !free_.empty(); })) {
      error_context c;
      c.controller = controller;
      c.status = nvme::status_timeout;
      throw error("no PRP list memory became free (commands that timed out keep theirs)", c);
    }
    const std::uint32_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void release(std::uint32_t e) {
    {
      std::lock_guard<std::mutex> lock(m_);
      free_.push_back(e);
    }
    cv_.notify_one();
  }
  void reset() { pages_.reset(); }

private:
  std::size_t offset(std::uint32_t e, std::size_t i) const { return (e * pages_per_entry_ + i) * dma_page_size; }

  std::unique_ptr<dma_region> pages_;
  std::size_t pages_per_entry_ = 0;
  std::vector<std::uint32_t> free_;
  std::mutex m_;
  std::condition_variable cv_;
};

} // namespace bam::detail
