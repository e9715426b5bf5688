// SPDX-License-Identifier: MIT
// bam-gnn aggregate: GraphSAGE-style mini-batches on the GPU over a dataset's
// CSR, with the feature rows read from storage through bam's page cache.
//
// Per mini-batch:
//   1. sampling: `--batch-size` seed nodes drawn uniformly; hop l samples
//      fanout[l] neighbours of every node of hop l's set (all of them when
//      the degree is at most the fanout, else uniformly with replacement);
//      hop l + 1's set is hop l's nodes and their samples, sorted and
//      de-duplicated with CUB (DeviceRadixSort + DeviceSelect::Unique);
//   2. gathering: the feature row of every node of the last hop's set (it
//      holds every other hop's) through `bam::gather_rows`;
//   3. aggregation: from the last hop inwards, each node's representation
//      is the mean of its own and the mean of its sampled neighbours'.
// The gathered rows of the first batches are compared with the generator
// (or the feature file); a difference ends the run with exit status 1.
// `--compare` gathers the same batches' rows by other paths (CPU threads,
// GPU zero-copy, mmap, GPU memory) for the comparison table.
#include "gnn_aggregate.hpp"

#include <bam/bam.cuh>
#include <bam/runtime/row_gather.cuh>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <cuda_fp16.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bam::gnn {

namespace {

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

constexpr std::uint32_t no_pos = ~std::uint32_t{0};
constexpr unsigned block_threads = 256;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

unsigned grid_for(std::uint64_t threads) {
  return static_cast<unsigned>(
      std::clamp<std::uint64_t>((threads + block_threads - 1) / block_threads, 1, 1u << 20));
}

// ---- kernels ------------------------------------------------------------------

__global__ void seeds_kernel(std::uint64_t* out, std::uint64_t count, std::uint64_t nodes,
                             std::uint64_t seed, std::uint64_t batch) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    out[i] = mix64(mix64(seed ^ (batch * 0x9e3779b97f4a7c15ull)) + i) % nodes;
}

//! Samples `fanout` neighbours of each of `count` nodes: `sampled[i * fanout + k]`
//! (or no_node), and the candidates of the next hop's set: the nodes
//! themselves, then their samples (a node itself where a slot has none,
//! which the de-duplication removes).
__global__ void sample_kernel(const std::uint64_t* frontier, std::uint64_t count,
                              const std::int64_t* indptr, const std::int32_t* indices,
                              std::uint32_t fanout, std::uint64_t seed, std::uint64_t batch,
                              std::uint32_t hop, std::uint64_t* sampled, std::uint64_t* cand) {
  const std::uint64_t total = count * fanout;
  for (std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       t < total; t += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t i = t / fanout, k = t % fanout;
    const std::uint64_t u = frontier[i];
    const std::int64_t begin = indptr[u];
    const std::uint64_t deg = static_cast<std::uint64_t>(indptr[u + 1] - begin);
    std::uint64_t v = no_node;
    if (deg != 0 && deg <= fanout) {
      if (k < deg) v = static_cast<std::uint64_t>(indices[begin + static_cast<std::int64_t>(k)]);
    } else if (deg > fanout) {
      const std::uint64_t h = mix64(mix64(seed ^ (batch << 8) ^ hop) + u * 0x100000001b3ull + k);
      v = static_cast<std::uint64_t>(indices[begin + static_cast<std::int64_t>(h % deg)]);
    }
    sampled[t] = v;
    cand[count + t] = v == no_node ? u : v;
    if (k == 0) cand[i] = u;
  }
}

__device__ std::uint32_t position_of(const std::uint64_t* sorted, std::uint64_t n,
                                     std::uint64_t v) {
  std::uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::uint64_t mid = (lo + hi) / 2;
    if (sorted[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && sorted[lo] == v ? static_cast<std::uint32_t>(lo) : no_pos;
}

//! Where each node of hop l (`self`) and each of its samples sits in hop
//! l + 1's sorted set.
__global__ void positions_kernel(const std::uint64_t* nodes, std::uint64_t count,
                                 const std::uint64_t* sampled, std::uint32_t fanout,
                                 const std::uint64_t* next, std::uint64_t next_count,
                                 std::uint32_t* self_pos, std::uint32_t* sample_pos) {
  const std::uint64_t total = count * (1ull + fanout);
  for (std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       t < total; t += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    if (t < count) {
      self_pos[t] = position_of(next, next_count, nodes[t]);
    } else {
      const std::uint64_t s = sampled[t - count];
      sample_pos[t - count] = s == no_node ? no_pos : position_of(next, next_count, s);
    }
  }
}

__device__ inline float as_float(float v) { return v; }
__device__ inline float as_float(std::uint16_t v) { return __half2float(__ushort_as_half(v)); }

//! One warp per node of hop l: out = (own + mean of sampled neighbours) / 2,
//! over the representations `in` of hop l + 1's nodes.
template <class In>
__global__ void mean_kernel(const In* in, std::uint32_t dim, std::uint64_t count,
                            std::uint32_t fanout, const std::uint32_t* self_pos,
                            const std::uint32_t* sample_pos, float* out,
                            unsigned long long* missing) {
  const std::uint64_t warp =
      (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::uint64_t i = warp; i < count; i += warps) {
    const std::uint32_t self = self_pos[i];
    if (self == no_pos) {
      if (lane == 0)
        atomicAdd(missing, 1ull); // a node missing from the next hop's set: a sampling bug
      continue;
    }
    unsigned n = 0;
    for (std::uint32_t k = 0; k < fanout; ++k)
      n += sample_pos[i * fanout + k] != no_pos;
    const float inv = n ? 1.0f / static_cast<float>(n) : 0.0f;
    for (std::uint32_t c = lane; c < dim; c += 32) {
      float sum = 0;
      for (std::uint32_t k = 0; k < fanout; ++k) {
        const std::uint32_t p = sample_pos[i * fanout + k];
        if (p != no_pos) sum += as_float(in[std::uint64_t{p} * dim + c]);
      }
      out[i * dim + c] = 0.5f * (as_float(in[std::uint64_t{self} * dim + c]) + sum * inv);
    }
  }
}

//! One warp per row: rows `ids` of a table in GPU-reachable memory (GPU
//! memory, or pinned host memory read over PCIe) into `out`.
__global__ void table_gather_kernel(const unsigned char* table, std::uint64_t row_bytes,
                                    const std::uint64_t* ids, std::uint64_t count,
                                    unsigned char* out) {
  const std::uint64_t warp =
      (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::uint64_t r = warp; r < count; r += warps) {
    const unsigned char* src = table + ids[r] * row_bytes;
    unsigned char* dst = out + r * row_bytes;
    if (row_bytes % 16 == 0) {
      const auto* s = reinterpret_cast<const uint4*>(src);
      auto* d = reinterpret_cast<uint4*>(dst);
      for (std::uint64_t k = lane; k < row_bytes / 16; k += 32)
        d[k] = __ldcg(s + k);
    } else if (row_bytes % 4 == 0) {
      const auto* s = reinterpret_cast<const unsigned*>(src);
      auto* d = reinterpret_cast<unsigned*>(dst);
      for (std::uint64_t k = lane; k < row_bytes / 4; k += 32)
        d[k] = __ldcg(s + k);
    } else {
      for (std::uint64_t k = lane; k < row_bytes; k += 32)
        dst[k] = src[k];
    }
  }
}

// ---- host helpers -------------------------------------------------------------

struct cuda_event {
  cudaEvent_t e{};
  cuda_event() { BAM_CUDA_TRY(cudaEventCreate(&e)); }
  ~cuda_event() { BAM_CUDA_LOG(cudaEventDestroy(e)); }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
};

struct cuda_stream {
  cudaStream_t s{};
  cuda_stream() { BAM_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~cuda_stream() { BAM_CUDA_LOG(cudaStreamDestroy(s)); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
};

double elapsed_s(const cuda_event& a, const cuda_event& b) {
  float ms = 0;
  BAM_CUDA_TRY(cudaEventElapsedTime(&ms, a.e, b.e));
  return ms / 1000.0;
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

std::uint64_t available_host_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

struct path_result {
  std::string path;
  std::string what;
  bool ran = false;
  std::string why_not;
  double seconds = 0;
  std::uint64_t rows = 0, bytes = 0;
  bool verified = false;
  double nodes_per_s() const { return seconds > 0 ? static_cast<double>(rows) / seconds : 0; }
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

//! The fastest of the baselines a user has without bam (CPU threads,
//! zero-copy, mmap); features resident in GPU memory are the upper bound,
//! not a baseline.
double best_baseline(const std::vector<path_result>& paths) {
  double best = 0;
  for (const auto& r : paths)
    if (r.ran && r.path != "gpu-memory") best = std::max(best, r.nodes_per_s());
  return best;
}

//! First differing row of `got` against `want` (rows of `rb`), or -1.
std::int64_t first_wrong_row(const unsigned char* got, const unsigned char* want,
                             std::uint64_t rows, std::uint64_t rb) {
  for (std::uint64_t r = 0; r < rows; ++r)
    if (std::memcmp(got + r * rb, want + r * rb, rb) != 0) return static_cast<std::int64_t>(r);
  return -1;
}

//! The run, for element type T (float for float32 features, raw 16-bit halves for float16).
template <class T>
int run_typed(const aggregate_options& o, const manifest& m) {
  const std::filesystem::path dir(o.dir);
  const std::vector<std::uint32_t> fanouts = parse_fanouts(o.fanouts);
  const std::uint32_t hops = static_cast<std::uint32_t>(fanouts.size());
  const std::uint32_t dim = m.features.dim;
  const std::uint64_t rb = m.features.row_bytes();
  const std::uint64_t table_bytes = m.nodes * rb;
  const bool text = !o.json_stdout;
  thread_pool pool(detail::thread_count(o.host_threads));

  // ---- the graph onto the GPU
  const std::vector<std::int64_t> indptr = detail::read_int_npy((dir / m.indptr_file).string());
  const std::string ipath = (dir / m.indices_file).string();
  const npy_header ih = npy_read_header(ipath);
  if (ih.dtype != "<i4")
    detail::gnn_fail(ipath + ": dtype " + ih.dtype + ", the dataset format stores int32");
  std::vector<std::int32_t> indices(ih.elements());
  npy_read(ipath, ih, 0, indices.size(), indices.data());
  check_csr(indptr, indices, m.nodes);
  device_buffer<std::int64_t> d_indptr(indptr.size());
  device_buffer<std::int32_t> d_indices(std::max<std::size_t>(indices.size(), 1));
  copy_to_device(d_indptr.get(), indptr.data(), indptr.size());
  copy_to_device(d_indices.get(), indices.data(), indices.size());

  // ---- where the features are read from
  std::string dev = o.device;
  const table_source src(dir, m);
  if (dev.empty()) {
    if (m.device)
      dev = m.device->device;
    else {
      const std::uint64_t mib = (table_bytes + (2ull << 20) - 1) >> 20;
      dev = "emu-gpu:ram=" + std::to_string(mib) + "M";
    }
  }
  // `--device file`: the dataset's own feature file, read through bam: from
  // its blocks on the raw disk where that disk opens here, else by the CPU
  // engine from the file (array::open's choice).
  const bool from_file = dev == "file";
  std::string file_reason;
  if (from_file) {
    if (src.path().empty())
      detail::gnn_fail(o.dir + ": --device file reads the features from their file, and this dataset has none "
                               "(made with --no-features-file): bam-gnn load it onto a device",
                       ENOENT);
    const file_access fa = plan_file_access(src.path());
    if (fa.kind == file_access::path::via_file) warn(src.path() + ": " + fa.reason);
    dev = fa.device + ",queues=32,threads=8";
    file_reason = fa.reason;
  }
  const device_spec spec = parse_device(dev);
  if (spec.kind != device_kind::pci && spec.media == media_kind::null)
    detail::gnn_fail(dev + ": null media keep no data; the features need a medium that holds them "
                           "(emu-gpu:ram=SIZE, emu-gpu:hbm=SIZE, emu:file=..., a loaded device)");
  const bool in_process = spec.kind != device_kind::pci &&
                          (spec.media == media_kind::ram || spec.media == media_kind::hbm);
  std::uint64_t start_lba = 0;
  storage s(spec);
  std::string placement;
  double load_seconds = 0;
  if (from_file) {
    if (m.features.file_offset % s.lba_size() != 0)
      detail::gnn_fail(src.path() + ": the rows start at byte " + std::to_string(m.features.file_offset) +
                           ", not on a " + std::to_string(s.lba_size()) +
                           "-byte block boundary, so bam cannot address them in place: bam-gnn load the "
                           "table onto a device, or use an in-process medium (--device emu-gpu:ram=SIZE)",
                       EINVAL);
    start_lba = m.features.file_offset / s.lba_size();
    placement = "the dataset's feature file " + src.path() + ": " + file_reason;
  } else if (!in_process) {
    if (!m.device || m.device->device != dev)
      detail::gnn_fail(o.dir + ": its features were not loaded onto " + dev +
                           (m.device ? " (the manifest names " + m.device->device + ")"
                                     : " (the manifest names no device)") +
                           ": run bam-gnn load " + o.dir + " " + dev +
                           ", or read them from an in-process medium (--device emu-gpu:ram=SIZE or "
                           "emu-gpu:hbm=SIZE)",
                       ENOENT);
    if (m.device->offset % s.lba_size() != 0)
      detail::gnn_fail(dev + ": the features start at byte " + std::to_string(m.device->offset) +
                       ", not on an LBA boundary of " + std::to_string(s.lba_size()) + " bytes");
    start_lba = m.device->offset / s.lba_size();
  }
  // The array is attached first: a table that does not fit the storage is refused here.
  page_cache cache(
      {.page_size = o.page_size, .capacity = static_cast<std::size_t>(o.cache_mib) << 20});
  array<T> feats(cache, s, m.nodes * dim, start_lba);
  if (in_process) {
    if (table_bytes > s.blocks_per_controller() * s.lba_size() * s.controller_count())
      detail::gnn_fail(
          dev + ": the feature table (" + std::to_string(table_bytes) +
          " bytes) does not fit its " +
          std::to_string(s.blocks_per_controller() * s.lba_size() * s.controller_count()) +
          " bytes");
    if (text)
      std::printf("loading the feature table (%.2f GiB, %s) into %s before timing...\n",
                  static_cast<double>(table_bytes) / (1ull << 30),
                  src.path().empty() ? "generated" : src.path().c_str(), dev.c_str());
    std::fflush(stdout);
    const auto t0 = clock_type::now();
    load_striped(src, table_bytes, o.page_size, s.controller_count(), 0, pool,
                 [&](std::uint32_t c, std::uint64_t off, const void* p, std::size_t len) {
                   s.write_media(c, off, p, len);
                 });
    load_seconds = seconds_since(t0);
    placement = "loaded into the in-process medium before timing";
  } else if (!from_file) {
    if (m.device->nsid != s.nsid())
      detail::gnn_fail(dev + ": the features are on namespace " + std::to_string(m.device->nsid) +
                       ", the storage opens namespace " + std::to_string(s.nsid()));
    if (s.controller_count() != 1)
      detail::gnn_fail(dev + ": names " + std::to_string(s.controller_count()) +
                       " controllers; bam-gnn load writes the table onto one");
    placement = "on the device at byte " + std::to_string(m.device->offset) + " (manifest)";
  }

  // ---- the hot set: the rows of the highest in-degree, in pinned host memory
  std::optional<hot_rows<T>> hot;
  std::vector<bool> is_hot;
  double hot_seconds = 0;
  if (o.hot_percent > 0) {
    const auto t0 = clock_type::now();
    const auto k = static_cast<std::uint64_t>(static_cast<double>(m.nodes) * o.hot_percent / 100.0 + 0.5);
    const std::vector<std::uint64_t> hot_ids = hottest_nodes(indices, m.nodes, k);
    hot.emplace(feats, dim, hot_ids);
    is_hot.assign(m.nodes, false);
    for (const std::uint64_t id : hot_ids)
      is_hot[id] = true;
    hot_seconds = seconds_since(t0);
    if (text)
      std::printf("hot set: %llu rows (%.1f MiB of pinned host memory, the highest in-degree), read through the "
                  "cache into host memory in %.2f s\n",
                  static_cast<unsigned long long>(hot->size()), static_cast<double>(hot->bytes()) / (1 << 20),
                  hot_seconds);
  }

  // ---- buffers, one set per mini-batch in flight, each sized for the
  // largest batch the fanouts allow
  const std::vector<std::uint64_t> cap = hop_capacities(m.nodes, o.batch_size, fanouts);
  std::uint64_t cand_cap = o.batch_size;
  for (std::uint32_t l = 0; l < hops; ++l)
    cand_cap = std::max<std::uint64_t>(cand_cap, cap[l] * (1ull + fanouts[l]));
  {
    std::size_t free_b = 0, total_b = 0;
    BAM_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    std::uint64_t need = cap[hops] * rb + 2 * cand_cap * 8;
    for (std::uint32_t l = 0; l < hops; ++l)
      need += cap[l] * (8 + 4ull * dim + 12ull * fanouts[l] + 4);
    need *= o.in_flight;
    if (need > free_b)
      detail::gnn_fail("a batch of " + std::to_string(o.batch_size) + " seeds with fanouts " + o.fanouts + ", " +
                           std::to_string(o.in_flight) + " in flight, may need " + std::to_string(need >> 20) +
                           " MiB of GPU memory, " + std::to_string(free_b >> 20) +
                           " MiB are free: lower --batch-size, --in-flight or the fanouts",
                       ENOMEM);
  }
  int end_bit = 1;
  while (end_bit < 64 && (1ull << end_bit) <= m.nodes)
    ++end_bit;
  std::size_t sort_bytes = 0, unique_bytes = 0;
  {
    device_buffer<std::uint64_t> probe(1);
    BAM_CUDA_TRY(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, probe.get(), probe.get(),
                                                static_cast<std::int64_t>(cand_cap), 0, end_bit));
    BAM_CUDA_TRY(cub::DeviceSelect::Unique(nullptr, unique_bytes, probe.get(), probe.get(),
                                           reinterpret_cast<unsigned long long*>(probe.get()),
                                           static_cast<std::int64_t>(cand_cap)));
  }
  //! What one mini-batch in flight owns: its stream, its buffers, its
  //! events and its look-ahead holds.
  struct batch_slot {
    std::vector<device_buffer<std::uint64_t>> nodes, sampled;
    std::vector<device_buffer<std::uint32_t>> self_pos, sample_pos;
    std::vector<device_buffer<float>> h;
    device_buffer<std::uint64_t> cand, sorted;
    device_buffer<T> rows;
    device_buffer<unsigned long long> count_dev{1};
    pinned_buffer<unsigned long long> count_host{1}, held_host{1};
    device_buffer<unsigned char> temp;
    std::vector<std::uint64_t> count;
    cuda_stream stream;
    cuda_event start, sampled_ev, gathered, aggregated;
    std::unique_ptr<row_holds<T>> holds;
    std::uint64_t batch = 0;
  };
  std::vector<std::unique_ptr<batch_slot>> slots;
  for (unsigned k = 0; k < o.in_flight; ++k) {
    auto sl = std::make_unique<batch_slot>();
    for (std::uint32_t l = 0; l <= hops; ++l)
      sl->nodes.emplace_back(cap[l]);
    for (std::uint32_t l = 0; l < hops; ++l) {
      sl->sampled.emplace_back(cap[l] * fanouts[l]);
      sl->self_pos.emplace_back(cap[l]);
      sl->sample_pos.emplace_back(cap[l] * fanouts[l]);
      sl->h.emplace_back(cap[l] * dim);
    }
    sl->cand = device_buffer<std::uint64_t>(cand_cap);
    sl->sorted = device_buffer<std::uint64_t>(cand_cap);
    sl->rows = device_buffer<T>(cap[hops] * dim);
    sl->temp = device_buffer<unsigned char>(std::max<std::size_t>({sort_bytes, unique_bytes, 1}));
    sl->count.assign(hops + 1, 0);
    if (o.lookahead) sl->holds = std::make_unique<row_holds<T>>(feats);
    slots.push_back(std::move(sl));
  }
  device_buffer<unsigned long long> d_missing(1);
  // The baselines and the checks run on the first slot's stream.
  const cudaStream_t stream = slots[0]->stream.s;

  //! Sorts and de-duplicates `n` candidates of `sl` into `out` on its
  //! stream; returns how many are left (waits for that stream alone).
  auto unique_into = [&](batch_slot& sl, std::uint64_t n, std::uint64_t* out) -> std::uint64_t {
    std::size_t bytes = sl.temp.size();
    BAM_CUDA_TRY(cub::DeviceRadixSort::SortKeys(sl.temp.get(), bytes, sl.cand.get(), sl.sorted.get(),
                                                static_cast<std::int64_t>(n), 0, end_bit, sl.stream.s));
    bytes = sl.temp.size();
    BAM_CUDA_TRY(cub::DeviceSelect::Unique(sl.temp.get(), bytes, sl.sorted.get(), out, sl.count_dev.get(),
                                           static_cast<std::int64_t>(n), sl.stream.s));
    BAM_CUDA_TRY(cudaMemcpyAsync(sl.count_host.get(), sl.count_dev.get(), sizeof(unsigned long long),
                                 cudaMemcpyDeviceToHost, sl.stream.s));
    BAM_CUDA_TRY(cudaStreamSynchronize(sl.stream.s));
    return *sl.count_host.get();
  };

  //! Mini-batch `b` into slot `sl`: sampling (the host waits for each hop's
  //! count), then, without waiting, the look-ahead holds, the gather
  //! through the cache and the aggregation, all on the slot's stream. The
  //! other slots' batches run meanwhile.
  auto start_batch = [&](batch_slot& sl, std::uint64_t b) {
    const cudaStream_t st = sl.stream.s;
    sl.batch = b;
    BAM_CUDA_TRY(cudaEventRecord(sl.start.e, st));
    seeds_kernel<<<grid_for(o.batch_size), block_threads, 0, st>>>(sl.cand.get(), o.batch_size, m.nodes, o.seed, b);
    BAM_CUDA_TRY(cudaGetLastError());
    sl.count[0] = unique_into(sl, o.batch_size, sl.nodes[0].get());
    for (std::uint32_t l = 0; l < hops; ++l) {
      const std::uint64_t n = sl.count[l] * fanouts[l];
      sample_kernel<<<grid_for(n), block_threads, 0, st>>>(sl.nodes[l].get(), sl.count[l], d_indptr.get(),
                                                             d_indices.get(), fanouts[l], o.seed, b, l,
                                                             sl.sampled[l].get(), sl.cand.get());
      BAM_CUDA_TRY(cudaGetLastError());
      sl.count[l + 1] = unique_into(sl, sl.count[l] + n, sl.nodes[l + 1].get());
    }
    BAM_CUDA_TRY(cudaEventRecord(sl.sampled_ev.e, st));
    const std::uint64_t* ids = sl.nodes[hops].get();
    const std::uint64_t nids = sl.count[hops];
    if (sl.holds) {
      // The pages of this batch's rows that are in the cache now stay there
      // while the batches before it (other streams) and its own gather miss.
      sl.holds->hold(ids, nids, dim, st);
      sl.holds->held_to(sl.held_host.get(), st);
    }
    if (hot)
      bam::gather_rows(feats, ids, nids, dim, sl.rows.get(), *hot, st);
    else
      bam::gather_rows(feats, ids, nids, dim, sl.rows.get(), st);
    if (sl.holds) sl.holds->release(st);
    BAM_CUDA_TRY(cudaEventRecord(sl.gathered.e, st));
    for (std::uint32_t l = hops; l-- > 0;) {
      const std::uint64_t n = sl.count[l] * (1ull + fanouts[l]);
      positions_kernel<<<grid_for(n), block_threads, 0, st>>>(sl.nodes[l].get(), sl.count[l], sl.sampled[l].get(),
                                                                fanouts[l], sl.nodes[l + 1].get(), sl.count[l + 1],
                                                                sl.self_pos[l].get(), sl.sample_pos[l].get());
      BAM_CUDA_TRY(cudaGetLastError());
      const unsigned grid = grid_for(sl.count[l] * 32);
      if (l + 1 == hops)
        mean_kernel<T><<<grid, block_threads, 0, st>>>(sl.rows.get(), dim, sl.count[l], fanouts[l],
                                                        sl.self_pos[l].get(), sl.sample_pos[l].get(), sl.h[l].get(),
                                                        d_missing.get());
      else
        mean_kernel<float><<<grid, block_threads, 0, st>>>(sl.h[l + 1].get(), dim, sl.count[l], fanouts[l],
                                                            sl.self_pos[l].get(), sl.sample_pos[l].get(),
                                                            sl.h[l].get(), d_missing.get());
      BAM_CUDA_TRY(cudaGetLastError());
    }
    BAM_CUDA_TRY(cudaEventRecord(sl.aggregated.e, st));
  };

  if (text)
    std::printf("%s: %llu nodes, %u x %s features (%llu B a row); features %s, %s\n"
                "%llu batches of %llu seeds, fanouts %s, page cache %llu MiB of %u-byte pages, %u batch(es) in "
                "flight%s\n",
                o.dir.c_str(), static_cast<unsigned long long>(m.nodes), dim, m.features.dtype.c_str(),
                static_cast<unsigned long long>(rb), dev.c_str(), placement.c_str(),
                static_cast<unsigned long long>(o.batches), static_cast<unsigned long long>(o.batch_size),
                o.fanouts.c_str(), static_cast<unsigned long long>(o.cache_mib), o.page_size, o.in_flight,
                o.lookahead ? ", look-ahead holds" : "");
  std::fflush(stdout);

  //! Batch 0's aggregation (in `sl`) against the host's, from the expected
  //! rows `want` of the last hop's nodes (throws on a difference).
  auto check_aggregation = [&](batch_slot& sl, const std::vector<unsigned char>& want) {
    const cudaStream_t st = sl.stream.s;
    std::vector<std::vector<std::uint64_t>> hn(hops + 1), hs(hops);
    for (std::uint32_t l = 0; l <= hops; ++l) {
      hn[l].resize(sl.count[l]);
      copy_to_host(hn[l].data(), sl.nodes[l].get(), sl.count[l], st);
    }
    for (std::uint32_t l = 0; l < hops; ++l) {
      hs[l].resize(sl.count[l] * fanouts[l]);
      copy_to_host(hs[l].data(), sl.sampled[l].get(), hs[l].size(), st);
    }
    std::vector<float> rows(sl.count[hops] * dim);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      T v;
      std::memcpy(&v, want.data() + k * sizeof(T), sizeof(T));
      if constexpr (sizeof(T) == 2) {
        __half_raw raw;
        raw.x = v;
        rows[k] = __half2float(__half(raw));
      } else {
        rows[k] = v;
      }
    }
    const std::vector<float> ref = mean_aggregate_reference(hn, hs, fanouts, std::move(rows), dim);
    std::vector<float> got(ref.size());
    copy_to_host(got.data(), sl.h[0].get(), got.size(), st);
    for (std::size_t k = 0; k < ref.size(); ++k)
      if (!(std::fabs(got[k] - ref[k]) <= 1e-4f * (1.0f + std::fabs(ref[k]))))
        detail::gnn_fail("batch 0: the aggregated features of seed node " + std::to_string(hn[0][k / dim]) +
                             ", column " + std::to_string(k % dim) + ", are " + std::to_string(got[k]) +
                             " on the GPU and " + std::to_string(ref[k]) + " on the host",
                         EIO);
  };

  // ---- the timed batches
  const page_cache_counters before = cache.counters(stream);
  double t_sample = 0, t_aggregate = 0, t_total = 0, first_batch = 0, t_unclocked = 0;
  std::uint64_t rows_total = 0, page_visits = 0, hot_visits = 0, verified_rows = 0, verified_batches = 0;
  std::uint64_t held_total = 0;
  std::vector<std::uint64_t> hop_nodes_total(hops + 1, 0);
  std::vector<std::vector<std::uint64_t>> batch_ids; // the rows each batch gathered (for --compare)
  std::vector<unsigned char> reference0;             // batch 0's expected rows (for --compare)
  std::vector<std::uint64_t> ids;
  // Each batch's gather as an interval from `origin` (ms): gathers of
  // batches in flight together overlap, so the gather stage's time is
  // their union.
  std::vector<std::pair<double, double>> gather_spans;
  cuda_event origin;
  BAM_CUDA_TRY(cudaEventRecord(origin.e, stream));
  auto ms_from_origin = [&](const cuda_event& e) { return 1e3 * elapsed_s(origin, e); };
  const auto progress_t0 = clock_type::now();
  int failed = 0;

  //! Waits for the batch in `sl` and takes its figures; checks its rows
  //! against the reference when asked. Returns false on a wrong row.
  auto finish_batch = [&](batch_slot& sl) -> bool {
    const cudaStream_t st = sl.stream.s;
    const std::uint64_t b = sl.batch;
    feats.check(st); // waits for the stream; a bad id or a failed read throws here
    if (b == 0) first_batch = elapsed_s(sl.start, sl.aggregated);
    t_sample += elapsed_s(sl.start, sl.sampled_ev);
    t_aggregate += elapsed_s(sl.gathered, sl.aggregated);
    gather_spans.emplace_back(ms_from_origin(sl.sampled_ev), ms_from_origin(sl.gathered));
    if (sl.holds) held_total += *sl.held_host.get();
    rows_total += sl.count[hops];
    for (std::uint32_t l = 0; l <= hops; ++l)
      hop_nodes_total[l] += sl.count[l];
    // The ids (for the hit rate, the baselines and the check).
    ids.resize(sl.count[hops]);
    copy_to_host(ids.data(), sl.nodes[hops].get(), ids.size(), st);
    for (const std::uint64_t id : ids) {
      if (hot && is_hot[id]) {
        ++hot_visits; // read from host memory: no page visited
        continue;
      }
      page_visits += row_pages(id, rb, o.page_size);
    }
    if (b < o.verify_batches || (o.compare && b == 0)) {
      // Not timed: the other batches in flight end first, and nothing runs
      // on the GPU while the host checks.
      BAM_CUDA_TRY(cudaDeviceSynchronize());
      const auto t0 = clock_type::now();
      std::vector<unsigned char> got(ids.size() * rb), want(ids.size() * rb);
      copy_to_host(reinterpret_cast<T*>(got.data()), sl.rows.get(), ids.size() * dim, st);
      reference_rows(dir, m, ids.data(), ids.size(), want.data());
      const std::int64_t bad = first_wrong_row(got.data(), want.data(), ids.size(), rb);
      if (bad >= 0) {
        std::fprintf(stderr,
                     "bam-gnn aggregate: batch %llu: the row of node %llu gathered through the "
                     "page cache differs from the %s\n",
                     static_cast<unsigned long long>(b),
                     static_cast<unsigned long long>(ids[static_cast<std::size_t>(bad)]),
                     m.features.source == "generated" ? "generator" : "feature file");
        return false;
      }
      verified_rows += ids.size();
      ++verified_batches;
      if (b == 0) check_aggregation(sl, want);
      if (b == 0) reference0 = std::move(want);
      t_unclocked += seconds_since(t0);
    }
    if (o.compare) batch_ids.push_back(ids);
    if (o.progress_every != 0 && (b + 1) % o.progress_every == 0 && b + 1 < o.batches && !o.quiet) {
      const page_cache_counters now = cache.counters(st);
      const double t = seconds_since(progress_t0) - t_unclocked;
      std::fprintf(stderr,
                   "  batch %llu/%llu: %.1f batches/s, %.2f M nodes/s, %.2f GB/s, hit rate %.1f%% "
                   "(%.0f s)\n",
                   static_cast<unsigned long long>(b + 1), static_cast<unsigned long long>(o.batches),
                   static_cast<double>(b + 1) / t, static_cast<double>(rows_total) / t / 1e6,
                   static_cast<double>(rows_total * rb) / t / 1e9,
                   page_visits ? 100.0 * (1.0 - static_cast<double>(now.misses - before.misses) /
                                                    static_cast<double>(page_visits))
                               : 0.0,
                   seconds_since(progress_t0));
    }
    return true;
  };

  // Batch b goes into slot b % in_flight once the batch there before it
  // (b - in_flight) is finished.
  const auto loop_t0 = clock_type::now();
  for (std::uint64_t b = 0; b < o.batches + o.in_flight && failed == 0; ++b) {
    batch_slot& sl = *slots[b % o.in_flight];
    if (b >= o.in_flight && !finish_batch(sl)) failed = 1;
    if (b < o.batches && failed == 0) start_batch(sl, b);
  }
  if (failed != 0) {
    BAM_CUDA_LOG(cudaDeviceSynchronize());
    return 1;
  }
  t_total = seconds_since(loop_t0) - t_unclocked;
  const double t_gather = interval_union_ms(gather_spans) / 1e3;
  unsigned long long missing = 0;
  copy_to_host(&missing, d_missing.get(), 1, stream);
  if (missing != 0) {
    std::fprintf(stderr,
                 "bam-gnn aggregate: %llu sampled nodes were missing from the next hop's set\n",
                 missing);
    return 1;
  }
  const page_cache_counters after = cache.counters(stream);
  const std::uint64_t misses = after.misses - before.misses;
  const double hit_rate =
      page_visits ? 1.0 - static_cast<double>(misses) / static_cast<double>(page_visits) : 0.0;
  const double nb = static_cast<double>(o.batches);

  path_result bam_path;
  bam_path.path = "bam";
  bam_path.what = "bam::gather_rows through the page cache (" + dev + ")";
  if (hot)
    bam_path.what += " + a hot set of " + std::to_string(hot->size()) + " rows in pinned host memory";
  bam_path.ran = true;
  bam_path.seconds = t_gather;
  bam_path.rows = rows_total;
  bam_path.bytes = rows_total * rb;
  bam_path.verified = verified_rows != 0;

  if (text) {
    std::printf("\n%llu mini-batches in %.3f s: %.2f batches/s, %.3f M sampled (unique) nodes/s, "
                "features %.2f GB/s "
                "(gather stage: %.2f GB/s)\n",
                static_cast<unsigned long long>(o.batches), t_total, nb / t_total,
                static_cast<double>(rows_total) / t_total / 1e6,
                static_cast<double>(rows_total * rb) / t_total / 1e9, bam_path.gb_per_s());
    std::printf("per batch: sampling %.3f ms, gathering %.3f ms, aggregation %.3f ms (first batch "
                "%.3f ms in all)%s\n",
                1e3 * t_sample / nb, 1e3 * t_gather / nb, 1e3 * t_aggregate / nb, 1e3 * first_batch,
                o.in_flight > 1 ? "; the stages of batches in flight overlap: gathering is the time any gather ran"
                                : "");
    if (o.lookahead)
      std::printf("look-ahead holds: %.0f pages per batch held before its gather (%.1f%% of its page visits)\n",
                  static_cast<double>(held_total) / nb,
                  page_visits ? 100.0 * static_cast<double>(held_total) / static_cast<double>(page_visits) : 0.0);
    std::printf("unique nodes per batch by hop:");
    for (std::uint32_t l = 0; l <= hops; ++l)
      std::printf(" %.0f", static_cast<double>(hop_nodes_total[l]) / nb);
    std::printf("\npage cache: hit rate %.1f%% (%llu pages loaded for %llu page visits)\n",
                100 * hit_rate, static_cast<unsigned long long>(misses),
                static_cast<unsigned long long>(page_visits));
    if (hot)
      std::printf("hot set: %.1f%% of the rows gathered came from host memory (%llu of %llu)\n",
                  rows_total ? 100.0 * static_cast<double>(hot_visits) / static_cast<double>(rows_total) : 0.0,
                  static_cast<unsigned long long>(hot_visits), static_cast<unsigned long long>(rows_total));
    if (verified_rows != 0)
      std::printf("verified: the %llu rows gathered in the first %llu batch(es) equal the %s\n",
                  static_cast<unsigned long long>(verified_rows),
                  static_cast<unsigned long long>(verified_batches),
                  m.features.source == "generated" ? "generator" : "feature file");
    else
      std::printf("not verified (--verify-batches 0)\n");
  }

  // ---- baselines on the same batches and ids
  std::vector<path_result> baselines;
  if (o.compare) {
    pinned_buffer<unsigned char> staging(cap[hops] * rb);
    device_buffer<unsigned char> d_out(cap[hops] * rb);
    device_buffer<std::uint64_t> d_ids(cap[hops]);
    auto check_first = [&](path_result& r) {
      std::vector<unsigned char> got(batch_ids[0].size() * rb);
      copy_to_host(got.data(), d_out.get(), got.size(), stream);
      const std::int64_t bad =
          first_wrong_row(got.data(), reference0.data(), batch_ids[0].size(), rb);
      if (bad >= 0)
        detail::gnn_fail(
            r.what + ": batch 0 row " + std::to_string(bad) + " differs from the reference", EIO);
      r.verified = true;
    };
    auto gpu_table_path = [&](path_result& r, const unsigned char* table) {
      cuda_event a, z;
      for (std::size_t b = 0; b < batch_ids.size(); ++b) {
        const auto& bi = batch_ids[b];
        copy_to_device(d_ids.get(), bi.data(), bi.size(), stream);
        BAM_CUDA_TRY(cudaEventRecord(a.e, stream));
        table_gather_kernel<<<grid_for(bi.size() * 32), block_threads, 0, stream>>>(
            table, rb, d_ids.get(), bi.size(), d_out.get());
        BAM_CUDA_TRY(cudaGetLastError());
        BAM_CUDA_TRY(cudaEventRecord(z.e, stream));
        BAM_CUDA_TRY(cudaStreamSynchronize(stream));
        r.seconds += elapsed_s(a, z);
        r.rows += bi.size();
        if (b == 0) check_first(r);
      }
      r.bytes = r.rows * rb;
      r.ran = true;
    };
    auto cpu_path = [&](path_result& r, const unsigned char* table) {
      for (std::size_t b = 0; b < batch_ids.size(); ++b) {
        const auto& bi = batch_ids[b];
        const auto t0 = clock_type::now();
        cpu_gather_rows(pool, table, m.nodes, rb, bi.data(), bi.size(), staging.get());
        BAM_CUDA_TRY(cudaMemcpyAsync(d_out.get(), staging.get(), bi.size() * rb,
                                     cudaMemcpyHostToDevice, stream));
        BAM_CUDA_TRY(cudaStreamSynchronize(stream));
        r.seconds += seconds_since(t0);
        r.rows += bi.size();
        if (b == 0) check_first(r);
      }
      r.bytes = r.rows * rb;
      r.ran = true;
    };

    path_result cpu{"cpu-threads",
                    "CPU threads (" + std::to_string(pool.size()) +
                        ") gather from host memory into pinned memory + one cudaMemcpyAsync"};
    path_result zero{"zero-copy", "GPU zero-copy gather from pinned host memory"};
    path_result mm{
        "mmap-cold",
        "mmap of the feature file (page cache dropped: cold) + CPU threads + cudaMemcpyAsync"};
    path_result mm_warm{"mmap-warm", "the same mmap again, the rows' pages now in the host page cache (warm) + "
                                      "CPU threads + cudaMemcpyAsync"};
    path_result hbm{"gpu-memory", "features resident in GPU memory, GPU gather"};

    // The host paths read pinned host memory holding the table. With the
    // table in one pinned-RAM controller of the GPU engine, that is the
    // medium itself (the same bytes, laid out from byte 0): a table too
    // large for two copies in host memory is still compared.
    std::optional<pinned_buffer<unsigned char>> host_copy;
    const unsigned char* host_table = nullptr;
    const std::uint64_t avail = available_host_bytes();
    if (in_process && spec.kind == device_kind::emu_gpu && spec.media == media_kind::ram &&
        s.controller_count() == 1 && start_lba == 0 && !s.gpu_engines().empty()) {
      host_table = s.gpu_engines()[0]->media_data();
      cpu.what += ", reading the medium's own pinned memory";
      zero.what += " (the medium's own pinned memory)";
    } else if (avail != 0 && table_bytes + (1ull << 30) > avail) {
      cpu.why_not = zero.why_not = "the table (" + std::to_string(table_bytes >> 20) +
                                   " MiB) does not fit the " + std::to_string(avail >> 20) +
                                   " MiB of available host memory";
    } else {
      host_copy.emplace(table_bytes);
      read_table(src, table_bytes, host_copy->get(), pool);
      host_table = host_copy->get();
    }
    if (host_table != nullptr) {
      cpu_path(cpu, host_table);
      gpu_table_path(zero, host_table);
    }

    if (src.path().empty()) {
      mm.why_not = mm_warm.why_not = "the dataset keeps no feature file (made with --no-features-file)";
    } else {
      const int fd = ::open(src.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw_errno("opening " + src.path());
      const std::uint64_t map_bytes = m.features.file_offset + table_bytes;
      ::fdatasync(fd);
      const int adv = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      void* p = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        throw_errno("mapping " + src.path(), e);
      }
      if (adv != 0) mm.what += " (posix_fadvise failed: not cold)";
      try {
        cpu_path(mm, static_cast<const unsigned char*>(p) + m.features.file_offset);
        // The cold pass read every page these rows touch: a second pass
        // finds them in the host page cache.
        cpu_path(mm_warm, static_cast<const unsigned char*>(p) + m.features.file_offset);
      } catch (...) {
        ::munmap(p, map_bytes);
        ::close(fd);
        throw;
      }
      ::munmap(p, map_bytes);
      ::close(fd);
    }

    std::size_t free_b = 0, total_b = 0;
    BAM_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    if (!host_table) {
      hbm.why_not = "the table is not in host memory to copy from";
    } else if (table_bytes + (1ull << 30) > free_b) {
      hbm.why_not = "the table (" + std::to_string(table_bytes >> 20) + " MiB) does not fit the " +
                    std::to_string(free_b >> 20) + " MiB of free GPU memory";
    } else {
      device_buffer<unsigned char> d_table(table_bytes);
      BAM_CUDA_TRY(cudaMemcpy(d_table.get(), host_table, table_bytes, cudaMemcpyHostToDevice));
      gpu_table_path(hbm, d_table.get());
    }
    baselines = {cpu, zero, mm, mm_warm, hbm};

    const double best = best_baseline(baselines);
    if (text) {
      std::printf("\nthe gather of the same %llu batches' rows (%llu rows, %.2f GB), by path:\n",
                  static_cast<unsigned long long>(batch_ids.size()),
                  static_cast<unsigned long long>(rows_total),
                  static_cast<double>(rows_total * rb) / 1e9);
      std::printf("  %-12s %14s %10s %12s  %s\n", "path", "nodes/s", "GB/s", "vs best base",
                  "what (best base: the better of the host paths; gpu-memory is the upper bound)");
      auto row = [&](const path_result& r) {
        if (!r.ran) {
          std::printf("  %-12s %14s %10s %12s  skipped: %s\n", r.path.c_str(), "-", "-", "-",
                      r.why_not.c_str());
          return;
        }
        std::printf("  %-12s %14.0f %10.2f %11.2fx  %s\n", r.path.c_str(), r.nodes_per_s(),
                    r.gb_per_s(), best > 0 ? r.nodes_per_s() / best : 0.0, r.what.c_str());
      };
      row(bam_path);
      for (const auto& r : baselines)
        row(r);
      if (mm.ran && mm_warm.ran && mm.nodes_per_s() > 0 && mm_warm.nodes_per_s() > 0)
        std::printf("bam against mmap of the feature file: %.2fx its cold figure, %.2fx its warm one\n",
                    bam_path.nodes_per_s() / mm.nodes_per_s(), bam_path.nodes_per_s() / mm_warm.nodes_per_s());
    }
  }

  // ---- JSON
  if (!o.json_file.empty() || o.json_stdout) {
    int driver = 0, dev_id = 0;
    cudaDeviceProp prop{};
    BAM_CUDA_TRY(cudaGetDevice(&dev_id));
    BAM_CUDA_TRY(cudaGetDeviceProperties(&prop, dev_id));
    BAM_CUDA_TRY(cudaDriverGetVersion(&driver));
    auto path_json = [&](const path_result& r, double best) {
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
    };
    const double best = best_baseline(baselines);
    json j;
    j["benchmark"] = "bam-gnn aggregate";
    j["gpu"] = prop.name;
    j["driver"] = driver;
    j["cuda_runtime"] = CUDART_VERSION;
    j["commit"] = commit_id();
    j["date"] = utc_now();
    j["dataset"] = {{"directory", std::filesystem::absolute(dir).string()},
                    {"nodes", m.nodes},
                    {"edges", m.edges},
                    {"dim", dim},
                    {"dtype", m.features.dtype},
                    {"row_bytes", rb},
                    {"features", m.features.source}};
    j["device"] = dev;
    j["transport"] = s.transport_name();
    j["placement"] = placement;
    if (in_process) j["load_seconds"] = load_seconds;
    j["page_size"] = o.page_size;
    j["cache_bytes"] = cache.slot_count() * o.page_size;
    j["fanouts"] = fanouts;
    j["in_flight"] = o.in_flight;
    j["lookahead"] = o.lookahead;
    if (o.lookahead) j["held_pages_per_batch"] = static_cast<double>(held_total) / nb;
    j["batch_size"] = o.batch_size;
    j["batches"] = o.batches;
    j["seed"] = o.seed;
    j["seconds"] = t_total;
    j["batches_per_s"] = nb / t_total;
    j["nodes_per_s"] = static_cast<double>(rows_total) / t_total;
    j["feature_GB_per_s"] = static_cast<double>(rows_total * rb) / t_total / 1e9;
    j["unique_nodes"] = rows_total;
    std::vector<double> per_hop;
    for (std::uint32_t l = 0; l <= hops; ++l)
      per_hop.push_back(static_cast<double>(hop_nodes_total[l]) / nb);
    j["unique_nodes_per_batch_by_hop"] = per_hop;
    j["ms_per_batch"] = {{"sampling", 1e3 * t_sample / nb},
                         {"gathering", 1e3 * t_gather / nb},
                         {"aggregation", 1e3 * t_aggregate / nb},
                         {"total", 1e3 * t_total / nb},
                         {"first_batch", 1e3 * first_batch}};
    j["cache"] = {{"hit_rate", page_visits ? json(hit_rate) : json(nullptr)}, // null: every row came from the hot set
                  {"pages_loaded", misses},
                  {"page_visits", page_visits}};
    if (hot)
      j["hot_set"] = {{"percent", o.hot_percent},
                      {"rows", hot->size()},
                      {"bytes", hot->bytes()},
                      {"chosen_by", "in-degree"},
                      {"fill_seconds", hot_seconds},
                      {"row_visits", hot_visits},
                      {"row_visit_fraction",
                       rows_total ? static_cast<double>(hot_visits) / static_cast<double>(rows_total) : 0.0}};
    j["verified_rows"] = verified_rows;
    j["verified_batches"] = verified_batches;
    j["gather"] = path_json(bam_path, best);
    if (o.compare) {
      json c = json::array();
      for (const auto& r : baselines)
        c.push_back(path_json(r, best));
      j["baselines"] = c;
    }
    if (!o.json_file.empty()) {
      std::ofstream f(o.json_file);
      f << j.dump(2) << "\n";
      if (!f) throw_errno("writing " + o.json_file);
    }
    if (o.json_stdout) std::cout << j.dump(2) << std::endl;
  }
  return 0;
}

} // namespace

int run_aggregate(const aggregate_options& o) {
  const manifest m = read_manifest(o.dir);
  (void)parse_fanouts(o.fanouts); // bad fanouts fail before anything is set up
  if (o.batch_size == 0) detail::gnn_fail("--batch-size must be at least 1");
  if (o.batches == 0) detail::gnn_fail("--batches must be at least 1");
  if (o.cache_mib == 0) detail::gnn_fail("--cache-mib must be at least 1");
  if (o.in_flight == 0 || o.in_flight > max_in_flight)
    detail::gnn_fail("--in-flight " + std::to_string(o.in_flight) + ": 1 to " + std::to_string(max_in_flight));
  if (o.page_size < 512 || o.page_size > (64u << 10) || (o.page_size & (o.page_size - 1)) != 0)
    detail::gnn_fail("--page-size " + std::to_string(o.page_size) +
                     ": a power of two from 512 to 65536");
  if (m.nodes > 0xffffffffull) detail::gnn_fail("more than 2^32 - 1 nodes: positions are 32-bit");
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    cudaGetLastError();
    detail::gnn_fail("bam-gnn aggregate needs an NVIDIA GPU: none is visible here", ENODEV);
  }
  if (m.features.dtype == "float16") return run_typed<std::uint16_t>(o, m);
  return run_typed<float>(o, m);
}

} // namespace bam::gnn
