// SPDX-License-Identifier: MIT
// The program scripts/qemu-test runs inside the guest: the controller driver
// over pci_transport on QEMU's emulated NVMe, bound to bam_nvme. Every case
// prints one line "BAMTEST CASE <name> PASS|FAIL <detail>" that the host
// collects; the exit status is the number of failures.
//
// Nothing here assumes a geometry: LBA sizes, transfer limits, queue counts
// and depths and the namespaces come from identify. What QEMU was told
// (--expect, --inactive) is checked against what the driver found.
//
//   bam_qemu_test all /dev/bam-nvme0 [options]   every case below but mark and ioctl-fuzz, in order
//   bam_qemu_test identify|geometry|io|dmabuf|args|unpriv|fork|kill|multi|queues|mark|ioctl-fuzz DEV [options]
//   options: --blocks N (random I/O, default 12000)   --threads N (4)
//            --queues N (I/O queue pairs asked for, 4)  --depth N (entries asked for, 256)
//            --expect NSID:LBA,...  active namespaces and their LBA sizes as QEMU was told
//            --inactive NSID,...    namespace ids that must be inactive
//            --seconds N            ioctl-fuzz duration (default 5)
#include "guest_report.hpp"

#include <bam/host.hpp>
#include <bam/transport/kmod_abi.h>
#include <bam/transport/pci.hpp>

#include "bam_test_dmabuf.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using bam::guest::failures;
using bam::guest::info;
using bam::guest::report;

//! What the guest was asked to use, and what QEMU was told.
struct test_options {
  std::uint64_t blocks = 12000;
  unsigned threads = 4;
  std::uint32_t queues = 4;
  std::uint32_t depth = 256;
  std::string expect;   //!< "1:512,3:4096"
  std::string inactive; //!< "2,4"
  unsigned seconds = 5;
};
test_options opt;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::uint64_t mix(std::uint64_t x) { // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Block content derived from its LBA and a generation: a misplaced,
//! stale or torn block fails the comparison.
void fill_block(void* p, std::size_t bytes, std::uint64_t lba, std::uint64_t gen) {
  auto* w = static_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < bytes / 8; ++i)
    w[i] = mix(lba * 0x100000001b3ull + gen * 0x10001 + i);
  w[0] = lba;
  w[1] = gen;
}
bool check_block(const void* p, std::size_t bytes, std::uint64_t lba, std::uint64_t gen) {
  std::vector<std::uint64_t> want(bytes / 8);
  fill_block(want.data(), bytes, lba, gen);
  return std::memcmp(want.data(), p, bytes) == 0;
}

std::int64_t read_sysfs_int(const std::string& path) {
  std::ifstream f(path);
  std::int64_t v = -1;
  f >> v;
  return v;
}

//! Physical address of a (touched) virtual page, from /proc/self/pagemap (root).
std::uint64_t physical_address(const void* p) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return 0;
  std::uint64_t e = 0;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto off = reinterpret_cast<std::uintptr_t>(p) / page * sizeof e;
  const bool ok = ::pread(fd, &e, sizeof e, static_cast<off_t>(off)) == sizeof e;
  ::close(fd);
  if (!ok || !(e >> 63)) return 0;
  return (e & ((1ull << 55) - 1)) * page + reinterpret_cast<std::uintptr_t>(p) % page;
}

bool pins_released(std::string* detail) {
  // Release runs during exit, before the parent is told; allow a little slack anyway.
  for (int i = 0; i < 200; ++i) {
    const auto pinned = read_sysfs_int("/sys/class/bam-nvme/pinned_pages");
    const auto maps = read_sysfs_int("/sys/class/bam-nvme/mappings");
    if (pinned == 0 && maps == 0) {
      *detail = "pinned_pages=0 mappings=0";
      return true;
    }
    if (i == 199) *detail = "pinned_pages=" + std::to_string(pinned) + " mappings=" + std::to_string(maps);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

struct session {
  std::shared_ptr<bam::pci_transport> t;
  std::unique_ptr<bam::controller> c;
  explicit session(const std::string& dev) {
    t = std::make_shared<bam::pci_transport>(dev);
    bam::controller_options o;
    o.io_queues = opt.queues;
    o.queue_depth = opt.depth;
    o.io_timeout_ns = 30'000'000'000ull;
    o.admin_timeout_ns = 30'000'000'000ull;
    c = std::make_unique<bam::controller>(t, o);
  }
};

// ---------------------------------------------------------------------------

void case_identify(const std::string& dev) {
  session s(dev);
  auto& c = *s.c;
  const auto& ns = c.ns(1);
  info("pci", s.t->pci_address() + " vendor " + hex(s.t->info().vendor_id) + " device " + hex(s.t->info().device_id) +
                  " BAR0 " + std::to_string(s.t->info().bar0_size) + " bytes, DMA mask " + hex(s.t->info().dma_mask) +
                  ", IOMMU " + (s.t->iommu() ? "on" : "off"));
  info("model", c.model());
  info("serial", c.serial());
  info("firmware", c.firmware());
  info("namespaces", std::to_string(c.namespaces().size()) + ", ns1 " + std::to_string(ns.blocks) + " blocks x " +
                         std::to_string(ns.lba_size) + " B = " + std::to_string(ns.blocks * ns.lba_size >> 20) +
                         " MiB");
  info("io queues", std::to_string(c.io_queue_count()) + " x " + std::to_string(c.io_queue_depth()) +
                        " entries, MDTS-limited transfer " + std::to_string(c.max_transfer_bytes()));
  // The controller's own word on queues (Get Features, Number of Queues) and
  // CAP.MQES decide what the driver must have created.
  const bam::nvme::number_of_queues noq{c.admin(bam::nvme::make_get_features(bam::nvme::feature_id::number_of_queues))};
  const std::uint32_t want_queues = std::min({opt.queues, noq.bits.nsq + 1u, noq.bits.ncq + 1u});
  const std::uint32_t want_depth =
      std::min<std::uint32_t>(std::max<std::uint32_t>(opt.depth, 2), c.cap().bits.mqes + 1u);
  info("queue limits", "controller allocated " + std::to_string(noq.bits.nsq + 1u) + " SQs / " +
                           std::to_string(noq.bits.ncq + 1u) +
                           " CQs, CAP.MQES+1 = " + std::to_string(c.cap().bits.mqes + 1u));
  report("identify",
         c.serial() == "bamtest" && ns.blocks > 0 && c.io_queue_count() == want_queues &&
             c.io_queue_depth() == want_depth,
         "model '" + c.model() + "' serial '" + c.serial() + "' ns1 " + std::to_string(ns.blocks) + " blocks of " +
             std::to_string(ns.lba_size) + " B, " + std::to_string(c.io_queue_count()) + " I/O queue pairs (want " +
             std::to_string(want_queues) + ") of " + std::to_string(c.io_queue_depth()) + " entries (want " +
             std::to_string(want_depth) + ")");

  // alloc() memory is contiguous in bus address space (queues need it).
  {
    auto q = s.t->alloc(64 * 1024);
    bool contiguous = true;
    for (std::size_t i = 1; i < q->page_bus().size(); ++i)
      contiguous = contiguous && q->page_bus()[i] == q->page_bus()[0] + i * bam::dma_page_size;
    report("alloc-bus-contiguous", contiguous, "64 KiB from alloc() at bus " + hex(q->page_bus()[0]));
  }
  // Bus addresses: equal to physical addresses without an IOMMU, IOVAs with one.
  void* pinned = ::mmap(nullptr, 4 * bam::dma_page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(pinned, 0x5a, 4 * bam::dma_page_size);
  auto buf = s.t->map(pinned, 4 * bam::dma_page_size, bam::memory_kind::host);
  const std::uint64_t bus = buf->page_bus()[0];
  const std::uint64_t phys = physical_address(buf->data());
  info("dma", "bus address " + hex(bus) + ", physical address " + hex(phys));
  if (s.t->iommu())
    report("iommu-iova", phys != 0 && bus != phys, "bus " + hex(bus) + " != phys " + hex(phys));
  else
    report("bus-equals-phys", phys != 0 && bus == phys, "bus " + hex(bus) + " == phys " + hex(phys));
}

//! Random writes and reads with verification on namespace `nsid`, from
//! `nthreads` threads over every I/O queue.
void io_on_namespace(session& s, std::uint32_t nsid, std::uint64_t target_blocks, unsigned nthreads) {
  auto& c = *s.c;
  const auto& ns = c.ns(nsid);
  const std::uint32_t bs = ns.lba_size;
  const std::uint64_t span = std::min<std::uint64_t>(ns.blocks, 65536);
  const std::uint32_t max_run = 16;
  std::atomic<std::uint64_t> written{0}, verified{0}, bad{0};
  std::atomic<bool> error{false};
  std::string first_error;
  std::mutex em;
  const auto t0 = std::chrono::steady_clock::now();

  auto worker = [&](unsigned id) {
    try {
      // Thread `id` owns LBAs [lo, hi): concurrent writers never overlap.
      const std::uint64_t lo = span * id / nthreads, hi = span * (id + 1) / nthreads;
      std::vector<std::uint64_t> gen(hi - lo, 0);
      std::mt19937_64 rng(1234 + id);
      auto buf = s.t->alloc(max_run * bs);
      const std::uint32_t q = id % c.io_queue_count();
      std::uint64_t mine = 0;
      const std::uint64_t quota = (target_blocks + nthreads - 1) / nthreads;
      while (mine < quota) {
        const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % max_run);
        const std::uint64_t lba = lo + rng() % (hi - lo - n);
        for (std::uint32_t i = 0; i < n; ++i) {
          ++gen[lba + i - lo];
          fill_block(buf->as<unsigned char>() + i * bs, bs, lba + i, gen[lba + i - lo]);
        }
        c.write(nsid, lba, n, *buf, 0, q);
        // Read back a random earlier-written run right away.
        const std::uint64_t r = lo + rng() % (hi - lo - n);
        std::memset(buf->data(), 0xee, n * bs);
        c.read(nsid, r, n, *buf, 0, q);
        for (std::uint32_t i = 0; i < n; ++i)
          if (gen[r + i - lo] != 0 && !check_block(buf->as<unsigned char>() + i * bs, bs, r + i, gen[r + i - lo]))
            ++bad;
        mine += n;
        written += n;
      }
      // Full verification of everything this thread wrote.
      for (std::uint64_t lba = lo; lba < hi; lba += max_run) {
        const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(max_run, hi - lba));
        c.read(nsid, lba, n, *buf, 0, q);
        for (std::uint32_t i = 0; i < n; ++i) {
          if (gen[lba + i - lo] == 0) continue;
          if (check_block(buf->as<unsigned char>() + i * bs, bs, lba + i, gen[lba + i - lo]))
            ++verified;
          else
            ++bad;
        }
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(em);
      if (!error.exchange(true)) first_error = e.what();
    }
  };
  std::vector<std::thread> th;
  for (unsigned i = 0; i < nthreads; ++i)
    th.emplace_back(worker, i);
  for (auto& x : th)
    x.join();
  try {
    c.flush(nsid);
  } catch (const std::exception& e) {
    if (!error.exchange(true)) first_error = std::string("flush: ") + e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char detail[256];
  std::snprintf(detail, sizeof detail,
                "namespace %u (%u-byte blocks): %llu blocks written at random LBAs by %u threads on %u "
                "queues, %llu distinct blocks verified, %llu mismatches, %.1f s%s%s",
                nsid, bs, static_cast<unsigned long long>(written.load()), nthreads, c.io_queue_count(),
                static_cast<unsigned long long>(verified.load()), static_cast<unsigned long long>(bad.load()), secs,
                error ? ": " : "", first_error.c_str());
  report(nsid == 1 ? std::string("random-write-read-verify") : "random-write-read-verify-ns" + std::to_string(nsid),
         !error && bad == 0 && written >= target_blocks && verified > 0, detail);
}

void case_io(const std::string& dev, std::uint64_t target_blocks, unsigned nthreads) {
  session s(dev);
  for (const auto& ns : s.c->namespaces())
    io_on_namespace(s, ns.nsid, ns.nsid == 1 ? target_blocks : target_blocks / 4, nthreads);
}

void case_dmabuf(const std::string& dev) {
  const int exp = ::open("/dev/bam-test-dmabuf", O_RDWR | O_CLOEXEC);
  if (exp < 0) {
    report("dmabuf", false, "no /dev/bam-test-dmabuf (bam_test_dmabuf.ko not loaded)");
    return;
  }
  constexpr std::size_t bytes = 1 << 20;
  bam_test_dmabuf_create cr{};
  cr.size = bytes;
  if (::ioctl(exp, BAM_TEST_DMABUF_CREATE, &cr) != 0) {
    report("dmabuf", false, std::string("create: ") + std::strerror(errno));
    ::close(exp);
    return;
  }
  ::close(exp);
  void* cpu = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, cr.fd, 0);
  if (cpu == MAP_FAILED) {
    report("dmabuf", false, std::string("mmap dma-buf: ") + std::strerror(errno));
    ::close(cr.fd);
    return;
  }
  try {
    session s(dev);
    auto& c = *s.c;
    const std::uint32_t bs = c.ns(1).lba_size;
    const std::uint32_t nblk = static_cast<std::uint32_t>(bytes / bs);
    const std::uint64_t base = 70000 % (c.ns(1).blocks - 2 * nblk);
    auto region = s.t->map_dmabuf(cr.fd, 0, bytes, cpu, bam::memory_kind::device);
    ::close(cr.fd); // the mapping holds its own reference
    cr.fd = -1;
    info("dmabuf", "bus addresses of the dma-buf's first pages: " + hex(region->page_bus()[0]) + ", " +
                       hex(region->page_bus()[1]) + ", " + hex(region->page_bus()[2]));
    // dma-buf -> disk -> host memory
    for (std::uint32_t i = 0; i < nblk; ++i)
      fill_block(static_cast<unsigned char*>(cpu) + std::size_t{i} * bs, bs, base + i, 77);
    c.write(1, base, nblk, *region);
    auto host = s.t->alloc(bytes);
    c.read(1, base, nblk, *host);
    std::uint32_t bad = 0;
    for (std::uint32_t i = 0; i < nblk; ++i)
      if (!check_block(host->as<unsigned char>() + std::size_t{i} * bs, bs, base + i, 77)) ++bad;
    // host memory -> disk -> dma-buf
    for (std::uint32_t i = 0; i < nblk; ++i)
      fill_block(host->as<unsigned char>() + std::size_t{i} * bs, bs, base + nblk + i, 78);
    c.write(1, base + nblk, nblk, *host);
    std::memset(cpu, 0, bytes);
    c.read(1, base + nblk, nblk, *region);
    for (std::uint32_t i = 0; i < nblk; ++i)
      if (!check_block(static_cast<unsigned char*>(cpu) + std::size_t{i} * bs, bs, base + nblk + i, 78)) ++bad;
    report("dmabuf", bad == 0,
           "MAP_DMABUF of a 1 MiB exported buffer: write from it and read into it, " + std::to_string(2 * nblk) +
               " blocks, " + std::to_string(bad) + " mismatches");
  } catch (const std::exception& e) {
    report("dmabuf", false, e.what());
  }
  if (cr.fd >= 0) ::close(cr.fd);
  ::munmap(cpu, bytes);
}

//! ioctl that is expected to fail with `want`.
void expect_errno(const std::string& name, int fd, unsigned long cmd, void* arg, int want) {
  errno = 0;
  const int rc = ::ioctl(fd, cmd, arg);
  const int e = rc == 0 ? 0 : errno;
  report("arg-" + name, rc != 0 && e == want,
         std::string("got ") + (rc == 0 ? "success" : std::strerror(e)) + ", want " + std::strerror(want));
}

void case_args(const std::string& dev) {
  bam::pci_transport t(dev);
  const int fd = t.fd();
  const std::size_t pg = bam::dma_page_size;
  void* mem = ::mmap(nullptr, 64 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* ro = ::mmap(nullptr, 4 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::vector<std::uint64_t> bus(64);
  auto host = [&](std::uint64_t vaddr, std::uint64_t len, std::uint32_t count = 64, std::uint32_t flags = 0) {
    bam_kmod_map_host m{};
    m.vaddr = vaddr;
    m.length = len;
    m.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    m.bus_addr_count = count;
    m.flags = flags;
    return m;
  };
  const auto base = reinterpret_cast<std::uintptr_t>(mem);
  bam_kmod_map_host m;
  m = host(base, 0);
  expect_errno("zero-length", fd, BAM_KMOD_IOC_MAP_HOST, &m, EINVAL);
  m = host(base + 8, pg);
  expect_errno("unaligned-address", fd, BAM_KMOD_IOC_MAP_HOST, &m, EINVAL);
  m = host(base, pg + 512);
  expect_errno("unaligned-length", fd, BAM_KMOD_IOC_MAP_HOST, &m, EINVAL);
  m = host(base, 1ull << 50, ~0u);
  expect_errno("huge-length", fd, BAM_KMOD_IOC_MAP_HOST, &m, E2BIG);
  m = host(~0ull - pg + 1 - 16 * pg, 32 * pg);
  expect_errno("wrapping-range", fd, BAM_KMOD_IOC_MAP_HOST, &m, EINVAL);
  m = host(base, 16 * pg, 8);
  expect_errno("short-bus-array", fd, BAM_KMOD_IOC_MAP_HOST, &m, EINVAL);
  m = host(base, pg, 64, 1);
  expect_errno("nonzero-flags", fd, BAM_KMOD_IOC_MAP_HOST, &m, EINVAL);
  m = host(0x1000, pg);
  expect_errno("unmapped-memory", fd, BAM_KMOD_IOC_MAP_HOST, &m, EFAULT);
  m = host(reinterpret_cast<std::uintptr_t>(ro), pg);
  expect_errno("read-only-memory", fd, BAM_KMOD_IOC_MAP_HOST, &m, EFAULT);
  // The registers (VM_IO|VM_PFNMAP) cannot be pinned.
  {
    void* bar = ::mmap(nullptr, pg, PROT_READ, MAP_SHARED, fd, 0);
    m = host(reinterpret_cast<std::uintptr_t>(bar), pg);
    expect_errno("mmio-memory", fd, BAM_KMOD_IOC_MAP_HOST, &m, EFAULT);
    ::munmap(bar, pg);
  }
  m = host(base, pg);
  m.bus_addrs = 0x10;
  expect_errno("bad-bus-array-pointer", fd, BAM_KMOD_IOC_MAP_HOST, &m, EFAULT);
  expect_errno("bad-struct-pointer", fd, BAM_KMOD_IOC_MAP_HOST, reinterpret_cast<void*>(0x10), EFAULT);

  bam_kmod_unmap u{};
  u.handle = 0;
  expect_errno("unmap-handle-0", fd, BAM_KMOD_IOC_UNMAP, &u, EINVAL);
  u.handle = 4242;
  expect_errno("unmap-unknown-handle", fd, BAM_KMOD_IOC_UNMAP, &u, EINVAL);
  u.handle = 1ull << 40;
  expect_errno("unmap-huge-handle", fd, BAM_KMOD_IOC_UNMAP, &u, EINVAL);
  {
    m = host(base, 2 * pg);
    const bool mapped = ::ioctl(fd, BAM_KMOD_IOC_MAP_HOST, &m) == 0;
    u.handle = m.handle;
    const bool first = mapped && ::ioctl(fd, BAM_KMOD_IOC_UNMAP, &u) == 0;
    report("arg-map-unmap-ok", first, "handle " + std::to_string(m.handle));
    expect_errno("unmap-twice", fd, BAM_KMOD_IOC_UNMAP, &u, EINVAL);
  }

  // Coherent allocations (ALLOC).
  {
    bam_kmod_alloc al{};
    al.length = 0;
    expect_errno("alloc-zero-length", fd, BAM_KMOD_IOC_ALLOC, &al, EINVAL);
    al.length = 1ull << 40;
    expect_errno("alloc-huge", fd, BAM_KMOD_IOC_ALLOC, &al, E2BIG);
    al.length = 3000;
    expect_errno("alloc-unaligned", fd, BAM_KMOD_IOC_ALLOC, &al, EINVAL);
    errno = 0;
    void* p = ::mmap(nullptr, pg, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(999ull << 32));
    report("mmap-unknown-alloc", p == MAP_FAILED && errno == EINVAL, std::strerror(errno));
    // UNMAP while still mmap()ed: the memory stays valid until munmap.
    const auto before = read_sysfs_int("/sys/class/bam-nvme/mappings");
    al = {};
    al.length = 2 * pg;
    bool ok = ::ioctl(fd, BAM_KMOD_IOC_ALLOC, &al) == 0;
    void* q = ok ? ::mmap(nullptr, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(al.mmap_offset))
                 : MAP_FAILED;
    ok = ok && q != MAP_FAILED;
    bam_kmod_unmap uu{};
    uu.handle = al.handle;
    ok = ok && ::ioctl(fd, BAM_KMOD_IOC_UNMAP, &uu) == 0;
    const auto during = read_sysfs_int("/sys/class/bam-nvme/mappings");
    if (ok) std::memset(q, 0x77, 2 * pg);
    if (q != MAP_FAILED) ::munmap(q, 2 * pg);
    const auto after = read_sysfs_int("/sys/class/bam-nvme/mappings");
    report("alloc-unmap-before-munmap", ok && during == before + 1 && after == before,
           "mappings " + std::to_string(before) + " -> " + std::to_string(during) + " after UNMAP (still mmapped) -> " +
               std::to_string(after) + " after munmap");
  }

  // Wrong fd types.
  bam_kmod_map_dmabuf d{};
  d.length = pg;
  d.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
  d.bus_addr_count = 64;
  d.fd = fd; // a bam device is not a dma-buf
  expect_errno("dmabuf-not-a-dmabuf", fd, BAM_KMOD_IOC_MAP_DMABUF, &d, EINVAL);
  d.fd = 1000; // not open
  expect_errno("dmabuf-closed-fd", fd, BAM_KMOD_IOC_MAP_DMABUF, &d, EBADF);
  d.fd = -1;
  expect_errno("dmabuf-negative-fd", fd, BAM_KMOD_IOC_MAP_DMABUF, &d, EBADF);
  {
    const int nul = ::open("/dev/null", O_RDWR);
    bam_kmod_version v{};
    expect_errno("ioctl-on-dev-null", nul, BAM_KMOD_IOC_VERSION, &v, ENOTTY);
    ::close(nul);
  }
  {
    int dummy = 0;
    expect_errno("unknown-ioctl", fd, _IOW(BAM_KMOD_IOC_MAGIC, 0x7f, int), &dummy, ENOTTY);
    bam_kmod_version v{};
    v.pad = 1;
    expect_errno("version-nonzero-pad", fd, BAM_KMOD_IOC_VERSION, &v, EINVAL);
  }
  // Without bam_nvme_gpu (and NVIDIA), MAP_GPU says so.
  {
    bam_kmod_map_gpu g{};
    g.vaddr = 0x10000;
    g.length = 0x10000;
    g.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    g.bus_addr_count = 64;
    expect_errno("gpu-without-gpu-module", fd, BAM_KMOD_IOC_MAP_GPU, &g, EOPNOTSUPP);
    g.vaddr = 0x11000;
    expect_errno("gpu-unaligned", fd, BAM_KMOD_IOC_MAP_GPU, &g, EINVAL);
  }
  // mmap outside BAR0, at an offset, or private; the registers only
  // read-only and the doorbells only with a queue pair (shared access).
  {
    const std::size_t bar = (t.info().bar0_size + pg - 1) / pg * pg;
    errno = 0;
    void* p = ::mmap(nullptr, bar + pg, PROT_READ, MAP_SHARED, fd, 0);
    report("mmap-beyond-bar", p == MAP_FAILED && errno == EINVAL, std::strerror(errno));
    if (p != MAP_FAILED) ::munmap(p, bar + pg);
    errno = 0;
    p = ::mmap(nullptr, pg, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(2 * pg));
    report("mmap-offset", p == MAP_FAILED && errno == EINVAL, std::strerror(errno));
    if (p != MAP_FAILED) ::munmap(p, pg);
    errno = 0;
    p = ::mmap(nullptr, pg, PROT_READ, MAP_PRIVATE, fd, 0);
    report("mmap-private", p == MAP_FAILED && errno == EINVAL, std::strerror(errno));
    if (p != MAP_FAILED) ::munmap(p, pg);
    errno = 0;
    p = ::mmap(nullptr, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    report("mmap-registers-writable", p == MAP_FAILED && errno == EACCES, std::strerror(errno));
    if (p != MAP_FAILED) ::munmap(p, pg);
    errno = 0;
    p = ::mmap(nullptr, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, BAM_KMOD_DOORBELL_OFFSET);
    report("mmap-doorbells-without-queue", p == MAP_FAILED && errno == EPERM, std::strerror(errno));
    if (p != MAP_FAILED) ::munmap(p, pg);
  }
  // Queue pairs and admin commands through the module.
  {
    bam_kmod_alloc al{};
    al.length = 2 * pg;
    const bool allocated = ::ioctl(fd, BAM_KMOD_IOC_ALLOC, &al) == 0;
    auto qc = [&](std::uint64_t handle, std::uint64_t sq_off, std::uint64_t cq_off, std::uint32_t depth,
                  std::uint32_t flags = 0) {
      bam_kmod_queue_create q{};
      q.sq_handle = handle;
      q.sq_offset = sq_off;
      q.cq_handle = handle;
      q.cq_offset = cq_off;
      q.depth = depth;
      q.flags = flags;
      return q;
    };
    bam_kmod_queue_create q = qc(al.handle, 0, pg, 1);
    expect_errno("queue-depth-1", fd, BAM_KMOD_IOC_QUEUE_CREATE, &q, EINVAL);
    q = qc(al.handle, 0, pg, 1u << 20);
    expect_errno("queue-depth-over-mqes", fd, BAM_KMOD_IOC_QUEUE_CREATE, &q, EINVAL);
    q = qc(al.handle, 0, pg, 2, 1);
    expect_errno("queue-nonzero-flags", fd, BAM_KMOD_IOC_QUEUE_CREATE, &q, EINVAL);
    q = qc(4242, 0, pg, 2);
    expect_errno("queue-unknown-handle", fd, BAM_KMOD_IOC_QUEUE_CREATE, &q, EINVAL);
    q = qc(al.handle, 0, 2 * pg, 2);
    expect_errno("queue-ring-outside-mapping", fd, BAM_KMOD_IOC_QUEUE_CREATE, &q, EINVAL);
    q = qc(al.handle, 0, 512, 2);
    expect_errno("queue-ring-unaligned", fd, BAM_KMOD_IOC_QUEUE_CREATE, &q, EINVAL);
    q = qc(al.handle, 0, pg, 2);
    const bool created = allocated && ::ioctl(fd, BAM_KMOD_IOC_QUEUE_CREATE, &q) == 0;
    report("queue-create", created,
           "qid " + std::to_string(q.qid) + ", doorbells " + hex(q.sq_doorbell) + "/" + hex(q.cq_doorbell) + "; " +
               std::to_string(q.queues_free) + " of " + std::to_string(q.queues_total) + " free");
    bam_kmod_unmap uu{};
    uu.handle = al.handle;
    expect_errno("unmap-ring-in-use", fd, BAM_KMOD_IOC_UNMAP, &uu, EBUSY);
    errno = 0;
    void* db = ::mmap(nullptr, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, BAM_KMOD_DOORBELL_OFFSET);
    report("mmap-doorbells-with-queue", db != MAP_FAILED, std::strerror(errno));
    if (db != MAP_FAILED) ::munmap(db, pg);
    bam_kmod_queue_delete qd{};
    qd.qid = q.qid + 1000;
    expect_errno("queue-delete-not-held", fd, BAM_KMOD_IOC_QUEUE_DELETE, &qd, EINVAL);
    qd.qid = q.qid;
    errno = 0;
    const bool deleted = created && ::ioctl(fd, BAM_KMOD_IOC_QUEUE_DELETE, &qd) == 0;
    report("queue-delete", deleted, deleted ? "qid " + std::to_string(qd.qid) + " deleted" : std::strerror(errno));
    errno = 0;
    const bool unmapped = allocated && ::ioctl(fd, BAM_KMOD_IOC_UNMAP, &uu) == 0;
    report("unmap-ring-after-delete", unmapped, unmapped ? "unmapped" : std::strerror(errno));

    bam_kmod_admin a{};
    a.opcode = 0x01; // Create I/O SQ: only the module creates queues
    expect_errno("admin-create-queue-refused", fd, BAM_KMOD_IOC_ADMIN, &a, EPERM);
    a.opcode = 0xc0; // vendor specific
    expect_errno("admin-vendor-refused", fd, BAM_KMOD_IOC_ADMIN, &a, EPERM);
    std::vector<unsigned char> page(2 * pg);
    a = {};
    a.opcode = 0x06; // Identify
    a.cdw10 = 1;
    a.data = reinterpret_cast<std::uintptr_t>(page.data());
    a.data_len = 2 * pg;
    expect_errno("admin-data-too-long", fd, BAM_KMOD_IOC_ADMIN, &a, EINVAL);
    a.data_len = pg;
    a.data = 0;
    expect_errno("admin-length-without-pointer", fd, BAM_KMOD_IOC_ADMIN, &a, EINVAL);
    a = {};
    a.opcode = 0x02; // Get Log Page of 8 KiB (NUMDL 2047): more than the module's page
    a.cdw10 = 2 | (2047u << 16);
    a.data = reinterpret_cast<std::uintptr_t>(page.data());
    a.data_len = pg;
    expect_errno("admin-log-page-too-long", fd, BAM_KMOD_IOC_ADMIN, &a, EINVAL);
    a = {};
    a.opcode = 0x06;
    a.cdw10 = 1;
    a.data = reinterpret_cast<std::uintptr_t>(page.data());
    a.data_len = pg;
    const bool ok = ::ioctl(fd, BAM_KMOD_IOC_ADMIN, &a) == 0 && a.status == 0;
    const std::string sn(reinterpret_cast<const char*>(page.data()) + 4, 7);
    report("admin-identify", ok && sn == "bamtest", "status " + hex(a.status) + ", serial '" + sn + "'");
  }
  // Several processes at a time; the whole controller for one only.
  {
    errno = 0;
    const int second = ::open(dev.c_str(), O_RDWR);
    report("second-open-shared", second >= 0, second >= 0 ? "opened" : std::strerror(errno));
    if (second >= 0) {
      errno = 0;
      const int rc = ::ioctl(second, BAM_KMOD_IOC_EXCLUSIVE);
      report("exclusive-refused-while-shared", rc != 0 && errno == EBUSY, rc == 0 ? "granted" : std::strerror(errno));
      ::close(second);
    }
    try {
      bam::pci_transport t2(dev, bam::pci_access::exclusive);
      report("library-error-busy", false, "exclusive transport opened next to another");
    } catch (const bam::error& e) {
      report("library-error-busy", e.errnum() == EBUSY, e.what());
    }
  }
  ::munmap(mem, 64 * pg);
  ::munmap(ro, 4 * pg);
  try {
    bam::pci_transport missing("/dev/bam-nvme99");
    report("library-error-missing", false, "opened");
  } catch (const bam::error& e) {
    report("library-error-missing",
           e.errnum() == ENOENT && std::string(e.what()).find("bind-nvme") != std::string::npos, e.what());
  }
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text << '\n';
}

//! Run `fn` in a child as `uid` with group `gid` only; returns what it returned.
std::string run_as(uid_t uid, gid_t gid, const std::function<std::string()>& fn) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    std::string out;
    if (::setgroups(1, &gid) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0)
      out = "could not become uid " + std::to_string(uid);
    else
      out = fn();
    (void)!::write(pipefd[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

//! The errno uid/gid saw opening `dev` (0: it opened).
int open_errno_as(uid_t uid, gid_t gid, const std::string& dev) {
  const std::string r = run_as(uid, gid, [&] {
    const int fd = ::open(dev.c_str(), O_RDWR);
    const int e = fd < 0 ? errno : 0;
    if (fd >= 0) ::close(fd);
    return std::to_string(e);
  });
  return static_cast<int>(std::strtol(r.c_str(), nullptr, 10));
}

//! Run `fn` in a child as uid/gid 1000; returns the errno it saw opening `dev`.
int open_errno_as_user(const std::string& dev) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    int e = 0;
    if (::setgroups(0, nullptr) != 0 || ::setgid(1000) != 0 || ::setuid(1000) != 0) {
      e = -2;
    } else {
      const int fd = ::open(dev.c_str(), O_RDWR);
      e = fd < 0 ? errno : 0;
    }
    (void)!::write(pipefd[1], &e, sizeof e);
    ::_exit(0);
  }
  ::close(pipefd[1]);
  int e = -1;
  (void)!::read(pipefd[0], &e, sizeof e);
  ::close(pipefd[0]);
  ::waitpid(pid, nullptr, 0);
  return e;
}

void case_unpriv(const std::string& dev) {
  struct stat st {};
  ::stat(dev.c_str(), &st);
  int e = open_errno_as_user(dev);
  report("unprivileged-file-permission", e == EACCES,
         "uid 1000 opening a mode " + std::to_string(st.st_mode & 0777) +
             " node: " + (e > 0 ? std::strerror(e) : std::to_string(e)));
  ::chmod(dev.c_str(), 0666);
  e = open_errno_as_user(dev);
  report("unprivileged-no-cap-sys-rawio", e == EPERM,
         "uid 1000 opening a mode 0666 node: " + (e > 0 ? std::string(std::strerror(e)) : std::to_string(e)));

  // unprivileged=1: a member of the device's group uses it without
  // CAP_SYS_RAWIO where an IOMMU confines the controller; nobody else.
  const std::string param = "/sys/module/bam_nvme/parameters/unprivileged";
  const bool iommu = bam::pci_transport(dev).iommu();
  write_file(param, "1");
  ::chown(dev.c_str(), 0, 1000);
  ::chmod(dev.c_str(), 0660);
  const std::string member = run_as(1000, 1000, [&]() -> std::string {
    try {
      session s(dev);
      const std::uint32_t bs = s.c->ns(1).lba_size;
      const std::uint64_t lba = s.c->ns(1).blocks / 2;
      auto buf = s.t->alloc(8 * bs);
      for (std::uint32_t i = 0; i < 8; ++i)
        fill_block(buf->as<unsigned char>() + i * bs, bs, lba + i, 77);
      s.c->write(1, lba, 8, *buf);
      std::memset(buf->data(), 0, 8 * bs);
      s.c->read(1, lba, 8, *buf);
      for (std::uint32_t i = 0; i < 8; ++i)
        if (!check_block(buf->as<unsigned char>() + i * bs, bs, lba + i, 77)) return "read back differs";
      bam_kmod_admin a{};
      a.opcode = 0x80; // Format NVM
      a.nsid = 1;
      errno = 0;
      const int rc = ::ioctl(s.t->fd(), BAM_KMOD_IOC_ADMIN, &a);
      if (rc == 0 || errno != EPERM)
        return std::string("Format NVM answered ") + (rc == 0 ? "success" : std::strerror(errno));
      return "ok: I/O on queue pairs " + std::to_string(s.c->io_queue(0).qid) + ".., Format NVM refused (EPERM)";
    } catch (const std::exception& ex) {
      return ex.what();
    }
  });
  if (iommu)
    report("unprivileged-group-member-works", member.rfind("ok:", 0) == 0,
           "uid 1000, group 1000, unprivileged=1, IOMMU: " + member);
  else
    report("unprivileged-group-member-needs-iommu", member.find("CAP_SYS_RAWIO") != std::string::npos,
           "uid 1000, group 1000, unprivileged=1, no IOMMU: " + member);
  e = open_errno_as(1001, 1001, dev);
  report("unprivileged-other-user-refused", e == EACCES,
         "uid 1001, group 1001, mode 0660 root:1000: " + (e > 0 ? std::string(std::strerror(e)) : std::to_string(e)));
  write_file(param, "0");
  ::chown(dev.c_str(), st.st_uid, st.st_gid);
  ::chmod(dev.c_str(), st.st_mode & 07777);
}

int wait_status(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

void case_fork(const std::string& dev) {
  session s(dev);
  auto& c = *s.c;
  const std::uint32_t bs = c.ns(1).lba_size;
  // Memory the caller owns (not MADV_DONTFORK): the child gets a copy.
  const std::size_t bytes = 16 * bam::dma_page_size;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(mem, 0x11, bytes);
  auto region = s.t->map(mem, bytes, bam::memory_kind::host);
  auto owned = s.t->alloc(bytes); // MADV_DONTFORK
  const auto handle = static_cast<bam::detail::kmod_region*>(region.get())->handle();
  const int fd = s.t->fd();
  volatile std::uint32_t* bar = s.t->doorbell(0x1c); // CSTS

  // 1. The child may not use the parent's fd state.
  pid_t pid = ::fork();
  if (pid == 0) {
    int bad = 0;
    bam_kmod_version v{};
    if (!(::ioctl(fd, BAM_KMOD_IOC_VERSION, &v) != 0 && errno == EACCES)) bad |= 1;
    bam_kmod_unmap u{};
    u.handle = handle;
    if (!(::ioctl(fd, BAM_KMOD_IOC_UNMAP, &u) != 0 && errno == EACCES)) bad |= 2;
    std::vector<std::uint64_t> bus(1);
    bam_kmod_map_host m{};
    m.vaddr = reinterpret_cast<std::uintptr_t>(mem);
    m.length = bam::dma_page_size;
    m.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    m.bus_addr_count = 1;
    if (!(::ioctl(fd, BAM_KMOD_IOC_MAP_HOST, &m) != 0 && errno == EACCES)) bad |= 4;
    if (::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0) != MAP_FAILED || errno != EACCES) bad |= 8;
    std::memset(mem, 0x22, bytes); // the child's copy only
    ::_exit(bad);
  }
  int st = wait_status(pid);
  report("fork-child-refused", WIFEXITED(st) && WEXITSTATUS(st) == 0,
         "child ioctl/mmap on the inherited fd: " + std::string(WIFEXITED(st) && WEXITSTATUS(st) == 0
                                                                    ? "all EACCES"
                                                                    : "bitmask " + std::to_string(WEXITSTATUS(st))));

  // 2. The child has no registers (VM_DONTCOPY) and no MADV_DONTFORK buffers.
  pid = ::fork();
  if (pid == 0) {
    (void)*bar;
    ::_exit(0);
  }
  st = wait_status(pid);
  report("fork-no-bar-in-child", WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
         WIFSIGNALED(st) ? std::string("child killed by ") + strsignal(WTERMSIG(st)) : "child read BAR0");
  pid = ::fork();
  if (pid == 0) {
    (void)*static_cast<volatile unsigned char*>(owned->data());
    ::_exit(0);
  }
  st = wait_status(pid);
  report("fork-no-alloc-buffer-in-child", WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
         WIFSIGNALED(st) ? std::string("child killed by ") + strsignal(WTERMSIG(st)) : "child read it");

  // 3. The parent's pinned pages stay the DMA target after fork + writes (no COW split).
  std::memset(mem, 0x33, bytes); // would break COW to a new page if the pin did not hold
  const std::uint64_t lba = 123456 % (c.ns(1).blocks - bytes / bs);
  auto src = s.t->alloc(bytes);
  for (std::size_t i = 0; i < bytes / bs; ++i)
    fill_block(src->as<unsigned char>() + i * bs, bs, lba + i, 99);
  c.write(1, lba, static_cast<std::uint32_t>(bytes / bs), *src);
  c.read(1, lba, static_cast<std::uint32_t>(bytes / bs), *region);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < bytes / bs; ++i)
    if (!check_block(static_cast<unsigned char*>(mem) + i * bs, bs, lba + i, 99)) ++bad;
  report("fork-parent-dma-intact", bad == 0,
         "DMA into the parent's pinned buffer after fork: " + std::to_string(bad) + " bad blocks");
  region.reset();
  ::munmap(mem, bytes);
}

//! Generation of the blocks the killed process writes and flushes before its
//! I/O storm (at the end of namespace 1, where the storm never goes).
constexpr std::uint64_t kill_kept_gen = 4242;
constexpr std::size_t kill_kept_bytes = 64 * 1024;

void case_kill(const std::string& dev) {
  int ready[2];
  if (::pipe(ready) != 0) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    try {
      session s(dev);
      auto& c = *s.c;
      const std::uint32_t bs = c.ns(1).lba_size;
      const std::uint64_t kept_blocks = std::max<std::uint64_t>(1, kill_kept_bytes / bs);
      const std::uint64_t kept_lba = c.ns(1).blocks - kept_blocks;
      {
        auto kept = s.t->alloc(kept_blocks * bs);
        for (std::uint64_t i = 0; i < kept_blocks; ++i)
          fill_block(kept->as<unsigned char>() + i * bs, bs, kept_lba + i, kill_kept_gen);
        c.write(1, kept_lba, static_cast<std::uint32_t>(kept_blocks), *kept);
        c.flush(1);
      }
      std::atomic<std::uint64_t> ops{0};
      std::vector<std::thread> th;
      for (unsigned i = 0; i < 4; ++i)
        th.emplace_back([&, i] {
          // Pinned user memory (MAP_HOST), next to the coherent queue memory.
          void* mem = ::mmap(nullptr, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          auto buf = s.t->map(mem, 64 * 1024, bam::memory_kind::host);
          std::mt19937_64 rng(i);
          const auto per_io = static_cast<std::uint32_t>(buf->size() / c.ns(1).lba_size);
          for (;;) {
            const std::uint64_t lba = rng() % (kept_lba - per_io);
            if (rng() & 1)
              c.read(1, lba, per_io, *buf, 0, i % c.io_queue_count());
            else
              c.write(1, lba, per_io, *buf, 0, i % c.io_queue_count());
            ++ops;
          }
        });
      while (ops < 200)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const char r = 'r';
      (void)!::write(ready[1], &r, 1);
      for (auto& x : th)
        x.join(); // never returns: SIGKILL
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(ready[1]);
  char r = 0;
  const bool got = ::read(ready[0], &r, 1) == 1;
  ::close(ready[0]);
  const auto pinned_during = read_sysfs_int("/sys/class/bam-nvme/pinned_pages");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(pid, SIGKILL);
  const int st = wait_status(pid);
  std::string detail;
  const bool released = pins_released(&detail);
  report("sigkill-mid-io-releases-pins",
         got && pinned_during > 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && released,
         "pinned_pages during I/O " + std::to_string(pinned_during) + ", after SIGKILL " + detail);
  // The controller was stopped and can be brought up again by a new process,
  // which reads what the killed one wrote and flushed before its I/O storm.
  try {
    session s(dev);
    auto buf = s.t->alloc(std::max<std::size_t>(4096, s.c->ns(1).lba_size));
    s.c->read(1, 0, static_cast<std::uint32_t>(buf->size() / s.c->ns(1).lba_size), *buf);
    report("reopen-after-kill", true, "bring-up and I/O by the next process work");
    const std::uint32_t bs = s.c->ns(1).lba_size;
    const std::uint64_t kept_blocks = std::max<std::uint64_t>(1, kill_kept_bytes / bs);
    const std::uint64_t kept_lba = s.c->ns(1).blocks - kept_blocks;
    auto kept = s.t->alloc(kept_blocks * bs);
    s.c->read(1, kept_lba, static_cast<std::uint32_t>(kept_blocks), *kept);
    std::size_t bad = 0;
    for (std::uint64_t i = 0; i < kept_blocks; ++i)
      if (!check_block(kept->as<unsigned char>() + i * bs, bs, kept_lba + i, kill_kept_gen)) ++bad;
    report("reopen-after-kill-reads-flushed", got && bad == 0,
           std::to_string(bad) + " of " + std::to_string(kept_blocks) + " blocks flushed before the kill differ (LBA " +
               std::to_string(kept_lba) + ")");
  } catch (const std::exception& e) {
    report("reopen-after-kill", false, e.what());
  }
  std::string d2;
  report("pins-zero-after-close", pins_released(&d2), d2);
}

// ---------------------------------------------------------------------------
// Several processes on one controller

//! What a child of case_multi tells the parent.
struct multi_msg {
  enum kind_t : int { ready = 1, done = 2, failed = 3 } kind = failed;
  std::uint32_t nqids = 0;
  std::uint16_t qids[8] = {};
  std::uint64_t passes = 0, verified = 0, bad = 0;
  char text[400] = {};
};

struct multi_child {
  pid_t pid = -1;
  int to = -1;   //!< parent -> child: 'g' go, 's' stop
  int from = -1; //!< child -> parent: multi_msg
  multi_msg first;
};

void send_msg(int fd, multi_msg m) { (void)!::write(fd, &m, sizeof m); }
bool recv_msg(int fd, multi_msg& m) { return ::read(fd, &m, sizeof m) == static_cast<ssize_t>(sizeof m); }

//! A child: its own session (queue pairs from the module), then passes of
//! writing every block of [lo, lo + n) and verifying every block, until the
//! parent says stop (a victim is never told: it is killed mid-pass).
void multi_child_main(const std::string& dev, int to, int from, std::uint64_t lo, std::uint64_t n, std::uint64_t tag) {
  multi_msg m;
  try {
    session s(dev);
    auto& c = *s.c;
    m.kind = multi_msg::ready;
    m.nqids = std::min<std::uint32_t>(c.io_queue_count(), 8);
    for (std::uint32_t i = 0; i < m.nqids; ++i)
      m.qids[i] = c.io_queue(i).qid;
    send_msg(from, m);
    char go = 0;
    if (::read(to, &go, 1) != 1) ::_exit(1);
    const std::uint32_t bs = c.ns(1).lba_size;
    constexpr std::uint32_t run = 16;
    auto buf = s.t->alloc(run * bs);
    m = {};
    for (std::uint64_t gen = tag * 1000 + 1;; ++gen) {
      for (std::uint64_t b = 0; b < n; b += run) {
        const auto k = static_cast<std::uint32_t>(std::min<std::uint64_t>(run, n - b));
        for (std::uint32_t i = 0; i < k; ++i)
          fill_block(buf->as<unsigned char>() + i * bs, bs, lo + b + i, gen);
        c.write(1, lo + b, k, *buf, 0, static_cast<std::uint32_t>((b / run) % c.io_queue_count()));
      }
      for (std::uint64_t b = 0; b < n; b += run) {
        const auto k = static_cast<std::uint32_t>(std::min<std::uint64_t>(run, n - b));
        std::memset(buf->data(), 0xee, std::size_t{k} * bs);
        c.read(1, lo + b, k, *buf, 0, static_cast<std::uint32_t>((b / run) % c.io_queue_count()));
        for (std::uint32_t i = 0; i < k; ++i) {
          if (check_block(buf->as<unsigned char>() + i * bs, bs, lo + b + i, gen))
            ++m.verified;
          else
            ++m.bad;
        }
      }
      ++m.passes;
      pollfd p{to, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) break;
    }
    m.kind = multi_msg::done;
  } catch (const std::exception& e) {
    m.kind = multi_msg::failed;
    std::snprintf(m.text, sizeof m.text, "%s", e.what());
  }
  send_msg(from, m);
  ::_exit(0);
}

multi_child spawn_multi_child(const std::string& dev, std::uint64_t lo, std::uint64_t n, std::uint64_t tag) {
  int to[2], from[2];
  multi_child c;
  if (::pipe(to) != 0 || ::pipe(from) != 0) return c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::close(to[1]);
    ::close(from[0]);
    multi_child_main(dev, to[0], from[1], lo, n, tag);
  }
  ::close(to[0]);
  ::close(from[1]);
  c.to = to[1];
  c.from = from[0];
  return c;
}

std::string qid_list(const multi_msg& m) {
  std::string s;
  for (std::uint32_t i = 0; i < m.nqids; ++i)
    s += (s.empty() ? "" : ",") + std::to_string(m.qids[i]);
  return s.empty() ? "-" : s;
}

std::string sysfs_of(const std::string& dev, const std::string& attr) {
  std::ifstream f("/sys/class/bam-nvme/" + dev.substr(dev.rfind('/') + 1) + "/" + attr);
  std::string all, line;
  while (std::getline(f, line))
    all += line + "\n";
  return all;
}

//! `bam list` as a user runs it; every line also goes to the log.
std::string bam_list() {
  std::string out;
  if (FILE* p = ::popen("/bin/bam list 2>&1", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, p) != nullptr) {
      out += line;
      std::string l(line);
      if (!l.empty() && l.back() == '\n') l.pop_back();
      info("bam list", l);
    }
    ::pclose(p);
  }
  return out;
}

//! `nproc` processes, each with its own queue pairs, write and verify
//! disjoint LBA ranges at once. With `kill_one`, the last of them is
//! SIGKILLed mid-I/O; the others go on, its queue pairs must be deleted and
//! a new process gets the same ids again.
void multi_run(const std::string& dev, unsigned nproc, bool kill_one) {
  const std::string tag = "multi-" + std::to_string(nproc);
  std::uint64_t ns_blocks = 0, total = 0;
  {
    bam::pci_transport t(dev);
    total = t.ctrl_info().queues_total;
    session s(dev);
    ns_blocks = s.c->ns(1).blocks;
  }
  // Disjoint ranges in the first half (the kill case keeps data at the end).
  const std::uint64_t span = std::min<std::uint64_t>(ns_blocks / 2 / nproc, 512);
  std::vector<multi_child> kids;
  for (unsigned i = 0; i < nproc; ++i) {
    kids.push_back(spawn_multi_child(dev, i * span, span, i + 1));
    if (!recv_msg(kids.back().from, kids.back().first)) kids.back().first.kind = multi_msg::failed;
  }
  std::vector<std::size_t> ready;
  std::string refusals;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    if (kids[i].first.kind == multi_msg::ready)
      ready.push_back(i);
    else
      refusals += std::string(refusals.empty() ? "" : " | ") + kids[i].first.text;
  }
  // Each child asks for opt.queues pairs: the controller has them or says it has not.
  const std::size_t can = std::min<std::size_t>(nproc, total);
  if (ready.size() < nproc)
    report(tag + "-exhausted",
           ready.size() == can && refusals.find("no I/O queue pair left") != std::string::npos &&
               refusals.find("I/O queue pairs, 0 free") != std::string::npos,
           std::to_string(ready.size()) + " of " + std::to_string(nproc) +
               " processes got queue pairs (the controller has " + std::to_string(total) + "): " + refusals);
  std::string holders;
  for (auto i : ready)
    holders += (holders.empty() ? "" : ", ") + std::string("pid ") + std::to_string(kids[i].pid) + ": " +
               qid_list(kids[i].first);
  if (nproc == 4) {
    const std::string table = bam_list();
    bool all_listed = true;
    for (auto i : ready)
      all_listed = all_listed && table.find("  " + std::to_string(kids[i].pid) + " ") != std::string::npos &&
                   table.find(qid_list(kids[i].first)) != std::string::npos;
    std::string flat = table;
    std::replace(flat.begin(), flat.end(), '\n', '|');
    report(tag + "-bam-list", all_listed, flat);
  }
  const bool victim = kill_one && ready.size() >= 2;
  for (auto i : ready)
    (void)!::write(kids[i].to, "g", 1);

  std::string kill_detail = "no process killed";
  if (victim) {
    multi_child& v = kids[ready.back()];
    const auto free_before = sysfs_of(dev, "io_queues");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(v.pid, SIGKILL);
    const int st = wait_status(v.pid);
    // Release runs before the parent hears of the death.
    const std::string clients = sysfs_of(dev, "clients");
    const bool gone = clients.find(std::to_string(v.pid) + " ") == std::string::npos;
    // A new process gets the ids back (the controller accepted Create again).
    multi_child again = spawn_multi_child(dev, nproc * span, span, 99);
    multi_msg m;
    const bool got = recv_msg(again.from, m) && m.kind == multi_msg::ready;
    bool same = got && m.nqids >= v.first.nqids;
    for (std::uint32_t i = 0; same && i < v.first.nqids; ++i)
      same = std::find(m.qids, m.qids + m.nqids, v.first.qids[i]) != m.qids + m.nqids;
    ::close(again.to); // its read of 'go' fails: it exits
    wait_status(again.pid);
    ::close(again.from);
    report(tag + "-killed-queues-deleted", WIFSIGNALED(st) && gone && same,
           "pid " + std::to_string(v.pid) + " held " + qid_list(v.first) +
               ", SIGKILLed mid-I/O: " + (gone ? "gone from clients" : "still listed: " + clients) +
               "; a new process got " + (got ? qid_list(m) : std::string(m.text)) +
               " (io_queues before the kill: " + free_before.substr(0, free_before.size() - 1) + ")");
    kill_detail = "pid " + std::to_string(v.pid) + " killed mid-I/O";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  bool ok = true;
  std::string results;
  for (std::size_t r = 0; r < ready.size() - (victim ? 1 : 0); ++r) {
    multi_child& k = kids[ready[r]];
    (void)!::write(k.to, "s", 1);
    multi_msg m;
    const bool got = recv_msg(k.from, m);
    wait_status(k.pid);
    ok = ok && got && m.kind == multi_msg::done && m.bad == 0 && m.verified >= span && m.passes >= 1;
    results += (results.empty() ? "" : "; ") + std::string("pid ") + std::to_string(k.pid) + ": " +
               (got && m.kind == multi_msg::done ? std::to_string(m.passes) + " passes, " + std::to_string(m.verified) +
                                                       " blocks verified, " + std::to_string(m.bad) + " bad"
                                                 : std::string(m.text));
  }
  for (auto& k : kids) {
    if (k.first.kind != multi_msg::ready) wait_status(k.pid);
    ::close(k.to);
    ::close(k.from);
  }
  report(tag + "-disjoint-write-verify", ok && !ready.empty(),
         std::to_string(ready.size()) + " processes (" + holders + ") on " + std::to_string(span) + " blocks each; " +
             kill_detail + "; " + results);
}

void case_multi(const std::string& dev) {
  multi_run(dev, 2, false);
  multi_run(dev, 4, true);
  std::string d;
  report("multi-pins-zero", pins_released(&d), d);
}

//! Queue pairs are bounded per file (module parameter) and per controller,
//! with errors that name the numbers; destructive admin commands wait for
//! the only open file.
void case_queues(const std::string& dev) {
  const std::string param = "/sys/module/bam_nvme/parameters/max_queues_per_file";
  auto t = std::make_shared<bam::pci_transport>(dev);
  const std::uint32_t total = t->ctrl_info().queues_total;
  std::vector<std::unique_ptr<bam::dma_region>> rings;
  std::vector<std::uint16_t> qids;
  auto create = [&](bam::pci_transport& tr) {
    rings.push_back(tr.alloc(2 * bam::dma_page_size));
    qids.push_back(tr.create_io_queue_pair(*rings.back(), 0, bam::dma_page_size, 2));
  };
  if (total >= 3) {
    write_file(param, "2");
    std::string err;
    int e = 0;
    try {
      create(*t);
      create(*t);
      create(*t);
    } catch (const bam::error& ex) {
      err = ex.what();
      e = ex.errnum();
    }
    report("queue-share-exhausted",
           e == EDQUOT && qids.size() == 2 && err.find("holds 2 of at most 2") != std::string::npos,
           std::to_string(qids.size()) + " pairs, then: " + err);
    write_file(param, "0");
    for (auto q : qids)
      t->delete_io_queue_pair(q);
    qids.clear();
    rings.clear();
  }
  // The whole controller: every pair, then a clear refusal.
  std::string err;
  int e = 0;
  try {
    for (std::uint32_t i = 0; i <= total; ++i)
      create(*t);
  } catch (const bam::error& ex) {
    err = ex.what();
    e = ex.errnum();
  }
  const std::string counts = "the controller has " + std::to_string(total) + " I/O queue pairs, 0 free";
  report("queue-controller-exhausted", e == ENOSPC && qids.size() == total && err.find(counts) != std::string::npos,
         std::to_string(qids.size()) + " pairs in one process, then: " + err);
  // Another process gets none while they are held, and a clear error.
  const std::string other = run_as(0, 0, [&]() -> std::string {
    try {
      session s(dev);
      return "got " + std::to_string(s.c->io_queue_count()) + " queue pairs";
    } catch (const std::exception& ex) {
      return ex.what();
    }
  });
  report("queue-exhausted-other-process", other.find("no I/O queue pair left") != std::string::npos, other);
  for (auto q : qids)
    t->delete_io_queue_pair(q);
  qids.clear();
  rings.clear();

  // Destructive admin commands: refused while another file is open, then
  // allowed (as root) to the only one. Set Features writes back the
  // temperature threshold it reads, which changes nothing.
  bam_kmod_admin get{};
  get.opcode = 0x0a;
  get.cdw10 = 0x04; // Temperature Threshold
  const bool got = ::ioctl(t->fd(), BAM_KMOD_IOC_ADMIN, &get) == 0 && get.status == 0;
  bam_kmod_admin set{};
  set.opcode = 0x09;
  set.cdw10 = 0x04;
  set.cdw11 = get.result & 0xffff;
  bam_kmod_admin format{};
  format.opcode = 0x80;
  format.nsid = 1;
  int busy_set = 0, busy_format = 0;
  {
    session holder(dev); // another process would do the same: it holds queue pairs
    errno = 0;
    busy_set = ::ioctl(t->fd(), BAM_KMOD_IOC_ADMIN, &set) == 0 ? 0 : errno;
    busy_format = ::ioctl(t->fd(), BAM_KMOD_IOC_ADMIN, &format) == 0 ? 0 : errno;
  }
  report("admin-destructive-refused-while-shared", got && busy_set == EBUSY && busy_format == EBUSY,
         std::string("Set Features: ") + std::strerror(busy_set) + ", Format NVM: " + std::strerror(busy_format) +
             " while another open file holds queue pairs");
  errno = 0;
  const int rc = ::ioctl(t->fd(), BAM_KMOD_IOC_ADMIN, &set);
  report("admin-destructive-sole-root", rc == 0 && set.status == 0,
         std::string("Set Features (temperature threshold ") + std::to_string(get.result & 0xffff) +
             " K) as the only file: " + (rc == 0 ? "status " + hex(set.status) : std::string(std::strerror(errno))));
}

//! Read or write `nblocks` at `lba` with a command built here and sent on
//! I/O queue 0 as it is: what the controller itself answers, with no driver
//! check (range, MDTS) in the way.
bam::nvme::status raw_rw(session& s, bam::nvme::nvm_opcode op, std::uint32_t nsid, std::uint64_t lba,
                         std::uint32_t nblocks, std::uint32_t lba_size, const bam::dma_region& buf) {
  const std::uint64_t bytes = std::uint64_t{nblocks} * lba_size;
  const std::size_t pages = bam::nvme::prp_pages_spanned(0, bytes, bam::dma_page_size);
  const std::size_t lists = bam::nvme::prp_list_pages_needed(pages, bam::dma_page_size);
  auto list_mem = s.t->alloc(std::max<std::size_t>(lists, 1) * bam::dma_page_size);
  std::vector<std::uint64_t*> virt;
  std::vector<std::uint64_t> bus;
  for (std::size_t i = 0; i < lists; ++i) {
    virt.push_back(reinterpret_cast<std::uint64_t*>(list_mem->as<unsigned char>() + i * bam::dma_page_size));
    bus.push_back(list_mem->bus_address(i * bam::dma_page_size));
  }
  bam::nvme::prp_pair prp;
  if (!bam::nvme::build_prp(buf.page_bus().data(), 0, bytes, bam::dma_page_size, virt.data(), bus.data(), lists, prp))
    return bam::nvme::status_out_of_range;
  return s.c->io_queue(0).execute(bam::nvme::make_rw(op, nsid, lba, nblocks, prp.prp1, prp.prp2));
}

std::string status_text(bam::nvme::status st) {
  return st.ok() ? std::string("success") : std::string(bam::nvme::status_name(st));
}

//! The geometry the driver found against what QEMU was given, inactive
//! namespaces, and the transfer limit (MDTS) from both sides.
void case_geometry(const std::string& dev) {
  session s(dev);
  auto& c = *s.c;
  std::string found;
  for (const auto& ns : c.namespaces())
    found += (found.empty() ? "" : ",") + std::to_string(ns.nsid) + ":" + std::to_string(ns.lba_size);
  if (!opt.expect.empty())
    report("namespaces-as-configured", found == opt.expect,
           "driver found " + found + "; QEMU was given " + opt.expect + " (identify NN " +
               std::to_string(c.identify_data().nn) + ")");

  auto idbuf = s.t->alloc(bam::nvme::identify_data_size);
  for (const auto& item : split(opt.inactive, ',')) {
    const auto nsid = static_cast<std::uint32_t>(std::stoul(item));
    bool driver_refuses = false;
    try {
      (void)c.ns(nsid);
    } catch (const bam::error&) {
      driver_refuses = true;
    }
    std::memset(idbuf->data(), 0xff, bam::nvme::identify_data_size);
    std::string nsze = "error";
    bool zero = false;
    try {
      c.admin(bam::nvme::make_identify(bam::nvme::identify_cns::ns, nsid, 0), idbuf.get(),
              bam::nvme::identify_data_size);
      const auto* id = idbuf->as<nvme_id_ns>();
      nsze = std::to_string(id->nsze);
      zero = id->nsze == 0;
    } catch (const bam::error& e) {
      nsze = e.what();
    }
    auto buf = s.t->alloc(bam::dma_page_size);
    const bam::nvme::status st = raw_rw(s, bam::nvme::nvm_opcode::read, nsid, 0, 1, 512, *buf);
    report("inactive-namespace-" + item, driver_refuses && zero && !st.ok(),
           "driver " + std::string(driver_refuses ? "refuses it" : "lists it") + ", identify NSZE " + nsze +
               ", a read answered " + status_text(st));
  }

  const std::uint8_t mdts = c.identify_data().mdts;
  const std::size_t pool_limit = 2u << 20;
  const std::size_t want =
      (mdts == 0 || mdts >= 20) ? pool_limit : std::min<std::size_t>(pool_limit, bam::dma_page_size << mdts);
  report("mdts-transfer-limit", c.max_transfer_bytes() == want,
         "MDTS " + std::to_string(mdts) + ": driver moves at most " + std::to_string(c.max_transfer_bytes()) +
             " bytes per command (want " + std::to_string(want) + ")");
  for (const auto& ns : c.namespaces()) {
    const auto max_blocks = static_cast<std::uint32_t>(c.max_transfer_bytes() / ns.lba_size);
    auto buf = s.t->alloc(c.max_transfer_bytes() + ns.lba_size);
    const bam::nvme::status at = raw_rw(s, bam::nvme::nvm_opcode::read, ns.nsid, 0, max_blocks, ns.lba_size, *buf);
    // One block more than MDTS allows: the controller must refuse it.
    const bool limited = mdts != 0 && c.max_transfer_bytes() == (bam::dma_page_size << mdts);
    const bam::nvme::status over =
        limited ? raw_rw(s, bam::nvme::nvm_opcode::read, ns.nsid, 0, max_blocks + 1, ns.lba_size, *buf)
                : bam::nvme::status_success;
    const bool over_refused = !limited || (over.sct() == bam::nvme::status_type::generic &&
                                           over.sc() == bam::nvme::generic_status::invalid_field);
    // Through the driver, a transfer of many times the limit is split and lands whole.
    const std::uint64_t big = std::min<std::uint64_t>(8 * c.max_transfer_bytes(), ns.blocks * ns.lba_size / 2);
    const auto big_blocks = static_cast<std::uint32_t>(big / ns.lba_size);
    auto wbuf = s.t->alloc(big);
    for (std::uint32_t b = 0; b < big_blocks; ++b)
      fill_block(wbuf->as<unsigned char>() + std::size_t{b} * ns.lba_size, ns.lba_size, b, 500 + ns.nsid);
    auto rbuf = s.t->alloc(big);
    std::uint32_t bad = 0;
    std::string err;
    try {
      c.write(ns.nsid, 0, big_blocks, *wbuf);
      c.read(ns.nsid, 0, big_blocks, *rbuf);
      for (std::uint32_t b = 0; b < big_blocks; ++b)
        bad += !check_block(rbuf->as<unsigned char>() + std::size_t{b} * ns.lba_size, ns.lba_size, b, 500 + ns.nsid);
    } catch (const bam::error& e) {
      err = std::string(", ") + e.what();
    }
    report("mdts-ns" + std::to_string(ns.nsid), at.ok() && over_refused && err.empty() && bad == 0,
           std::to_string(max_blocks) + " blocks in one command: " + status_text(at) +
               (limited ? "; " + std::to_string(max_blocks + 1) + " blocks: " + status_text(over) : std::string()) +
               "; " + std::to_string(big) + " bytes through the driver, " + std::to_string(bad) + " bad blocks" + err);
  }
}

//! Random ioctls (and mmaps) on the device for a while, with pointers to
//! real memory half of the time: every answer must be a documented errno or
//! success, and closing must leave nothing pinned or mapped.
void case_ioctl_fuzz(const std::string& dev) {
  const int fd = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    report("ioctl-fuzz", false, std::string("open: ") + std::strerror(errno));
    return;
  }
  constexpr std::size_t arena_bytes = 1 << 20;
  void* arena = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(arena, 0x5a, arena_bytes);
  const auto base = reinterpret_cast<std::uint64_t>(arena);
  std::vector<std::uint64_t> bus(arena_bytes / bam::dma_page_size + 64);
  std::mt19937_64 rng(std::random_device{}());
  auto coin = [&] { return (rng() & 1) != 0; };
  auto small_len = [&] { return (1 + rng() % 16) * bam::dma_page_size; };
  const std::vector<int> documented = {0,     EINVAL,     E2BIG, EFAULT, ENOMEM, EACCES, ENODEV, ENOTTY,
                                       EBADF, EOPNOTSUPP, EPERM, EBUSY,  ENOSPC, EDQUOT, EIO};
  std::map<int, std::uint64_t> answers;
  std::vector<std::uint64_t> handles;
  std::string odd;
  const unsigned long cmds[] = {BAM_KMOD_IOC_VERSION,      BAM_KMOD_IOC_INFO,      BAM_KMOD_IOC_MAP_HOST,
                                BAM_KMOD_IOC_MAP_DMABUF,   BAM_KMOD_IOC_MAP_GPU,   BAM_KMOD_IOC_UNMAP,
                                BAM_KMOD_IOC_ALLOC,        BAM_KMOD_IOC_CTRL_INFO, BAM_KMOD_IOC_QUEUE_CREATE,
                                BAM_KMOD_IOC_QUEUE_DELETE, BAM_KMOD_IOC_ADMIN,     BAM_KMOD_IOC_EXCLUSIVE};
  // Commands that would change the device (the fuzzer runs as root and alone): never sent.
  const std::uint32_t destructive[] = {0x09, 0x0d, 0x10, 0x11, 0x14, 0x15, 0x80, 0x84};
  std::vector<std::uint32_t> qids;
  std::uint64_t calls = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opt.seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    alignas(8) unsigned char arg[128];
    for (auto& b : arg)
      b = static_cast<unsigned char>(rng());
    unsigned long cmd = cmds[rng() % std::size(cmds)];
    if (rng() % 8 == 0) cmd = _IOC(rng() % 4, BAM_KMOD_IOC_MAGIC, rng() % 16, rng() % 64); // any number, any size
    if (coin()) {
      // Plausible arguments: real memory, small lengths, zero reserved fields.
      if (cmd == BAM_KMOD_IOC_MAP_HOST) {
        bam_kmod_map_host m{};
        m.length = small_len();
        m.vaddr = base + (rng() % (arena_bytes / bam::dma_page_size)) * bam::dma_page_size;
        m.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
        m.bus_addr_count = static_cast<std::uint32_t>(coin() ? bus.size() : rng() % 32);
        std::memcpy(arg, &m, sizeof m);
      } else if (cmd == BAM_KMOD_IOC_ALLOC) {
        bam_kmod_alloc a{};
        a.length = coin() ? small_len() : rng() % (8u << 20);
        std::memcpy(arg, &a, sizeof a);
      } else if (cmd == BAM_KMOD_IOC_UNMAP && !handles.empty()) {
        bam_kmod_unmap u{};
        const std::size_t k = rng() % handles.size();
        u.handle = handles[k];
        handles.erase(handles.begin() + static_cast<std::ptrdiff_t>(k));
        std::memcpy(arg, &u, sizeof u);
      } else if (cmd == BAM_KMOD_IOC_MAP_DMABUF) {
        bam_kmod_map_dmabuf d{};
        d.fd = static_cast<int>(rng() % 8) - 1;
        d.length = small_len();
        d.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
        d.bus_addr_count = static_cast<std::uint32_t>(bus.size());
        std::memcpy(arg, &d, sizeof d);
      } else if (cmd == BAM_KMOD_IOC_QUEUE_CREATE && !handles.empty()) {
        bam_kmod_queue_create q{};
        q.sq_handle = handles[rng() % handles.size()];
        q.cq_handle = coin() ? q.sq_handle : handles[rng() % handles.size()];
        q.sq_offset = (rng() % 4) * bam::dma_page_size;
        q.cq_offset = (rng() % 4) * bam::dma_page_size;
        q.depth = 2 + static_cast<std::uint32_t>(rng() % 300);
        std::memcpy(arg, &q, sizeof q);
      } else if (cmd == BAM_KMOD_IOC_QUEUE_DELETE) {
        bam_kmod_queue_delete d{};
        d.qid = !qids.empty() && coin() ? qids[rng() % qids.size()] : static_cast<std::uint32_t>(rng() % 80);
        std::memcpy(arg, &d, sizeof d);
      } else if (cmd == BAM_KMOD_IOC_ADMIN) {
        bam_kmod_admin a{};
        const std::uint32_t reads[] = {0x02, 0x06, 0x0a};
        a.opcode = reads[rng() % 3];
        a.nsid = static_cast<std::uint32_t>(rng() % 5);
        a.cdw10 =
            static_cast<std::uint32_t>(rng() % 0x20) | (coin() ? 0u : static_cast<std::uint32_t>(rng() % 1024) << 16);
        a.data = coin() ? base : 0;
        a.data_len = a.data != 0 ? static_cast<std::uint32_t>(rng() % 8193) : 0;
        std::memcpy(arg, &a, sizeof a);
      }
    }
    if (cmd == BAM_KMOD_IOC_ADMIN) {
      bam_kmod_admin a;
      std::memcpy(&a, arg, sizeof a);
      if (std::find(std::begin(destructive), std::end(destructive), a.opcode) != std::end(destructive)) {
        a.opcode = 0x06;
        std::memcpy(arg, &a, sizeof a);
      }
    }
    void* p = rng() % 16 == 0 ? reinterpret_cast<void*>(rng()) : static_cast<void*>(arg);
    errno = 0;
    const int rc = ::ioctl(fd, cmd, p);
    const int e = rc == 0 ? 0 : errno;
    ++answers[e];
    ++calls;
    if (std::find(documented.begin(), documented.end(), e) == documented.end() && odd.empty())
      odd = "cmd " + hex(cmd) + " answered " + std::strerror(e);
    if (rc == 0 && cmd == BAM_KMOD_IOC_QUEUE_CREATE) {
      bam_kmod_queue_create q;
      std::memcpy(&q, arg, sizeof q);
      qids.push_back(q.qid);
    }
    if (rc == 0 && (cmd == BAM_KMOD_IOC_MAP_HOST || cmd == BAM_KMOD_IOC_ALLOC)) {
      std::uint64_t h = 0;
      std::memcpy(&h, arg + (cmd == BAM_KMOD_IOC_ALLOC ? 16 : 32), sizeof h);
      handles.push_back(h);
      if (cmd == BAM_KMOD_IOC_ALLOC && coin()) {
        bam_kmod_alloc a;
        std::memcpy(&a, arg, sizeof a);
        void* m = ::mmap(nullptr, a.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(a.mmap_offset));
        if (m != MAP_FAILED) {
          std::memset(m, 1, a.length);
          ::munmap(m, a.length);
        }
      }
    }
    if (handles.size() > 32) {
      bam_kmod_unmap u{handles.front()};
      handles.erase(handles.begin());
      ::ioctl(fd, BAM_KMOD_IOC_UNMAP, &u);
    }
  }
  const auto pinned_open = read_sysfs_int("/sys/class/bam-nvme/pinned_pages");
  ::close(fd); // everything still mapped goes here
  std::string detail;
  const bool released = pins_released(&detail);
  bool works = false;
  try {
    session s(dev);
    auto buf = s.t->alloc(bam::dma_page_size);
    s.c->read(1, 0, 1, *buf);
    works = true;
  } catch (const std::exception& e) {
    detail += std::string(", afterwards: ") + e.what();
  }
  ::munmap(arena, arena_bytes);
  std::string summary;
  for (const auto& [e, n] : answers)
    summary += " " + std::string(e == 0 ? "ok" : strerrorname_np(e)) + "=" + std::to_string(n);
  report("ioctl-fuzz", odd.empty() && released && works,
         std::to_string(calls) + " ioctls in " + std::to_string(opt.seconds) + " s:" + summary + "; " +
             std::to_string(pinned_open) + " pages pinned before close, then " + detail +
             (odd.empty() ? "" : "; undocumented answer: " + odd));
}

//! Write a text marker at LBA 5 for the guest script to read back through
//! the kernel's own nvme driver after unbind-nvme.
void case_mark(const std::string& dev) {
  session s(dev);
  auto buf = s.t->alloc(bam::dma_page_size);
  const char text[] = "bam wrote this block";
  std::memcpy(buf->data(), text, sizeof text - 1);
  s.c->write(1, 5, 1, *buf);
  s.c->flush(1);
  report("mark", true, "LBA 5 holds '" + std::string(text) + "'");
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s all|identify|geometry|io|dmabuf|args|unpriv|fork|kill|multi|queues|mark|ioctl-fuzz DEVICE "
                 "[--blocks N] [--threads N] [--queues N] [--depth N] [--expect NSID:LBA,...] "
                 "[--inactive NSID,...] [--seconds N]\n",
                 argv[0]);
    return 2;
  }
  const std::string what = argv[1], dev = argv[2];
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--blocks")
      opt.blocks = std::strtoull(v.c_str(), nullptr, 0);
    else if (k == "--threads")
      opt.threads = static_cast<unsigned>(std::strtoul(v.c_str(), nullptr, 0));
    else if (k == "--queues")
      opt.queues = static_cast<std::uint32_t>(std::strtoul(v.c_str(), nullptr, 0));
    else if (k == "--depth")
      opt.depth = static_cast<std::uint32_t>(std::strtoul(v.c_str(), nullptr, 0));
    else if (k == "--expect")
      opt.expect = v;
    else if (k == "--inactive")
      opt.inactive = v;
    else if (k == "--seconds")
      opt.seconds = static_cast<unsigned>(std::strtoul(v.c_str(), nullptr, 0));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"identify", [&] { case_identify(dev); }},
      {"geometry", [&] { case_geometry(dev); }},
      {"io", [&] { case_io(dev, opt.blocks, opt.threads); }},
      {"dmabuf", [&] { case_dmabuf(dev); }},
      {"args", [&] { case_args(dev); }},
      {"unpriv", [&] { case_unpriv(dev); }},
      {"fork", [&] { case_fork(dev); }},
      {"kill", [&] { case_kill(dev); }},
      {"multi", [&] { case_multi(dev); }},
      {"queues", [&] { case_queues(dev); }},
      {"mark", [&] { case_mark(dev); }},
      {"ioctl-fuzz", [&] { case_ioctl_fuzz(dev); }},
  };
  for (const auto& [name, fn] : cases) {
    if (what != name && (what != "all" || name == "mark" || name == "ioctl-fuzz")) continue;
    try {
      fn();
    } catch (const std::exception& e) {
      report(name, false, std::string("exception: ") + e.what());
    }
  }
  return failures;
}
