// SPDX-License-Identifier: MIT
// The CUDA half of the package test's consumer: C++20 library headers in a
// .cu file (the host driver and the queue protocol), and a kernel that
// encodes NVMe read commands with bam's spec encoders.
#include <bam/controller.hpp>
#include <bam/nvme/queue.hpp>

#include <cuda_runtime.h>

#include <span>

__global__ void encode_reads(bam::nvme::command* out, unsigned count) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count)
    out[i] = bam::nvme::make_rw(bam::nvme::nvm_opcode::read, 1, 8ull * i, 8, 0x1000, 0);
}

int encode_reads_on_gpu(unsigned count) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return -1;
  bam::nvme::command* d = nullptr;
  if (cudaMalloc(&d, count * sizeof *d) != cudaSuccess) return -1;
  encode_reads<<<(count + 255) / 256, 256>>>(d, count);
  std::vector<bam::nvme::command> h(count);
  cudaMemcpy(h.data(), d, count * sizeof *d, cudaMemcpyDeviceToHost);
  cudaFree(d);
  int bad = 0;
  for (const auto& c : std::span(h))
    bad += !(c.opcode == static_cast<std::uint8_t>(bam::nvme::nvm_opcode::read) &&
             bam::nvme::command_slba(c) == 8ull * static_cast<std::uint64_t>(&c - h.data()) &&
             bam::nvme::command_nblocks(c) == 8);
  return bad;
}
