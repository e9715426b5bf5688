// SPDX-License-Identifier: MIT
// Where `bam-graph` reads a graph from on a bam::storage, and the two
// bam::arrays over it: the offsets (uint64) at the image's first byte and
// the edges (uint32) at image.edges_at() (graph_dataset.hpp), on every
// controller of the storage, each array's pages striped over them. An
// in-process medium (emu-gpu:ram, emu-gpu:hbm, emu:ram) gets the graph
// written into it before any timing; a device must hold the image that
// `bam-graph load` wrote. Null media (emu-gpu:null) move no data: every
// edge reads as node 0 (cache pages start zeroed), which keeps PageRank's
// access pattern, not its ranks: the miss path with no medium behind it.
#pragma once

#include <bam/bam.cuh>

#include "graph_dataset.hpp"

#include <bam/emu/access.hpp>

#include <optional>
#include <string>

namespace bam::graph {

struct graph_location {
  std::string device;           //!< the device string
  device_spec spec;             //!< parsed
  bool in_process = false;      //!< a medium this process fills
  bool null_media = false;      //!< no data moved: the access pattern of an algorithm that does not depend on it
  std::uint64_t start_byte = 0; //!< the image's first byte on each controller
  std::string placement;        //!< in words, for the report
  double load_seconds = 0;      //!< in_process: writing the graph into the medium
};

//! The device a run reads the graph from: `device`, else the manifest's,
//! else pinned host RAM the size of the image (emu-gpu:ram).
//! `pattern_only`: the run needs the edges' pages, not their values, and
//! compares them with nothing (PageRank over offsets in GPU memory, a fixed
//! number of iterations, unchecked, no baselines), so null media will do.
inline graph_location choose_device(const std::string& device, const manifest& m, bool pattern_only = false) {
  graph_location l;
  l.device = device;
  if (l.device.empty())
    l.device = m.device ? m.device->device : "emu-gpu:ram=" + std::to_string((m.image().bytes() >> 20) + 2) + "M";
  l.spec = parse_device(l.device);
  l.null_media = l.spec.kind != device_kind::pci && l.spec.media == media_kind::null;
  if (l.null_media && !pattern_only)
    gnn_fail(l.device + ": null media keep no data; the graph needs a medium that holds it (emu-gpu:ram=SIZE, "
                        "emu-gpu:hbm=SIZE, a device bam-graph load wrote). Only pagerank --no-validate "
                        "--no-baselines, with the offsets in GPU memory and no --tolerance, runs on null media: "
                        "its pages do not depend on the edges' values");
  if (l.null_media) {
    l.placement = "null media: no data moved, every edge reads as node 0 (PageRank's access pattern, not its ranks)";
    return l;
  }
  l.in_process =
      l.spec.kind != device_kind::pci && (l.spec.media == media_kind::ram || l.spec.media == media_kind::hbm);
  if (!l.in_process) {
    if (!m.device || m.device->device != l.device)
      gnn_fail("the graph was not loaded onto " + l.device +
                   (m.device ? " (the manifest names " + m.device->device + ")" : " (the manifest names no device)") +
                   ": run bam-graph load DIR " + l.device +
                   ", or read it from an in-process medium (--device "
                   "emu-gpu:ram=SIZE)",
               ENOENT);
    l.start_byte = m.device->offset;
    l.placement = "on the device from byte " + std::to_string(l.start_byte) + " (manifest)";
  } else {
    l.placement = "written into the in-process medium before timing";
  }
  return l;
}

//! Writes `bytes` at `data` as an array starting at byte `start` of every
//! controller of `s` reads it: page k on controller k % n at `start` plus
//! (k / n) pages.
inline void fill_striped(const storage& s, std::uint64_t start, const void* data, std::uint64_t bytes,
                         std::uint64_t page) {
  const std::uint32_t n = s.controller_count();
  const auto* p = static_cast<const unsigned char*>(data);
  constexpr std::uint64_t piece = 64ull << 20;
  for (std::uint64_t k = 0, at = 0; at < bytes; ++k, at += n == 1 ? piece : page) {
    const std::uint64_t len = std::min(n == 1 ? piece : page, bytes - at);
    emu::write_media(s, static_cast<std::uint32_t>(k % n), n == 1 ? start + at : start + k / n * page, p + at, len);
  }
}

//! Checks that `s` can hold the graph where `l` says and, for an in-process
//! medium, writes it there. Throws `bam::error` otherwise.
inline void prepare_medium(graph_location& l, const storage& s, const manifest& m, const csr_graph& g,
                           std::uint32_t page_size) {
  if (l.start_byte % s.lba_size() != 0 || m.image().edges_at() % s.lba_size() != 0)
    gnn_fail(l.device + ": the image starts at byte " + std::to_string(l.start_byte) + ", not on an LBA boundary of " +
             std::to_string(s.lba_size()) + " bytes");
  if (l.null_media) return;
  if (!l.in_process) {
    if (s.controller_count() != 1)
      gnn_fail(l.device + ": names " + std::to_string(s.controller_count()) +
               " controllers; bam-graph load writes the image onto one");
    if (m.device->nsid != s.nsid())
      gnn_fail(l.device + ": the graph is on namespace " + std::to_string(m.device->nsid) + ", the storage opens " +
               std::to_string(s.nsid()));
    return;
  }
  const auto t0 = gnn::clock_type::now();
  fill_striped(s, 0, g.indptr.data(), m.image().offsets_bytes(), page_size);
  fill_striped(s, m.image().edges_at(), g.indices.data(), m.image().edges_bytes(), page_size);
  l.load_seconds = gnn::seconds_since(t0);
}

//! The graph's arrays on a storage, through one page cache.
struct cached_graph {
  page_cache cache;
  array<std::uint32_t> edges;
  std::optional<array<std::uint64_t>> offsets; //!< only when the offsets are read through the cache

  cached_graph(const storage& s, const graph_location& l, const manifest& m, std::uint64_t cache_bytes,
               std::uint32_t page_size, bool offsets_through_cache, cudaStream_t stream)
      : cache({.page_size = page_size, .capacity = cache_bytes}),
        edges(cache, s, std::max<std::uint64_t>(m.edges, 1), (l.start_byte + m.image().edges_at()) / s.lba_size(),
              stream) {
    if (offsets_through_cache) offsets.emplace(cache, s, m.nodes + 1, l.start_byte / s.lba_size(), stream);
  }
  //! log2 of the edges a cache page holds.
  unsigned edge_page_shift() const {
    unsigned k = 0;
    while ((4ull << k) < cache.page_size())
      ++k;
    return k;
  }
  //! Throws `bam::error` for a failure a kernel recorded.
  void check(cudaStream_t stream) {
    edges.check(stream);
    if (offsets) offsets->check(stream);
  }
};

} // namespace bam::graph
