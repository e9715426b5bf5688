// SPDX-License-Identifier: MIT
// `bam-gnn aggregate` on the GPU as a user runs it (label gpu): on one GPU,
// and with two GPUs in the four ways of running on both: a host thread or a
// process per GPU, a cache each or one cache for both. Every run checks the
// rows of its first batches against the generator and its first batch's
// aggregation against the host's (a difference is exit status 1); the test
// checks what the runs report. The two-GPU cases skip on one GPU.
#include "gnn_test_util.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <nlohmann/json.hpp>

#include <cuda_runtime.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

namespace {

using bam_gnn_test::bam_gnn;
using bam_gnn_test::run_result;
using bam_gnn_test::temp_dir;

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

//! A dataset 12 times the 16 MiB cache of each GPU: 200,000 nodes of 1 KiB rows.
const temp_dir& dataset() {
  static const temp_dir d;
  static bool made = false;
  if (!made) {
    const run_result r = bam_gnn("make " + d.path.string() + " --nodes 200K --degree 6 --dim 256 --no-features-file");
    INFO(r.out);
    REQUIRE(r.status == 0);
    made = true;
  }
  return d;
}

struct aggregate_run {
  nlohmann::json j;
  std::string out;
};

aggregate_run aggregate(const std::string& args) {
  const temp_dir& d = dataset();
  const std::string json = d / ("run-" + std::to_string(std::hash<std::string>{}(args)) + ".json");
  const run_result r = bam_gnn("aggregate " + d.path.string() +
                               " --cache-mib 16 --batch-size 256 --batches 40 --verify-batches 4 "
                               "--progress-every 0 --json " +
                               json + args);
  INFO("bam-gnn aggregate" << args << "\n" << r.out);
  REQUIRE(r.status == 0);
  std::ifstream f(json);
  return {nlohmann::json::parse(f), r.out};
}

double hit_rate(const aggregate_run& r) { return r.j["cache"]["hit_rate"].get<double>(); }

} // namespace

TEST_CASE("bam-gnn aggregate on one GPU verifies its rows and reports its batches", "[gnn][aggregate][gpu]") {
  const aggregate_run r = aggregate("");
  CHECK(r.j["verified_batches"].get<std::uint64_t>() == 4);
  CHECK(r.j["verified_rows"].get<std::uint64_t>() > 0);
  CHECK(r.j["batches"].get<std::uint64_t>() == 40);
  CHECK(hit_rate(r) > 0.0);
  CHECK(hit_rate(r) < 1.0);
}

TEST_CASE("bam-gnn aggregate on two GPUs, a thread or a process each, a cache each or one for both",
          "[gnn][aggregate][gpu][node-cache]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  const aggregate_run threads_own = aggregate(" --gpus 2");
  const aggregate_run threads_node = aggregate(" --gpus 2 --node-cache");
  const aggregate_run processes_own = aggregate(" --gpus 2 --processes");
  const aggregate_run processes_node = aggregate(" --gpus 2 --processes --node-cache");
  for (const aggregate_run* r : {&threads_own, &threads_node, &processes_own, &processes_node}) {
    INFO(r->out);
    CHECK(r->j["gpus"].get<int>() == 2);
    REQUIRE(r->j["per_gpu"].size() == 2);
    for (const auto& g : r->j["per_gpu"]) {
      CHECK(g["verified_rows"].get<std::uint64_t>() > 0); // every GPU checked its own batches
      CHECK(g["unique_nodes"].get<std::uint64_t>() > 0);
    }
    CHECK(r->j["batches"].get<std::uint64_t>() == 80); // 40 on each GPU
    CHECK(r->j["cache_bytes_per_gpu"].get<std::uint64_t>() == 16u << 20);
  }
  // One cache's parts, GPU by GPU: the slots go to the GPUs in runs of
  // 2 MiB of pages, so a cache of 32 MiB is half on each.
  for (const aggregate_run* r : {&threads_node, &processes_node}) {
    REQUIRE(r->j.contains("cache_bytes_by_gpu"));
    CHECK(r->j["cache_bytes_by_gpu"] == nlohmann::json::array({16u << 20, 16u << 20}));
  }
  CHECK_THAT(threads_node.out, Catch::Matchers::ContainsSubstring("the cache's pages on GPUs 0 .. 1: 16 MiB, 16 MiB"));
  CHECK_FALSE(threads_own.j.contains("cache_bytes_by_gpu"));
  CHECK(threads_own.j["cache_layout"] == "a cache per GPU");
  CHECK(threads_node.j["cache_layout"] == "one cache spread over the GPUs");
  CHECK(processes_own.j["cache_layout"] == "a cache per process, one GPU each");
  CHECK(processes_node.j["cache_layout"] == "one cache shared by the processes, one GPU each");
  // Each GPU runs the same batches whichever way: one cache for both holds
  // one copy of a page in twice the room, so it misses less than a cache
  // each, whether its parts belong to one process or to two.
  CHECK(hit_rate(threads_node) > hit_rate(threads_own));
  CHECK(hit_rate(processes_node) > hit_rate(processes_own));
  // A process per GPU sees what a thread per GPU sees (eviction order varies).
  CHECK(std::abs(hit_rate(processes_own) - hit_rate(threads_own)) < 0.05);
  CHECK(std::abs(hit_rate(processes_node) - hit_rate(threads_node)) < 0.05);
}

TEST_CASE("bam-gnn aggregate on two GPUs with a hot set in each GPU's memory in front of one cache",
          "[gnn][aggregate][gpu][node-cache]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  const aggregate_run plain = aggregate(" --gpus 2 --node-cache");
  for (const std::string how : {"", " --processes"}) {
    const aggregate_run hot = aggregate(" --gpus 2 --node-cache --hot-percent 5 --hot-memory gpu" + how);
    INFO(hot.out);
    REQUIRE(hot.j.contains("hot_set"));
    CHECK(hot.j["hot_set"]["memory"] == "gpu");
    // A copy on each GPU: 5 % of the 200,000 rows of 1 KiB, twice.
    CHECK(hot.j["hot_set"]["rows"].get<std::uint64_t>() == 10000);
    CHECK(hot.j["hot_set"]["copies"].get<std::uint64_t>() == 2);
    CHECK(hot.j["hot_set"]["bytes"].get<std::uint64_t>() == 2 * 10000 * 1024);
    for (const auto& g : hot.j["per_gpu"])
      CHECK(g["verified_rows"].get<std::uint64_t>() > 0); // hot and cold rows alike equal the generator
    // The hot rows (those of the highest in-degree: a large share of the
    // sampled ones) come from the copies, not through the cache.
    CHECK(hot.j["hot_set"]["row_visit_fraction"].get<double>() > 0.1);
    CHECK(hot.j["cache"]["page_visits"].get<std::uint64_t>() < plain.j["cache"]["page_visits"].get<std::uint64_t>());
  }
}

TEST_CASE("bam-gnn aggregate with a process per GPU fails as a whole, without waiting, when its processes fail",
          "[gnn][aggregate][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  // A shared medium too small for the table: every process refuses it.
  const run_result r = bam_gnn("aggregate " + dataset().path.string() +
                               " --gpus 2 --processes --node-cache --batches 4 --device emu-gpu:shm=bam-gnn-test-" +
                               std::to_string(::getpid()) + ",size=8M,unlink");
  INFO(r.out);
  CHECK(r.status != 0);
  CHECK(r.out.find("not fit") != std::string::npos);
}

TEST_CASE("bam-gnn aggregate with a process per GPU reads the dataset's own feature file in every process",
          "[gnn][aggregate][gpu]") {
  if (gpu_count() < 2) SKIP("this test needs 2 GPUs; " << gpu_count() << " found");
  temp_dir d;
  const run_result made = bam_gnn("make " + d.path.string() + " --nodes 20K --degree 6 --dim 64");
  INFO(made.out);
  REQUIRE(made.status == 0);
  for (const std::string cache : {"", " --node-cache"}) {
    // Each process plans its own reading of the file (the raw disk or the
    // CPU engine from the file) and checks its first batches against it.
    const run_result r = bam_gnn("aggregate " + d.path.string() +
                                 " --device file --gpus 2 --processes --cache-mib 4 --batch-size 128 --batches 6 "
                                 "--verify-batches 6 --progress-every 0" +
                                 cache);
    INFO("--device file --gpus 2 --processes" << cache << "\n" << r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find("rows verified") != std::string::npos);
  }
}
