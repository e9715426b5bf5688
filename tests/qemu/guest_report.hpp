// SPDX-License-Identifier: MIT
// How the QEMU guest programs report: one "BAMTEST CASE <name> PASS|FAIL
// <detail>" line per check and "BAMTEST INFO" lines, which scripts/qemu-test
// collects from the console; failures counts the failed checks (the exit
// status).
#pragma once

#include <cstdio>
#include <string>

namespace bam::guest {

inline int failures = 0;

inline void report(const std::string& name, bool ok, const std::string& detail = {}) {
  std::printf("BAMTEST CASE %s %s %s\n", name.c_str(), ok ? "PASS" : "FAIL", detail.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

inline void info(const std::string& key, const std::string& value) {
  std::printf("BAMTEST INFO %s: %s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
}

} // namespace bam::guest
