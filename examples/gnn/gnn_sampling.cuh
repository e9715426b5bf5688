// SPDX-License-Identifier: MIT
// The neighbour sampling of `bam-gnn aggregate`'s mini-batches, on the GPU.
//
// Hop 0's set is `batch_size` seed nodes drawn uniformly. Hop l samples
// fanouts[l] neighbours of every node of hop l's set: all of them when the
// degree is at most the fanout, else uniformly with replacement. Hop l + 1's
// set is hop l's nodes and their samples, sorted and de-duplicated with CUB
// (DeviceRadixSort + DeviceSelect::Unique). Every set is sorted, so a node's
// place in it is a binary search (the aggregation's), and the last hop's set
// holds every other hop's nodes: its rows are all the features a batch needs.
// The sampling is a function of (seed, batch, hop, node, slot) alone: the
// same batches whatever the batches in flight or the run's timing.
#pragma once

#include "gnn_aggregate.hpp"
#include "gnn_cuda.cuh"
#include "gnn_features.hpp"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace bam::gnn {

//! Seeds of batch `batch`: `count` node ids drawn uniformly from [0, nodes).
__global__ inline void seeds_kernel(std::uint64_t* out, std::uint64_t count, std::uint64_t nodes, std::uint64_t seed,
                                    std::uint64_t batch) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    out[i] = mix64(mix64(seed ^ (batch * 0x9e3779b97f4a7c15ull)) + i) % nodes;
}

//! Samples `fanout` neighbours of each of `count` nodes: `sampled[i * fanout + k]`
//! (or no_node), and the candidates of the next hop's set: the nodes
//! themselves, then their samples (a node itself where a slot has none,
//! which the de-duplication removes).
__global__ inline void sample_kernel(const std::uint64_t* frontier, std::uint64_t count, const std::int64_t* indptr,
                                     const std::int32_t* indices, std::uint32_t fanout, std::uint64_t seed,
                                     std::uint64_t batch, std::uint32_t hop, std::uint64_t* sampled,
                                     std::uint64_t* cand) {
  const std::uint64_t total = count * fanout;
  for (std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
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

//! The graph's CSR in GPU memory.
struct device_csr {
  device_buffer<std::int64_t> indptr;
  device_buffer<std::int32_t> indices;
};

inline device_csr upload_csr(const std::vector<std::int64_t>& indptr, const std::vector<std::int32_t>& indices) {
  device_csr g{device_buffer<std::int64_t>(indptr.size()),
               device_buffer<std::int32_t>(std::max<std::size_t>(indices.size(), 1))};
  copy_to_device(g.indptr.get(), indptr.data(), indptr.size());
  copy_to_device(g.indices.get(), indices.data(), indices.size());
  return g;
}

//! The most candidates one hop's sort sees: the seeds, or hop l's nodes and
//! their fanouts[l] samples each (`cap`: hop_capacities).
inline std::uint64_t candidate_capacity(std::uint64_t batch_size, const std::vector<std::uint64_t>& cap,
                                        const std::vector<std::uint32_t>& fanouts) {
  std::uint64_t most = batch_size;
  for (std::size_t l = 0; l < fanouts.size(); ++l)
    most = std::max<std::uint64_t>(most, cap[l] * (1ull + fanouts[l]));
  return most;
}

//! One mini-batch's node sets in GPU memory, hop by hop, sized for the
//! largest batch the fanouts allow, and the scratch space that builds them.
struct sampled_batch {
  std::vector<device_buffer<std::uint64_t>> nodes;   //!< nodes[l]: hop l's nodes, sorted, unique (l = 0..hops)
  std::vector<device_buffer<std::uint64_t>> sampled; //!< sampled[l]: fanouts[l] samples per node of hop l, or no_node
  std::vector<std::uint64_t> count;                  //!< count[l]: the nodes of hop l's set (host)
  device_buffer<std::uint64_t> cand, sorted;         //!< a hop's candidates, before and after the sort
  device_buffer<unsigned char> temp;                 //!< CUB's scratch
  device_buffer<unsigned long long> count_dev;       //!< a hop's count, on the GPU
  pinned_buffer<unsigned long long> count_host;      //!< and where the host reads it
};

//! Samples mini-batches of `batch_size` seeds over a graph in GPU memory.
class neighbour_sampler {
public:
  //! `csr` (of `nodes` nodes) must outlive the sampler.
  neighbour_sampler(const device_csr& csr, std::uint64_t nodes, const std::vector<std::uint32_t>& fanouts,
                    std::uint64_t batch_size, std::uint64_t seed)
      : csr_(csr), nodes_(nodes), fanouts_(fanouts), batch_size_(batch_size), seed_(seed),
        cap_(hop_capacities(nodes, batch_size, fanouts)), cand_cap_(candidate_capacity(batch_size, cap_, fanouts)) {
    // The radix sort needs only the bits a node id can have.
    while (end_bit_ < 64 && (1ull << end_bit_) <= nodes)
      ++end_bit_;
    // CUB's scratch for the largest sort and de-duplication (a query: null
    // scratch sorts nothing, but CUB wants pointers).
    std::size_t sort_bytes = 0, unique_bytes = 0;
    device_buffer<std::uint64_t> probe(1);
    BAM_CUDA_TRY(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, probe.get(), probe.get(),
                                                static_cast<std::int64_t>(cand_cap_), 0, end_bit_));
    BAM_CUDA_TRY(cub::DeviceSelect::Unique(nullptr, unique_bytes, probe.get(), probe.get(),
                                           reinterpret_cast<unsigned long long*>(probe.get()),
                                           static_cast<std::int64_t>(cand_cap_)));
    temp_bytes_ = std::max<std::size_t>({sort_bytes, unique_bytes, 1});
  }

  std::uint32_t hops() const { return static_cast<std::uint32_t>(fanouts_.size()); }
  //! capacity()[l]: the most nodes hop l's set can hold (l = 0..hops).
  const std::vector<std::uint64_t>& capacity() const { return cap_; }

  //! The buffers of one batch in flight.
  sampled_batch make_batch() const {
    sampled_batch b;
    for (std::uint32_t l = 0; l <= hops(); ++l)
      b.nodes.emplace_back(cap_[l]);
    for (std::uint32_t l = 0; l < hops(); ++l)
      b.sampled.emplace_back(cap_[l] * fanouts_[l]);
    b.count.assign(hops() + 1, 0);
    b.cand = device_buffer<std::uint64_t>(cand_cap_);
    b.sorted = device_buffer<std::uint64_t>(cand_cap_);
    b.temp = device_buffer<unsigned char>(temp_bytes_);
    b.count_dev = device_buffer<unsigned long long>(1);
    b.count_host = pinned_buffer<unsigned long long>(1);
    return b;
  }

  //! Samples batch number `batch` into `b` on `stream`. Returns with the
  //! sets' kernels queued and their sizes in `b.count`: the host waits for
  //! each hop's count, the launch size of the next hop.
  void sample(sampled_batch& b, std::uint64_t batch, cudaStream_t stream) const {
    seeds_kernel<<<grid_for(batch_size_), block_threads, 0, stream>>>(b.cand.get(), batch_size_, nodes_, seed_, batch);
    BAM_CUDA_TRY(cudaGetLastError());
    b.count[0] = sort_unique(b, batch_size_, b.nodes[0].get(), stream);
    for (std::uint32_t l = 0; l < hops(); ++l) {
      const std::uint64_t n = b.count[l] * fanouts_[l];
      sample_kernel<<<grid_for(n), block_threads, 0, stream>>>(b.nodes[l].get(), b.count[l], csr_.indptr.get(),
                                                               csr_.indices.get(), fanouts_[l], seed_, batch, l,
                                                               b.sampled[l].get(), b.cand.get());
      BAM_CUDA_TRY(cudaGetLastError());
      b.count[l + 1] = sort_unique(b, b.count[l] + n, b.nodes[l + 1].get(), stream);
    }
  }

private:
  //! Sorts and de-duplicates the `n` candidates of `b` into `out`; returns
  //! how many are left (waits for `stream` alone: the other batches in
  //! flight keep running).
  std::uint64_t sort_unique(sampled_batch& b, std::uint64_t n, std::uint64_t* out, cudaStream_t stream) const {
    std::size_t bytes = b.temp.size();
    BAM_CUDA_TRY(cub::DeviceRadixSort::SortKeys(b.temp.get(), bytes, b.cand.get(), b.sorted.get(),
                                                static_cast<std::int64_t>(n), 0, end_bit_, stream));
    bytes = b.temp.size();
    BAM_CUDA_TRY(cub::DeviceSelect::Unique(b.temp.get(), bytes, b.sorted.get(), out, b.count_dev.get(),
                                           static_cast<std::int64_t>(n), stream));
    BAM_CUDA_TRY(cudaMemcpyAsync(b.count_host.get(), b.count_dev.get(), sizeof(unsigned long long),
                                 cudaMemcpyDeviceToHost, stream));
    BAM_CUDA_TRY(cudaStreamSynchronize(stream));
    return *b.count_host.get();
  }

  const device_csr& csr_;
  std::uint64_t nodes_;
  std::vector<std::uint32_t> fanouts_;
  std::uint64_t batch_size_, seed_;
  std::vector<std::uint64_t> cap_;
  std::uint64_t cand_cap_;
  int end_bit_ = 1;
  std::size_t temp_bytes_ = 1;
};

} // namespace bam::gnn
