// SPDX-License-Identifier: MIT
// A scratch directory for a test (with a `src` folder for mkfs -d), removed
// with everything in it when the object goes.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace bam_test {

struct scratch_dir {
  std::filesystem::path dir;
  explicit scratch_dir(const std::string& prefix) {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    dir = t;
    std::filesystem::create_directories(dir / "src");
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

} // namespace bam_test
