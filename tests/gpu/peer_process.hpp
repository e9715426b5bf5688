// SPDX-License-Identifier: MIT
// Another process of a test, driven through its standard input and output
// one line at a time (the group-cache tests' peer). Plain C++: built by the
// host compiler.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace bam_test {

class peer {
public:
  //! Start `args[0]` with arguments `args[1..]`.
  explicit peer(const std::vector<std::string>& args);
  ~peer();
  peer(const peer&) = delete;
  peer& operator=(const peer&) = delete;

  //! Its next line of output ("" at its end).
  std::string line();
  //! Send `command`, return its answer.
  std::string ask(const std::string& command);
  //! "check FIRST COUNT SALT": elements done and wrong, and the peer's page
  //! loads so far (bad is ~0 when the answer is not "ok ...").
  struct checked {
    unsigned long long done = 0, bad = ~0ull, misses = 0;
  };
  checked check(std::uint64_t first, std::uint64_t count, std::uint32_t salt);
  //! Its exit status, once its input is closed (-1 if it could not be waited for).
  int finish();

private:
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
};

} // namespace bam_test
