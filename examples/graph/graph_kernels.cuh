// SPDX-License-Identifier: MIT
// The GPU algorithms of `bam-graph`, each a function template over how the
// graph is read (`graph_view<Offsets, Edges>`), so that the same kernels
// run over the graph in a bam::array through the page cache, in GPU memory
// (the upper bound) and in pinned host memory read zero-copy (the paper's
// baseline):
//
//   pointer_source<T>     a plain pointer: GPU memory, or pinned host memory
//   bam_copy_source<T>    a bam::array_ref: a warp reads a node's neighbours
//                         with copy_to, up to 1024 ids at a time through
//                         shared memory (up to 32 pages in flight)
//   bam_reader_source<T>  a bam::array_ref: lanes read ids 32 apart through
//                         a reader (one cache lookup per page per warp)
//
// A source reads one element per lane (`get`, warp-collective over the
// active lanes) or a range warp-cooperatively (`warp_range`, the whole warp,
// converged, with the same range), calling f(value) on the lanes.
//
//   bfs_gpu       level-synchronous BFS, direction-optimizing: top-down (a
//                 warp per frontier node, the next frontier compacted with
//                 CUB, sorted by node id, so that the next level reads the
//                 edge array in order) while the frontier is small;
//                 bottom-up (a warp per unreached node, reading its
//                 neighbours until one is in the frontier) while it is large
//   cc_gpu        Afforest, as cc_cpu (graph_cpu.hpp), labels equal to it
//   pagerank_gpu  pull-based PageRank: a warp per node sums its neighbours'
//                 rank / degree, as pagerank_cpu
#pragma once

#include <bam/bam.cuh> // first: the GPU engine's device hook goes into the runtime's wait loops

#include "../gnn/gnn_cuda.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <random>
#include <vector>

namespace bam::graph {

inline constexpr std::uint32_t unreached = 0xffffffffu;
inline constexpr unsigned warps_per_block = gnn::block_threads / 32;
//! Afforest: neighbours hooked per node before the largest component is skipped.
inline constexpr unsigned afforest_rounds = 2;

//! Blocks for `warps` warps (a warp per item): capped, the kernels loop with
//! a grid stride, and their one atomic per warp at the end stays cheap.
inline unsigned grid_for_warps(std::uint64_t warps) {
  return static_cast<unsigned>(std::clamp<std::uint64_t>((warps + warps_per_block - 1) / warps_per_block, 1, 8192));
}

BAM_DEVICE inline unsigned lane_of_thread() { return threadIdx.x & 31u; }

// ---- how the graph is read --------------------------------------------------

template <class T>
struct pointer_source {
  static constexpr bool through_cache = false;
  const T* p = nullptr;
  BAM_DEVICE T get(std::uint64_t i) const { return p[i]; }
  BAM_DEVICE std::uint64_t pages(std::uint64_t, std::uint64_t) const { return 0; }
  template <class F>
  BAM_DEVICE std::uint64_t warp_range(std::uint64_t begin, std::uint64_t end, F&& f) const {
    for (std::uint64_t j = begin + lane_of_thread(); j < end; j += 32)
      f(p[j]);
    return 0;
  }
  BAM_DEVICE unsigned look_ahead() const { return 0; }
  BAM_DEVICE unsigned items_per_lane(std::uint64_t, std::uint64_t) const { return 1; }
  BAM_DEVICE void prefetch_spans(std::uint64_t, std::uint64_t) const {}
};

//! Pages of 2^shift elements that [begin, end) spans.
BAM_DEVICE inline std::uint64_t pages_spanned(std::uint64_t begin, std::uint64_t end, unsigned shift) {
  return end > begin ? ((end - 1) >> shift) - (begin >> shift) + 1 : 0;
}

//! Whole-warp: each lane names a range [b, e) of `a` (empty when e <= b),
//! b nondecreasing over the lanes (an empty range at b = 0 after the
//! others is allowed); the warp brings in the first `ahead` (<= 32)
//! distinct pages of 2^shift elements they span, a page per lane, all at
//! once (bam::array_ref::prefetch), and holds none.
template <class T>
BAM_DEVICE void prefetch_spans(const array_ref<T>& a, unsigned shift, unsigned ahead, std::uint64_t b,
                               std::uint64_t e) {
  constexpr unsigned all = 0xffffffffu;
  const unsigned lane = lane_of_thread();
  std::uint64_t first = b >> shift;
  const std::uint64_t stop = e > b ? ((e - 1) >> shift) + 1 : first; // pages [first, stop)
  // A page an earlier lane's range reaches is that lane's: the latest stop before this lane.
  std::uint64_t before = stop;
  for (unsigned o = 1; o < 32; o *= 2) {
    const std::uint64_t x = __shfl_up_sync(all, before, o);
    if (lane >= o && x > before) before = x;
  }
  before = __shfl_up_sync(all, before, 1);
  if (lane > 0 && before > first) first = before < stop ? before : stop;
  const std::uint64_t mine = stop - first;
  const unsigned n = static_cast<unsigned>(mine < ahead ? mine : ahead);
  unsigned upto = n; // inclusive scan of n over the lanes
  for (unsigned o = 1; o < 32; o *= 2) {
    const unsigned x = __shfl_up_sync(all, upto, o);
    if (lane >= o) upto += x;
  }
  const unsigned total = __shfl_sync(all, upto, 31);
  const unsigned take = total < ahead ? total : ahead;
  // Lane t brings in the t-th page of the union: the one of the lane whose share holds t.
  std::uint64_t page = 0;
  for (unsigned j = 0; j < 32; ++j) {
    const unsigned end_j = __shfl_sync(all, upto, j), n_j = __shfl_sync(all, n, j);
    const std::uint64_t first_j = __shfl_sync(all, first, j);
    if (lane < end_j && lane >= end_j - n_j) page = first_j + (lane - (end_j - n_j));
  }
  a.prefetch(page << shift, lane < take);
}

//! Look-ahead of a cached source: `ahead` pages (0: none) a warp brings in
//! at once before it reads a window of items' lists, and `nodes_per_page`
//! (nodes / pages of the edge array) for the window's size.
struct look_ahead_settings {
  unsigned ahead = 0;
  float nodes_per_page = 1;
  //! Items a lane's share of a window holds, for `count` items drawn from
  //! `nodes` in node order: about a page's worth of lists, 1 to 32.
  BAM_DEVICE unsigned items_per_lane(std::uint64_t count, std::uint64_t nodes) const {
    const float k = nodes_per_page * static_cast<float>(count) / static_cast<float>(nodes > 0 ? nodes : 1);
    return k < 1.5f ? 1u : k > 32.0f ? 32u : static_cast<unsigned>(k + 0.5f);
  }
};

//! What the sources through the cache share: the array, its page size, the
//! look-ahead, single reads and page counts.
template <class T>
struct cached_source {
  static constexpr bool through_cache = true;
  array_ref<T> a;
  unsigned page_shift = 0; //!< log2(elements per cache page)
  look_ahead_settings ahead;
  BAM_DEVICE unsigned look_ahead() const { return ahead.ahead; }
  BAM_DEVICE unsigned items_per_lane(std::uint64_t count, std::uint64_t nodes) const {
    return ahead.items_per_lane(count, nodes);
  }
  BAM_DEVICE void prefetch_spans(std::uint64_t b, std::uint64_t e) const {
    graph::prefetch_spans(a, page_shift, ahead.ahead, b, e);
  }
  BAM_DEVICE T get(std::uint64_t i) const { return a[i]; }
  BAM_DEVICE std::uint64_t pages(std::uint64_t begin, std::uint64_t end) const {
    return pages_spanned(begin, end, page_shift);
  }
};

template <class T>
struct bam_copy_source : cached_source<T> {
  static constexpr unsigned chunk = 4096 / sizeof(T); //!< elements a warp copies at a time
  template <class F>
  BAM_DEVICE std::uint64_t warp_range(std::uint64_t begin, std::uint64_t end, F&& f) const {
    __shared__ T buf[warps_per_block][chunk];
    T* mine = buf[threadIdx.x / 32];
    for (std::uint64_t c = begin; c < end; c += chunk) {
      const std::uint64_t n = end - c < chunk ? end - c : chunk;
      this->a.copy_to(c, n, mine);
      __syncwarp();
      for (std::uint64_t k = lane_of_thread(); k < n; k += 32)
        f(mine[k]);
      __syncwarp();
    }
    return this->pages(begin, end);
  }
};

template <class T>
struct bam_reader_source : cached_source<T> {
  template <class F>
  BAM_DEVICE std::uint64_t warp_range(std::uint64_t begin, std::uint64_t end, F&& f) const {
    auto r = this->a.reader();
    for (std::uint64_t j = begin + lane_of_thread(); j < end; j += 32)
      f(r[j]);
    return this->pages(begin, end);
  }
};

//! A graph as the kernels read it: `nodes`, offsets (uint64, nodes + 1) and
//! edges (uint32). `visits` (may be null) counts the cache pages the reads
//! through the cache touched: the pages each warp's range spans, and one
//! per single-element read. With `head_k` > 0, `heads` (GPU memory) holds
//! the first `head_k` neighbours of every node (`list_heads`): BFS and
//! CC's sampling read those there, and the edges only past them.
template <class Offsets, class Edges>
struct graph_view {
  std::uint64_t nodes = 0;
  Offsets off;
  Edges edg;
  unsigned long long* visits = nullptr;
  const std::uint32_t* heads = nullptr;
  unsigned head_k = 0; //!< 0 to 32

  //! Whole-warp: f(u) on the lanes for those of v's neighbours [b, e) that
  //! `heads` holds (none without heads); returns where the rest begins.
  template <class F>
  BAM_DEVICE std::uint64_t warp_heads(std::uint64_t v, std::uint64_t b, std::uint64_t e, F&& f) const {
    const std::uint64_t n = e - b < head_k ? e - b : head_k;
    if (lane_of_thread() < n) f(heads[v * head_k + lane_of_thread()]);
    return b + n;
  }

  //! [begin, end) of node v's neighbours, read by the calling lane.
  BAM_DEVICE void row(std::uint64_t v, std::uint64_t& begin, std::uint64_t& end, std::uint64_t& seen) const {
    begin = off.get(v);
    end = off.get(v + 1);
    if constexpr (Offsets::through_cache) seen += 2;
  }
  //! The same for a warp working on v together (lanes 0 and 1 read).
  BAM_DEVICE void warp_row(std::uint64_t v, std::uint64_t& begin, std::uint64_t& end, std::uint64_t& seen) const {
    const unsigned lane = lane_of_thread();
    std::uint64_t x = 0;
    if (lane < 2) x = off.get(v + lane);
    begin = __shfl_sync(0xffffffffu, x, 0);
    end = __shfl_sync(0xffffffffu, x, 1);
    if constexpr (Offsets::through_cache) seen += lane == 0;
  }
  BAM_DEVICE void count(std::uint64_t seen) const {
    if (visits != nullptr && seen != 0) atomicAdd(visits, static_cast<unsigned long long>(seen));
  }
  //! Whole-warp, through the cache with look-ahead: the lists of items
  //! [i, end) of a warp's run, nodes node_of(item) in increasing order, are
  //! read next; lane l takes items [i + l k, i + (l + 1) k) (k > 1 only for consecutive nodes; k from the
  //! run's density), the span of their lists (a single item's cut to
  //! `limit` ids), and the warp brings in the first pages of those spans at
  //! once. Returns the items the window covers (32 k).
  template <class NodeOf>
  BAM_DEVICE std::uint64_t prefetch_window(NodeOf node_of, std::uint64_t i, std::uint64_t end, unsigned k,
                                           std::uint64_t limit) const {
    const std::uint64_t first = i + std::uint64_t{lane_of_thread()} * k;
    std::uint64_t b = 0, e = 0;
    if (first < end) {
      const std::uint64_t last = (first + k < end ? first + k : end) - 1;
      const std::uint64_t v = node_of(first);
      b = off.get(v);
      if (k == 1) {
        e = off.get(v + 1);
        b = e - b < head_k ? e : b + head_k; // the heads are read in GPU memory
        if (e - b > limit) e = b + limit;
      } else {
        e = off.get(node_of(last) + 1);
      }
    }
    edg.prefetch_spans(b, e);
    return std::uint64_t{32} * k;
  }
};

//! The offsets when they are in memory (a plain pointer), else null.
template <class V>
const std::uint64_t* offsets_in_memory(const V& g) {
  if constexpr (decltype(g.off)::through_cache)
    return nullptr;
  else
    return g.off.p;
}

//! Ids of a neighbour list read when a node is looked at whole.
inline constexpr std::uint64_t whole_list = ~std::uint64_t{0};

//! f(i) for the items i of [0, count) this warp takes, the whole warp on
//! each. Through the cache a warp takes a run of consecutive items (the
//! lists are in node order): the warps running at once then read different
//! pages and have as many misses in flight, instead of waiting together on
//! the same few pages, as consecutive items dealt to consecutive warps
//! would. Elsewhere the items are dealt out with a grid stride.
//! With a look-ahead (`window(i, end)`, whole-warp, returning the items it
//! covers, called when item i of a run is reached and the last window is
//! used up) a run's lists are brought in a window at a time, many misses
//! in flight per warp, instead of one page per item.
template <bool Runs, class F, class Window>
BAM_DEVICE void for_warp_items(std::uint64_t count, F&& f, Window&& window) {
  const std::uint64_t warps = std::uint64_t{gridDim.x} * blockDim.x / 32;
  const std::uint64_t w = (std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if constexpr (Runs) {
    const std::uint64_t run = (count + warps - 1) / warps;
    const std::uint64_t end = (w + 1) * run < count ? (w + 1) * run : count;
    std::uint64_t covered = 0; // items [.., covered) are in a window brought in
    for (std::uint64_t i = w * run; i < end; ++i) {
      if (i >= covered) covered = i + window(i, end);
      f(i);
    }
  } else {
    for (std::uint64_t i = w; i < count; i += warps)
      f(i);
  }
}
template <bool Runs, class F>
BAM_DEVICE void for_warp_items(std::uint64_t count, F&& f) {
  for_warp_items<Runs>(count, f, [](std::uint64_t i, std::uint64_t end) { return end - i; });
}

//! The look-ahead of a run of items from `list` (null: the items are the
//! nodes), each list cut to `limit` ids; none unless the edges are read
//! through the cache with look-ahead.
template <class V>
struct list_window {
  const V& g;
  const std::uint32_t* list;
  unsigned k;
  std::uint64_t limit;
  BAM_DEVICE std::uint64_t operator()(std::uint64_t i, std::uint64_t end) const {
    if constexpr (decltype(g.edg)::through_cache) {
      if (g.edg.look_ahead() != 0)
        return g.prefetch_window([&](std::uint64_t j) -> std::uint64_t { return list ? list[j] : j; }, i, end, k,
                                 limit);
    }
    return end - i;
  }
};
//! A lane's share of a window: a node's list from `list` (whose nodes may
//! lie far apart: a share of several would span the lists of the nodes
//! between them), or about a page's worth of consecutive nodes.
template <class V>
BAM_DEVICE list_window<V> window_over(const V& g, const std::uint32_t* list, std::uint64_t count, std::uint64_t limit) {
  return {g, list, list != nullptr ? 1u : g.edg.items_per_lane(count, g.nodes), limit};
}

//! A warp per node of list[0, count): f(v, begin, end) with the whole warp,
//! then the pages it reported counted. The lists are read up to `limit`
//! ids first (what the look-ahead brings in).
template <class V, class F>
BAM_DEVICE void warp_per_listed_node(const V& g, const std::uint32_t* list, std::uint64_t count, F&& f,
                                     std::uint64_t limit = whole_list) {
  std::uint64_t seen = 0;
  for_warp_items<decltype(g.edg)::through_cache>(
      count,
      [&](std::uint64_t i) {
        const std::uint32_t v = list[i];
        std::uint64_t b, e;
        g.warp_row(v, b, e, seen);
        const std::uint64_t pages = f(v, b, e);
        if (lane_of_thread() == 0) seen += pages;
      },
      window_over(g, list, count, limit));
  g.count(seen);
}

// ---- BFS --------------------------------------------------------------------

template <class V>
__global__ void bfs_expand(V g, const std::uint32_t* frontier, std::uint64_t count, std::uint32_t* parent,
                           std::uint32_t* level, std::uint32_t next) {
  warp_per_listed_node(g, frontier, count, [&](std::uint32_t v, std::uint64_t b, std::uint64_t e) {
    auto visit = [&](std::uint32_t u) {
      if (level[u] == unreached && atomicCAS(&level[u], unreached, next) == unreached) parent[u] = v;
    };
    return g.edg.warp_range(g.warp_heads(v, b, e, visit), e, visit);
  });
}

//! Neighbours a warp of a bottom-up step reads before it looks whether one
//! of them is in the frontier.
inline constexpr std::uint64_t bottom_up_chunk = 128;

//! A bottom-up step: each node of `unreached_nodes` reads its neighbours a
//! chunk at a time until one is at level `cur` (in the frontier); that one
//! becomes its parent. The list is in node order and a warp takes a run of
//! it, so the warps read the edge array from start to end. With heads, the
//! list holds only nodes none of whose heads is in the frontier
//! (bfs_bottom_up_heads looked), and with more neighbours than heads where
//! the offsets are in memory; their lists are read past the heads.
template <class V>
__global__ void bfs_bottom_up(V g, const std::uint32_t* unreached_nodes, std::uint64_t count, std::uint32_t* parent,
                              std::uint32_t* level, std::uint32_t cur) {
  const unsigned lane = lane_of_thread();
  warp_per_listed_node(
      g, unreached_nodes, count,
      [&](std::uint32_t v, std::uint64_t b, std::uint64_t e) {
        // A node reached in this step is at cur + 1, never cur: the other
        // warps' writes do not change what this one finds.
        std::uint32_t found = unreached;
        auto look = [&](std::uint32_t u) {
          if (found == unreached && level[u] == cur) found = u;
        };
        const std::uint64_t from = e - b < g.head_k ? e : b + g.head_k;
        unsigned with = 0;
        std::uint64_t read_to = from; // the pages of [from, read_to) are counted once, as a top-down read counts them
        for (std::uint64_t c = from; with == 0 && c < e; c += bottom_up_chunk) {
          read_to = e - c < bottom_up_chunk ? e : c + bottom_up_chunk;
          g.edg.warp_range(c, read_to, look);
          with = __ballot_sync(0xffffffffu, found != unreached);
        }
        if (with != 0 && lane == static_cast<unsigned>(__ffs(with) - 1)) {
          parent[v] = found;
          level[v] = cur + 1;
        }
        return g.edg.pages(from, read_to);
      },
      bottom_up_chunk);
}

//! A bottom-up step's look at the heads, a thread per node: an unreached
//! node with a head at level `cur` (in the frontier) takes it as parent.
//! A plain kernel (nothing of the cache's code, a plain kernel's
//! occupancy); bfs_bottom_up reads the lists of the nodes it leaves.
__global__ inline void bfs_bottom_up_heads(const std::uint32_t* heads, unsigned head_k, std::uint64_t nodes,
                                           std::uint32_t* parent, std::uint32_t* level, std::uint32_t cur) {
  for (std::uint64_t v = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < nodes;
       v += std::uint64_t{gridDim.x} * blockDim.x) {
    if (level[v] != unreached) continue;
    for (unsigned j = 0; j < head_k; ++j) {
      const std::uint32_t u = heads[v * head_k + j];
      if (u == unreached) break; // list_heads pads with no_node (the same)
      if (level[u] == cur) {
        parent[v] = u;
        level[v] = cur + 1;
        break;
      }
    }
  }
}

//! Direction-optimizing BFS goes bottom-up for a level whose frontier holds
//! more than 1 / bottom_up_share of the nodes.
inline constexpr std::uint64_t bottom_up_share = 20;

__global__ inline void bfs_start(std::uint32_t* parent, std::uint32_t* level, std::uint32_t* frontier,
                                 std::uint32_t root) {
  parent[root] = root;
  level[root] = 0;
  frontier[0] = root;
}

struct at_level {
  const std::uint32_t* level;
  std::uint32_t want;
  BAM_DEVICE bool operator()(std::uint32_t v) const { return level[v] == want; }
};

//! An unreached node with neighbours past its first `head_k` (every
//! unreached node when `off`, the offsets in memory, is null).
struct unreached_past_heads {
  const std::uint32_t* level;
  const std::uint64_t* off;
  unsigned head_k;
  BAM_DEVICE bool operator()(std::uint32_t v) const {
    return level[v] == unreached && (off == nullptr || off[v + 1] - off[v] > head_k);
  }
};

//! A node outside component `giant` with neighbours past the first
//! `afforest_rounds` (all of them when `off`, the offsets in memory, is null).
struct not_in_component {
  const std::uint32_t* comp;
  std::uint32_t giant;
  const std::uint64_t* off = nullptr;
  BAM_DEVICE bool operator()(std::uint32_t v) const {
    return comp[v] != giant && (off == nullptr || off[v + 1] - off[v] > afforest_rounds);
  }
};

//! GPU memory the algorithms work in, for a graph of `nodes` nodes,
//! allocated once for every run of a path.
struct work_buffers {
  std::uint64_t nodes = 0;
  device_buffer<std::uint32_t> a, b, list; //!< BFS: parent, level, frontier; CC: labels, -, list
  device_buffer<float> r0, r1, contrib;    //!< PageRank
  device_buffer<double> sums;              //!< PageRank: dangling mass, change
  device_buffer<unsigned long long> visits;
  device_buffer<std::uint64_t> selected;
  pinned_buffer<std::uint64_t> host_word;
  device_buffer<unsigned char> temp; //!< CUB's
  std::size_t temp_bytes = 0;

  work_buffers(std::uint64_t n, bool pagerank)
      : nodes(n), a(n), b(n), list(n), sums(2), visits(1), selected(1), host_word(1) {
    if (pagerank) {
      r0 = device_buffer<float>(n);
      r1 = device_buffer<float>(n);
      contrib = device_buffer<float>(n);
    }
    BAM_CUDA_TRY(cub::DeviceSelect::If(nullptr, temp_bytes, thrust::counting_iterator<std::uint32_t>(0), list.get(),
                                       selected.get(), n, at_level{a.get(), 0}));
    temp = device_buffer<unsigned char>(temp_bytes);
  }
  //! GPU memory these take for a graph of `n` nodes (roughly: CUB's temporary storage aside).
  static std::uint64_t bytes_for(std::uint64_t n, bool pagerank) { return n * (12 + (pagerank ? 12 : 0)) + (64 << 20); }

  //! The nodes v with pred(v) into `list`; returns how many.
  template <class Pred>
  std::uint64_t select(Pred pred, cudaStream_t s) {
    BAM_CUDA_TRY(cub::DeviceSelect::If(temp.get(), temp_bytes, thrust::counting_iterator<std::uint32_t>(0), list.get(),
                                       selected.get(), nodes, pred, s));
    return read_word(selected.get(), s);
  }
  std::uint64_t read_word(const std::uint64_t* p, cudaStream_t s) {
    BAM_CUDA_TRY(cudaMemcpyAsync(host_word.get(), p, 8, cudaMemcpyDeviceToHost, s));
    BAM_CUDA_TRY(cudaStreamSynchronize(s));
    return *host_word.get();
  }
  std::uint64_t page_visits(cudaStream_t s) {
    return read_word(reinterpret_cast<const std::uint64_t*>(visits.get()), s);
  }
};

struct bfs_figures {
  std::uint32_t levels = 0;
  std::uint32_t bottom_up_levels = 0; //!< of them, the levels run bottom-up
};

//! BFS from `root`: parents into w.a (root's is root, unreached: unreached).
//! `bottom_up`: direction-optimizing (a large frontier's level bottom-up);
//! else every level top-down.
template <class V>
bfs_figures bfs_gpu(V g, std::uint32_t root, work_buffers& w, cudaStream_t s, bool bottom_up = true) {
  g.visits = w.visits.get();
  BAM_CUDA_TRY(cudaMemsetAsync(w.a.get(), 0xff, w.a.bytes(), s));
  BAM_CUDA_TRY(cudaMemsetAsync(w.b.get(), 0xff, w.b.bytes(), s));
  bfs_start<<<1, 1, 0, s>>>(w.a.get(), w.b.get(), w.list.get(), root);
  bfs_figures f;
  for (std::uint64_t count = 1; count != 0; ++f.levels) {
    if (bottom_up && count > g.nodes / bottom_up_share) {
      // w.list: the nodes not reached yet, instead of the frontier; with
      // heads, those the heads did not settle and with more neighbours.
      std::uint64_t left = 0;
      if (g.head_k != 0) {
        bfs_bottom_up_heads<<<gnn::grid_for(g.nodes), gnn::block_threads, 0, s>>>(g.heads, g.head_k, g.nodes, w.a.get(),
                                                                                  w.b.get(), f.levels);
        left = w.select(unreached_past_heads{w.b.get(), offsets_in_memory(g), g.head_k}, s);
      } else {
        left = w.select(at_level{w.b.get(), unreached}, s);
      }
      if (left != 0)
        bfs_bottom_up<<<grid_for_warps(left), gnn::block_threads, 0, s>>>(g, w.list.get(), left, w.a.get(), w.b.get(),
                                                                          f.levels);
      ++f.bottom_up_levels;
    } else {
      bfs_expand<<<grid_for_warps(count), gnn::block_threads, 0, s>>>(g, w.list.get(), count, w.a.get(), w.b.get(),
                                                                      f.levels + 1);
    }
    BAM_CUDA_TRY(cudaGetLastError());
    count = w.select(at_level{w.b.get(), f.levels + 1}, s);
  }
  return f;
}

// ---- connected components (Afforest) -----------------------------------------

BAM_DEVICE inline std::uint32_t load_label(const std::uint32_t* p) {
  return *static_cast<const volatile std::uint32_t*>(p);
}

//! Joins the trees of u and v, the larger root under the smaller.
BAM_DEVICE inline void link(std::uint32_t u, std::uint32_t v, std::uint32_t* comp) {
  std::uint32_t p1 = load_label(comp + u), p2 = load_label(comp + v);
  while (p1 != p2) {
    const std::uint32_t high = p1 > p2 ? p1 : p2, low = p1 > p2 ? p2 : p1;
    const std::uint32_t p_high = load_label(comp + high);
    if (p_high == low) break;
    if (p_high == high && atomicCAS(comp + high, high, low) == high) break;
    p1 = load_label(comp + load_label(comp + high));
    p2 = load_label(comp + low);
  }
}

__global__ inline void cc_init(std::uint32_t* comp, std::uint64_t n) {
  for (std::uint64_t v = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < n;
       v += std::uint64_t{gridDim.x} * blockDim.x)
    comp[v] = static_cast<std::uint32_t>(v);
}

__global__ inline void cc_compress(std::uint32_t* comp, std::uint64_t n) {
  for (std::uint64_t v = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < n;
       v += std::uint64_t{gridDim.x} * blockDim.x)
    while (load_label(comp + comp[v]) != comp[v])
      comp[v] = load_label(comp + comp[v]);
}

//! Each node hooked to its first `afforest_rounds` neighbours (a thread per
//! node). The rounds run in one pass: a node's first neighbours share a
//! page, read once through the cache instead of once per round.
template <class V>
__global__ void cc_sample(V g, std::uint32_t* comp) {
  std::uint64_t seen = 0;
  for (std::uint64_t v = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < g.nodes;
       v += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint64_t b, e;
    g.row(v, b, e, seen);
    std::uint32_t first[afforest_rounds];
    unsigned k = 0;
    for (unsigned r = 0; r < afforest_rounds && b + r < e; ++r) {
      if (r < g.head_k) {
        first[k++] = g.heads[v * g.head_k + r];
        continue;
      }
      first[k++] = g.edg.get(b + r);
      if constexpr (decltype(g.edg)::through_cache) ++seen;
    }
    for (unsigned r = 0; r < k; ++r)
      link(static_cast<std::uint32_t>(v), first[r], comp);
  }
  g.count(seen);
}

//! cc_sample when `heads` holds each node's first afforest_rounds (or more)
//! neighbours: it reads nothing else, so it carries none of the cache's
//! code and runs with a plain kernel's registers and occupancy.
__global__ inline void cc_sample_heads(const std::uint32_t* heads, unsigned head_k, std::uint64_t nodes,
                                       std::uint32_t* comp) {
  for (std::uint64_t v = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < nodes;
       v += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint32_t first[afforest_rounds];
    for (unsigned r = 0; r < afforest_rounds; ++r)
      first[r] = heads[v * head_k + r];
    for (unsigned r = 0; r < afforest_rounds && first[r] != unreached; ++r) // list_heads pads with no_node (the same)
      link(static_cast<std::uint32_t>(v), first[r], comp);
  }
}

//! The rest of the neighbours of each listed node (a warp per node).
template <class V>
__global__ void cc_link_rest(V g, const std::uint32_t* list, std::uint64_t count, std::uint32_t* comp) {
  warp_per_listed_node(g, list, count, [&](std::uint32_t v, std::uint64_t b, std::uint64_t e) {
    auto hook = [&](std::uint32_t u) { link(v, u, comp); };
    // cc_sample hooked the first afforest_rounds; the heads past them here.
    const std::uint64_t past_heads = g.warp_heads(v, b, e, [&](std::uint32_t u) {
      if (lane_of_thread() >= afforest_rounds) hook(u);
    });
    b = e - b < afforest_rounds ? e : b + afforest_rounds;
    return g.edg.warp_range(past_heads > b ? past_heads : b, e, hook);
  });
}

__global__ inline void gather_labels(const std::uint32_t* comp, const std::uint32_t* ids, std::uint32_t* out,
                                     unsigned k) {
  for (unsigned i = threadIdx.x; i < k; i += blockDim.x)
    out[i] = comp[ids[i]];
}

//! The most frequent label among 1024 nodes drawn from `nodes` (as cc_cpu draws them).
inline std::uint32_t sampled_giant(const std::uint32_t* comp, std::uint64_t nodes, work_buffers& w, cudaStream_t s) {
  constexpr unsigned k = 1024;
  std::mt19937_64 rng(nodes);
  std::vector<std::uint32_t> ids(k), labels(k);
  for (auto& id : ids)
    id = static_cast<std::uint32_t>(rng() % nodes);
  // The ids and labels travel through w.b (unused by CC).
  copy_to_device(w.b.get(), ids.data(), k, s);
  gather_labels<<<1, 256, 0, s>>>(comp, w.b.get(), w.b.get() + k, k);
  copy_to_host(labels.data(), w.b.get() + k, k, s);
  std::sort(labels.begin(), labels.end());
  std::uint32_t giant = labels[0];
  std::size_t best = 0;
  for (std::size_t i = 0, j; i < k; i = j) {
    for (j = i; j < k && labels[j] == labels[i]; ++j) {
    }
    if (j - i > best) best = j - i, giant = labels[i];
  }
  return giant;
}

//! Afforest: labels into w.a (each the smallest node id of its component).
template <class V>
void cc_gpu(V g, work_buffers& w, cudaStream_t s) {
  g.visits = w.visits.get();
  const unsigned grid = gnn::grid_for(g.nodes);
  std::uint32_t* comp = w.a.get();
  cc_init<<<grid, gnn::block_threads, 0, s>>>(comp, g.nodes);
  if (g.heads != nullptr && g.head_k >= afforest_rounds)
    cc_sample_heads<<<grid, gnn::block_threads, 0, s>>>(g.heads, g.head_k, g.nodes, comp);
  else
    cc_sample<<<grid, gnn::block_threads, 0, s>>>(g, comp);
  cc_compress<<<grid, gnn::block_threads, 0, s>>>(comp, g.nodes);
  BAM_CUDA_TRY(cudaGetLastError());
  // Nodes whose whole list cc_sample hooked have no more to hook.
  const std::uint64_t* off = offsets_in_memory(g);
  // Small graphs: every node (no sample of 2048 labels to find the giant in w.b).
  const std::uint32_t giant = g.nodes > 2 * 1024 ? sampled_giant(comp, g.nodes, w, s) : unreached;
  const std::uint64_t rest = w.select(not_in_component{comp, giant, off}, s);
  if (rest != 0) cc_link_rest<<<grid_for_warps(rest), gnn::block_threads, 0, s>>>(g, w.list.get(), rest, comp);
  cc_compress<<<grid, gnn::block_threads, 0, s>>>(comp, g.nodes);
  BAM_CUDA_TRY(cudaGetLastError());
}

// ---- PageRank ---------------------------------------------------------------

//! rank / degree of each node; the dangling nodes' rank summed into *dangling.
template <class V>
__global__ void pagerank_contrib(V g, const float* rank, float* contrib, double* dangling) {
  using reduce = cub::BlockReduce<double, gnn::block_threads>;
  __shared__ typename reduce::TempStorage tmp;
  std::uint64_t seen = 0;
  double mine = 0;
  // Every thread of the block runs the same number of iterations (the block reduction needs them all).
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t base = std::uint64_t{blockIdx.x} * blockDim.x; base < g.nodes; base += stride) {
    const std::uint64_t v = base + threadIdx.x;
    if (v < g.nodes) {
      std::uint64_t b, e;
      g.row(v, b, e, seen);
      contrib[v] = e > b ? rank[v] / static_cast<float>(e - b) : 0.0f;
      if (e == b) mine += rank[v];
    }
  }
  const double total = reduce(tmp).Sum(mine);
  if (threadIdx.x == 0 && total != 0) atomicAdd(dangling, total);
  g.count(seen);
}

//! next[v] = (1 - d) / n + d * (dangling / n + sum of contrib over v's neighbours); |next - rank| summed into *change.
template <class V>
__global__ void pagerank_pull(V g, const float* contrib, const float* rank, float* next, double* sums, double damping) {
  std::uint64_t seen = 0;
  double change = 0;
  const double n = static_cast<double>(g.nodes);
  const double base = (1 - damping) / n + damping * sums[0] / n;
  for_warp_items<decltype(g.edg)::through_cache>(
      g.nodes,
      [&](std::uint64_t v) {
        std::uint64_t b, e;
        g.warp_row(v, b, e, seen);
        double sum = 0;
        const std::uint64_t pages = g.edg.warp_range(b, e, [&](std::uint32_t u) { sum += contrib[u]; });
        for (unsigned o = 16; o != 0; o /= 2)
          sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane_of_thread() == 0) {
          seen += pages;
          const float r = static_cast<float>(base + damping * sum);
          next[v] = r;
          change += fabs(static_cast<double>(r) - rank[v]);
        }
      },
      window_over(g, nullptr, g.nodes, whole_list));
  if (lane_of_thread() == 0 && change != 0) atomicAdd(sums + 1, change);
  g.count(seen);
}

struct pagerank_figures {
  unsigned iterations = 0;
  double last_change = 0;
};

//! PageRank: ranks into w.r0 (sums to 1).
template <class V>
pagerank_figures pagerank_gpu(V g, double damping, unsigned max_iterations, double tolerance, work_buffers& w,
                              cudaStream_t s) {
  g.visits = w.visits.get();
  std::vector<float> init(g.nodes, static_cast<float>(1.0 / static_cast<double>(g.nodes)));
  copy_to_device(w.r0.get(), init.data(), init.size(), s);
  float* rank = w.r0.get();
  float* next = w.r1.get();
  pagerank_figures f;
  while (f.iterations < max_iterations) {
    ++f.iterations;
    BAM_CUDA_TRY(cudaMemsetAsync(w.sums.get(), 0, 2 * sizeof(double), s));
    pagerank_contrib<<<gnn::grid_for(g.nodes), gnn::block_threads, 0, s>>>(g, rank, w.contrib.get(), w.sums.get());
    pagerank_pull<<<grid_for_warps(g.nodes), gnn::block_threads, 0, s>>>(g, w.contrib.get(), rank, next, w.sums.get(),
                                                                         damping);
    BAM_CUDA_TRY(cudaGetLastError());
    std::swap(rank, next);
    if (tolerance > 0) {
      double change = 0;
      copy_to_host(&change, w.sums.get() + 1, 1, s);
      f.last_change = change;
      if (change < tolerance) break;
    }
  }
  if (rank != w.r0.get()) BAM_CUDA_TRY(cudaMemcpyAsync(w.r0.get(), rank, w.r0.bytes(), cudaMemcpyDeviceToDevice, s));
  return f;
}

} // namespace bam::graph
