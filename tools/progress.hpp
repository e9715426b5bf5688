// SPDX-License-Identifier: MIT
// A one-line progress bar on standard error for long transfers: percent,
// bytes, rate and time left, redrawn at most ten times a second, and only
// when standard error is a terminal.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace bam::tools {

class progress_bar {
public:
  progress_bar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled && ::isatty(2) != 0) {}
  ~progress_bar() { finish(); }
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  void update(std::uint64_t done, std::uint64_t total, double seconds) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    constexpr int width = 30;
    const double frac = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const int fill = static_cast<int>(frac * width);
    const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
    const double left = rate > 0 ? static_cast<double>(total - done) / rate : 0;
    std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%%  %.1f/%.1f MiB  %.1f MiB/s  %d:%02d left ", label_.c_str(), fill,
                 "##############################", width - fill, "", frac * 100, static_cast<double>(done) / mib,
                 static_cast<double>(total) / mib, rate / mib, static_cast<int>(left) / 60,
                 static_cast<int>(left) % 60);
    std::fflush(stderr);
  }
  //! A transfer's progress callback that redraws this bar (e.g. for
  //! `bam::dataset_options::progress`); the bar must outlive the transfer.
  auto follow() {
    return [this](const auto& p) { update(p.bytes_done, p.bytes_total, p.seconds); };
  }
  //! End the line (once).
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

private:
  static constexpr double mib = 1024.0 * 1024.0;
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

} // namespace bam::tools
