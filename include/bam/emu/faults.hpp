// SPDX-License-Identifier: MIT
//! Fault injection for the software NVMe controller: rules that make chosen
//! commands complete with an error status, complete late, or never complete.
//! Rules can be added and removed while I/O runs.
//!
//! @code
//!   bam::emu::fault_rule r;
//!   r.opcode = static_cast<std::uint8_t>(bam::nvme::nvm_opcode::read);
//!   r.lba_first = 100; r.lba_last = 199;       // reads touching LBAs 100..199
//!   r.skip = 2; r.count = 1;                    // the third such read, once
//!   r.action = bam::emu::fault_action::fail;
//!   r.status = {bam::nvme::status_type::media_error,
//!   bam::nvme::media_status::unrecovered_read_error}; auto id = ctrl->faults().add(r);
//!   ...
//!   REQUIRE(ctrl->faults().fired(id) == 1);
//! @endcode
#pragma once

#include <bam/nvme/spec.hpp>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

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

//! A thread-safe set of rules, checked for every command the controller fetches.
class fault_injector {
public:
  using rule_id = std::uint64_t;

  //! Add a rule; returns its id. Rules are checked in the order added; the first that fires wins.
  rule_id add(const fault_rule& r) {
    std::lock_guard lock(mutex_);
    rules_.push_back({next_id_, r, 0, 0});
    active_.store(true, std::memory_order_release);
    return next_id_++;
  }
  //! Remove a rule; false if there was none with that id.
  bool remove(rule_id id) {
    std::lock_guard lock(mutex_);
    for (auto it = rules_.begin(); it != rules_.end(); ++it) {
      if (it->id == id) {
        rules_.erase(it);
        active_.store(!rules_.empty(), std::memory_order_release);
        return true;
      }
    }
    return false;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    rules_.clear();
    active_.store(false, std::memory_order_release);
  }
  //! Times rule `id` has fired (0 if unknown).
  std::uint64_t fired(rule_id id) const {
    std::lock_guard lock(mutex_);
    for (const auto& e : rules_)
      if (e.id == id) return e.fired;
    return 0;
  }

  //! Latency added to every completion, admin and I/O (0: none).
  void set_global_latency_ns(std::uint64_t ns) {
    global_latency_ns_.store(ns, std::memory_order_relaxed);
  }
  std::uint64_t global_latency_ns() const {
    return global_latency_ns_.load(std::memory_order_relaxed);
  }

  //! Check `cmd`, fetched from submission queue `qid`, against the rules.
  fault_decision check(const nvme::command& cmd, std::uint16_t qid) {
    fault_decision d;
    if (!active_.load(std::memory_order_acquire)) return d;
    std::lock_guard lock(mutex_);
    for (auto& e : rules_) {
      if (!matches(e.rule, cmd, qid)) continue;
      if (e.rule.count != 0 && e.fired >= e.rule.count) continue;
      if (e.seen++ < e.rule.skip) continue;
      ++e.fired;
      d.matched = true;
      d.action = e.rule.action;
      d.status = e.rule.status;
      d.latency_ns = e.rule.latency_ns;
      return d;
    }
    return d;
  }

private:
  struct entry {
    rule_id id;
    fault_rule rule;
    std::uint64_t seen;  //!< matches so far
    std::uint64_t fired; //!< times it acted
  };

  static bool carries_lba(std::uint8_t opcode) {
    using nvme::nvm_opcode;
    return opcode == static_cast<std::uint8_t>(nvm_opcode::read) ||
           opcode == static_cast<std::uint8_t>(nvm_opcode::write) ||
           opcode == static_cast<std::uint8_t>(nvm_opcode::write_zeroes);
  }

  static bool matches(const fault_rule& r, const nvme::command& cmd, std::uint16_t qid) {
    const bool is_admin = qid == 0;
    if (r.admin != is_admin) return false;
    if (r.opcode && *r.opcode != cmd.opcode) return false;
    if (r.qid && *r.qid != qid) return false;
    const bool whole_range =
        r.lba_first == 0 && r.lba_last == std::numeric_limits<std::uint64_t>::max();
    if (whole_range) return true;
    if (is_admin || !carries_lba(cmd.opcode)) return false;
    const std::uint64_t first = nvme::command_slba(cmd);
    const std::uint64_t last = first + nvme::command_nblocks(cmd) - 1;
    return first <= r.lba_last && last >= r.lba_first;
  }

  mutable std::mutex mutex_;
  std::vector<entry> rules_;
  rule_id next_id_ = 1;
  std::atomic<bool> active_{false};
  std::atomic<std::uint64_t> global_latency_ns_{0};
};

} // namespace bam::emu
