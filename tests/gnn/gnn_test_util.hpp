// SPDX-License-Identifier: MIT
// Helpers of the bam-gnn tests: a temporary directory removed at the end of
// a test, and the bam-gnn command run with its output and exit status.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace bam_gnn_test {

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/bam-gnn-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

struct run_result {
  int status = -1;
  std::string out;
};

//! `bam-gnn ARGS` (BAM_GNN_PATH), stdout and stderr together.
inline run_result bam_gnn(const std::string& args) {
  run_result r;
  const std::string cmd = std::string(BAM_GNN_PATH) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p))
    r.out += buf;
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return r;
}

} // namespace bam_gnn_test
