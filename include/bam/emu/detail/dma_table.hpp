// SPDX-License-Identifier: MIT
//! The software controller's model of DMA: bus address -> virtual address
//! translation for every region mapped for it, and the region object that
//! removes its mapping when destroyed.
#pragma once

#include <bam/transport/transport.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace bam::emu::detail {

//! First fake bus address handed out: above every user-space virtual address.
inline constexpr std::uint64_t fake_bus_base = 0x0000'b000'0000'0000ull;

//! Bus address -> virtual address translation for every mapped region.
class dma_table {
public:
  explicit dma_table(bool identity) : identity_(identity) {}

  //! Record `[ptr, ptr + size)`; returns its bus base and a key to remove it.
  std::uint64_t add(void* ptr, std::size_t size, std::uint64_t& key) {
    std::unique_lock lock(mutex_);
    const std::uint64_t bus = identity_ ? reinterpret_cast<std::uint64_t>(ptr) : next_bus_;
    if (!identity_) next_bus_ += size + dma_page_size; // a guard page between regions
    key = next_key_++;
    regions_.emplace(bus, region{bus, size, static_cast<unsigned char*>(ptr), key});
    return bus;
  }
  void remove(std::uint64_t bus, std::uint64_t key) {
    std::unique_lock lock(mutex_);
    auto [lo, hi] = regions_.equal_range(bus);
    for (auto it = lo; it != hi; ++it) {
      if (it->second.key == key) {
        regions_.erase(it);
        return;
      }
    }
  }
  //! Virtual address of `[bus, bus + len)` if one mapping holds all of it, else nullptr.
  void* translate(std::uint64_t bus, std::uint64_t len) const {
    std::shared_lock lock(mutex_);
    auto it = regions_.upper_bound(bus);
    while (it != regions_.begin()) {
      --it;
      const region& r = it->second;
      if (bus - r.bus < r.size && len <= r.size - (bus - r.bus)) return r.vaddr + (bus - r.bus);
      if (!identity_) break; // regions never overlap: only the nearest one can hold it
    }
    return nullptr;
  }
  bool identity() const { return identity_; }

private:
  struct region {
    std::uint64_t bus;
    std::uint64_t size;
    unsigned char* vaddr;
    std::uint64_t key;
  };
  const bool identity_;
  mutable std::shared_mutex mutex_;
  std::multimap<std::uint64_t, region> regions_;
  std::uint64_t next_bus_ = fake_bus_base;
  std::uint64_t next_key_ = 1;
};

//! A mapping in a `dma_table`; removes itself when destroyed (even after the controller).
class emu_dma_region final : public dma_region {
public:
  emu_dma_region(std::shared_ptr<dma_table> table, void* ptr, std::size_t size, memory_kind kind, std::uint64_t bus,
                 std::uint64_t key)
      : dma_region(ptr, size, kind, page_list(bus, size)), table_(std::move(table)), bus_(bus), key_(key) {}
  ~emu_dma_region() override { table_->remove(bus_, key_); }

private:
  static std::vector<std::uint64_t> page_list(std::uint64_t bus, std::size_t size) {
    std::vector<std::uint64_t> pages(size / dma_page_size);
    for (std::size_t i = 0; i < pages.size(); ++i)
      pages[i] = bus + i * dma_page_size;
    return pages;
  }
  std::shared_ptr<dma_table> table_;
  std::uint64_t bus_;
  std::uint64_t key_;
};

} // namespace bam::emu::detail
