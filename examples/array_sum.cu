// SPDX-License-Identifier: MIT
// array_sum: a GPU kernel sums a storage-backed bam::array<float>.
//
//   array_sum --device emu-gpu:hbm=1G --n 100000000
//   array_sum --device emu:file=/tmp/data.img,size=1G      (CPU engine on a file)
//   array_sum --device /dev/bam-nvme0                      (a real SSD, kernel module)
//
// The array is first filled from the GPU (writes go through the page cache and
// are written back by flush()), then summed by a kernel reading it element by
// element; the cache turns the reads into NVMe commands that GPU threads submit.
#include <bam/bam.cuh>

#include <CLI/CLI.hpp>

#include <cstdio>

__global__ void fill(bam::array_ref<float> a) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < a.size();
       i += std::uint64_t(gridDim.x) * blockDim.x)
    a.write(i, float(i % 1000));
}

__global__ void sum(bam::array_ref<float> a, double* out) {
  double acc = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < a.size();
       i += std::uint64_t(gridDim.x) * blockDim.x)
    acc += a[i]; // element access: the page cache loads the page on a miss
  atomicAdd(out, acc);
}

int main(int argc, char** argv) {
  CLI::App app{"Sum a bam::array<float> on NVMe storage with a GPU kernel"};
  std::string device = "emu-gpu:hbm=1G";
  std::uint64_t n = 100'000'000;
  std::size_t cache_mib = 256;
  app.add_option("--device", device, "device string (emu-gpu:..., emu:..., /dev/bam-nvme0)");
  app.add_option("--n", n, "elements");
  app.add_option("--cache-mib", cache_mib, "page cache size in MiB");
  CLI11_PARSE(app, argc, argv);
  try {
    bam::storage dev(device); // controllers + queues for GPU threads
    bam::page_cache cache({.page_size = 4096, .capacity = cache_mib << 20});
    bam::array<float> a(cache, dev, n); // n floats from LBA 0

    fill<<<1024, 256>>>(a.ref());
    a.check();     // throws bam::error on a device-side failure
    cache.flush(); // dirty pages to storage, then NVMe Flush

    bam::device_buffer<double> out(1);
    sum<<<1024, 256>>>(a.ref(), out.get());
    a.check();
    double total = 0;
    bam::copy_to_host(&total, out.get(), 1);
    double expected = 0;
    for (std::uint64_t i = 0; i < n; ++i)
      expected += double(i % 1000);
    std::printf("sum of %llu floats on %s: %.0f (expected %.0f) %s\n", (unsigned long long)n,
                dev.transport_name().c_str(), total, expected, total == expected ? "OK" : "MISMATCH");
    return total == expected ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
