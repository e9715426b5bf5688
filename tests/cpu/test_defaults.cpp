// SPDX-License-Identifier: MIT
// bam::defaults: settings start from their environment variable (CTest sets
// BAM_GATHER_ROWS_PER_WARP=7 for this test) and change through their setters.
#include <bam/defaults.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <stdexcept>

TEST_CASE("a setting starts from its environment variable and changes through its setter", "[defaults]") {
  // Read once, at first use: the value CTest put in the environment.
  REQUIRE(std::getenv("BAM_GATHER_ROWS_PER_WARP") != nullptr);
  CHECK(bam::defaults::gather_rows_per_warp() == 7);
  bam::defaults::set_gather_rows_per_warp(32);
  CHECK(bam::defaults::gather_rows_per_warp() == 32);
  bam::defaults::set_gather_rows_per_warp(0);
  CHECK(bam::defaults::gather_rows_per_warp() == 0);
  CHECK_THROWS_AS(bam::defaults::set_gather_rows_per_warp(33), std::invalid_argument);
  CHECK(bam::defaults::gather_rows_per_warp() == 0); // a refused value changes nothing
}

TEST_CASE("an environment value out of range or not a number is ignored", "[defaults]") {
  using bam::defaults::detail::env_integer;
  ::setenv("BAM_TEST_DEFAULTS_KNOB", "12", 1);
  CHECK(env_integer("BAM_TEST_DEFAULTS_KNOB", 1, 32, 5) == 12);
  ::setenv("BAM_TEST_DEFAULTS_KNOB", "33", 1);
  CHECK(env_integer("BAM_TEST_DEFAULTS_KNOB", 1, 32, 5) == 5);
  ::setenv("BAM_TEST_DEFAULTS_KNOB", "12abc", 1);
  CHECK(env_integer("BAM_TEST_DEFAULTS_KNOB", 1, 32, 5) == 5);
  ::setenv("BAM_TEST_DEFAULTS_KNOB", "", 1);
  CHECK(env_integer("BAM_TEST_DEFAULTS_KNOB", 1, 32, 5) == 5);
  ::unsetenv("BAM_TEST_DEFAULTS_KNOB");
  CHECK(env_integer("BAM_TEST_DEFAULTS_KNOB", 1, 32, 5) == 5);
}
