// SPDX-License-Identifier: MIT
// The comparison harness of `bam-gnn aggregate` (aggregate_bench.cuh): the
// baselines, and the order of the report.
//
// Every baseline gathers the rows of the very batches the run gathered
// through bam, into GPU memory, and its batch 0 is compared with the
// reference rows: a path that is fast because it gathers the wrong bytes
// ends the run.
#include "aggregate_bench.cuh"
#include "aggregate_report.hpp"

#include "../../examples/gnn/gnn_cuda.cuh"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <optional>
#include <string>

namespace bam::gnn {

namespace {

//! One warp per row: rows `ids` of a table in GPU-reachable memory (GPU
//! memory, or pinned host memory read over PCIe) into `out`.
__global__ void table_gather_kernel(const unsigned char* table, std::uint64_t row_bytes, const std::uint64_t* ids,
                                    std::uint64_t count, unsigned char* out) {
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (std::uint64_t r = warp; r < count; r += warps) {
    const unsigned char* src = table + ids[r] * row_bytes;
    unsigned char* dst = out + r * row_bytes;
    // The widest loads the row size allows; __ldcg skips L1: each row is read once.
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

std::uint64_t available_host_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

//! Runs the baselines of a finished run, one after the other, on the
//! run's first stream (the run's batches are all done by then).
class baselines {
public:
  explicit baselines(const finished_run& run)
      : run_(run), rb_(run.m.features.row_bytes()), table_bytes_(run.m.nodes * rb_), staging_(run.max_batch_rows * rb_),
        out_(run.max_batch_rows * rb_), ids_(run.max_batch_rows) {}

  //! Every baseline, in the table's order.
  std::vector<path_result> run_all() {
    path_result cpu{"cpu-threads", "CPU threads (" + std::to_string(run_.pool.size()) +
                                       ") gather from host memory into pinned memory + one cudaMemcpyAsync"};
    path_result zero{"zero-copy", "GPU zero-copy gather from pinned host memory"};
    path_result cold{"mmap-cold",
                     "mmap of the feature file (page cache dropped: cold) + CPU threads + cudaMemcpyAsync"};
    path_result warm{"mmap-warm", "the same mmap again, the rows' pages now in the host page cache (warm) + "
                                  "CPU threads + cudaMemcpyAsync"};
    path_result hbm{"gpu-memory", "features resident in GPU memory, GPU gather"};
    const unsigned char* table = host_table(cpu, zero);
    if (table != nullptr) {
      gather_on_cpu(cpu, table);
      gather_on_gpu(zero, table);
    }
    through_mmap(cold, warm);
    from_gpu_memory(hbm, table);
    return {cpu, zero, cold, warm, hbm};
  }

private:
  //! Pinned host memory holding the table, for the CPU and zero-copy
  //! paths; nullptr (and the paths' reason) where it does not fit. With the
  //! table in one pinned-RAM controller of the GPU engine, that is the
  //! medium itself (the same bytes, laid out from byte 0): a table too
  //! large for two copies in host memory is still compared.
  const unsigned char* host_table(path_result& cpu, path_result& zero) {
    const feature_location& w = run_.where;
    const std::uint64_t avail = available_host_bytes();
    if (w.in_process && w.spec.kind == device_kind::emu_gpu && w.spec.media == media_kind::ram &&
        run_.s.controller_count() == 1 && w.start_lba == 0 && emu::gpu_engine_of(run_.s, 0) != nullptr) {
      cpu.what += ", reading the medium's own pinned memory";
      zero.what += " (the medium's own pinned memory)";
      return bam::emu::gpu_engine_of(run_.s, 0)->media_data();
    }
    if (avail != 0 && table_bytes_ + (1ull << 30) > avail) {
      cpu.why_not = zero.why_not = "the table (" + std::to_string(table_bytes_ >> 20) + " MiB) does not fit the " +
                                   std::to_string(avail >> 20) + " MiB of available host memory";
      return nullptr;
    }
    host_copy_.emplace(table_bytes_);
    read_table(run_.src, table_bytes_, host_copy_->get(), run_.pool);
    return host_copy_->get();
  }

  //! Batch 0's rows as `r` gathered them against the reference.
  void check_first(path_result& r) {
    const std::uint64_t rows = run_.batch_ids[0].size();
    std::vector<unsigned char> got(rows * rb_);
    copy_to_host(got.data(), out_.get(), got.size(), run_.stream);
    const std::int64_t bad = first_wrong_row(got.data(), run_.batch0_rows.data(), rows, rb_);
    if (bad >= 0)
      detail::gnn_fail(r.what + ": batch 0 row " + std::to_string(bad) + " differs from the reference", EIO);
    r.verified = true;
  }

  //! A GPU kernel reads the rows from `table` (GPU memory, or pinned host
  //! memory over PCIe); timed by events around the kernel alone.
  void gather_on_gpu(path_result& r, const unsigned char* table) {
    cuda_event a, z;
    const cudaStream_t st = run_.stream;
    for (std::size_t b = 0; b < run_.batch_ids.size(); ++b) {
      const auto& ids = run_.batch_ids[b];
      copy_to_device(ids_.get(), ids.data(), ids.size(), st);
      BAM_CUDA_TRY(cudaEventRecord(a.e, st));
      table_gather_kernel<<<grid_for(ids.size() * 32), block_threads, 0, st>>>(table, rb_, ids_.get(), ids.size(),
                                                                               out_.get());
      BAM_CUDA_TRY(cudaGetLastError());
      BAM_CUDA_TRY(cudaEventRecord(z.e, st));
      BAM_CUDA_TRY(cudaStreamSynchronize(st));
      r.seconds += elapsed_s(a, z);
      r.rows += ids.size();
      if (b == 0) check_first(r);
    }
    r.bytes = r.rows * rb_;
    r.ran = true;
  }

  //! A data loader's path: CPU threads copy the rows into pinned memory,
  //! one copy moves them to the GPU; timed from the first row to the copy's end.
  void gather_on_cpu(path_result& r, const unsigned char* table) {
    const cudaStream_t st = run_.stream;
    for (std::size_t b = 0; b < run_.batch_ids.size(); ++b) {
      const auto& ids = run_.batch_ids[b];
      const auto t0 = clock_type::now();
      cpu_gather_rows(run_.pool, table, run_.m.nodes, rb_, ids.data(), ids.size(), staging_.get());
      BAM_CUDA_TRY(cudaMemcpyAsync(out_.get(), staging_.get(), ids.size() * rb_, cudaMemcpyHostToDevice, st));
      BAM_CUDA_TRY(cudaStreamSynchronize(st));
      r.seconds += seconds_since(t0);
      r.rows += ids.size();
      if (b == 0) check_first(r);
    }
    r.bytes = r.rows * rb_;
    r.ran = true;
  }

  //! The CPU path over an mmap of the feature file: first with the file's
  //! pages dropped from the host page cache (cold), then again (warm).
  void through_mmap(path_result& cold, path_result& warm) {
    const std::string& path = run_.src.path();
    if (path.empty()) {
      cold.why_not = warm.why_not = "the dataset keeps no feature file (made with --no-features-file)";
      return;
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("opening " + path);
    const std::uint64_t offset = run_.m.features.file_offset;
    const std::uint64_t map_bytes = offset + table_bytes_;
    // Dirty pages are not dropped: write them back first.
    ::fdatasync(fd);
    const int adv = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void* p = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw_errno("mapping " + path, e);
    }
    if (adv != 0) cold.what += " (posix_fadvise failed: not cold)";
    try {
      gather_on_cpu(cold, static_cast<const unsigned char*>(p) + offset);
      // The cold pass read every page these rows touch: a second pass
      // finds them in the host page cache.
      gather_on_cpu(warm, static_cast<const unsigned char*>(p) + offset);
    } catch (...) {
      ::munmap(p, map_bytes);
      ::close(fd);
      throw;
    }
    ::munmap(p, map_bytes);
    ::close(fd);
  }

  //! The upper bound: the whole table copied into GPU memory (where it
  //! fits, with 1 GiB to spare), gathered by the GPU.
  void from_gpu_memory(path_result& hbm, const unsigned char* host_table) {
    std::size_t free_b = 0, total_b = 0;
    BAM_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    if (!host_table) {
      hbm.why_not = "the table is not in host memory to copy from";
    } else if (table_bytes_ + (1ull << 30) > free_b) {
      hbm.why_not = "the table (" + std::to_string(table_bytes_ >> 20) + " MiB) does not fit the " +
                    std::to_string(free_b >> 20) + " MiB of free GPU memory";
    } else {
      device_buffer<unsigned char> d_table(table_bytes_);
      BAM_CUDA_TRY(cudaMemcpy(d_table.get(), host_table, table_bytes_, cudaMemcpyHostToDevice));
      gather_on_gpu(hbm, d_table.get());
    }
  }

  const finished_run& run_;
  std::uint64_t rb_, table_bytes_;
  pinned_buffer<unsigned char> staging_; //!< the CPU paths' rows, before their copy to the GPU
  device_buffer<unsigned char> out_;     //!< every path's rows, on the GPU
  device_buffer<std::uint64_t> ids_;     //!< the GPU paths' row ids
  std::optional<pinned_buffer<unsigned char>> host_copy_;
};

gpu_description this_gpu() {
  gpu_description g;
  int dev = 0;
  cudaDeviceProp prop{};
  BAM_CUDA_TRY(cudaGetDevice(&dev));
  BAM_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  BAM_CUDA_TRY(cudaDriverGetVersion(&g.driver));
  g.name = prop.name;
  g.cuda_runtime = CUDART_VERSION;
  return g;
}

} // namespace

void report_aggregate(const finished_run& run) {
  const aggregate_options& o = run.options;
  const bool text = !o.json_stdout;
  // The figures first: the baselines take a while, and fail loudly.
  if (text) print_run_summary(o, run.m, run.figures);
  std::vector<path_result> others;
  if (o.compare) {
    others = baselines(run).run_all();
    if (text) print_comparison(run.figures, run.m.features.row_bytes(), run.batch_ids.size(), others);
  }
  if (!o.json_file.empty() || o.json_stdout)
    write_json(o, aggregate_json(o, run.m, run.figures, others, this_gpu(), commit_id(), utc_now()));
}

} // namespace bam::gnn
