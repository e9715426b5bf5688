// SPDX-License-Identifier: MIT
// bam-graph: graph analytics over storage with bam.
//
//   bam-graph make DIR --scale 20 --degree 16 [--seed 1]
//       an R-MAT graph (GAP's kron: a = 0.57, b = 0.19, c = 0.19) of 2^scale
//       nodes and degree x 2^scale undirected edges, symmetric, deduplicated
//   bam-graph import DIR --edges FILE [--format snap|npy|mtx] [--nodes N]
//       an edge list (SNAP text, .npy of shape (E, 2), Matrix Market)
//   bam-graph load DIR DEV [--offset 1G]     the graph's image onto a device
//   bam-graph check DIR [--device]            the CSR (and the device's copy)
//   bam-graph info DIR                        sizes and degrees
//   bam-graph bfs|cc|pagerank DIR [--device DEV] [--cache-mib 1024] [--page-size 4096]
//           [--runs N] [--no-baselines] [--json FILE] ...
//       the algorithm over the graph read through bam's page cache, next to
//       the same algorithm over the graph in GPU memory, zero-copy from
//       pinned host memory and on CPU threads; every result checked
//
// Every subcommand takes --json (before the subcommand).
#include "graph_cpu.hpp"
#include "graph_dataset.hpp"
#include "graph_run.hpp"

#include "../../tools/progress.hpp"

#include <bam/host.hpp>
#include <bam/transport/open.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;
std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted.store(true); }

json summary_json(const fs::path& dir, const bam::graph::manifest& m) {
  json j = bam::graph::to_json(m);
  j["directory"] = fs::absolute(dir).string();
  return j;
}

void print_summary(const fs::path& dir, const bam::graph::manifest& m) {
  std::printf("%s: %llu nodes, %llu undirected edges (%llu stored, %.2f per node), %s; image %.2f MiB\n", dir.c_str(),
              static_cast<unsigned long long>(m.nodes), static_cast<unsigned long long>(m.edges / 2),
              static_cast<unsigned long long>(m.edges),
              m.nodes ? static_cast<double>(m.edges) / static_cast<double>(m.nodes) : 0.0, m.source.c_str(),
              static_cast<double>(m.image().bytes()) / (1 << 20));
  if (m.device)
    std::printf("  on device %s namespace %u at byte %llu (%s)\n", m.device->device.c_str(), m.device->nsid,
                static_cast<unsigned long long>(m.device->offset), m.device->checksum.c_str());
}

//! The one controller a device string names (the image goes onto one).
std::unique_ptr<bam::controller> one_controller(const std::string& device) {
  const bam::device_spec spec = bam::parse_device(device);
  auto transports = bam::open_host_transports(spec);
  bam::controller_options co;
  co.io_timeout_ns = co.admin_timeout_ns = spec.timeout_ns;
  if (transports.size() == 1) return std::make_unique<bam::controller>(transports.front(), co);
  throw bam::error("'" + device + "' names " + std::to_string(transports.size()) +
                   " controllers; bam-graph load writes the image onto one");
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"bam-graph: graph analytics (BFS, connected components, PageRank) on GPU kernels reading the graph "
               "from storage through bam, next to GPU-memory, zero-copy and CPU baselines."};
  app.require_subcommand(1);
  app.fallthrough();
  bool json_out = false, quiet = false;
  unsigned threads = 0;
  app.add_flag("--json", json_out, "machine-readable output");
  app.add_flag("-q,--quiet", quiet, "no progress bars");
  app.add_option("--threads", threads, "CPU threads (default: all cores)");

  std::string dir, device;
  bam::graph::make_options mo;
  auto* make = app.add_subcommand("make", "an R-MAT graph (GAP kron a=0.57 b=0.19 c=0.19), symmetric, deduplicated");
  make->add_option("--scale", mo.scale, "2^scale nodes (default 16)")->check(CLI::Range(1u, 31u));
  make->add_option("--degree", mo.degree, "undirected edges drawn per node, as Graph500's edge factor (default 16)")
      ->check(CLI::Range(0.001, 1e5));
  make->add_option("--seed", mo.seed, "seed (default 1)");
  make->add_flag("--force", mo.force, "replace another graph in DIR");

  bam::graph::import_options io;
  auto* import = app.add_subcommand("import", "an edge list, stored as a symmetric CSR");
  import->add_option("--edges", io.edges, "SNAP text ('u v' lines, # comments), .npy (E, 2) or Matrix Market .mtx")
      ->required()
      ->check(CLI::ExistingFile);
  import->add_option("--format", io.format, "snap, npy or mtx (default: from the file name)");
  import->add_option("--nodes", io.nodes, "nodes (default: the highest id + 1, or the matrix's size)");
  import->add_flag("--force", io.force, "replace another graph in DIR");

  std::uint64_t offset = 0;
  std::uint32_t nsid = 1;
  auto* load = app.add_subcommand("load", "write the graph's image (offsets, then edges) onto a device (resumable)");
  load->add_option("--offset", offset, "byte offset on the device (K, M, G: binary; default 0)")
      ->transform(CLI::AsSizeValue(false));
  load->add_option("--nsid", nsid, "namespace (default 1)");

  bool check_device = false;
  auto* check = app.add_subcommand("check", "check the CSR (and, --device, the device's copy of the image)");
  check->add_flag("--device", check_device, "read the image back from the device the manifest names");

  auto* info = app.add_subcommand("info", "sizes and degrees");

  for (auto* sub : {make, import, load, check, info})
    sub->add_option("dir", dir, "graph directory")->required();
  load->add_option("device", device, "device string")->required(); // after dir

  bam::graph::run_options ro;
  std::vector<CLI::App*> algos;
  for (const char* name : {"bfs", "cc", "pagerank"}) {
    const std::string what = std::string(name) == "bfs"  ? "breadth-first search from random roots"
                             : std::string(name) == "cc" ? "connected components (Afforest)"
                                                         : "PageRank (pull)";
    auto* a = app.add_subcommand(name, what + " on the GPU, the graph read through bam's page cache, with baselines");
    a->add_option("dir", ro.dir, "graph directory")->required();
    a->add_option("--device", ro.device,
                  "device string (default: the manifest's device, else pinned host RAM the image's size, "
                  "emu-gpu:ram); in-process media (emu-gpu:ram, emu-gpu:hbm) get the graph written before timing");
    a->add_option("--cache-mib", ro.cache_mib, "page cache size in MiB (default 1024)");
    a->add_option("--page-size", ro.page_size, "cache page size in bytes, 512 to 65536 (default 4096)");
    a->add_option("--access", ro.access,
                  "how a warp reads a node's neighbours through the cache: copy (copy_to into shared memory; "
                  "default) or reader (warp-strided reads through array_ref::reader)");
    a->add_option("--offsets", ro.offsets, "where the offsets are read from: gpu (GPU memory; default) or cache");
    a->add_option("--look-ahead", ro.look_ahead,
                  "pages a warp brings in at once before reading a window of neighbour lists through the cache, "
                  "up to 32 (default: from the cache's size; 0: none)")
        ->check(CLI::Range(-1, 32));
    if (std::string(name) != "pagerank")
      a->add_option("--heads", ro.heads,
                    "keep the first N neighbours of every node in GPU memory, taken out of --cache-mib: BFS and CC's "
                    "sampling read them there and the edges only past them; the baselines gain a zero-copy run "
                    "behind the same heads (default 0: none)")
          ->check(CLI::Range(0u, 32u));
    a->add_option("--runs", ro.runs, "runs, each with a cold cache (default: 4; pagerank 1); BFS: a root each");
    a->add_option("--root", ro.root, "BFS: this root for every run (default: roots drawn from --seed)");
    a->add_option("--seed", ro.seed, "BFS: the seed the roots are drawn from (default 1)");
    a->add_flag("--bottom-up,!--top-down", ro.bottom_up,
                "BFS: direction-optimizing, a level whose frontier holds more than 1/20 of the nodes run bottom-up "
                "(default); --top-down: every level top-down");
    a->add_flag("--baselines,!--no-baselines", ro.baselines,
                "also run on the graph in GPU memory, zero-copy from pinned host memory and on CPU threads "
                "(default)");
    a->add_flag("--validate,!--no-validate", ro.validate, "check every run's result (default)");
    a->add_option("--damping", ro.damping, "PageRank: damping factor (default 0.85)");
    a->add_option("--iterations", ro.iterations, "PageRank: iterations, at most (default 20)");
    a->add_option("--tolerance", ro.tolerance, "PageRank: stop when an iteration changes less (L1; default 0: never)");
    a->add_option("--max-l1", ro.max_l1, "PageRank: largest L1 distance to the CPU's ranks (default 1e-4)");
    a->add_option("--json", ro.json_file, "also write the results to FILE as JSON");
    algos.push_back(a);
  }

  CLI11_PARSE(app, argc, argv);
  try {
    const fs::path d(dir);
    if (*make) {
      mo.threads = threads;
      bam::tools::progress_bar bar("generating", !quiet && !json_out && ::isatty(2) != 0);
      mo.progress = [&](const char*, std::uint64_t done, std::uint64_t total) { bar.update(done, total, 0); };
      const auto r = bam::graph::make_graph(d, mo);
      bar.finish();
      if (json_out) {
        json j = summary_json(d, r.m);
        j["already_there"] = r.already_there;
        std::cout << j.dump(2) << std::endl;
      } else {
        if (r.already_there) std::printf("%s already holds this graph: nothing written\n", dir.c_str());
        print_summary(d, r.m);
      }
      return 0;
    }
    if (*import) {
      io.threads = threads;
      const auto m = bam::graph::import_graph(d, io);
      if (json_out)
        std::cout << summary_json(d, m).dump(2) << std::endl;
      else
        print_summary(d, m);
      return 0;
    }
    if (*load) {
      std::signal(SIGINT, on_interrupt); // a load stops cleanly, resumable
      std::signal(SIGTERM, on_interrupt);
      bam::graph::manifest m = bam::graph::read_manifest(d);
      const bam::gnn::csr_graph g = bam::graph::read_graph(d, m);
      auto ctrl = one_controller(device);
      bam::tools::progress_bar bar("graph -> " + device, !quiet && !json_out);
      const bam::dataset_options o{.nsid = nsid,
                                   .offset = offset,
                                   .state_path = (d / "image.bam-load").string(),
                                   .progress = bar.follow(),
                                   .cancel = &interrupted};
      const bam::dataset_result r = bam::load_dataset(*ctrl, bam::graph::image_source(g), o);
      bar.finish();
      m.device = bam::graph::device_placement{device, nsid, offset, ctrl->ns(nsid).lba_size, r.checksum};
      bam::graph::write_manifest(d, m);
      if (json_out)
        std::cout << summary_json(d, m).dump(2) << std::endl;
      else
        std::printf("image: %llu bytes onto %s namespace %u at byte %llu in %.1f s, checksum %s\n",
                    static_cast<unsigned long long>(r.bytes), device.c_str(), nsid,
                    static_cast<unsigned long long>(offset), r.seconds, r.checksum.c_str());
      return 0;
    }
    if (*check || *info) {
      const bam::graph::manifest m = bam::graph::read_manifest(d);
      std::unique_ptr<bam::controller> ctrl;
      if (check_device) {
        if (!m.device) throw bam::error(dir + ": the graph was never loaded onto a device (bam-graph load)");
        ctrl = one_controller(m.device->device);
      }
      const bam::graph::check_report r = bam::graph::check_graph(d, ctrl.get());
      if (json_out) {
        json j = summary_json(d, m);
        j["max_degree"] = r.max_degree;
        j["isolated_nodes"] = r.isolated;
        j["csr_valid"] = true;
        j["device_checked"] = r.device_checked;
        std::cout << j.dump(2) << std::endl;
      } else {
        print_summary(d, m);
        std::printf("  CSR valid and symmetric; degree at most %llu, %llu nodes without neighbours%s\n",
                    static_cast<unsigned long long>(r.max_degree), static_cast<unsigned long long>(r.isolated),
                    r.device_checked ? ("; the image on " + m.device->device + " equals the files").c_str() : "");
      }
      return 0;
    }
    for (auto* a : algos) {
      if (!*a) continue;
      ro.algorithm = a->get_name();
      ro.json_stdout = json_out;
      ro.quiet = quiet;
      ro.threads = threads;
#if defined(BAM_GRAPH_WITH_CUDA)
      return bam::graph::run_algorithm(ro);
#else
      throw bam::error("bam-graph " + ro.algorithm +
                       " runs on a GPU: this bam-graph was built without CUDA (configure with a CUDA toolkit, "
                       "BAM_ENABLE_CUDA=ON)");
#endif
    }
  } catch (const bam::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    if (json_out) std::cout << json{{"error", e.what()}, {"errno", e.errnum()}}.dump(2) << std::endl;
    return e.errnum() == EINTR ? 130 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bam-graph: %s\n", e.what());
    if (json_out) std::cout << json{{"error", e.what()}}.dump(2) << std::endl;
    return 1;
  }
  return 0;
}
