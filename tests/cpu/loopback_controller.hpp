// SPDX-License-Identifier: MIT
// A minimal NVMe queue peer for protocol tests: one thread fetches SQ entries
// in order after the tail doorbell, completes them in a shuffled order, reports
// the SQ head in every completion and never overwrites an unconsumed CQ entry.
// Completion dword 0 echoes a token derived from the command, so the test can
// prove that every completion reached the submitter of that command.
#pragma once

#include <bam/nvme/queue.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace bam::test {

inline std::uint32_t echo_token(const nvme::command& c) { return c.cdw12 ^ 0x5a5a'a5a5u; }

class loopback_controller {
public:
  explicit loopback_controller(std::uint32_t depth, std::uint32_t seed = 1)
      : depth_(depth), sq_(depth), cq_(depth),
        state_(static_cast<unsigned char*>(std::aligned_alloc(128, round(nvme::queue_state_bytes(depth))))),
        rng_(seed) {
    if (!state_) throw std::bad_alloc();
    std::memset(state_.get(), 0, nvme::queue_state_bytes(depth));
    ref_.sq = sq_.data();
    ref_.cq = cq_.data();
    ref_.sq_doorbell = &sq_doorbell_;
    ref_.cq_doorbell = &cq_doorbell_;
    ref_.sq_depth = depth;
    ref_.cq_depth = depth;
    ref_.qid = 1;
    ref_.attach_state(state_.get());
    worker_ = std::thread([this] { run(); });
  }
  ~loopback_controller() {
    stop_.store(true);
    worker_.join();
  }

  nvme::queue_pair_ref queue() const { return ref_; }
  void stop_answering(bool v) { silent_.store(v); }
  //! Complete commands whose token has this bit set with an error status.
  void fail_tokens_with_bit(std::uint32_t bit) { fail_bit_.store(bit); }
  std::uint64_t completed() const { return completed_.load(); }
  std::uint64_t overruns() const { return overruns_.load(); }

private:
  using u32_ref = cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>;

  void run() {
    std::uint32_t head = 0, cq_tail = 0, phase = 1;
    std::vector<std::pair<nvme::command, std::uint32_t>> fetched;
    while (!stop_.load(std::memory_order_relaxed)) {
      if (silent_.load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      const std::uint32_t tail = u32_ref(sq_doorbell_).load(cuda::memory_order_acquire);
      if (tail >= depth_) {
        overruns_.fetch_add(1);
        continue;
      }
      // Entries between head and tail, in order; more than depth-1 would be an overrun.
      const std::uint32_t avail = (tail + depth_ - head) % depth_;
      if (fetched.size() + avail > depth_ - 1) overruns_.fetch_add(1);
      while (head != tail) {
        fetched.emplace_back(sq_[head], 0);
        head = (head + 1) % depth_;
      }
      if (fetched.empty()) {
        std::this_thread::yield();
        continue;
      }
      std::shuffle(fetched.begin(), fetched.end(), rng_);
      // Complete a random part of what was fetched; the rest waits a round.
      const std::size_t n = 1 + rng_() % fetched.size();
      for (std::size_t i = 0; i < n; ++i) {
        const nvme::command& c = fetched[i].first;
        // CQ full: tail + 1 == head doorbell. Wait for the host to consume.
        while (((cq_tail + 1) % depth_) == u32_ref(cq_doorbell_).load(cuda::memory_order_acquire)) {
          if (stop_.load()) return;
          std::this_thread::yield();
        }
        nvme::completion& e = cq_[cq_tail];
        const std::uint32_t token = echo_token(c);
        e.dw0 = token;
        e.dw1 = 0;
        e.sq_head = static_cast<std::uint16_t>(head);
        e.sq_id = 1;
        const std::uint32_t fb = fail_bit_.load();
        const std::uint16_t st =
            (fb != 0 && (token & fb))
                ? nvme::status{nvme::status_type::media_error, nvme::media_status::unrecovered_read_error}.raw
                : 0;
        const std::uint32_t dw3 = c.cid | (static_cast<std::uint32_t>((st << 1) | phase) << 16);
        u32_ref(*reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(&e) + 12))
            .store(dw3, cuda::memory_order_release);
        cq_tail = (cq_tail + 1) % depth_;
        if (cq_tail == 0) phase ^= 1;
        completed_.fetch_add(1, std::memory_order_relaxed);
      }
      fetched.erase(fetched.begin(), fetched.begin() + static_cast<std::ptrdiff_t>(n));
    }
  }

  std::uint32_t depth_;
  std::vector<nvme::command> sq_;
  std::vector<nvme::completion> cq_;
  alignas(64) std::uint32_t sq_doorbell_ = 0;
  alignas(64) std::uint32_t cq_doorbell_ = 0;
  static std::size_t round(std::size_t n) { return (n + 127) / 128 * 128; }
  struct free_deleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, free_deleter> state_; // zeroed, 128-byte aligned
  nvme::queue_pair_ref ref_;
  std::mt19937 rng_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> silent_{false};
  std::atomic<std::uint32_t> fail_bit_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> overruns_{0};
  std::thread worker_;
};

} // namespace bam::test
