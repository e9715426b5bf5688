// SPDX-License-Identifier: MIT
// The report of `bam-gnn aggregate` (benchmarks/gnn/aggregate_report.cpp):
// the JSON document's keys, in their order, which scripts/gnn-sweep,
// scripts/gnn-pipeline and the plots read; the best baseline; bam's row of
// the comparison.
#include "../../benchmarks/gnn/aggregate_report.hpp"

#include <catch2/catch_test_macros.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using bam::gnn::path_result;
using json = nlohmann::ordered_json;

std::vector<std::string> keys(const json& j) {
  std::vector<std::string> k;
  for (const auto& [key, value] : j.items())
    k.push_back(key);
  return k;
}

bam::gnn::manifest small_manifest() {
  bam::gnn::manifest m;
  m.nodes = 1000;
  m.edges = 6000;
  m.features.dim = 8;
  m.features.dtype = "float32";
  m.features.source = "generated";
  return m;
}

bam::gnn::aggregate_figures some_figures() {
  bam::gnn::aggregate_figures f;
  f.device = "emu-gpu:ram=2M";
  f.transport = "the GPU engine";
  f.placement = "loaded into the in-process medium before timing";
  f.in_process = true;
  f.cache_bytes = 1 << 20;
  f.fanouts = {3, 2};
  f.seconds = 2;
  f.sampling_seconds = 0.5;
  f.gathering_seconds = 1;
  f.aggregation_seconds = 0.25;
  f.rows = 4000;
  f.hop_nodes = {100, 400, 1000};
  f.page_visits = 1000;
  f.pages_loaded = 250;
  f.verified_rows = 40;
  f.verified_batches = 1;
  return f;
}

path_result ran(const std::string& path, double seconds, std::uint64_t rows) {
  path_result r;
  r.path = path;
  r.what = "what " + path;
  r.ran = true;
  r.seconds = seconds;
  r.rows = rows;
  r.bytes = rows * 32;
  return r;
}

} // namespace

TEST_CASE("bam-gnn aggregate's JSON report keeps its keys, in their order", "[gnn][report]") {
  const bam::gnn::manifest m = small_manifest();
  bam::gnn::aggregate_options o;
  o.dir = "/tmp/data";
  o.batches = 4;
  o.lookahead = false;
  bam::gnn::aggregate_figures f = some_figures();
  f.in_process = false;
  const bam::gnn::gpu_description gpu{"H100", 12080, 12080};

  const json plain = bam::gnn::aggregate_json(o, m, f, {}, gpu, "abc1234", "2025-01-01T00:00:00Z");
  // clang-format off
  CHECK(keys(plain) == std::vector<std::string>{
      "benchmark", "gpu", "driver", "cuda_runtime", "commit", "date", "dataset", "device", "transport", "placement",
      "page_size", "cache_bytes", "fanouts", "in_flight", "lookahead", "batch_size", "batches", "seed", "seconds",
      "batches_per_s", "nodes_per_s", "feature_GB_per_s", "unique_nodes", "unique_nodes_per_batch_by_hop",
      "ms_per_batch", "cache", "verified_rows", "verified_batches", "gather"});
  // clang-format on
  CHECK(keys(plain["dataset"]) ==
        std::vector<std::string>{"directory", "nodes", "edges", "dim", "dtype", "row_bytes", "features"});
  CHECK(keys(plain["ms_per_batch"]) ==
        std::vector<std::string>{"sampling", "gathering", "aggregation", "total", "first_batch"});
  CHECK(keys(plain["cache"]) == std::vector<std::string>{"hit_rate", "pages_loaded", "page_visits"});
  CHECK(keys(plain["gather"]) == std::vector<std::string>{"path", "what", "ran", "seconds", "rows", "bytes",
                                                          "nodes_per_s", "GB_per_s", "ratio_to_best_baseline",
                                                          "verified"});
  CHECK(plain["benchmark"] == "bam-gnn aggregate");
  CHECK(plain["gather"]["path"] == "bam");
  CHECK(plain["gather"]["GB_per_s"].get<double>() == 4000.0 * 32 / 1 / 1e9);
  CHECK(plain["gather"]["ratio_to_best_baseline"].is_null()); // no baselines
  CHECK(plain["cache"]["hit_rate"].get<double>() == 0.75);
  CHECK(plain["unique_nodes_per_batch_by_hop"] == json::array({25.0, 100.0, 250.0}));
  CHECK(plain["ms_per_batch"]["gathering"].get<double>() == 250.0);
  CHECK(plain["fanouts"] == json::array({3, 2}));

  // Everything optional: an in-process medium, look-ahead holds, a hot set, --compare.
  o.lookahead = true;
  o.compare = true;
  o.hot_percent = 5;
  f.in_process = true;
  f.load_seconds = 1.5;
  f.held_pages = 80;
  f.hot_set = true;
  f.hot_rows = 50;
  f.hot_bytes = 50 * 32;
  f.hot_row_visits = 1000;
  path_result skipped;
  skipped.path = "gpu-memory";
  skipped.why_not = "too big";
  const std::vector<path_result> baselines{ran("cpu-threads", 4, 4000), skipped};
  const json full = bam::gnn::aggregate_json(o, m, f, baselines, gpu, "abc1234", "2025-01-01T00:00:00Z");
  // clang-format off
  CHECK(keys(full) == std::vector<std::string>{
      "benchmark", "gpu", "driver", "cuda_runtime", "commit", "date", "dataset", "device", "transport", "placement",
      "load_seconds", "page_size", "cache_bytes", "fanouts", "in_flight", "lookahead", "held_pages_per_batch",
      "batch_size", "batches", "seed", "seconds", "batches_per_s", "nodes_per_s", "feature_GB_per_s", "unique_nodes",
      "unique_nodes_per_batch_by_hop", "ms_per_batch", "cache", "hot_set", "verified_rows", "verified_batches",
      "gather", "baselines"});
  // clang-format on
  CHECK(keys(full["hot_set"]) == std::vector<std::string>{"percent", "memory", "rows", "bytes", "chosen_by",
                                                          "fill_seconds", "row_visits", "row_visit_fraction"});
  CHECK(full["held_pages_per_batch"].get<double>() == 20.0);
  CHECK(full["hot_set"]["row_visit_fraction"].get<double>() == 0.25);
  REQUIRE(full["baselines"].size() == 2);
  CHECK(full["baselines"][0]["ratio_to_best_baseline"].get<double>() == 1.0);
  CHECK(full["gather"]["ratio_to_best_baseline"].get<double>() == 4.0);
  CHECK(keys(full["baselines"][1]) == std::vector<std::string>{"path", "what", "ran", "skipped"});
  CHECK(full["gather"]["what"] ==
        "bam::gather_rows through the page cache (emu-gpu:ram=2M) + a hot set of 50 rows in pinned host memory");

  // Every row from the hot set: no page visited, no hit rate.
  f.page_visits = 0;
  CHECK(bam::gnn::aggregate_json(o, m, f, {}, gpu, "", "")["cache"]["hit_rate"].is_null());
}

TEST_CASE("bam-gnn aggregate's best baseline is the fastest host path that ran, not GPU memory", "[gnn][report]") {
  using bam::gnn::best_baseline;
  CHECK(best_baseline({}) == 0);
  path_result not_run;
  not_run.path = "zero-copy";
  CHECK(best_baseline({not_run}) == 0);
  CHECK(best_baseline({ran("cpu-threads", 2, 100), ran("mmap-warm", 1, 100)}) == 100);
  CHECK(best_baseline({ran("cpu-threads", 2, 100), ran("gpu-memory", 1, 1000)}) == 50);
}

TEST_CASE("bam-gnn aggregate on several GPUs: the GPUs' sums over the longest GPU's time, and each GPU's figures",
          "[gnn][report]") {
  const bam::gnn::manifest m = small_manifest();
  bam::gnn::aggregate_figures a = some_figures(), b = some_figures();
  b.seconds = 4;
  b.gathering_seconds = 3;
  b.rows = 6000;
  b.hop_nodes = {100, 300, 900};
  b.pages_loaded = 500;
  // One cache over both, in uneven parts; a hot set in each GPU's memory.
  a.cache_bytes_by_gpu = b.cache_bytes_by_gpu = {2 << 20, 1 << 20};
  for (auto* f : {&a, &b}) {
    f->hot_set = f->hot_in_gpu = true;
    f->hot_rows = 10;
    f->hot_bytes = 320;
    f->hot_row_visits = 1000;
  }
  const bam::gnn::aggregate_figures all = bam::gnn::combine_gpu_figures({a, b}, 3 << 20);
  CHECK(all.hot_rows == 10);   // the same rows on each GPU
  CHECK(all.hot_bytes == 640); // in two copies
  CHECK(all.hot_row_visits == 2000);
  CHECK(all.seconds == 4);
  CHECK(all.gathering_seconds == 4);
  CHECK(all.sampling_seconds == 1);
  CHECK(all.rows == 10000);
  CHECK(all.hop_nodes == std::vector<std::uint64_t>{200, 700, 1900});
  CHECK(all.page_visits == 2000);
  CHECK(all.pages_loaded == 750);
  CHECK(all.hit_rate() == 0.625);
  CHECK(all.verified_rows == 80);
  CHECK(all.cache_bytes == 3 << 20);

  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("bam-gnn-report-" + std::to_string(::getpid()) + ".json");
  bam::gnn::aggregate_options o;
  o.dir = "/tmp/data";
  o.batches = 4; // each GPU's
  o.lookahead = false;
  o.gpus = 2;
  o.node_cache = true;
  o.json_file = out.string();
  const std::vector<bam::gnn::aggregate_figures> per{a, b};
  const std::vector<bam::gnn::gpu_description> gpus{{"H100", 12080, 12080}, {"H100", 12080, 12080}};
  std::fflush(stdout);
  bam::gnn::report_gpus({.options = o,
                         .m = m,
                         .per_gpu = per,
                         .all = all,
                         .cache_layout = "one cache spread over the GPUs",
                         .gpus = gpus});
  std::ifstream f(out);
  const json j = json::parse(f);
  std::filesystem::remove(out);
  CHECK(j["batches"] == 8); // every GPU's batches
  CHECK(j["batches_per_s"].get<double>() == 2.0);
  CHECK(j["gpus"] == 2);
  CHECK(j["cache_layout"] == "one cache spread over the GPUs");
  CHECK(j["batches_per_gpu"] == 4);
  CHECK(j["cache_bytes_per_gpu"] == (3 << 20) / 2);
  CHECK(j["cache_bytes_by_gpu"] == json::array({2 << 20, 1 << 20}));
  CHECK(j["hot_set"]["memory"] == "gpu");
  CHECK(j["hot_set"]["rows"] == 10);
  CHECK(j["hot_set"]["copies"] == 2);
  CHECK(j["hot_set"]["bytes"] == 640);
  CHECK(j["hot_set"]["row_visit_fraction"].get<double>() == 2000.0 / 10000.0);
  CHECK(j["cache"]["hit_rate"].get<double>() == 0.625);
  REQUIRE(j["per_gpu"].size() == 2);
  CHECK(j["per_gpu"][1]["cuda_device"] == 1);
  CHECK(j["per_gpu"][1]["batches_per_s"].get<double>() == 1.0);
  CHECK(j["per_gpu"][0]["batches_per_s"].get<double>() == 2.0);
  CHECK(j["per_gpu"][1]["cache"]["hit_rate"].get<double>() == 0.5);
  // The gathers ran at once: their rates add up (4000 rows of 32 B in 1 s, 6000 in 3 s).
  CHECK(j["gather"]["seconds"].get<double>() == 3);
  CHECK(j["gather"]["nodes_per_s"].get<double>() == 4000.0 + 2000.0);
  CHECK(j["gather"]["GB_per_s"].get<double>() == (4000.0 * 32 + 2000.0 * 32) / 1e9);
}
