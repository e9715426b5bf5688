// SPDX-License-Identifier: MIT
// The GPU engine and the device-side I/O path below the cache: direct reads
// through small queues, the SSD model, no persistent kernel, requests that
// must be refused before they become commands, engine limits, and how GPU
// memory is mapped for a controller.
#include "test_util.cuh"

#include <catch2/catch_test_macros.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

using bam_test::counters;
using bam_test::device_counters;

namespace {

// Every thread reads `blocks` blocks (crossing pages: PRP lists) into its own
// part of a mapped GPU buffer and checks them.
__global__ void direct_read_kernel(bam::queue_set_ref q, const std::uint64_t* bus, std::uint8_t* buf,
                                   std::uint32_t blocks, std::uint32_t iters, std::uint32_t ctrl_index,
                                   std::uint64_t misalign, counters* c) {
  const std::uint64_t tid = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t bytes = static_cast<std::uint64_t>(blocks) * q.lba_size();
  // 512-byte (not 4 KiB) aligned destination: PRP1 carries an offset.
  const std::uint64_t offset = tid * (bytes + 512) + misalign;
  for (std::uint32_t it = 0; it < iters; ++it) {
    const std::uint64_t lba = bam_test::rnd(tid * 977 + it) % (q.blocks() - blocks);
    const bam::nvme::status st = q.read(lba, blocks, bus, offset);
    if (!st.ok()) {
      atomicAdd(&c->errors, 1ull);
      continue;
    }
    const auto* words = reinterpret_cast<const unsigned*>(buf + offset);
    unsigned long long b = 0;
    for (std::uint32_t w = 0; w < bytes / 4; ++w) {
      const std::uint64_t byte = w * 4ull;
      b += bam::detail::ld_cg(words + w) != bam_test::pattern(ctrl_index, lba + byte / q.lba_size(),
                                                              static_cast<std::uint32_t>((byte % q.lba_size()) / 4));
    }
    if (b) atomicAdd(&c->bad, b);
    atomicAdd(&c->done, 1ull);
  }
}

__global__ void trivial_kernel(int* p) { *p = 42; }

__global__ void xor_kernel(bam::array_ref<std::uint32_t> r, std::uint32_t* o) {
  std::uint32_t acc = 0;
  const std::uint64_t t = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  for (std::uint64_t i = t * 97; i < r.size(); i += 4099ull * gridDim.x * blockDim.x)
    acc ^= r[i];
  o[t] = acc;
}

__global__ void write_all_kernel(bam::array_ref<std::uint32_t> a) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < a.size();
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    a.write(i, static_cast<std::uint32_t>(i * 2654435761u));
}

struct direct_run {
  double seconds;
  counters c;
};

// `nblk` x `nthr` threads each read `blocks` blocks `iters` times from controller 0.
direct_run run_direct_reads(const bam::storage& s, int nblk, int nthr, std::uint32_t blocks, std::uint32_t iters,
                            std::uint64_t misalign = 0) {
  const std::size_t bytes = static_cast<std::size_t>(nblk) * nthr * (blocks * 512 + 512) + 4096;
  const std::size_t mapped = (bytes + bam::gpu_page_size - 1) / bam::gpu_page_size * bam::gpu_page_size;
  bam::detail::aligned_device_memory mem(mapped, bam::gpu_page_size);
  auto mapping = s.map(mem.data(), mem.size());
  device_counters c;
  const auto t0 = std::chrono::steady_clock::now();
  direct_read_kernel<<<nblk, nthr>>>(s.ref(0), mapping->bus_table(0), mem.data(), blocks, iters, 0, misalign, c.ptr());
  BAM_TEST_SYNC();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), c.get()};
}

} // namespace

TEST_CASE("GPU threads drive small queues hard: PRP lists, wrap-around, cid reuse", "[gpu][engine]") {
  // 4 queues of 16 entries for 16,384 threads, 64 KiB transfers (PRP lists).
  bam::storage s("emu-gpu:ram=64M,queues=4,depth=16");
  bam_test::fill_pattern(s);
  const int nblk = 64, nthr = 256;
  const direct_run r = run_direct_reads(s, nblk, nthr, /*blocks=*/128, /*iters=*/4);
  CHECK(r.c.errors == 0);
  CHECK(r.c.bad == 0);
  CHECK(r.c.done == static_cast<unsigned long long>(nblk) * nthr * 4);
  std::uint64_t served = 0;
  for (std::uint16_t q = 1; q <= 4; ++q)
    served += bam::emu::gpu_engine_of(s, 0)->served(q);
  CHECK(served == static_cast<std::uint64_t>(nblk) * nthr * 4);
}

TEST_CASE("a request PRPs cannot describe is refused before it becomes a command", "[gpu][engine][sanitize]") {
  bam::storage s("emu-gpu:hbm=8M,queues=2,depth=16");
  bam_test::fill_pattern(s);
  // A destination 2 bytes past a dword boundary: no PRP can point there.
  const direct_run r = run_direct_reads(s, 1, 32, 8, 1, /*misalign=*/2);
  CHECK(r.c.errors == 32);
  CHECK(r.c.done == 0);
  // Nothing reached the controller (no command with PRP1 = 0, no DMA to bus address 0).
  CHECK(bam::emu::gpu_engine_of(s, 0)->served(1) + bam::emu::gpu_engine_of(s, 0)->served(2) == 0);
  CHECK(bam::emu::software_controller(s, 0).counters().host_reads == 0);
}

TEST_CASE("the SSD model holds commands to its IOPS limit and its latency", "[gpu][engine]") {
  SECTION("iops=100K: 2,048 reads take at least 2,047 x 10 us") {
    bam::storage s("emu-gpu:hbm=16M,queues=8,depth=64,iops=100K");
    bam_test::fill_pattern(s);
    const direct_run r = run_direct_reads(s, 8, 256, 1, 1);
    CHECK(r.c.errors == 0);
    CHECK(r.c.bad == 0);
    CHECK(r.seconds >= 2047 * 10e-6 * 0.95);
  }
  SECTION("latency=2ms: four reads in a row take at least 8 ms") {
    bam::storage s("emu-gpu:hbm=16M,queues=2,depth=8,latency=2ms");
    bam_test::fill_pattern(s);
    const direct_run r = run_direct_reads(s, 1, 1, 1, 4);
    CHECK(r.c.errors == 0);
    CHECK(r.c.bad == 0);
    CHECK(r.seconds >= 4 * 2e-3 * 0.95);
  }
}

TEST_CASE("no persistent kernel: launch + cudaDeviceSynchronize works with lazy loading", "[gpu][engine][sanitize]") {
  // The hazard needs the default (lazy) module loading; refuse to pass vacuously.
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  INFO("CUDA_MODULE_LOADING=" << (loading ? loading : "(unset: lazy)"));
  REQUIRE((loading == nullptr || std::strcmp(loading, "LAZY") == 0));
  bam::storage s("emu-gpu:hbm=8M,queues=8,depth=32,timeout=5s");
  bam_test::fill_pattern(s);
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, (8ull << 20) / 4);
  bam::device_buffer<std::uint32_t> out(512);
  bam::device_buffer<int> flag(1);
  cudaStream_t s1, s2;
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  BAM_CUDA_TRY(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const auto t0 = std::chrono::steady_clock::now();
  // An I/O kernel (its first launch: its module is loaded lazily now), and
  // while it runs the first launch of another kernel on another stream; then
  // the ordinary cudaDeviceSynchronize. The engine's work is done by the I/O
  // kernel's own threads, so nothing waits for a kernel that never ends.
  xor_kernel<<<4, 128, 0, s1>>>(a.ref(), out.get());
  trivial_kernel<<<1, 1, 0, s2>>>(flag.get());
  BAM_TEST_SYNC();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("both kernels done in " << secs << " s");
  CHECK(secs < 10);
  int f = 0;
  bam::copy_to_host(&f, flag.get(), 1);
  CHECK(f == 42);
  REQUIRE_NOTHROW(a.check(s1));
  BAM_CUDA_TRY(cudaStreamDestroy(s1));
  BAM_CUDA_TRY(cudaStreamDestroy(s2));
}

// ---- the GPU engine's limits ------------------------------------------------

namespace {

//! A software controller with a GPU engine, built by hand.
struct engine_rig {
  std::shared_ptr<bam::emu::gpu_engine> engine;
  std::shared_ptr<bam::emu::emulated_controller> emu;
  explicit engine_rig(std::uint8_t dstrd, std::uint64_t bytes = 8 << 20) {
    bam::emu::gpu_engine_config ec;
    ec.media = bam::media_kind::hbm;
    ec.bytes = bytes;
    ec.max_qid = 8;
    engine = std::make_shared<bam::emu::gpu_engine>(ec);
    bam::emu::controller_config cc;
    cc.namespaces = {bam::emu::namespace_config{bytes / 512, 512, engine->namespace_media()}};
    cc.identity_dma = true;
    cc.io_engine = engine;
    cc.dstrd = dstrd;
    cc.max_io_queues = 8;
    cc.name = "emu-gpu-dstrd" + std::to_string(dstrd);
    emu = bam::emu::make_emulated_controller(cc);
  }
};

} // namespace

TEST_CASE("the GPU engine honours a doorbell stride other than 4 bytes", "[gpu][engine]") {
  engine_rig rig(2); // 16-byte stride
  bam::controller_options o;
  o.io_queues = 4;
  o.queue_depth = 32;
  auto ctrl = std::make_shared<bam::controller>(rig.emu, bam::detail::gpu_queue_options(o));
  CHECK(ctrl->cap().bits.dstrd == 2);
  bam::storage s(std::vector<std::shared_ptr<bam::controller>>{ctrl});
  bam_test::fill_pattern(*rig.emu);
  const direct_run r = run_direct_reads(s, 16, 128, 8, 4);
  CHECK(r.c.errors == 0);
  CHECK(r.c.bad == 0);
  CHECK(r.c.done == 16ull * 128 * 4);
}

TEST_CASE("the GPU engine refuses a second SQ on one CQ instead of misreporting SQ heads", "[gpu][engine]") {
  engine_rig rig(0);
  bam::controller_options o;
  o.io_queues = 1;
  o.queue_depth = 16;
  bam::controller ctrl(rig.emu, bam::detail::gpu_queue_options(o));
  ctrl.admin(bam::nvme::make_set_num_queues(2, 2));
  auto sq = bam::detail::device_region::make(ctrl.transport(), 16 * sizeof(bam::nvme::command));
  try {
    ctrl.admin(bam::nvme::make_create_io_sq(2, 16, sq->bus_address(0), /*cqid=*/1)); // CQ 1 has SQ 1 already
    FAIL("a second SQ on CQ 1 was accepted");
  } catch (const bam::error& e) {
    INFO(e.what());
    REQUIRE(e.status().has_value());
    CHECK(*e.status() == bam::nvme::status(bam::nvme::status_type::command_specific,
                                           bam::nvme::command_specific_status::invalid_completion_queue));
  }
}

// ---- how GPU memory is mapped for a controller --------------------------------

namespace {

std::atomic<int> unmapped_after_free{0};
std::atomic<int> regions_unmapped{0};

//! A transport in front of a software controller that maps GPU memory only
//! in 64 KiB units (as nvidia_p2p does) and checks, when a mapping is
//! undone, that the memory is still allocated.
class strict_transport final : public bam::transport {
public:
  explicit strict_transport(std::shared_ptr<bam::emu::emulated_controller> c) : c_(std::move(c)) {}
  std::string name() const override { return "strict(" + c_->name() + ")"; }
  std::uint32_t read32(std::uint32_t o) override { return c_->read32(o); }
  void write32(std::uint32_t o, std::uint32_t v) override { c_->write32(o, v); }
  volatile std::uint32_t* doorbell(std::uint32_t o) override { return c_->doorbell(o); }
  volatile std::uint32_t* device_doorbell(std::uint32_t o) override { return c_->device_doorbell(o); }
  bam::nvme::memory_scope device_doorbell_scope() const override { return c_->device_doorbell_scope(); }
  bam::device_progress device_progress_hook() const override { return c_->device_progress_hook(); }
  bool exact_sq_head() const override { return c_->exact_sq_head(); }
  std::size_t device_map_alignment() const override { return bam::gpu_page_size; }
  std::unique_ptr<bam::dma_region> map(void* p, std::size_t n, bam::memory_kind k) override {
    check_map_args(p, n, k); // throws for GPU memory not in 64 KiB units
    struct checked final : bam::dma_region {
      std::unique_ptr<bam::dma_region> inner;
      checked(std::unique_ptr<bam::dma_region> r)
          : bam::dma_region(r->data(), r->size(), r->kind(), r->page_bus()), inner(std::move(r)) {}
      ~checked() override {
        if (kind() == bam::memory_kind::device) {
          cudaPointerAttributes a{};
          if (cudaPointerGetAttributes(&a, data()) != cudaSuccess || a.type != cudaMemoryTypeDevice)
            ++unmapped_after_free;
          (void)cudaGetLastError();
          ++regions_unmapped;
        }
      }
    };
    return std::make_unique<checked>(c_->map(p, n, k));
  }

private:
  std::shared_ptr<bam::emu::emulated_controller> c_;
};

} // namespace

TEST_CASE("GPU memory is mapped in 64 KiB units and unmapped before it is freed", "[gpu][engine][mapping]") {
  unmapped_after_free = 0;
  regions_unmapped = 0;
  {
    engine_rig rig(0, 16 << 20);
    auto t = std::make_shared<strict_transport>(rig.emu);
    bam::controller_options o;
    o.io_queues = 4;
    o.queue_depth = 32;
    auto ctrl = std::make_shared<bam::controller>(t, bam::detail::gpu_queue_options(o)); // rings: 64 KiB units
    bam::storage s(std::vector<std::shared_ptr<bam::controller>>{ctrl});                 // PRP lists too
    bam_test::fill_pattern(*rig.emu);
    bam::page_cache cache({.page_size = 4096, .capacity = (1 << 20) + 4096}); // not a 64 KiB multiple
    {
      bam::array<std::uint32_t> a(cache, s, (16ull << 20) / 4);
      write_all_kernel<<<128, 256>>>(a.ref());
      BAM_TEST_SYNC();
      REQUIRE_NOTHROW(a.check());
      REQUIRE_NOTHROW(cache.flush());
    }
    std::vector<std::uint32_t> media((16 << 20) / 4);
    REQUIRE(rig.emu->namespace_media(1).read(0, media.data(), media.size() * 4) == 0);
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < media.size(); ++i)
      bad += media[i] != static_cast<std::uint32_t>(i * 2654435761u);
    CHECK(bad == 0);
  } // cache, storage, controller, engine: every mapping undone here
  CHECK(regions_unmapped > 0);
  CHECK(unmapped_after_free == 0);
}

TEST_CASE("flush reaches every controller, also past the 32nd", "[gpu][engine]") {
  bam::storage s("emu-gpu:hbm=1M,ssds=40,queues=2,depth=8");
  bam::page_cache cache({.page_size = 4096, .capacity = 1 << 20});
  bam::array<std::uint32_t> a(cache, s, (40ull << 20) / 4);
  write_all_kernel<<<64, 256>>>(a.ref());
  BAM_TEST_SYNC();
  REQUIRE_NOTHROW(a.check());
  REQUIRE_NOTHROW(cache.flush());
  std::uint32_t flushed = 0;
  for (std::uint32_t c = 0; c < s.controller_count(); ++c)
    flushed += bam::emu::software_controller(s, c).counters().flushes > 0;
  CHECK(flushed == 40);
}
