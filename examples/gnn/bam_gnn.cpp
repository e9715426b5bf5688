// SPDX-License-Identifier: MIT
// bam-gnn: GNN datasets for bam.
//
//   bam-gnn make DIR --nodes 1M --degree 16 --dim 1024 [--seed 1] [--device DEV --offset 1G]
//       a power-law (R-MAT) graph in CSR and a feature table generated from
//       (seed, node, column), optionally written onto a device
//   bam-gnn import DIR --features feats.npy (--edges edges.txt|edges.npy | --indptr a.npy --indices b.npy)
//       an existing dataset (ogbn-papers100M, IGB, ...): the features stay in
//       their .npy file; the graph is stored as CSR
//   bam-gnn load DIR DEV [--offset 1G]     the feature table onto a device (resumable)
//   bam-gnn check DIR [--rows 4096] [--device]
//       the CSR is one, every sampled row equals the generator or the file,
//       and (--device) what the device holds
//   bam-gnn info DIR                        sizes and the degree distribution
//   bam-gnn aggregate DIR [--device DEV] [--fanouts 15,10,5] [--batch-size 1024] [--batches 100]
//           [--cache-mib 1024] [--page-size 4096] [--seed 1] [--compare] [--json FILE]
//           [--hot-percent P [--hot-memory gpu]] [--in-flight 2] [--no-lookahead]
//           [--gpus N [--node-cache] [--processes]]
//       GraphSAGE mini-batches on the GPU: neighbour sampling over the CSR,
//       the feature rows through bam's page cache, a mean aggregation per
//       layer; --compare adds the same gathers by CPU threads, GPU zero-copy,
//       mmap and from GPU memory (needs a CUDA build and a GPU); --gpus N
//       runs on N GPUs at once over one copy of the features, with a cache
//       per GPU or (--node-cache) one cache spread over them, from one
//       process or (--processes) one process per GPU
//
// Every subcommand takes --json. Sizes take K, M, G suffixes (decimal for
// counts: --nodes 50M is 50,000,000 nodes; binary for bytes: --offset 1G).
#include "gnn_aggregate.hpp"
#include "gnn_dataset.hpp"

#include "../../tools/progress.hpp"

#include <bam/host.hpp>
#include <bam/transport/open.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;
std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted.store(true); }

struct common {
  bool json = false;
  bool quiet = false;
  unsigned threads = 0;
};

//! Counts with decimal suffixes: 50M = 50,000,000.
std::uint64_t parse_count(const std::string& s) {
  std::size_t n = 0;
  double v = 0;
  try {
    v = std::stod(s, &n);
  } catch (const std::out_of_range&) {
    throw CLI::ValidationError("count", "'" + s + "' is not a count from 0 to 2^64 - 1");
  } catch (const std::exception&) {
    throw CLI::ValidationError("count", "'" + s + "' is not a count (a number, K, M or G after it)");
  }
  const std::string suf = s.substr(n);
  double mult = 1;
  if (suf == "K" || suf == "k")
    mult = 1e3;
  else if (suf == "M")
    mult = 1e6;
  else if (suf == "G")
    mult = 1e9;
  else if (!suf.empty())
    throw CLI::ValidationError("count", "unknown suffix '" + suf + "' (K, M, G)");
  // A double converts to uint64 only below 2^64; negative counts and NaN are refused too.
  if (!(v >= 0) || v * mult + 0.5 >= 18446744073709551616.0)
    throw CLI::ValidationError("count", "'" + s + "' is not a count from 0 to 2^64 - 1");
  return static_cast<std::uint64_t>(v * mult + 0.5);
}

//! A stage progress line on standard error (a terminal only, and not with -q).
struct stage_progress {
  bool enabled = false;
  std::string last;
  std::unique_ptr<bam::tools::progress_bar> bar;
  double t0 = static_cast<double>(bam::detail::now_ns());
  void operator()(const char* stage, std::uint64_t done, std::uint64_t total) {
    if (!enabled) return;
    if (last != stage) {
      bar = std::make_unique<bam::tools::progress_bar>(stage, true);
      last = stage;
      t0 = static_cast<double>(bam::detail::now_ns());
    }
    bar->update(done, total, (static_cast<double>(bam::detail::now_ns()) - t0) / 1e9);
  }
};

std::unique_ptr<bam::controller> open_one(const std::string& device) {
  const bam::device_spec spec = bam::parse_device(device);
  auto ts = bam::open_host_transports(spec);
  if (ts.size() != 1)
    throw bam::error("'" + device + "' names " + std::to_string(ts.size()) +
                     " controllers; the feature table goes onto one");
  bam::controller_options o;
  o.io_timeout_ns = spec.timeout_ns;
  o.admin_timeout_ns = spec.timeout_ns;
  return std::make_unique<bam::controller>(ts.front(), o);
}

//! Writes the feature table of the dataset in `dir` onto `device`; records where in the manifest.
bam::gnn::manifest load_features(const fs::path& dir, const std::string& device, std::uint64_t offset,
                                 std::uint32_t nsid, const common& co) {
  // A load stops cleanly on Ctrl-C, resumable; the other work (generating,
  // importing, checking: files written under temporary names) just ends.
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  bam::gnn::manifest m = bam::gnn::read_manifest(dir);
  auto ctrl = open_one(device);
  bam::tools::progress_bar bar("features -> " + device, !co.quiet && !co.json);
  bam::dataset_options o{.nsid = nsid,
                         .offset = offset,
                         .state_path = (dir / "features.bam-load").string(),
                         .progress = bar.follow(),
                         .cancel = &interrupted};
  const std::string file = bam::gnn::features_path(dir, m);
  bam::dataset_result r;
  if (!file.empty() && m.features.file_offset == 0) {
    r = bam::load_dataset(*ctrl, file, o);
  } else if (!file.empty()) {
    // Rows inside an imported .npy: the bytes after its header.
    bam::data_source src;
    src.size = m.nodes * m.features.row_bytes();
    src.identity = file + " from byte " + std::to_string(m.features.file_offset);
    const std::uint64_t base = m.features.file_offset;
    src.read = [file, base](std::uint64_t off, void* dst, std::size_t len) {
      const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) bam::throw_errno("opening " + file);
      const ssize_t n = ::pread(fd, dst, len, static_cast<off_t>(base + off));
      ::close(fd);
      if (n != static_cast<ssize_t>(len)) bam::throw_errno("reading " + file, n < 0 ? errno : EIO);
    };
    r = bam::load_dataset(*ctrl, src, o);
  } else {
    r = bam::load_dataset(*ctrl, bam::gnn::generated_features(m), o);
  }
  bar.finish();
  m.device = bam::gnn::device_placement{device, nsid, offset, ctrl->ns(nsid).lba_size, r.checksum};
  bam::gnn::write_manifest(dir, m);
  if (!co.json)
    std::printf("features: %llu bytes onto %s namespace %u at byte %llu in %.1f s%s, checksum %s\n",
                static_cast<unsigned long long>(r.bytes), device.c_str(), nsid, static_cast<unsigned long long>(offset),
                r.seconds,
                r.resumed_chunks ? (" (" + std::to_string(r.resumed_chunks) + " chunks resumed)").c_str() : "",
                r.checksum.c_str());
  return m;
}

json info_json(const fs::path& dir, const bam::gnn::manifest& m) {
  json j = bam::gnn::to_json(m);
  j["directory"] = fs::absolute(dir).string();
  j["feature_table_bytes"] = m.nodes * m.features.row_bytes();
  return j;
}

void print_summary(const fs::path& dir, const bam::gnn::manifest& m) {
  std::printf("%s: %llu nodes, %llu stored edges (%.2f per node, %s), graph %s\n", dir.c_str(),
              static_cast<unsigned long long>(m.nodes), static_cast<unsigned long long>(m.edges),
              m.nodes ? static_cast<double>(m.edges) / static_cast<double>(m.nodes) : 0.0,
              m.undirected ? "undirected" : "directed", m.graph_source.c_str());
  std::printf("  features: %u x %s per node (%llu bytes a row, %.2f GiB in all), %s%s%s\n", m.features.dim,
              m.features.dtype.c_str(), static_cast<unsigned long long>(m.features.row_bytes()),
              static_cast<double>(m.nodes * m.features.row_bytes()) / (1ull << 30), m.features.source.c_str(),
              m.features.file.empty() ? ", no file" : (", in " + m.features.file).c_str(),
              m.features.file_offset ? (" from byte " + std::to_string(m.features.file_offset)).c_str() : "");
  if (m.device)
    std::printf("  on device %s namespace %u at byte %llu (%s)\n", m.device->device.c_str(), m.device->nsid,
                static_cast<unsigned long long>(m.device->offset), m.device->checksum.c_str());
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"bam-gnn: GNN datasets for bam: make a power-law graph with node features, import one, "
               "put its features onto a device, check it."};
  app.require_subcommand(1);
  app.fallthrough();
  common co;
  app.add_flag("--json", co.json, "machine-readable output");
  app.add_flag("-q,--quiet", co.quiet, "no progress bars");
  app.add_option("--threads", co.threads, "CPU threads (default: all cores)");

  std::string dir, nodes_s = "1M", device;
  std::uint64_t offset = 0;
  double degree = 16;
  std::uint64_t seed = 1, feature_seed = 0;
  std::uint32_t dim = 1024, nsid = 1;
  bool directed = false, no_file = false, force = false;
  auto* make = app.add_subcommand("make", "an R-MAT graph (Graph500 a=0.57 b=0.19 c=0.19) and generated features");
  make->add_option("dir", dir, "dataset directory")->required();
  make->add_option("--nodes", nodes_s, "nodes (K, M, G: decimal; default 1M)");
  make->add_option("--degree", degree, "average stored neighbours per node (default 16)");
  make->add_option("--seed", seed, "graph seed (default 1)");
  make->add_option("--feature-seed", feature_seed, "feature seed (default: derived from --seed)");
  make->add_option("--dim", dim, "features per node (default 1024 float32 = 4 KiB, as IGB; 128 = 512 B)")
      ->check(CLI::Range(1u, 1u << 20));
  make->add_flag("--directed", directed, "store each edge once (default: both directions)");
  make->add_flag("--no-features-file", no_file,
                 "keep no feature file: the table is generated where it is loaded (--device)");
  make->add_flag("--force", force, "replace a different dataset in DIR");
  make->add_option("--device", device, "also write the features onto this device string (e.g. /dev/bam-nvme0)");
  make->add_option("--offset", offset, "byte offset on the device (K, M, G: binary; default 0)")
      ->transform(CLI::AsSizeValue(false));
  make->add_option("--nsid", nsid, "namespace (default 1)");

  bam::gnn::import_options io;
  auto* import =
      app.add_subcommand("import", "an existing dataset: features from .npy, a graph from an edge list or CSR");
  import->add_option("dir", dir, "dataset directory")->required();
  import->add_option("--features", io.features_npy, "2-D float32/float16 .npy, one row per node")
      ->required()
      ->check(CLI::ExistingFile);
  import->add_option("--edges", io.edges, "edge list: text (two ids a line) or .npy (E, 2) / (2, E)")
      ->check(CLI::ExistingFile);
  import->add_option("--indptr", io.indptr_npy, "CSR row pointers .npy")->check(CLI::ExistingFile);
  import->add_option("--indices", io.indices_npy, "CSR neighbour ids .npy")->check(CLI::ExistingFile);
  import->add_flag("--undirected", io.undirected, "edge list: store both directions");

  auto* load = app.add_subcommand("load", "write a dataset's feature table onto a device (resumable)");
  load->add_option("dir", dir, "dataset directory")->required();
  load->add_option("device", device, "device string")->required();
  load->add_option("--offset", offset, "byte offset on the device (K, M, G: binary; default 0)")
      ->transform(CLI::AsSizeValue(false));
  load->add_option("--nsid", nsid, "namespace (default 1)");

  std::uint64_t rows = 4096;
  bool check_device = false;
  auto* check =
      app.add_subcommand("check", "check the CSR and sampled feature rows (and, --device, the device's copy)");
  check->add_option("dir", dir, "dataset directory")->required();
  check->add_option("--rows", rows, "random rows to compare (default 4096)");
  check->add_flag("--device", check_device, "read the rows back from the device the manifest names");

  auto* info = app.add_subcommand("info", "sizes, sources and the degree distribution");
  info->add_option("dir", dir, "dataset directory")->required();

  bam::gnn::aggregate_options ao;
  auto* aggregate = app.add_subcommand(
      "aggregate", "GraphSAGE mini-batches on the GPU: sampling, feature rows through bam's page cache, mean "
                   "aggregation; --compare adds baselines (needs a GPU)");
  aggregate->add_option("dir", ao.dir, "dataset directory")->required();
  aggregate->add_option("--device", ao.device,
                        "device string the features are read from (default: the manifest's device, else "
                        "emu-gpu:ram sized to the table); in-process media (emu-gpu:ram, emu-gpu:hbm, emu:ram) "
                        "get the table loaded before timing; 'file': the dataset's feature file itself, from its "
                        "blocks on the raw disk where that disk opens, else through the file");
  aggregate->add_option("--cache-mib", ao.cache_mib, "page cache size in MiB, on each GPU (default 1024)");
  aggregate->add_option("--page-size", ao.page_size, "page cache page size in bytes (default 4096)");
  aggregate->add_option("--fanouts", ao.fanouts, "neighbours sampled per node, hop by hop (default 15,10,5)");
  aggregate->add_option("--batch-size", ao.batch_size, "seed nodes per mini-batch (default 1024)");
  aggregate->add_option("--batches", ao.batches, "mini-batches (default 100)");
  aggregate->add_option("--seed", ao.seed, "sampling seed (default 1)");
  aggregate->add_option("--verify-batches", ao.verify_batches,
                        "batches whose gathered rows are checked against the generator or file (default 2)");
  aggregate->add_option("--progress-every", ao.progress_every, "a progress line every N batches (0: none; default 10)");
  aggregate->add_option("--json", ao.json_file, "also write the results to FILE as JSON");
  aggregate->add_flag("--compare", ao.compare,
                      "gather the same batches' rows by CPU threads, GPU zero-copy, mmap and from GPU memory");
  aggregate->add_option("--host-threads", ao.host_threads,
                        "CPU threads of the baselines (default: --threads, all cores)");
  aggregate
      ->add_option("--hot-percent", ao.hot_percent,
                   "keep this percentage of the rows, those of the highest in-degree, in a copy the gathers read "
                   "instead of the cache (a hot set; default 0); with --gpus, each GPU has its own")
      ->check(CLI::Range(0.0, 100.0));
  aggregate
      ->add_option_function<std::string>(
          "--hot-memory", [&ao](const std::string& v) { ao.hot_in_gpu = v == "gpu"; },
          "where the hot set is: host (pinned host memory, read zero-copy; default) or gpu (the GPU's memory; "
          "with --gpus a copy on each GPU, which pays in front of --node-cache: it keeps the other rows once "
          "in the node)")
      ->check(CLI::IsMember({"host", "gpu"}));
  aggregate
      ->add_option("--in-flight", ao.in_flight,
                   "mini-batches in flight at once, each on a CUDA stream of its own: the next batches' "
                   "sampling and gathers overlap this one's (1 to 8; default 2)")
      ->check(CLI::Range(1u, bam::gnn::max_in_flight));
  aggregate
      ->add_option("--gpus", ao.gpus,
                   "run on GPUs 0 .. N-1 at once, a host thread each; every GPU runs --batches batches of its own "
                   "over one copy of the features (default 1)")
      ->check(CLI::Range(1u, 64u));
  aggregate->add_flag("--node-cache", ao.node_cache,
                      "with --gpus N (N >= 2): one page cache spread over the N GPUs' memory (--cache-mib on each; "
                      "one copy of a page, read by any GPU over NVLink) instead of a cache per GPU");
  aggregate->add_flag("--processes", ao.processes,
                      "with --gpus N (N >= 2): one process per GPU (this one starts the others) instead of a host "
                      "thread each; with --node-cache the processes share one page cache "
                      "(page_cache_config::group), as the processes of a torchrun job do");
  // A process that --processes started: its rank, the run's barrier, the
  // medium, the cache group and where it writes its figures.
  aggregate->add_option("--process-rank", ao.child.rank)->group("");
  aggregate->add_option("--process-sync-fd", ao.child.sync_fd)->group("");
  aggregate->add_option("--process-device", ao.child.device)->group("");
  aggregate->add_option("--process-group", ao.child.group)->group("");
  aggregate->add_option("--process-out", ao.child.out)->group("");
  aggregate->add_flag("--lookahead,!--no-lookahead", ao.lookahead,
                      "hold the pages of each batch's rows that are in the cache from its sampling until its "
                      "gather, so that the misses of the batches before it and its own cannot evict them "
                      "(bam::row_holds; the default; --no-lookahead: none)");

  CLI11_PARSE(app, argc, argv);
  try {
    const fs::path d(dir);
    if (*make) {
      bam::gnn::make_options o;
      o.graph.nodes = parse_count(nodes_s);
      o.graph.avg_degree = degree;
      o.graph.seed = seed;
      o.graph.undirected = !directed;
      o.graph.threads = co.threads;
      o.dim = dim;
      o.feature_seed = feature_seed;
      o.features_file = !no_file;
      o.force = force;
      stage_progress sp;
      sp.enabled = !co.quiet && !co.json && ::isatty(2) != 0;
      o.progress = [&](const char* s, std::uint64_t a, std::uint64_t b) { sp(s, a, b); };
      const double t0 = static_cast<double>(bam::detail::now_ns());
      const bam::gnn::make_result r = bam::gnn::make_dataset(d, o);
      sp.bar.reset();
      const double secs = (static_cast<double>(bam::detail::now_ns()) - t0) / 1e9;
      bam::gnn::manifest m = r.m;
      if (!co.json) {
        if (r.already_there)
          std::printf("%s already holds this dataset: nothing written\n", dir.c_str());
        else
          std::printf("made in %.1f s\n", secs);
        print_summary(d, m);
      }
      if (!device.empty()) {
        const std::uint64_t off = offset;
        if (m.device && m.device->device == device && m.device->offset == off && m.device->nsid == nsid) {
          if (!co.json) std::printf("features already on %s (manifest): not written again\n", device.c_str());
        } else {
          m = load_features(d, device, off, nsid, co);
        }
      }
      if (co.json) {
        json j = info_json(d, m);
        j["already_there"] = r.already_there;
        j["seconds"] = secs;
        std::cout << j.dump(2) << std::endl;
      }
      return 0;
    }
    if (*import) {
      io.threads = co.threads;
      const bam::gnn::manifest m = bam::gnn::import_dataset(d, io);
      if (co.json)
        std::cout << info_json(d, m).dump(2) << std::endl;
      else
        print_summary(d, m);
      return 0;
    }
    if (*load) {
      const bam::gnn::manifest m = load_features(d, device, offset, nsid, co);
      if (co.json) std::cout << info_json(d, m).dump(2) << std::endl;
      return 0;
    }
    if (*check) {
      const bam::gnn::manifest m = bam::gnn::read_manifest(d);
      std::unique_ptr<bam::controller> ctrl;
      if (check_device) {
        if (!m.device) throw bam::error(dir + ": the features were never loaded onto a device (bam-gnn load)");
        ctrl = open_one(m.device->device);
      }
      const bam::gnn::check_report r = bam::gnn::check_dataset(d, rows, ctrl.get());
      if (co.json) {
        std::cout << json{{"rows_checked", r.rows_checked},
                          {"rows_wrong", r.rows_wrong},
                          {"first_wrong_row", r.rows_wrong ? json(r.first_wrong_row) : json(nullptr)},
                          {"device_checked", check_device},
                          {"max_degree", r.max_degree},
                          {"mean_degree", r.mean_degree},
                          {"top1pct_edge_share", r.top1pct_edge_share}}
                         .dump(2)
                  << std::endl;
      } else {
        std::printf("%s: CSR valid; %llu feature rows checked%s: %llu wrong\n", dir.c_str(),
                    static_cast<unsigned long long>(r.rows_checked),
                    check_device ? (" against " + m.device->device).c_str() : "",
                    static_cast<unsigned long long>(r.rows_wrong));
      }
      if (r.rows_wrong != 0) {
        std::fprintf(stderr, "bam-gnn: %llu of %llu rows differ (first: row %llu)\n",
                     static_cast<unsigned long long>(r.rows_wrong), static_cast<unsigned long long>(r.rows_checked),
                     static_cast<unsigned long long>(r.first_wrong_row));
        return 1;
      }
      return 0;
    }
    if (*aggregate) {
      ao.json_stdout = co.json;
      ao.quiet = co.quiet;
      if (ao.host_threads == 0) ao.host_threads = co.threads;
      ao.command.assign(argv, argv + argc);
#if defined(BAM_GNN_WITH_CUDA)
      return bam::gnn::run_aggregate(ao);
#else
      (void)bam::gnn::parse_fanouts(ao.fanouts);
      throw bam::error("bam-gnn aggregate runs on a GPU: this bam-gnn was built without CUDA (configure with a CUDA "
                       "toolkit, BAM_ENABLE_CUDA=ON)");
#endif
    }
    if (*info) {
      const bam::gnn::manifest m = bam::gnn::read_manifest(d);
      const bam::gnn::check_report r = bam::gnn::check_dataset(d, 0);
      if (co.json) {
        json j = info_json(d, m);
        j["degree"] = {{"max", r.max_degree}, {"mean", r.mean_degree}, {"top1pct_edge_share", r.top1pct_edge_share}};
        std::cout << j.dump(2) << std::endl;
      } else {
        print_summary(d, m);
        std::printf("  degrees: mean %.2f, max %llu; the 1%% highest-degree nodes hold %.1f%% of the edges\n",
                    r.mean_degree, static_cast<unsigned long long>(r.max_degree), 100 * r.top1pct_edge_share);
      }
      return 0;
    }
  } catch (const bam::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    if (co.json) std::cout << json{{"error", e.what()}, {"errno", e.errnum()}}.dump(2) << std::endl;
    return e.errnum() == EINTR ? 130 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bam-gnn: %s\n", e.what());
    if (co.json) std::cout << json{{"error", e.what()}}.dump(2) << std::endl;
    return 1;
  }
  return 0;
}
