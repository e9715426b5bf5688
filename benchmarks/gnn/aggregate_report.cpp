// SPDX-License-Identifier: MIT
// The report of `bam-gnn aggregate` (aggregate_report.hpp). The JSON keys
// are read by scripts/gnn-sweep, scripts/gnn-pipeline,
// benchmarks/plot_compare.py and examples/gnn/plot_*.py: rename none.
#include "aggregate_report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace bam::gnn {

using json = nlohmann::ordered_json;

double best_baseline(const std::vector<path_result>& paths) {
  double best = 0;
  for (const auto& r : paths)
    if (r.ran && r.path != "gpu-memory") best = std::max(best, r.nodes_per_s());
  return best;
}

path_result bam_path(const aggregate_figures& f, std::uint64_t row_bytes) {
  path_result r;
  r.path = "bam";
  r.what = "bam::gather_rows through the page cache (" + f.device + ")";
  if (f.hot_set)
    r.what += " + a hot set of " + std::to_string(f.hot_rows) + " rows in " +
              (f.hot_in_gpu ? "GPU memory" : "pinned host memory");
  r.ran = true;
  r.seconds = f.gathering_seconds;
  r.rows = f.rows;
  r.bytes = f.rows * row_bytes;
  r.verified = f.verified_rows != 0;
  return r;
}

std::string commit_id() {
  if (const char* c = std::getenv("BAM_COMMIT"); c != nullptr && *c != '\0') return c;
  std::string out;
  if (FILE* p = ::popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[128];
    while (std::fgets(buf, sizeof buf, p))
      out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

void print_run_summary(const aggregate_options& o, const manifest& m, const aggregate_figures& f, double gather_gbs) {
  const double nb = static_cast<double>(o.batches);
  const std::uint64_t rb = m.features.row_bytes();
  std::printf("\n%llu mini-batches in %.3f s: %.2f batches/s, %.3f M sampled (unique) nodes/s, "
              "features %.2f GB/s "
              "(gather stage: %.2f GB/s)\n",
              static_cast<unsigned long long>(o.batches), f.seconds, nb / f.seconds,
              static_cast<double>(f.rows) / f.seconds / 1e6, static_cast<double>(f.rows * rb) / f.seconds / 1e9,
              gather_gbs >= 0 ? gather_gbs : bam_path(f, rb).gb_per_s());
  std::printf("per batch: sampling %.3f ms, gathering %.3f ms, aggregation %.3f ms (first batch "
              "%.3f ms in all)%s\n",
              1e3 * f.sampling_seconds / nb, 1e3 * f.gathering_seconds / nb, 1e3 * f.aggregation_seconds / nb,
              1e3 * f.first_batch_seconds,
              o.in_flight > 1 ? "; the stages of batches in flight overlap: gathering is the time any gather ran" : "");
  if (o.lookahead)
    std::printf("look-ahead holds: %.0f pages per batch held before its gather (%.1f%% of its page visits)\n",
                static_cast<double>(f.held_pages) / nb,
                f.page_visits ? 100.0 * static_cast<double>(f.held_pages) / static_cast<double>(f.page_visits) : 0.0);
  std::printf("unique nodes per batch by hop:");
  for (const std::uint64_t n : f.hop_nodes)
    std::printf(" %.0f", static_cast<double>(n) / nb);
  std::printf("\npage cache: hit rate %.1f%% (%llu pages loaded for %llu page visits)\n", 100 * f.hit_rate(),
              static_cast<unsigned long long>(f.pages_loaded), static_cast<unsigned long long>(f.page_visits));
  if (f.hot_set)
    std::printf("hot set: %.1f%% of the rows gathered came from its copy in %s (%llu of %llu)\n",
                f.rows ? 100.0 * static_cast<double>(f.hot_row_visits) / static_cast<double>(f.rows) : 0.0,
                f.hot_in_gpu ? "GPU memory" : "host memory", static_cast<unsigned long long>(f.hot_row_visits),
                static_cast<unsigned long long>(f.rows));
  if (f.verified_rows != 0)
    std::printf("verified: the %llu rows gathered in the first %llu batch(es) equal the %s\n",
                static_cast<unsigned long long>(f.verified_rows), static_cast<unsigned long long>(f.verified_batches),
                m.features.source == "generated" ? "generator" : "feature file");
  else
    std::printf("not verified (--verify-batches 0)\n");
}

void print_comparison(const aggregate_figures& f, std::uint64_t row_bytes, std::uint64_t batches,
                      const std::vector<path_result>& baselines) {
  const double best = best_baseline(baselines);
  const path_result bam = bam_path(f, row_bytes);
  std::printf("\nthe gather of the same %llu batches' rows (%llu rows, %.2f GB), by path:\n",
              static_cast<unsigned long long>(batches), static_cast<unsigned long long>(f.rows),
              static_cast<double>(f.rows * row_bytes) / 1e9);
  std::printf("  %-12s %14s %10s %12s  %s\n", "path", "nodes/s", "GB/s", "vs best base",
              "what (best base: the better of the host paths; gpu-memory is the upper bound)");
  auto row = [&](const path_result& r) {
    if (!r.ran) {
      std::printf("  %-12s %14s %10s %12s  skipped: %s\n", r.path.c_str(), "-", "-", "-", r.why_not.c_str());
      return;
    }
    std::printf("  %-12s %14.0f %10.2f %11.2fx  %s\n", r.path.c_str(), r.nodes_per_s(), r.gb_per_s(),
                best > 0 ? r.nodes_per_s() / best : 0.0, r.what.c_str());
  };
  row(bam);
  for (const auto& r : baselines)
    row(r);
  const auto find = [&](const char* path) -> const path_result* {
    for (const auto& r : baselines)
      if (r.path == path) return &r;
    return nullptr;
  };
  const path_result* cold = find("mmap-cold");
  const path_result* warm = find("mmap-warm");
  if (cold && warm && cold->ran && warm->ran && cold->nodes_per_s() > 0 && warm->nodes_per_s() > 0)
    std::printf("bam against mmap of the feature file: %.2fx its cold figure, %.2fx its warm one\n",
                bam.nodes_per_s() / cold->nodes_per_s(), bam.nodes_per_s() / warm->nodes_per_s());
}

namespace {

json path_json(const path_result& r, double best) {
  json j{{"path", r.path}, {"what", r.what}, {"ran", r.ran}};
  if (!r.ran) {
    j["skipped"] = r.why_not;
    return j;
  }
  j["seconds"] = r.seconds;
  j["rows"] = r.rows;
  j["bytes"] = r.bytes;
  j["nodes_per_s"] = r.nodes_per_s();
  j["GB_per_s"] = r.gb_per_s();
  j["ratio_to_best_baseline"] = best > 0 ? json(r.nodes_per_s() / best) : json(nullptr);
  j["verified"] = r.verified;
  return j;
}

//! The figures per batch, and the cache's and the hot set's.
void add_batch_figures(json& j, const aggregate_options& o, const aggregate_figures& f, std::uint64_t rb) {
  const double nb = static_cast<double>(o.batches);
  j["seconds"] = f.seconds;
  j["batches_per_s"] = nb / f.seconds;
  j["nodes_per_s"] = static_cast<double>(f.rows) / f.seconds;
  j["feature_GB_per_s"] = static_cast<double>(f.rows * rb) / f.seconds / 1e9;
  j["unique_nodes"] = f.rows;
  std::vector<double> per_hop;
  for (const std::uint64_t n : f.hop_nodes)
    per_hop.push_back(static_cast<double>(n) / nb);
  j["unique_nodes_per_batch_by_hop"] = per_hop;
  j["ms_per_batch"] = {{"sampling", 1e3 * f.sampling_seconds / nb},
                       {"gathering", 1e3 * f.gathering_seconds / nb},
                       {"aggregation", 1e3 * f.aggregation_seconds / nb},
                       {"total", 1e3 * f.seconds / nb},
                       {"first_batch", 1e3 * f.first_batch_seconds}};
  j["cache"] = {
      {"hit_rate", f.page_visits ? json(f.hit_rate()) : json(nullptr)}, // null: every row came from the hot set
      {"pages_loaded", f.pages_loaded},
      {"page_visits", f.page_visits}};
  if (f.hot_set)
    j["hot_set"] = {
        {"percent", o.hot_percent},
        {"memory", f.hot_in_gpu ? "gpu" : "host"},
        {"rows", f.hot_rows},
        {"bytes", f.hot_bytes},
        {"chosen_by", "in-degree"},
        {"fill_seconds", f.hot_fill_seconds},
        {"row_visits", f.hot_row_visits},
        {"row_visit_fraction", f.rows ? static_cast<double>(f.hot_row_visits) / static_cast<double>(f.rows) : 0.0}};
}

} // namespace

json aggregate_json(const aggregate_options& o, const manifest& m, const aggregate_figures& f,
                    const std::vector<path_result>& baselines, const gpu_description& gpu, const std::string& commit,
                    const std::string& date) {
  const std::uint64_t rb = m.features.row_bytes();
  const double best = best_baseline(baselines);
  json j;
  j["benchmark"] = "bam-gnn aggregate";
  j["gpu"] = gpu.name;
  j["driver"] = gpu.driver;
  j["cuda_runtime"] = gpu.cuda_runtime;
  j["commit"] = commit;
  j["date"] = date;
  j["dataset"] = {{"directory", std::filesystem::absolute(o.dir).string()},
                  {"nodes", m.nodes},
                  {"edges", m.edges},
                  {"dim", m.features.dim},
                  {"dtype", m.features.dtype},
                  {"row_bytes", rb},
                  {"features", m.features.source}};
  j["device"] = f.device;
  j["transport"] = f.transport;
  j["placement"] = f.placement;
  if (f.in_process) j["load_seconds"] = f.load_seconds;
  j["page_size"] = o.page_size;
  j["cache_bytes"] = f.cache_bytes;
  j["fanouts"] = f.fanouts;
  j["in_flight"] = o.in_flight;
  j["lookahead"] = o.lookahead;
  if (o.lookahead) j["held_pages_per_batch"] = static_cast<double>(f.held_pages) / static_cast<double>(o.batches);
  j["batch_size"] = o.batch_size;
  j["batches"] = o.batches;
  j["seed"] = o.seed;
  add_batch_figures(j, o, f, rb);
  j["verified_rows"] = f.verified_rows;
  j["verified_batches"] = f.verified_batches;
  j["gather"] = path_json(bam_path(f, rb), best);
  if (o.compare) {
    json c = json::array();
    for (const auto& r : baselines)
      c.push_back(path_json(r, best));
    j["baselines"] = c;
  }
  return j;
}

aggregate_figures combine_gpu_figures(const std::vector<aggregate_figures>& per, std::uint64_t cache_bytes) {
  aggregate_figures all = per[0];
  all.cache_bytes = cache_bytes;
  for (std::size_t g = 1; g < per.size(); ++g) {
    const aggregate_figures& f = per[g];
    all.seconds = std::max(all.seconds, f.seconds);
    all.gathering_seconds += f.gathering_seconds;
    all.sampling_seconds += f.sampling_seconds;
    all.aggregation_seconds += f.aggregation_seconds;
    all.rows += f.rows;
    for (std::size_t l = 0; l < all.hop_nodes.size(); ++l)
      all.hop_nodes[l] += f.hop_nodes[l];
    all.page_visits += f.page_visits;
    all.pages_loaded += f.pages_loaded;
    all.held_pages += f.held_pages;
    all.hot_bytes += f.hot_bytes; // each GPU's own copy of the same rows
    all.hot_fill_seconds = std::max(all.hot_fill_seconds, f.hot_fill_seconds);
    all.hot_row_visits += f.hot_row_visits;
    all.verified_rows += f.verified_rows;
    all.verified_batches += f.verified_batches;
  }
  return all;
}

void report_gpus(const gpus_report& r) {
  const aggregate_options& o = r.options;
  aggregate_options all = o; // the totals: every GPU's batches
  all.batches = o.batches * r.per_gpu.size();
  const std::uint64_t rb = r.m.features.row_bytes();
  if (!o.json_stdout) {
    std::printf("\n%zu GPUs, %s:\n", r.per_gpu.size(), r.cache_layout.c_str());
    for (std::size_t g = 0; g < r.per_gpu.size(); ++g) {
      const aggregate_figures& f = r.per_gpu[g];
      std::printf("  GPU %zu (%s): %.2f batches/s, features %.2f GB/s, hit rate %.1f%%, %llu rows verified\n", g,
                  r.gpus[g].name.c_str(), static_cast<double>(o.batches) / f.seconds,
                  static_cast<double>(f.rows * rb) / f.seconds / 1e9, 100 * f.hit_rate(),
                  static_cast<unsigned long long>(f.verified_rows));
    }
  }
  // The gather stages of the GPUs ran at once: their rates add up.
  double gather_gbs = 0, gather_nodes = 0, gather_longest = 0;
  for (const aggregate_figures& f : r.per_gpu) {
    const path_result p = bam_path(f, rb);
    gather_gbs += p.gb_per_s();
    gather_nodes += p.nodes_per_s();
    gather_longest = std::max(gather_longest, p.seconds);
  }
  if (!o.json_stdout) {
    std::printf("in all (the GPUs' sums over the longest GPU's time; per batch: the mean over every GPU's batches):");
    print_run_summary(all, r.m, r.all, gather_gbs);
  }
  if (o.json_file.empty() && !o.json_stdout) return;
  json j = aggregate_json(all, r.m, r.all, {}, r.gpus[0], commit_id(), utc_now());
  j["gather"]["seconds"] = gather_longest;
  j["gather"]["nodes_per_s"] = gather_nodes;
  j["gather"]["GB_per_s"] = gather_gbs;
  j["gpus"] = r.per_gpu.size();
  j["cache_layout"] = r.cache_layout;
  j["batches_per_gpu"] = o.batches;
  j["cache_bytes_per_gpu"] = r.all.cache_bytes / r.per_gpu.size();
  if (!r.per_gpu[0].cache_bytes_by_gpu.empty()) j["cache_bytes_by_gpu"] = r.per_gpu[0].cache_bytes_by_gpu;
  if (j.contains("hot_set")) j["hot_set"]["copies"] = r.per_gpu.size(); // bytes: of them all
  json per = json::array();
  for (std::size_t g = 0; g < r.per_gpu.size(); ++g) {
    json x{{"cuda_device", g}, {"gpu", r.gpus[g].name}};
    add_batch_figures(x, o, r.per_gpu[g], rb);
    x["verified_rows"] = r.per_gpu[g].verified_rows;
    per.push_back(x);
  }
  j["per_gpu"] = per;
  write_json(o, j);
}

void write_json(const aggregate_options& o, const json& j) {
  if (!o.json_file.empty()) {
    std::ofstream f(o.json_file);
    f << j.dump(2) << "\n";
    if (!f) throw_errno("writing " + o.json_file);
  }
  if (o.json_stdout) std::cout << j.dump(2) << std::endl;
}

} // namespace bam::gnn
