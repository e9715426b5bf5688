// SPDX-License-Identifier: MIT
// The processes of a --processes run (benchmarks/detail/process_run.hpp, used
// by block_bench and bam-gnn aggregate): their barrier fails, rather than
// waits forever, when a process of the run failed or ended without reaching
// it (exited early, killed), and the first process sees how each ended.
#include "../../benchmarks/detail/process_run.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <signal.h>

#include <string>
#include <thread>

using Catch::Matchers::ContainsSubstring;

TEST_CASE("the run's barrier fails when a process of the run ends without reaching it", "[process-run]") {
  const std::string script = GENERATE(std::string("exit 0"), std::string("exit 3"), std::string("kill -9 $$"));
  INFO("the second process runs: sh -c '" << script << "'");
  bam::bench::process_run run;
  run.start({"sh", "-c", script}, "/bin/sh");
  CHECK_THROWS_WITH(run.sync().wait(2), ContainsSubstring("process 1 of the run") && ContainsSubstring("ended"));
  const bool all_ok = run.wait_all();
  CHECK(all_ok == (script == "exit 0")); // a failed or killed process is reported as failed
  if (script == "exit 3") {
    REQUIRE(run.failures().size() == 1);
    CHECK_THAT(run.failures()[0],
               ContainsSubstring("process 1 of the run") && ContainsSubstring("exited with status 3"));
  }
  if (script == "kill -9 $$") {
    REQUIRE(run.failures().size() == 1);
    CHECK_THAT(run.failures()[0], ContainsSubstring("killed by signal 9"));
  }
}

TEST_CASE("the run's barrier fails when another process of the run failed", "[process-run]") {
  bam::bench::process_run run;
  run.start({"sh", "-c", "sleep 30"}, "/bin/sh"); // runs, never arrives
  run.fail();                                     // as a process that caught an error does
  CHECK_THROWS_WITH(run.sync().wait(2), ContainsSubstring("another process of the run failed"));
  // The destructor waits for the started process: end it first.
  ::kill(run.sync().pids[1].load(), SIGKILL);
  CHECK_FALSE(run.wait_all());
}

TEST_CASE("the run's barrier lets its processes through together and again", "[process-run]") {
  bam::bench::process_run run;
  bam::bench::process_sync& s = run.sync();
  // Two waiters in this process stand for two processes: both pass each
  // barrier, and a process of the run that no longer runs is not blamed
  // once the barrier is passed.
  for (int round = 0; round < 3; ++round) {
    std::thread t([&] { s.wait(2); });
    s.wait(2);
    t.join();
  }
  CHECK(s.generation.load() == 3);
  CHECK(s.arrived.load() == 0);
  CHECK(s.first_ended() == -1); // only this process is registered, and it runs
  CHECK(bam::bench::process_running(::getpid()));
  CHECK_FALSE(bam::bench::process_running(0x7ffffff0)); // no such process
}

TEST_CASE("a run starts no more processes than its page has places for", "[process-run]") {
  bam::bench::process_run run;
  for (int k = 1; k < bam::bench::process_sync::max_processes; ++k)
    run.start({"sh", "-c", "exit 0"}, "/bin/sh");
  CHECK_THROWS_WITH(run.start({"sh", "-c", "exit 0"}, "/bin/sh"), ContainsSubstring("at most 64 processes"));
  CHECK(run.wait_all());
}
