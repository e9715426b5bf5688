// SPDX-License-Identifier: MIT
// block_bench: bam's block benchmark — throughput, latency and hit rate of
// GPU-initiated I/O on any transport, next to ceilings and baselines
// measured in the same run. Every mode checks the data it reads against a
// pattern derived from the address (the media is filled with it first).
//
//   block_bench --device emu-gpu:null=64G --mode raw --io-size 512            # commands/s of the queue path
//   block_bench --device emu-gpu:ram=8G --mode range --io-size 4096 --compare # 4 KiB random reads vs zero-copy
//   block_bench --mode element --working-set-mib 512 --cache-mib 1024         # cache hits, element access
//   block_bench --device /dev/bam-nvme0 --mode raw --op mix --read-percent 70 --json out.json
//   block_bench --device emu:extents=/data/f.img --file /data/f.img --mode range --compare  # a file: bam vs pread vs
//   KvikIO
//   block_bench --device emu-gpu:shm=bench,size=8G,unlink --gpus 1,2 --mode range --cache-mib 256  # 1 GPU, then 2
//   block_bench --device emu-gpu:shm=bench,size=8G,unlink --gpus 2 --node-cache --mode range --cache-mib 2048
//       [--spread-ceiling]  # and the gather from memory spread over the GPUs, same run
//   block_bench --device emu-gpu:shm=bench,size=8G,unlink --gpus 2 --processes --node-cache --mode range --cache-mib
//   2048
//
// Several GPUs (--gpus N, or a list: 1,2 measures one GPU, then two, in one
// run): one host thread per GPU, each with its own storage over the device
// string and its own page cache, running the same benchmark at once (every
// repetition starts on all GPUs together). With shm= media the GPUs share one
// copy of the data; the JSON has per-GPU figures, their sum, and the scaling
// against the one-GPU run of the same invocation. With --node-cache the GPUs
// share one page cache spread over them (--cache-mib on each GPU, one copy
// of a page for all) instead of a cache each. With --processes each GPU runs
// in a process of its own (torchrun's layout) instead of a thread; with
// --node-cache as well, the processes share one cache (page_cache_config::group).
//
// Modes: raw (GPU threads issue NVMe commands straight through the queues,
// no cache), element (a[i], 32 lanes on consecutive elements of a page),
// reader (the same through a reader that remembers slots), page (the same
// through a pinned page handle, a.page(i)), span (the same through the
// handle's unchecked span, pg.span()[k]), range (a warp copies whole
// pages with copy_to), gather (every lane reads one word of a random page
// of its own with a[i]: up to 32 misses in flight per warp). In the array
// modes --io-size is the page size.
#include "detail/bench_kernels.cuh"
#include "detail/host_baselines.hpp"
#include "detail/process_run.hpp"
#include "detail/timing.cuh"

#include <bam/bam.cuh>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
  std::vector<std::string> devices;
  std::string mode = "raw";
  std::string access = "random";
  std::string op = "read";
  std::uint32_t read_percent = 70;
  std::uint32_t io_size = 4096;
  std::uint64_t threads = 262144;
  unsigned block_threads = 256;
  std::uint32_t queues = 128;
  std::uint32_t depth = 256;
  std::uint32_t ssds = 1;
  std::size_t cache_mib = 1024;
  std::size_t working_set_mib = 0; //!< array modes: bytes the accesses range over (0: the whole storage)
  double seconds = 0.5;            //!< target time of one timed repetition
  int reps = 3;
  bool compare = false;
  bool host_ceiling = false;   //!< with --gpus: the zero-copy host gather on the same GPUs at once
  bool spread_ceiling = false; //!< with --gpus N (N >= 2): gathers from GPU memory spread over the N GPUs
  bool node_cache = false;     //!< with --gpus: one page cache spread over the GPUs
  bool verify = true;
  bool verify_all = false;
  std::string json;
  std::string commit;
  std::string file = "/tmp/bam-bench.img";
  std::size_t file_mib = 4096;
  unsigned host_threads = 32;
  bool quiet = false;
  std::vector<int> gpus;  //!< GPU counts to run each device with (empty: one GPU, the current one)
  bool processes = false; //!< with --gpus: one process per GPU instead of one thread
  // A process started by --processes (rank >= 1): what it runs and where it reports.
  int child_rank = 0;
  int child_of = 0;
  int child_sync_fd = -1;
  std::string child_device, child_out, child_group;
};

using bam::bench::process_sync;

//! The salt of this process's offsets (--processes: each rank draws its own).
std::uint64_t seed_salt = 0;

//! The GPUs of one concurrent run: they agree on the operation count and
//! start every timed launch together.
struct gpu_group {
  std::barrier<>* barrier = nullptr;
  std::vector<double>* times = nullptr; //!< one slot per GPU
  int index = 0;                        //!< this thread's GPU
  int count = 1;
  bam::page_cache* shared_cache = nullptr; //!< --node-cache: the one cache over the group's GPUs
  process_sync* processes = nullptr;       //!< --processes: the run's shared barrier and times
  std::string group;                       //!< --processes --node-cache: the page cache group's name

  void sync() const {
    if (processes != nullptr)
      processes->wait(count);
    else
      barrier->arrive_and_wait();
  }
  //! The longest of every GPU's `t`.
  double slowest(double t) const {
    double* const all = processes != nullptr ? processes->times : times->data();
    all[index] = t;
    sync();
    const double m = *std::max_element(all, all + count);
    sync();
    return m;
  }
};

struct run_result {
  nlohmann::json j;
  double ops_per_s = 0;
};

std::string gpu_name(int* driver, int d = -1) {
  cudaDeviceProp p{};
  if (d < 0) cudaGetDevice(&d);
  cudaGetDeviceProperties(&p, d);
  cudaDriverGetVersion(driver);
  return p.name;
}

//! Percentile (0..1) of a latency histogram, in microseconds.
double percentile_us(const unsigned long long* hist, double q) {
  unsigned long long total = 0;
  for (int i = 0; i < bench::latency_buckets; ++i)
    total += hist[i];
  if (total == 0) return 0;
  const double want = q * static_cast<double>(total);
  unsigned long long seen = 0;
  for (int i = 0; i < bench::latency_buckets; ++i) {
    if (seen + hist[i] >= want) {
      const double lo = bench::latency_bucket_ns(i), hi = bench::latency_bucket_ns(i + 1);
      const double frac = hist[i] ? (want - seen) / static_cast<double>(hist[i]) : 0;
      return (lo + frac * (hi - lo)) / 1000.0;
    }
    seen += hist[i];
  }
  return bench::latency_bucket_ns(bench::latency_buckets - 1) / 1000.0;
}

//! The offsets' seed of the next launch. Every launch (calibration, warm-up,
//! repetitions) draws new offsets: with the same ones, a launch that visits
//! fewer pages than the cache holds would find the previous launch's pages
//! cached, and report hits that a workload larger than the cache never gets.
std::uint64_t next_seed() {
  static std::atomic<std::uint64_t> launches{0}; // the threads of --gpus draw too
  return 12345 + seed_salt + 0x9e3779b97f4a7c15ull * ++launches;
}

//! Time `launch(ops_per_thread)`: a calibration run picks the operation count
//! for about `o.seconds` a repetition; the median of `o.reps` is reported.
//! In a group of GPUs (`g`), every GPU calibrates with the slowest GPU's time
//! (so all pick the same count) and each launch starts on all GPUs together.
template <class Launch>
std::pair<double, bench::stats> timed(const options& o, Launch&& launch, std::uint32_t& ops_per_thread,
                                      const gpu_group* g = nullptr) {
  const bool report = !o.quiet && (g == nullptr || g->index == 0);
  bam::device_buffer<bench::stats> st(1);
  auto once = [&](std::uint32_t ops) {
    BAM_CUDA_TRY(cudaMemset(st.get(), 0, sizeof(bench::stats)));
    const float ms = bench::time_launch_ms([&] { launch(ops, st.get()); });
    bench::stats s{};
    bam::copy_to_host(&s, st.get(), 1);
    return std::pair<double, bench::stats>{ms / 1000.0, s};
  };
  std::uint32_t ops = std::max<std::uint32_t>(ops_per_thread, 1);
  // Calibrate (also the warm-up: lazy module loading, first misses).
  for (int i = 0; i < 6; ++i) {
    if (g != nullptr) g->sync();
    const double t = g != nullptr ? g->slowest(once(ops).first) : once(ops).first;
    if (t >= o.seconds / 4 || ops >= (1u << 20)) {
      ops = static_cast<std::uint32_t>(std::clamp(ops * o.seconds / std::max(t, 1e-6), 1.0, double(1u << 22)));
      break;
    }
    ops *= 8;
  }
  std::vector<std::pair<double, bench::stats>> runs;
  for (int r = 0; r < o.reps; ++r) {
    if (g != nullptr) g->sync();
    runs.push_back(once(ops));
    if (report) std::fprintf(stderr, "\r  repetition %d/%d: %.3f s   ", r + 1, o.reps, runs.back().first);
  }
  if (report) std::fprintf(stderr, "\r%60s\r", "");
  std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  ops_per_thread = ops;
  return runs[runs.size() / 2];
}

void fill_storage(const bam::storage& s) {
  for (std::uint32_t c = 0; c < s.controller_count(); ++c) {
    const std::uint64_t bytes = s.blocks_per_controller() * s.lba_size();
    if (const auto* engine = bam::emu::gpu_engine_of(s, c)) {
      const auto r = engine->ref();
      if (r.media == nullptr) continue; // null media: nothing to fill
      bench::fill_kernel<<<4096, 256>>>(reinterpret_cast<std::uint32_t*>(r.media), bytes / 4, c, 0);
      BAM_CUDA_TRY(cudaGetLastError());
      BAM_CUDA_TRY(cudaDeviceSynchronize());
    } else {
      std::vector<std::uint32_t> buf((8u << 20) / 4);
      for (std::uint64_t off = 0; off < bytes; off += buf.size() * 4) {
        const std::uint64_t n = std::min<std::uint64_t>(buf.size() * 4, bytes - off);
        for (std::uint64_t k = 0; k < n / 4; ++k)
          buf[k] = bench::pattern_word(c, off + 4 * k);
        bam::emu::write_media(s, c, off, buf.data(), n);
      }
    }
  }
}

//! One device string on the current GPU (in a group: GPU `g->index`, with
//! the others at once).
run_result run_device(const options& o, const std::string& dev, const gpu_group* g = nullptr) {
  // A device over the baselines' file (emu:file=F, emu:extents=F with F the
  // --file): the file is written with the pattern once, before it is opened
  // (extents are mapped at open, and read-only), and read by every path.
  const bam::device_spec spec = bam::parse_device(dev);
  const auto same_file = [](const std::string& x, const std::string& y) {
    std::error_code e1, e2;
    return std::filesystem::weakly_canonical(x, e1) == std::filesystem::weakly_canonical(y, e2) && !e1 && !e2;
  };
  const bool on_bench_file = spec.media == bam::media_kind::file && spec.ssds == 1 && same_file(spec.path, o.file);
  if (on_bench_file) {
    if (spec.bytes > (std::uint64_t{o.file_mib} << 20))
      throw std::runtime_error(dev + ": size= is larger than the --file-mib the file is written with");
    if (const std::string why = bench::prepare_file(o.file, std::uint64_t{o.file_mib} << 20); !why.empty())
      throw std::runtime_error(why);
  }
  bam::storage s(dev, bam::storage_options{.device = g != nullptr ? g->index : -1});
  const bool data = s.spec().kind != bam::device_kind::pci && s.spec().media != bam::media_kind::null;
  // Shared media are filled once, by the group's first GPU.
  const bool shared = spec.media == bam::media_kind::shm;
  if (data && !on_bench_file && (g == nullptr || g->index == 0 || !shared)) fill_storage(s);
  if (g != nullptr) g->sync();
  bench::workload w;
  w.unit_bytes = o.io_size;
  w.read_percent = o.op == "read" ? 100 : o.op == "write" ? 0 : o.read_percent;
  w.sequential = o.access == "sequential";
  w.verify = (o.verify && data) ? 1 : 0;
  w.verify_all = o.verify_all ? 1 : 0;
  w.seed = 12345;
  const std::uint32_t nctrl = s.controller_count();
  const std::uint64_t storage_bytes = s.blocks_per_controller() * s.lba_size() * nctrl;
  nlohmann::json j;
  j["device"] = dev;
  j["transport"] = s.transport_name();
  j["cuda_device"] = s.device();
#ifdef BAM_DEVICE_PROGRESS_HOOK
  j["kernels"] = "with the software controller's device hook";
#else
  j["kernels"] = "real-controller build (no software controller device code)";
#endif
  j["mode"] = o.mode;
  j["op"] = o.op;
  if (o.op == "mix") j["read_percent"] = w.read_percent;
  j["access"] = o.access;
  j["io_bytes"] = o.io_size;
  j["controllers"] = nctrl;
  j["queues_per_controller"] = s.ref(0).queue_count();
  j["queue_depth"] = s.controller_at(0).io_queue_depth();
  j["verified"] = w.verify != 0;
  if (o.mode == "range") j["verified_words"] = o.verify_all ? "every word" : "first word of every 512 bytes";
  unsigned blocks = static_cast<unsigned>((o.threads + o.block_threads - 1) / o.block_threads);
  // Raw mode: one buffer slot of io_size bytes per thread, 4 GiB at most; for
  // huge commands, fewer threads (still far more than the queues hold).
  const std::uint64_t max_slots = std::max<std::uint64_t>(o.block_threads, (4ull << 30) / o.io_size);
  if (o.mode == "raw" && std::uint64_t{blocks} * o.block_threads > max_slots)
    blocks = static_cast<unsigned>(max_slots / o.block_threads);
  const std::uint64_t threads = std::uint64_t{blocks} * o.block_threads;
  j["threads"] = threads;
  std::uint32_t ops = 1;
  std::pair<double, bench::stats> r;
  double units_per_op = 1; // pages or commands counted per stats op
  std::optional<bam::page_cache> cache;
  if (o.mode == "raw") {
    w.span_units = storage_bytes / nctrl / o.io_size;
    const std::uint64_t slots = threads; // one buffer slot per thread
    const std::size_t bytes = (slots * o.io_size + bam::gpu_page_size - 1) / bam::gpu_page_size * bam::gpu_page_size;
    bam::detail::aligned_device_memory buf(bytes, bam::gpu_page_size);
    auto map = s.map(buf.data(), buf.size());
    j["buffer_slots"] = slots;
    j["in_flight_max"] = std::min<std::uint64_t>(threads, std::uint64_t{nctrl} * s.ref(0).queue_count() *
                                                              (s.controller_at(0).io_queue_depth() - 1));
    r = timed(
        o,
        [&](std::uint32_t n, bench::stats* st) {
          w.ops_per_thread = n;
          w.seed = next_seed(); // new offsets every launch (see next_seed)
          bench::raw_kernel<<<blocks, o.block_threads>>>(s.device_refs(), nctrl, map->bus_tables(), buf.data(), slots,
                                                         w, data, st);
        },
        ops, g);
  } else {
    const std::uint64_t ws = o.working_set_mib
                                 ? std::min<std::uint64_t>(std::uint64_t{o.working_set_mib} << 20, storage_bytes)
                                 : storage_bytes;
    const bool node = g != nullptr && (g->shared_cache != nullptr || !g->group.empty());
    if (g != nullptr && !g->group.empty()) {
      bam::page_cache_config cfg{.page_size = o.io_size,
                                 .capacity = (o.cache_mib << 20) * static_cast<std::size_t>(g->count),
                                 .device = g->index};
      cfg.group = {.name = g->group, .rank = g->index, .size = g->count};
      cache.emplace(cfg);
    } else if (node)
      cache.emplace(*g->shared_cache);
    else
      cache.emplace(bam::page_cache_config{.page_size = o.io_size, .capacity = o.cache_mib << 20});
    bam::array<std::uint32_t> a(*cache, s, ws / 4);
    // The misses of this GPU's kernels (a node-wide cache counts every GPU's).
    const auto counted = [&] { return node ? cache->counters(s.device()) : cache->counters(); };
    w.span_units = ws / o.io_size;
    const std::uint64_t warps = threads / 32;
    bam::device_buffer<std::uint32_t> scratch(o.mode == "range" ? warps * (o.io_size / 4) : 1);
    j["cache_bytes"] = cache->slot_count() * o.io_size;
    j["cache"] = !node              ? std::string("a cache per GPU")
                 : g->group.empty() ? "one cache spread over " + std::to_string(cache->devices().size()) + " GPUs"
                                    : "one cache shared by " + std::to_string(g->count) + " processes, one GPU each";
    j["working_set_bytes"] = ws;
    const bool gather = o.mode == "gather";
    // Pages a launch visits: one per warp and op, or one per lane (gather).
    const std::uint64_t visitors = gather ? threads : warps;
    j["in_flight_max"] = visitors;
    const auto before = counted();
    std::uint64_t launched_pages = 0;
    r = timed(
        o,
        [&](std::uint32_t n, bench::stats* st) {
          w.ops_per_thread = n;
          w.seed = next_seed(); // new offsets every launch (see next_seed)
          launched_pages += visitors * n;
          if (gather)
            bench::array_gather_kernel<<<blocks, o.block_threads>>>(a.ref(), nctrl, w, st);
          else if (o.mode == "element")
            bench::array_kernel<bench::array_mode::element>
                <<<blocks, o.block_threads>>>(a.ref(), nctrl, w, scratch.get(), st);
          else if (o.mode == "reader")
            bench::array_reader_kernel<<<blocks, o.block_threads>>>(a.ref(), nctrl, w, scratch.get(), st);
          else if (o.mode == "page")
            bench::array_page_kernel<<<blocks, o.block_threads>>>(a.ref(), nctrl, w, scratch.get(), st);
          else if (o.mode == "span")
            bench::array_span_kernel<<<blocks, o.block_threads>>>(a.ref(), nctrl, w, scratch.get(), st);
          else
            bench::array_kernel<bench::array_mode::range>
                <<<blocks, o.block_threads>>>(a.ref(), nctrl, w, scratch.get(), st);
        },
        ops, g);
    a.check();
    const auto after = counted();
    // Hit rate over every run (calibration included): 1 - pages loaded / pages visited.
    j["hit_rate"] = 1.0 - static_cast<double>(after.misses - before.misses) / static_cast<double>(launched_pages);
    j["writebacks"] = after.writebacks - before.writebacks;
    j["accesses_per_s"] = static_cast<double>(r.second.ops) * (gather ? 1 : o.io_size / 4) / r.first;
  }
  const double ops_per_s = static_cast<double>(r.second.ops) * units_per_op / r.first;
  j["ops_per_thread"] = ops;
  j["seconds"] = r.first;
  j["ops"] = r.second.ops;
  j["ops_per_s"] = ops_per_s;
  // Payload: whole pages, or the one word a gather lane reads of its page.
  j["GB_per_s"] = ops_per_s * (o.mode == "gather" ? 4 : o.io_size) / 1e9;
  if (j.contains("hit_rate")) j["misses_per_s"] = ops_per_s * (1.0 - j["hit_rate"].get<double>());
  j["latency_us"] = {{"p50", percentile_us(r.second.hist, 0.50)},
                     {"p99", percentile_us(r.second.hist, 0.99)},
                     {"p999", percentile_us(r.second.hist, 0.999)}};
  j["bad_words"] = r.second.bad;
  j["errors"] = r.second.errors;
  if (o.mode == "page" || o.mode == "span")
    j["page_handles_unpinned"] = r.second.unpinned; // page visits served through a[i]
  if (r.second.bad != 0 || r.second.errors != 0)
    std::fprintf(stderr, "block_bench: %s: %llu wrong words, %llu failed operations\n", dev.c_str(), r.second.bad,
                 r.second.errors);
  return {j, ops_per_s};
}

//! `dev` on GPUs 0 .. n-1 at once, a host thread and a storage and cache each:
//! per-GPU figures and their sums.
run_result run_device_in_processes(const options& o, const std::string& dev, int n);
run_result combine(const std::vector<run_result>& per, int n, const std::string& how);

run_result run_device_on_gpus(const options& o, const std::string& dev, int n) {
  int have = 0;
  BAM_CUDA_TRY(cudaGetDeviceCount(&have));
  if (n > have)
    throw std::runtime_error("--gpus " + std::to_string(n) + ": this machine has " + std::to_string(have) + " GPU(s)");
  if (o.processes) return run_device_in_processes(o, dev, n);
  std::barrier<> barrier(n);
  std::vector<double> times(static_cast<std::size_t>(n));
  std::vector<run_result> per(static_cast<std::size_t>(n));
  std::exception_ptr failed;
  std::mutex failed_mutex;
  std::optional<bam::page_cache> node;
  if (o.node_cache && o.mode != "raw") {
    std::vector<int> devs(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k)
      devs[static_cast<std::size_t>(k)] = k;
    node.emplace(bam::page_cache_config{
        .page_size = o.io_size, .capacity = (o.cache_mib << 20) * static_cast<std::size_t>(n), .devices = devs});
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      const gpu_group g{&barrier, &times, k, n, node ? &*node : nullptr};
      try {
        BAM_CUDA_TRY(cudaSetDevice(k));
        per[static_cast<std::size_t>(k)] = run_device(o, dev, &g);
      } catch (...) {
        {
          std::lock_guard lock(failed_mutex);
          if (!failed) failed = std::current_exception();
        }
        barrier.arrive_and_drop(); // the others go on without this GPU, and the run fails
      }
    });
  }
  for (auto& t : threads)
    t.join();
  if (failed) std::rethrow_exception(failed);
  return combine(per, n, "one host thread per GPU");
}

//! The command line this program was started with (--processes starts it again).
std::vector<std::string> program_args;

//! `dev` on GPUs 0 .. n-1 at once, one process each (this one is the first):
//! per-GPU figures and their sums. With --node-cache the processes share
//! one page cache (`page_cache_config::group`).
run_result run_device_in_processes(const options& o, const std::string& dev, int n) {
  static int runs = 0;
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(runs++);
  bam::bench::process_run run;
  std::vector<std::string> outs;
  const std::string group = o.node_cache && o.mode != "raw" && n > 1 ? "block_bench-" + tag : "-";
  for (int k = 1; k < n; ++k) {
    outs.push_back(run.report_file("block_bench-" + tag + "-" + std::to_string(k) + ".json"));
    std::vector<std::string> args = program_args;
    for (const std::string& x :
         {std::string("--child-rank"), std::to_string(k), std::string("--child-of"), std::to_string(n),
          std::string("--child-sync-fd"), std::to_string(run.fd()), std::string("--child-device"), dev,
          std::string("--child-out"), outs.back(), std::string("--child-group"), group})
      args.push_back(x);
    run.start(std::move(args));
  }
  const gpu_group g{nullptr, nullptr, 0, n, nullptr, &run.sync(), group == "-" ? "" : group};
  std::vector<run_result> per(static_cast<std::size_t>(n));
  std::exception_ptr failed;
  try {
    BAM_CUDA_TRY(cudaSetDevice(0));
    per[0] = run_device(o, dev, &g);
  } catch (...) {
    run.fail();
    failed = std::current_exception();
  }
  const bool all_ok = run.wait_all();
  if (failed) std::rethrow_exception(failed);
  if (!all_ok) throw std::runtime_error("--processes: " + run.failures().front());
  for (int k = 1; k < n; ++k) {
    std::ifstream f(outs[static_cast<std::size_t>(k - 1)]);
    per[static_cast<std::size_t>(k)].j = nlohmann::json::parse(f);
  }
  return combine(per, n, "one process per GPU");
}

//! A process started by --processes: its GPU's share of the run.
int run_child(const options& o) {
  process_sync* const ps = bam::bench::attach_process_sync(o.child_sync_fd);
  if (ps == nullptr) return 2;
  seed_salt = 0x5851f42d4c957f2dull * static_cast<std::uint64_t>(o.child_rank);
  const gpu_group g{nullptr, nullptr, o.child_rank, o.child_of, nullptr, ps, o.child_group == "-" ? "" : o.child_group};
  try {
    BAM_CUDA_TRY(cudaSetDevice(o.child_rank));
    const run_result r = run_device(o, o.child_device, &g);
    std::ofstream f(o.child_out);
    f << r.j.dump() << "\n";
    return f ? 0 : 1;
  } catch (const std::exception& e) {
    ps->failed.store(1);
    std::fprintf(stderr, "block_bench: process %d: %s\n", o.child_rank, e.what());
    return 1;
  }
}

//! Per-GPU results of one run on `n` GPUs at once, and their sums.
run_result combine(const std::vector<run_result>& per, int n, const std::string& how) {
  nlohmann::json j = per[0].j;
  nlohmann::json per_gpu = nlohmann::json::array();
  double ops = 0, gbs = 0, misses = 0;
  unsigned long long bad = 0, errors = 0;
  for (int k = 0; k < n; ++k) {
    const nlohmann::json& r = per[static_cast<std::size_t>(k)].j;
    int driver = 0;
    nlohmann::json x{{"cuda_device", k},
                     {"gpu", gpu_name(&driver, k)},
                     {"ops_per_s", r["ops_per_s"]},
                     {"GB_per_s", r["GB_per_s"]},
                     {"seconds", r["seconds"]},
                     {"latency_us", r["latency_us"]},
                     {"bad_words", r["bad_words"]},
                     {"errors", r["errors"]}};
    for (const char* key : {"hit_rate", "misses_per_s", "accesses_per_s"})
      if (r.contains(key)) x[key] = r[key];
    per_gpu.push_back(x);
    ops += r["ops_per_s"].get<double>();
    gbs += r["GB_per_s"].get<double>();
    if (r.contains("misses_per_s")) misses += r["misses_per_s"].get<double>();
    bad += r["bad_words"].get<unsigned long long>();
    errors += r["errors"].get<unsigned long long>();
  }
  j.erase("cuda_device");
  j["gpus"] = n;
  j["per_gpu"] = per_gpu;
  j["ops_per_s"] = ops;
  j["GB_per_s"] = gbs;
  if (j.contains("misses_per_s")) j["misses_per_s"] = misses;
  if (j.contains("accesses_per_s")) {
    double a = 0;
    for (const auto& x : per_gpu)
      a += x["accesses_per_s"].get<double>();
    j["accesses_per_s"] = a;
  }
  j["bad_words"] = bad;
  j["errors"] = errors;
  j["concurrency"] = how + "; every repetition starts on all GPUs together; figures are per-GPU medians and their sums";
  return {j, ops};
}

//! A gather ceiling: random `io` blocks from pinned host memory or GPU memory.
nlohmann::json gather_ceiling(const options& o, bool host, std::uint64_t bytes) {
  std::uint8_t* mem = nullptr;
  std::optional<bam::pinned_buffer<std::uint8_t>> pinned;
  std::optional<bam::device_buffer<std::uint8_t>> device;
  if (host) {
    pinned.emplace(bytes);
    mem = pinned->get();
  } else {
    device.emplace(bytes);
    mem = device->get();
  }
  bench::fill_kernel<<<4096, 256>>>(reinterpret_cast<std::uint32_t*>(mem), bytes / 4, 0, 0);
  BAM_CUDA_TRY(cudaDeviceSynchronize());
  bench::workload w;
  w.unit_bytes = o.io_size;
  w.verify = o.verify;
  w.sequential = o.access == "sequential";
  const unsigned blocks = static_cast<unsigned>((o.threads + o.block_threads - 1) / o.block_threads);
  std::uint32_t ops = 1;
  const auto r = timed(
      o,
      [&](std::uint32_t n, bench::stats* st) {
        w.ops_per_thread = n;
        w.seed = next_seed();
        bench::gather_source src;
        src.part[0] = mem;
        src.units_per_part = bytes / o.io_size;
        bench::gather_kernel<<<blocks, o.block_threads>>>(src, w, st);
      },
      ops);
  const double ops_per_s = static_cast<double>(r.second.ops) / r.first;
  return {
      {"what", host ? "GPU zero-copy random gather from pinned host memory" : "random gather inside GPU memory (HBM)"},
      {"bytes", bytes},
      {"io_bytes", o.io_size},
      {"ops_per_s", ops_per_s},
      {"GB_per_s", ops_per_s * o.io_size / 1e9},
      {"bad_words", r.second.bad}};
}

//! The GPUs' gathers of one ceiling (each with ops_per_s and bad_words), summed.
nlohmann::json summed_gathers(const std::vector<nlohmann::json>& per, const std::string& what, std::uint32_t io) {
  double ops = 0;
  unsigned long long bad = 0;
  for (const auto& r : per) {
    ops += r["ops_per_s"].get<double>();
    bad += r["bad_words"].get<unsigned long long>();
  }
  return {{"what", what},     {"gpus", per.size()},         {"io_bytes", io},
          {"ops_per_s", ops}, {"GB_per_s", ops * io / 1e9}, {"bad_words", bad}};
}

//! gather_ceiling from pinned host memory on GPUs 0 .. n-1 at once (a host
//! thread each, started together): what the host's memory and the GPUs' links
//! give a medium in host memory (shm=, ram=) when n GPUs read it.
nlohmann::json host_gather_on_gpus(const options& o, int n) {
  const std::uint64_t bytes = std::max<std::uint64_t>(4ull << 30, std::uint64_t{o.io_size} * 1024);
  std::barrier<> barrier(n);
  std::vector<nlohmann::json> per(static_cast<std::size_t>(n));
  std::exception_ptr failed;
  std::mutex failed_mutex;
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      try {
        BAM_CUDA_TRY(cudaSetDevice(k));
        barrier.arrive_and_wait();
        per[static_cast<std::size_t>(k)] = gather_ceiling(o, true, bytes);
      } catch (...) {
        std::lock_guard lock(failed_mutex);
        if (!failed) failed = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  if (failed) std::rethrow_exception(failed);
  return summed_gathers(
      per, "GPU zero-copy random gather from pinned host memory, " + std::to_string(n) + " GPU(s) at once", o.io_size);
}

//! The random gather of --io-size blocks on GPUs 0 .. n-1 at once from GPU
//! memory spread over them, a host thread each (started together every
//! repetition): the ceiling of a cache spread over the GPUs, whose hits read
//! a page in its home GPU's memory. `peer`: each GPU reads only the next
//! GPU's part (every read crosses NVLink: the remote hits' ceiling); else
//! every GPU reads every part (1/n of the reads are local, as for a
//! cache's hits spread evenly).
nlohmann::json spread_gather_on_gpus(const options& o, int n, bool peer) {
  const std::uint64_t part_bytes = std::max<std::uint64_t>(2ull << 30, std::uint64_t{o.io_size} * 1024);
  const std::uint64_t units = part_bytes / o.io_size;
  if (static_cast<std::uint32_t>(n) > bench::gather_source::max_parts)
    throw std::runtime_error("--spread-ceiling: at most " + std::to_string(bench::gather_source::max_parts) + " GPUs");
  std::barrier<> barrier(n);
  std::vector<double> times(static_cast<std::size_t>(n));
  std::vector<bam::device_buffer<std::uint8_t>*> parts(static_cast<std::size_t>(n), nullptr);
  std::vector<nlohmann::json> per(static_cast<std::size_t>(n));
  std::exception_ptr failed;
  std::mutex failed_mutex;
  std::atomic<bool> broken{false};
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      std::optional<bam::device_buffer<std::uint8_t>> mine;
      bool arrived = false; // at the step where every part exists
      try {
        BAM_CUDA_TRY(cudaSetDevice(k));
        mine.emplace(part_bytes);
        // Part k holds the pattern's blocks k * units on.
        bench::fill_kernel<<<4096, 256>>>(reinterpret_cast<std::uint32_t*>(mine->get()), part_bytes / 4, 0,
                                          static_cast<std::uint64_t>(k) * part_bytes);
        BAM_CUDA_TRY(cudaDeviceSynchronize());
        for (int p = 0; p < n; ++p) {
          if (p == k) continue;
          const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
          if (e == cudaErrorPeerAccessAlreadyEnabled)
            cudaGetLastError();
          else
            BAM_CUDA_TRY(e);
        }
        parts[static_cast<std::size_t>(k)] = &*mine;
        arrived = true;
        barrier.arrive_and_wait();
        if (broken) return barrier.arrive_and_drop(); // a part is missing
        bench::gather_source src;
        if (peer) {
          const int p = (k + 1) % n;
          src.part[0] = parts[static_cast<std::size_t>(p)]->get();
          src.first_unit = static_cast<std::uint64_t>(p) * units;
        } else {
          src.count = static_cast<std::uint32_t>(n);
          for (int p = 0; p < n; ++p)
            src.part[p] = parts[static_cast<std::size_t>(p)]->get();
        }
        src.units_per_part = units;
        bench::workload w;
        w.unit_bytes = o.io_size;
        w.verify = o.verify;
        const unsigned blocks = static_cast<unsigned>((o.threads + o.block_threads - 1) / o.block_threads);
        std::uint32_t ops = 1;
        const gpu_group g{&barrier, &times, k, n, nullptr};
        const auto r = timed(
            o,
            [&](std::uint32_t m, bench::stats* st) {
              w.ops_per_thread = m;
              w.seed = next_seed();
              bench::gather_kernel<<<blocks, o.block_threads>>>(src, w, st);
            },
            ops, &g);
        per[static_cast<std::size_t>(k)] = {{"ops_per_s", static_cast<double>(r.second.ops) / r.first},
                                            {"bad_words", r.second.bad}};
        barrier.arrive_and_wait(); // no part is freed while another GPU reads it
      } catch (...) {
        {
          std::lock_guard lock(failed_mutex);
          if (!failed) failed = std::current_exception();
        }
        broken = true;
        if (!arrived) barrier.arrive_and_wait(); // the step every part exists at: the others leave there
        barrier.arrive_and_drop();
      }
    });
  for (auto& t : threads)
    t.join();
  if (failed) std::rethrow_exception(failed);
  nlohmann::json j = summed_gathers(per,
                                    peer ? "random gather from the next GPU's memory over NVLink, " +
                                               std::to_string(n) + " GPUs at once (remote hits' ceiling)"
                                         : "random gather from GPU memory spread over " + std::to_string(n) +
                                               " GPUs, every GPU reading every part, at once (spread cache hits' "
                                               "ceiling)",
                                    o.io_size);
  j["bytes_per_gpu"] = part_bytes;
  return j;
}

nlohmann::json memcpy_ceiling() {
  const std::size_t bytes = 1ull << 30;
  bam::pinned_buffer<std::uint8_t> h(bytes);
  bam::device_buffer<std::uint8_t> d(bytes);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    BAM_CUDA_TRY(cudaMemcpy(d.get(), h.get(), bytes, cudaMemcpyHostToDevice));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return {{"what", "cudaMemcpy pinned host to GPU, 1 GiB"}, {"GB_per_s", bytes / best / 1e9}};
}

nlohmann::json host_json(const char* what, const bench::host_result& r, std::uint32_t io) {
  nlohmann::json j{{"what", what}, {"ran", r.ran}, {"io_bytes", io}};
  if (!r.ran)
    j["skipped"] = r.why_not;
  else {
    j["ops_per_s"] = r.ops_per_s;
    j["GB_per_s"] = r.gb_per_s;
    j["ops"] = r.ops;
    j["bad_words"] = r.bad;
    if (!r.why_not.empty()) j["note"] = r.why_not;
  }
  return j;
}

void print_row(const nlohmann::json& j) {
  const double lat50 = j.contains("latency_us") ? j["latency_us"]["p50"].get<double>() : 0;
  const double lat99 = j.contains("latency_us") ? j["latency_us"]["p99"].get<double>() : 0;
  const double lat999 = j.contains("latency_us") ? j["latency_us"]["p999"].get<double>() : 0;
  std::string hit = j.contains("hit_rate")
                        ? std::to_string(static_cast<int>(std::lround(j["hit_rate"].get<double>() * 100))) + "%"
                        : "-";
  std::string name = j["device"].get<std::string>();
  if (j.contains("gpus")) name += " x" + std::to_string(j["gpus"].get<int>()) + " GPU";
  if (j.contains("cache") && j["cache"].get<std::string>().rfind("one cache", 0) == 0) name += " node cache";
  std::printf("%-44s %-7s %-5s %7u %8llu %9.2f %8.2f %5s %8.1f %8.1f %8.1f\n", name.c_str(),
              j["mode"].get<std::string>().c_str(), j["op"].get<std::string>().c_str(), j["io_bytes"].get<unsigned>(),
              static_cast<unsigned long long>(j["threads"].get<std::uint64_t>()), j["ops_per_s"].get<double>() / 1e6,
              j["GB_per_s"].get<double>(), hit.c_str(), lat50, lat99, lat999);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"bam block benchmark: GPU-initiated I/O on any transport, with ceilings from the same run"};
  options o;
  app.add_option("--device", o.devices, "device strings (default: emu-gpu:null=64G with --queues/--depth/--ssds)");
  app.add_option("--mode", o.mode, "raw | element | reader | page | span | range | gather")
      ->check(CLI::IsMember({"raw", "element", "reader", "page", "span", "range", "gather"}));
  app.add_option("--access", o.access, "random | sequential")->check(CLI::IsMember({"random", "sequential"}));
  app.add_option("--op", o.op, "read | write | mix")->check(CLI::IsMember({"read", "write", "mix"}));
  app.add_option("--read-percent", o.read_percent, "reads in a mix")->check(CLI::Range(0u, 100u));
  app.add_option("--io-size", o.io_size, "bytes per command (raw) or page size (array modes)")
      ->check(CLI::Range(512u, 1u << 20));
  app.add_option("--threads", o.threads, "GPU threads")->check(CLI::Range(32ull, 1ull << 26));
  app.add_option("--block-threads", o.block_threads, "threads per block")->check(CLI::Range(32u, 1024u));
  app.add_option("--queues", o.queues, "I/O queue pairs per controller (default device)");
  app.add_option("--depth", o.depth, "entries per queue (default device)");
  app.add_option("--ssds", o.ssds, "controllers (default device)");
  app.add_option("--cache-mib", o.cache_mib, "page cache size (array modes)");
  app.add_option("--working-set-mib", o.working_set_mib, "bytes the array accesses range over (array modes; 0: all)");
  app.add_option("--seconds", o.seconds, "target time of one repetition");
  app.add_option("--reps", o.reps, "timed repetitions (the median is reported)")->check(CLI::Range(1, 100));
  app.add_flag("--compare", o.compare, "also measure the ceilings and baselines (same sizes, same run)");
  app.add_flag("!--no-verify", o.verify, "do not check the data read");
  app.add_flag(
      "--verify-all", o.verify_all,
      "range mode: check every word copied (default: the first word of every 512 bytes, as raw mode and the ceilings)");
  app.add_option("--json", o.json, "write the results here as JSON");
  app.add_option("--commit", o.commit, "commit id recorded in the JSON (default: $BAM_COMMIT)");
  app.add_option("--file", o.file, "file for the pread and KvikIO baselines");
  app.add_option("--file-mib", o.file_mib, "size of that file");
  app.add_option("--host-threads", o.host_threads, "threads of the pread baseline");
  app.add_flag("--quiet", o.quiet, "no progress line");
  app.add_option("--gpus", o.gpus,
                 "run each device on GPUs 0..N-1 at once, a storage and cache each (a list, e.g. 1,2: one run per "
                 "count; shm= media: one copy of the data for all)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_flag("--node-cache", o.node_cache,
               "with --gpus N (N >= 2): one page cache spread over the N GPUs (--cache-mib on each; one copy of a "
               "page for all, read over NVLink by the others) instead of a cache per GPU");
  app.add_flag("--host-ceiling", o.host_ceiling,
               "with --gpus: after each GPU count, the zero-copy random gather from pinned host memory on as many GPUs "
               "at once (the ceiling of a medium in host memory), and each run's ratio to it");
  app.add_flag("--spread-ceiling", o.spread_ceiling,
               "with --gpus N (N >= 2): after each count, the random gather from GPU memory spread over the N GPUs "
               "(every GPU reading every part: a spread cache's hits) and from the next GPU's memory alone (remote "
               "hits), on the N GPUs at once, and each run's ratio to them");
  app.add_flag("--processes", o.processes,
               "with --gpus: one process per GPU (torchrun's layout) instead of one thread; with --node-cache they "
               "share one page cache (page_cache_config::group)");
  app.add_option("--child-rank", o.child_rank)->group("");
  app.add_option("--child-of", o.child_of)->group("");
  app.add_option("--child-sync-fd", o.child_sync_fd)->group("");
  app.add_option("--child-device", o.child_device)->group("");
  app.add_option("--child-out", o.child_out)->group("");
  app.add_option("--child-group", o.child_group)->group("");
  CLI11_PARSE(app, argc, argv);
  if (o.child_rank > 0) return run_child(o);
  for (int i = 0; i < argc; ++i)
    program_args.emplace_back(argv[i]);
  if (o.commit.empty()) o.commit = std::getenv("BAM_COMMIT") ? std::getenv("BAM_COMMIT") : "unknown";
  if (o.devices.empty())
    o.devices = {"emu-gpu:null=64G,queues=" + std::to_string(o.queues) + ",depth=" + std::to_string(o.depth) +
                 ",ssds=" + std::to_string(o.ssds)};
  try {
    nlohmann::json out;
    int driver = 0;
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    out["benchmark"] = "block_bench";
    out["gpu"] = gpu_name(&driver);
    if (!o.gpus.empty()) {
      int count = 0;
      BAM_CUDA_TRY(cudaGetDeviceCount(&count));
      out["gpu_count"] = count;
      nlohmann::json models = nlohmann::json::array();
      for (int d = 0; d < count; ++d)
        models.push_back(gpu_name(&driver, d));
      out["gpu_models"] = models;
    }
    out["driver"] = driver;
    out["cuda_runtime"] = CUDART_VERSION;
    out["machine"] = host;
    out["commit"] = o.commit;
    const std::time_t now = std::time(nullptr);
    char date[64];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    out["date"] = date;
    std::printf("%-44s %-7s %-5s %7s %8s %9s %8s %5s %8s %8s %8s\n", "device", "mode", "op", "bytes", "threads",
                "Mops/s", "GB/s", "hit", "p50 us", "p99 us", "p99.9us");
    for (const auto& d : o.devices) {
      if (o.gpus.empty()) {
        const run_result r = run_device(o, d);
        print_row(r.j);
        out["results"].push_back(r.j);
        continue;
      }
      std::optional<nlohmann::json> one_gpu;
      for (const int n : o.gpus) {
        run_result r = run_device_on_gpus(o, d, n);
        if (o.host_ceiling && o.mode != "gather") { // gather's figures count rows, not bytes moved
          const nlohmann::json c = host_gather_on_gpus(o, n);
          r.j["host_ceiling"] = c;
          r.j["ratio_to_host_ceiling"] = r.j["GB_per_s"].get<double>() / c["GB_per_s"].get<double>();
          std::printf("  ceiling, same run: %s: %.2f GB/s (this run: %.2f of it)\n",
                      c["what"].get<std::string>().c_str(), c["GB_per_s"].get<double>(),
                      r.j["ratio_to_host_ceiling"].get<double>());
        }
        if (o.spread_ceiling && n > 1 && o.mode != "gather") {
          for (const bool peer : {false, true}) {
            const nlohmann::json c = spread_gather_on_gpus(o, n, peer);
            const char* key = peer ? "peer_ceiling" : "spread_ceiling";
            const std::string ratio = std::string("ratio_to_") + key;
            r.j[key] = c;
            r.j[ratio] = r.j["GB_per_s"].get<double>() / c["GB_per_s"].get<double>();
            std::printf("  ceiling, same run: %s: %.2f GB/s (this run: %.2f of it)\n",
                        c["what"].get<std::string>().c_str(), c["GB_per_s"].get<double>(), r.j[ratio].get<double>());
            if (c["bad_words"].get<unsigned long long>() != 0)
              throw std::runtime_error("the spread-memory gather read wrong words");
          }
        }
        if (n == 1) one_gpu = r.j;
        if (n > 1 && one_gpu) {
          // Against n independent GPUs at the one-GPU rate (1.0: perfect scaling).
          r.j["scaling_vs_one_gpu"] = r.j["ops_per_s"].get<double>() / (n * (*one_gpu)["ops_per_s"].get<double>());
          if (r.j.contains("misses_per_s") && (*one_gpu)["misses_per_s"].get<double>() > 0)
            r.j["miss_scaling_vs_one_gpu"] =
                r.j["misses_per_s"].get<double>() / (n * (*one_gpu)["misses_per_s"].get<double>());
        }
        print_row(r.j);
        if (n > 1) {
          for (const auto& x : r.j["per_gpu"])
            std::printf("  GPU %d (%s): %9.2f Mops/s %8.2f GB/s\n", x["cuda_device"].get<int>(),
                        x["gpu"].get<std::string>().c_str(), x["ops_per_s"].get<double>() / 1e6,
                        x["GB_per_s"].get<double>());
          if (r.j.contains("scaling_vs_one_gpu"))
            std::printf("  %d GPUs: %.2f x %d x one GPU\n", n, r.j["scaling_vs_one_gpu"].get<double>(), n);
        }
        out["results"].push_back(r.j);
      }
    }
    if (o.compare) {
      const std::uint64_t gather_bytes = std::max<std::uint64_t>(4ull << 30, std::uint64_t{o.io_size} * 1024);
      nlohmann::json c;
      c.push_back(gather_ceiling(o, true, gather_bytes));
      c.push_back(gather_ceiling(o, false, gather_bytes));
      c.push_back(memcpy_ceiling());
      const std::uint64_t file_bytes = std::uint64_t{o.file_mib} << 20;
      const std::string why = bench::prepare_file(o.file, file_bytes);
      const std::uint64_t host_ops = 200'000;
      if (!why.empty()) {
        bench::host_result skip;
        skip.why_not = why;
        c.push_back(host_json("POSIX pread (thread pool) + cudaMemcpy", skip, o.io_size));
        c.push_back(host_json("KvikIO pread into GPU memory", skip, o.io_size));
      } else {
        c.push_back(host_json("POSIX pread (thread pool) + cudaMemcpy",
                              bench::pread_baseline(o.file, file_bytes, o.io_size, o.host_threads, host_ops),
                              o.io_size));
        c.push_back(host_json("KvikIO pread into GPU memory",
                              bench::kvikio_baseline(o.file, file_bytes, o.io_size, o.host_threads, 128, host_ops),
                              o.io_size));
      }
      out["ceilings"] = c;
      std::printf("\nceilings and baselines, same run (%u-byte units):\n", o.io_size);
      for (const auto& x : c) {
        if (x.contains("skipped"))
          std::printf("  %-56s skipped: %s\n", x["what"].get<std::string>().c_str(),
                      x["skipped"].get<std::string>().c_str());
        else if (x.contains("ops_per_s"))
          std::printf("  %-56s %9.2f Mops/s %8.2f GB/s\n", x["what"].get<std::string>().c_str(),
                      x["ops_per_s"].get<double>() / 1e6, x["GB_per_s"].get<double>());
        else
          std::printf("  %-56s %27.2f GB/s\n", x["what"].get<std::string>().c_str(), x["GB_per_s"].get<double>());
      }
    }
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << out.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
