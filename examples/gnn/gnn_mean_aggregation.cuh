// SPDX-License-Identifier: MIT
// The aggregation of `bam-gnn aggregate`'s mini-batches, on the GPU: from
// the last hop inwards, each node's representation is the mean of its own
// and the mean of its sampled neighbours' (GraphSAGE's mean aggregator,
// without the weights: the point is the data movement, not the model).
// The last hop's representations are the feature rows gathered through bam.
#pragma once

#include "gnn_aggregate.hpp"
#include "gnn_cuda.cuh"
#include "gnn_sampling.cuh"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace bam::gnn {

//! A node missing from the next hop's set (a sampling bug if it shows).
inline constexpr std::uint32_t no_pos = ~std::uint32_t{0};

__device__ inline std::uint32_t position_of(const std::uint64_t* sorted, std::uint64_t n, std::uint64_t v) {
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
__global__ inline void positions_kernel(const std::uint64_t* nodes, std::uint64_t count, const std::uint64_t* sampled,
                                        std::uint32_t fanout, const std::uint64_t* next, std::uint64_t next_count,
                                        std::uint32_t* self_pos, std::uint32_t* sample_pos) {
  const std::uint64_t total = count * (1ull + fanout);
  for (std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    if (t < count) {
      self_pos[t] = position_of(next, next_count, nodes[t]);
    } else {
      const std::uint64_t s = sampled[t - count];
      sample_pos[t - count] = s == no_node ? no_pos : position_of(next, next_count, s);
    }
  }
}

__device__ inline float as_float(float v) { return v; }
//! float16 features travel as their raw 16 bits (bam::array<std::uint16_t>).
__device__ inline float as_float(std::uint16_t v) { return __half2float(__ushort_as_half(v)); }

//! One warp per node of hop l: out = (own + mean of sampled neighbours) / 2,
//! over the representations `in` of hop l + 1's nodes. Any dim and fanout;
//! a lane reads one column of a row at a time.
template <class In>
__global__ void mean_kernel(const In* in, std::uint32_t dim, std::uint64_t count, std::uint32_t fanout,
                            const std::uint32_t* self_pos, const std::uint32_t* sample_pos, float* out,
                            unsigned long long* missing) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::uint64_t i = warp; i < count; i += warps) {
    const std::uint32_t self = self_pos[i];
    if (self == no_pos) {
      if (lane == 0) atomicAdd(missing, 1ull); // a node missing from the next hop's set: a sampling bug
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

//! Four consecutive columns of a row as floats: one 16-byte load of float
//! rows, one 8-byte load of float16 rows.
__device__ inline float4 load_quad(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ inline float4 load_quad(const std::uint16_t* p) {
  const uint2 r = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&r.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ inline void add_quad(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

//! mean_kernel for rows of a multiple of 4 columns and fanouts up to 32 (the
//! usual case): the warp first lists the node's sampled neighbours that are
//! in the next hop's set, then each lane reads four columns at a time from
//! four neighbours at once, so that a warp has several rows' loads in flight.
template <class In>
__global__ void mean_kernel_quads(const In* in, std::uint32_t dim, std::uint64_t count, std::uint32_t fanout,
                                  const std::uint32_t* self_pos, const std::uint32_t* sample_pos, float* out,
                                  unsigned long long* missing) {
  __shared__ std::uint32_t listed[block_threads / 32][32];
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  std::uint32_t* const pos = listed[threadIdx.x / 32];
  const std::uint32_t quads = dim / 4;
  for (std::uint64_t i = warp; i < count; i += warps) {
    const std::uint32_t self = self_pos[i];
    if (self == no_pos) {
      if (lane == 0) atomicAdd(missing, 1ull); // a node missing from the next hop's set: a sampling bug
      continue;
    }
    const std::uint32_t mine = lane < fanout ? sample_pos[i * fanout + lane] : no_pos;
    const unsigned present = __ballot_sync(~0u, mine != no_pos);
    const unsigned n = static_cast<unsigned>(__popc(present));
    if (mine != no_pos) pos[__popc(present & ((1u << lane) - 1))] = mine;
    __syncwarp();
    const float inv = n ? 1.0f / static_cast<float>(n) : 0.0f;
    const In* const own = in + std::uint64_t{self} * dim;
    for (std::uint32_t q = lane; q < quads; q += 32) {
      float4 sum = make_float4(0, 0, 0, 0);
      unsigned k = 0;
      for (; k + 4 <= n; k += 4) {
        const float4 a = load_quad(in + std::uint64_t{pos[k]} * dim + 4 * q);
        const float4 b = load_quad(in + std::uint64_t{pos[k + 1]} * dim + 4 * q);
        const float4 c = load_quad(in + std::uint64_t{pos[k + 2]} * dim + 4 * q);
        const float4 d = load_quad(in + std::uint64_t{pos[k + 3]} * dim + 4 * q);
        add_quad(sum, make_float4((a.x + b.x) + (c.x + d.x), (a.y + b.y) + (c.y + d.y), (a.z + b.z) + (c.z + d.z),
                                  (a.w + b.w) + (c.w + d.w)));
      }
      for (; k < n; ++k)
        add_quad(sum, load_quad(in + std::uint64_t{pos[k]} * dim + 4 * q));
      const float4 o = load_quad(own + 4 * q);
      *reinterpret_cast<float4*>(out + i * dim + 4 * q) =
          make_float4(0.5f * (o.x + sum.x * inv), 0.5f * (o.y + sum.y * inv), 0.5f * (o.z + sum.z * inv),
                      0.5f * (o.w + sum.w * inv));
    }
    __syncwarp(); // the list is rewritten for the warp's next node
  }
}

//! One hop's mean over `in`: the kernel for quads where the rows allow it.
template <class In>
void launch_mean(const In* in, std::uint32_t dim, std::uint64_t count, std::uint32_t fanout,
                 const std::uint32_t* self_pos, const std::uint32_t* sample_pos, float* out,
                 unsigned long long* missing, cudaStream_t stream) {
  const unsigned grid = grid_for(count * 32); // one warp a node
  if (dim % 4 == 0 && fanout <= 32)
    mean_kernel_quads<In>
        <<<grid, block_threads, 0, stream>>>(in, dim, count, fanout, self_pos, sample_pos, out, missing);
  else
    mean_kernel<In><<<grid, block_threads, 0, stream>>>(in, dim, count, fanout, self_pos, sample_pos, out, missing);
  BAM_CUDA_TRY(cudaGetLastError());
}

//! The aggregation's buffers for one mini-batch in flight, hop by hop.
struct mean_buffers {
  std::vector<device_buffer<std::uint32_t>> self_pos;   //!< hop l's nodes in hop l + 1's set
  std::vector<device_buffer<std::uint32_t>> sample_pos; //!< their samples in hop l + 1's set (or no_pos)
  std::vector<device_buffer<float>> h;                  //!< h[l]: hop l's representations (h[0]: the seeds')
};

//! `cap`: each hop's most nodes (neighbour_sampler::capacity()).
inline mean_buffers make_mean_buffers(const std::vector<std::uint64_t>& cap, const std::vector<std::uint32_t>& fanouts,
                                      std::uint32_t dim) {
  mean_buffers m;
  for (std::size_t l = 0; l < fanouts.size(); ++l) {
    m.self_pos.emplace_back(cap[l]);
    m.sample_pos.emplace_back(cap[l] * fanouts[l]);
    m.h.emplace_back(cap[l] * dim);
  }
  return m;
}

//! Queues the aggregation of batch `b` on `stream`: `rows` are the feature
//! rows of its last hop's nodes (dim elements each, in that set's order).
//! Every node missing from a next hop's set counts one in `*missing`.
template <class T>
void mean_aggregate(const sampled_batch& b, const T* rows, const std::vector<std::uint32_t>& fanouts, std::uint32_t dim,
                    mean_buffers& m, unsigned long long* missing, cudaStream_t stream) {
  const auto hops = static_cast<std::uint32_t>(fanouts.size());
  for (std::uint32_t l = hops; l-- > 0;) {
    const std::uint64_t n = b.count[l] * (1ull + fanouts[l]);
    positions_kernel<<<grid_for(n), block_threads, 0, stream>>>(b.nodes[l].get(), b.count[l], b.sampled[l].get(),
                                                                fanouts[l], b.nodes[l + 1].get(), b.count[l + 1],
                                                                m.self_pos[l].get(), m.sample_pos[l].get());
    BAM_CUDA_TRY(cudaGetLastError());
    // The last hop reads the gathered rows (float or float16); the hops
    // inside it the float representations just made.
    if (l + 1 == hops)
      launch_mean<T>(rows, dim, b.count[l], fanouts[l], m.self_pos[l].get(), m.sample_pos[l].get(), m.h[l].get(),
                     missing, stream);
    else
      launch_mean<float>(m.h[l + 1].get(), dim, b.count[l], fanouts[l], m.self_pos[l].get(), m.sample_pos[l].get(),
                         m.h[l].get(), missing, stream);
  }
}

//! Checks batch `b`'s aggregation (done, in `m`) against the host's
//! (mean_aggregate_reference) from `want`, the expected bytes of the rows of
//! its last hop's nodes. Throws `bam::error` (EIO) on a difference.
template <class T>
void check_mean_aggregation(const sampled_batch& b, const mean_buffers& m, const std::vector<std::uint32_t>& fanouts,
                            std::uint32_t dim, const std::vector<unsigned char>& want, cudaStream_t stream) {
  const std::size_t hops = fanouts.size();
  std::vector<std::vector<std::uint64_t>> nodes(hops + 1), sampled(hops);
  for (std::size_t l = 0; l <= hops; ++l) {
    nodes[l].resize(b.count[l]);
    copy_to_host(nodes[l].data(), b.nodes[l].get(), b.count[l], stream);
  }
  for (std::size_t l = 0; l < hops; ++l) {
    sampled[l].resize(b.count[l] * fanouts[l]);
    copy_to_host(sampled[l].data(), b.sampled[l].get(), sampled[l].size(), stream);
  }
  std::vector<float> rows(b.count[hops] * dim);
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
  const std::vector<float> ref = mean_aggregate_reference(nodes, sampled, fanouts, std::move(rows), dim);
  std::vector<float> got(ref.size());
  copy_to_host(got.data(), m.h[0].get(), got.size(), stream);
  // Equal up to rounding: the GPU may fuse multiplies and adds the host does apart.
  for (std::size_t k = 0; k < ref.size(); ++k)
    if (!(std::fabs(got[k] - ref[k]) <= 1e-4f * (1.0f + std::fabs(ref[k]))))
      detail::gnn_fail("batch 0: the aggregated features of seed node " + std::to_string(nodes[0][k / dim]) +
                           ", column " + std::to_string(k % dim) + ", are " + std::to_string(got[k]) +
                           " on the GPU and " + std::to_string(ref[k]) + " on the host",
                       EIO);
}

} // namespace bam::gnn
