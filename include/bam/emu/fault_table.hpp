// SPDX-License-Identifier: MIT
//! Fault injection for the software NVMe controller: rules that make chosen
//! commands complete with an error status, complete late, or never complete;
//! a switch that makes the controller stop answering; a latency added to
//! every completion. One table serves every engine: the CPU engine and the
//! CPU engine for GPU clients read it in host memory, the GPU engine a copy
//! in GPU memory. Rules can be added and removed while I/O runs.
//!
//! @code
//!   bam::emu::fault_rule r;
//!   r.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::read);
//!   r.lba_first = 100; r.lba_last = 199;       // reads touching LBAs 100..199
//!   r.skip = 2; r.count = 1;                   // the third such read, once
//!   r.action = bam::emu::fault_action::fail;
//!   r.status = {bam::nvme::status_type::media_error, bam::nvme::media_status::unrecovered_read_error};
//!   auto id = ctrl->faults().add(r);
//!   ...
//!   REQUIRE(ctrl->faults().fired(id) == 1);
//! @endcode
#pragma once

#include <bam/detail/macros.hpp>
#include <bam/error.hpp>
#include <bam/nvme/spec.hpp>

#include <cuda/atomic>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <memory>

namespace bam::emu {

//! What a matching rule does to the command.
enum class fault_action : std::uint8_t {
  fail,  //!< complete at once with `status`, without executing the command
  delay, //!< execute, then complete `latency_ns` later
  drop,  //!< fetch and forget: never complete
};

//! Which commands a rule matches, and what it then does. Empty fields match anything.
struct fault_rule {
  bool admin = false;                 //!< match admin commands (queue 0) instead of NVM ones
  std::optional<std::uint8_t> opcode; //!< opcode within that command set
  std::optional<std::uint16_t> qid;   //!< submission queue id
  //! Inclusive LBA range a Read/Write/Write Zeroes must overlap. A rule with a
  //! narrowed range never matches commands that carry no LBA.
  std::uint64_t lba_first = 0;
  std::uint64_t lba_last = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t skip = 0;  //!< let the first `skip` matches through
  std::uint64_t count = 1; //!< fire this many times, then stay inert (0: forever)
  fault_action action = fault_action::fail;
  nvme::status status{nvme::status_type::generic, nvme::generic_status::internal_error};
  std::uint64_t latency_ns = 0; //!< for `delay`
};

//! The decision for one command.
struct fault_decision {
  bool matched = false;
  fault_action action = fault_action::fail;
  nvme::status status;
  std::uint64_t latency_ns = 0;
};

//! Rules one table holds.
inline constexpr std::uint32_t max_fault_rules = 32;

namespace detail {

//! One rule as the table stores it: plain words, read and written with
//! atomics (engines read rules while the host changes them).
struct fault_slot {
  std::uint32_t in_use; //!< written last when a rule is added, first when removed
  std::uint32_t match;  //!< bit 0: admin, bit 1: opcode given, bit 2: qid given
  std::uint32_t opcode;
  std::uint32_t qid;
  std::uint32_t action;
  std::uint32_t status;
  std::uint64_t lba_first;
  std::uint64_t lba_last;
  std::uint64_t skip;
  std::uint64_t count;
  std::uint64_t latency_ns;
  std::uint64_t seen;  //!< matches so far
  std::uint64_t fired; //!< times it acted
};

inline constexpr std::uint32_t match_admin = 1;
inline constexpr std::uint32_t match_opcode = 2;
inline constexpr std::uint32_t match_qid = 4;

template <class T>
BAM_HD T load_word(const T& w) {
#if BAM_DEVICE_CODE
  // The GPU engine's copy is GPU memory.
  return cuda::atomic_ref<T, cuda::thread_scope_device>(const_cast<T&>(w)).load(cuda::memory_order_relaxed);
#else
  return cuda::atomic_ref<T, cuda::thread_scope_system>(const_cast<T&>(w)).load(cuda::memory_order_relaxed);
#endif
}
template <class T>
BAM_HD void store_word(T& w, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(w).store(v, cuda::memory_order_relaxed);
}

BAM_HD inline bool carries_lba(std::uint8_t opcode) {
  using nvme::nvm_opcode;
  return opcode == static_cast<std::uint8_t>(nvm_opcode::read) ||
         opcode == static_cast<std::uint8_t>(nvm_opcode::write) ||
         opcode == static_cast<std::uint8_t>(nvm_opcode::write_zeroes);
}

} // namespace detail

//! The table engines consult for every command they fetch. Plain data:
//! lives wherever the engine that reads it runs (host or GPU memory).
struct fault_table {
  std::uint32_t rules;             //!< slots in use or used since the last clear (0: fast path)
  std::uint32_t paused;            //!< 1: the controller stops fetching and completing; 2: and its threads stop
                                   //!< running (as if the host kept them off the CPU)
  std::uint64_t global_latency_ns; //!< added to every completion
  detail::fault_slot slot[max_fault_rules];

  BAM_HD bool is_paused() const { return detail::load_word(paused) != 0; }
  BAM_HD bool is_stalled() const { return detail::load_word(paused) == 2; }
  BAM_HD std::uint64_t added_latency_ns() const { return detail::load_word(global_latency_ns); }

  //! Check `cmd`, fetched from submission queue `qid`, against the rules.
  //! Rules are checked in slot order; the first that fires wins.
  BAM_HD fault_decision check(const nvme::command& cmd, std::uint16_t qid) {
    fault_decision d;
    const std::uint32_t n = detail::load_word(rules);
    for (std::uint32_t i = 0; i < n && i < max_fault_rules; ++i) {
      detail::fault_slot& s = slot[i];
      if (cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(s.in_use).load(cuda::memory_order_acquire) == 0)
        continue;
      if (!matches(s, cmd, qid)) continue;
      cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system> seen(s.seen), fired(s.fired);
      const std::uint64_t count = detail::load_word(s.count);
      if (count != 0 && fired.load(cuda::memory_order_relaxed) >= count) continue;
      if (seen.fetch_add(1, cuda::memory_order_relaxed) < detail::load_word(s.skip)) continue;
      // Fire at most `count` times, also when several engines match at once.
      std::uint64_t f = fired.load(cuda::memory_order_relaxed);
      bool won = false;
      while (count == 0 || f < count) {
        if (fired.compare_exchange_weak(f, f + 1, cuda::memory_order_relaxed)) {
          won = true;
          break;
        }
      }
      if (!won) continue;
      d.matched = true;
      d.action = static_cast<fault_action>(detail::load_word(s.action));
      d.status = nvme::status(static_cast<std::uint16_t>(detail::load_word(s.status)));
      d.latency_ns = detail::load_word(s.latency_ns);
      return d;
    }
    return d;
  }

private:
  BAM_HD static bool matches(const detail::fault_slot& s, const nvme::command& cmd, std::uint16_t qid) {
    const std::uint32_t m = detail::load_word(s.match);
    const bool is_admin = qid == 0;
    if (((m & detail::match_admin) != 0) != is_admin) return false;
    if ((m & detail::match_opcode) && detail::load_word(s.opcode) != cmd.opcode) return false;
    if ((m & detail::match_qid) && detail::load_word(s.qid) != qid) return false;
    const std::uint64_t lo = detail::load_word(s.lba_first), hi = detail::load_word(s.lba_last);
    if (lo == 0 && hi == ~0ull) return true;
    if (is_admin || !detail::carries_lba(cmd.opcode)) return false;
    const std::uint64_t first = nvme::command_slba(cmd);
    const std::uint64_t last = first + nvme::command_nblocks(cmd) - 1;
    return first <= hi && last >= lo;
  }
};

//! Where a fault table lives and how the host reaches it. The default keeps
//! it in host memory; the GPU engine keeps it in GPU memory and copies.
class fault_table_memory {
public:
  virtual ~fault_table_memory() = default;
  //! The table as the engines read it.
  virtual fault_table* table() = 0;
  //! Copy host bytes into the table at byte `offset` (in GPU memory: ordered
  //! with nothing else; the engines read it while kernels run).
  virtual void write(std::size_t offset, const void* src, std::size_t bytes) = 0;
  //! Copy table bytes at `offset` out to the host.
  virtual void read(std::size_t offset, void* dst, std::size_t bytes) const = 0;
};

namespace detail {

//! A fault table in host memory; every word is accessed with atomics.
class host_fault_table final : public fault_table_memory {
public:
  host_fault_table() { std::memset(static_cast<void*>(&t_), 0, sizeof t_); }
  fault_table* table() override { return &t_; }
  // The table holds 4- and 8-byte words at their natural alignment, and every
  // offset and length here is a multiple of 4: copies go word by word, each
  // word with a relaxed atomic of its own width, so engine threads never see
  // a torn word.
  void write(std::size_t offset, const void* src, std::size_t bytes) override {
    auto* d = reinterpret_cast<unsigned char*>(&t_) + offset;
    const auto* s = static_cast<const unsigned char*>(src);
    for (std::size_t i = 0; i < bytes;) {
      if (reinterpret_cast<std::uintptr_t>(d + i) % 8 == 0 && bytes - i >= 8) {
        std::uint64_t v;
        std::memcpy(&v, s + i, 8);
        cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(*reinterpret_cast<std::uint64_t*>(d + i))
            .store(v, cuda::memory_order_relaxed);
        i += 8;
      } else {
        std::uint32_t v;
        std::memcpy(&v, s + i, 4);
        cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(*reinterpret_cast<std::uint32_t*>(d + i))
            .store(v, cuda::memory_order_relaxed);
        i += 4;
      }
    }
  }
  void read(std::size_t offset, void* dst, std::size_t bytes) const override {
    auto* s = reinterpret_cast<unsigned char*>(const_cast<fault_table*>(&t_)) + offset;
    auto* d = static_cast<unsigned char*>(dst);
    for (std::size_t i = 0; i < bytes;) {
      if (reinterpret_cast<std::uintptr_t>(s + i) % 8 == 0 && bytes - i >= 8) {
        const std::uint64_t v =
            cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(*reinterpret_cast<std::uint64_t*>(s + i))
                .load(cuda::memory_order_relaxed);
        std::memcpy(d + i, &v, 8);
        i += 8;
      } else {
        const std::uint32_t v =
            cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(*reinterpret_cast<std::uint32_t*>(s + i))
                .load(cuda::memory_order_relaxed);
        std::memcpy(d + i, &v, 4);
        i += 4;
      }
    }
  }

private:
  fault_table t_;
};

} // namespace detail

//! The host's handle on a fault table: add and remove rules, pause, add
//! latency, read how often rules fired. Thread-safe.
class fault_injector {
public:
  using rule_id = std::uint64_t;

  fault_injector() : mems_{} { mems_.push_back(std::make_unique<detail::host_fault_table>()); }

  //! The table in host memory (the one the CPU engines read).
  fault_table* table() const { return mems_.front()->table(); }
  //! Another copy every change reaches (the GPU engine's, in GPU memory).
  //! Added before any I/O; rules already there are copied over.
  void add_copy(std::unique_ptr<fault_table_memory> mem) {
    std::lock_guard lock(mutex_);
    fault_table t;
    mems_.front()->read(0, &t, sizeof t);
    mem->write(0, &t, sizeof t);
    mems_.push_back(std::move(mem));
  }

  //! Add a rule; returns its id. Rules are checked in the order added; the first that fires wins.
  rule_id add(const fault_rule& r) {
    std::lock_guard lock(mutex_);
    std::uint32_t rules = 0;
    mems_.front()->read(offsetof(fault_table, rules), &rules, sizeof rules);
    std::uint32_t i = 0;
    while (i < rules && ids_[i] != 0)
      ++i;
    if (i == max_fault_rules)
      throw error("fault injector: at most " + std::to_string(max_fault_rules) + " rules at once");
    detail::fault_slot s{};
    s.match = (r.admin ? detail::match_admin : 0u) | (r.opcode ? detail::match_opcode : 0u) |
              (r.qid ? detail::match_qid : 0u);
    s.opcode = r.opcode.value_or(0);
    s.qid = r.qid.value_or(0);
    s.action = static_cast<std::uint32_t>(r.action);
    s.status = r.status.raw;
    s.lba_first = r.lba_first;
    s.lba_last = r.lba_last;
    s.skip = r.skip;
    s.count = r.count;
    s.latency_ns = r.latency_ns;
    // Fields first, `in_use` last: an engine never sees a half-written rule in use.
    const std::size_t off = offsetof(fault_table, slot) + i * sizeof(detail::fault_slot);
    write(off + sizeof(std::uint32_t), reinterpret_cast<const unsigned char*>(&s) + sizeof(std::uint32_t),
          sizeof s - sizeof(std::uint32_t));
    const std::uint32_t one = 1;
    write(off, &one, sizeof one);
    if (i == rules) {
      rules = i + 1;
      write(offsetof(fault_table, rules), &rules, sizeof rules);
    }
    ids_[i] = next_id_;
    return next_id_++;
  }
  //! Remove a rule; false if there was none with that id.
  bool remove(rule_id id) {
    std::lock_guard lock(mutex_);
    for (std::uint32_t i = 0; i < max_fault_rules; ++i) {
      if (ids_[i] != id || id == 0) continue;
      const std::uint32_t zero = 0;
      write(offsetof(fault_table, slot) + i * sizeof(detail::fault_slot), &zero, sizeof zero);
      ids_[i] = 0;
      return true;
    }
    return false;
  }
  //! Remove every rule (pause and added latency stay).
  void clear() {
    std::lock_guard lock(mutex_);
    for (std::uint32_t i = 0; i < max_fault_rules; ++i) {
      if (ids_[i] == 0) continue;
      const std::uint32_t zero = 0;
      write(offsetof(fault_table, slot) + i * sizeof(detail::fault_slot), &zero, sizeof zero);
      ids_[i] = 0;
    }
  }
  //! Times rule `id` has fired (0 if unknown).
  std::uint64_t fired(rule_id id) const {
    std::lock_guard lock(mutex_);
    for (std::uint32_t i = 0; i < max_fault_rules; ++i) {
      if (ids_[i] != id || id == 0) continue;
      // Every copy counts the commands its engines saw.
      std::uint64_t total = 0;
      for (const auto& m : mems_) {
        std::uint64_t f = 0;
        m->read(offsetof(fault_table, slot) + i * sizeof(detail::fault_slot) + offsetof(detail::fault_slot, fired), &f,
                sizeof f);
        total += f;
      }
      return total;
    }
    return 0;
  }

  //! Latency added to every completion, admin and I/O (0: none).
  void set_global_latency_ns(std::uint64_t ns) {
    std::lock_guard lock(mutex_);
    write(offsetof(fault_table, global_latency_ns), &ns, sizeof ns);
  }
  std::uint64_t global_latency_ns() const {
    std::uint64_t ns = 0;
    mems_.front()->read(offsetof(fault_table, global_latency_ns), &ns, sizeof ns);
    return ns;
  }
  //! The controller stops fetching and completing commands (true) or resumes.
  void set_paused(bool stop) {
    std::lock_guard lock(mutex_);
    const std::uint32_t v = stop ? 1 : 0;
    write(offsetof(fault_table, paused), &v, sizeof v);
  }
  //! The threads serving the controller stop running, as a busy host would
  //! keep them off the CPU (true), or run again. Unlike a pause, waits do not
  //! run out meanwhile (`nvme::queue_pair_ref::controller_run_ns`).
  void set_stalled(bool stall) {
    std::lock_guard lock(mutex_);
    const std::uint32_t v = stall ? 2 : 0;
    write(offsetof(fault_table, paused), &v, sizeof v);
  }
  bool paused() const {
    std::uint32_t v = 0;
    mems_.front()->read(offsetof(fault_table, paused), &v, sizeof v);
    return v != 0;
  }

private:
  void write(std::size_t offset, const void* src, std::size_t bytes) {
    for (auto& m : mems_)
      m->write(offset, src, bytes);
  }

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<fault_table_memory>> mems_;
  rule_id ids_[max_fault_rules] = {};
  rule_id next_id_ = 1;
};

} // namespace bam::emu
