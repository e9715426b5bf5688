// SPDX-License-Identifier: MIT
// libFuzzer target: the kernel module's ioctl argument checks
// (kernel_module/bam_nvme_args.h, the very code the module runs) against
// their specification: a request is accepted exactly when every documented
// condition holds, and then with the right page count.
#include "bam_nvme_args.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

void fail(const char* what, std::uint64_t a, std::uint64_t b) {
  std::fprintf(stderr, "%s (0x%llx, 0x%llx)\n", what, static_cast<unsigned long long>(a),
               static_cast<unsigned long long>(b));
  std::abort();
}

//! What the ABI header documents for (start, length) of a MAP request.
long expected_range(std::uint64_t start, std::uint64_t length, std::uint64_t align, std::uint32_t count,
                    std::uint64_t max_bytes) {
  if (length == 0 || start % align != 0 || length % align != 0) return -EINVAL;
  if (length > max_bytes) return -E2BIG;
  if (start > UINT64_MAX - length) return -EINVAL; // wraps
  if (count < length / BAM_KMOD_DMA_PAGE_SIZE) return -EINVAL;
  return static_cast<long>(length / BAM_KMOD_DMA_PAGE_SIZE);
}

template <class T>
T take(const std::uint8_t*& p, std::size_t& n) {
  T v{};
  const std::size_t k = n < sizeof v ? n : sizeof v;
  std::memcpy(&v, p, k);
  p += k;
  n -= k;
  return v;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint8_t* p = data;
  std::size_t n = size;
  const auto which = take<std::uint8_t>(p, n) % 9;
  // max_map_mib is 1..2^24 (checked at module load): the cap in bytes.
  const std::uint64_t max_bytes = (1 + take<std::uint32_t>(p, n) % (1u << 24)) * (1ull << 20);
  switch (which) {
  case 0: {
    const auto r = take<bam_kmod_map_host>(p, n);
    const long got = bam_check_map_host(&r, max_bytes);
    const long want =
        r.flags ? -EINVAL : expected_range(r.vaddr, r.length, BAM_KMOD_DMA_PAGE_SIZE, r.bus_addr_count, max_bytes);
    if (got != want) fail("MAP_HOST check disagrees with the ABI", r.vaddr, r.length);
    break;
  }
  case 1: {
    const auto r = take<bam_kmod_map_dmabuf>(p, n);
    const long got = bam_check_map_dmabuf(&r, max_bytes);
    const long want = (r.flags || r.pad)
                          ? -EINVAL
                          : expected_range(r.offset, r.length, BAM_KMOD_DMA_PAGE_SIZE, r.bus_addr_count, max_bytes);
    if (got != want) fail("MAP_DMABUF check disagrees with the ABI", r.offset, r.length);
    break;
  }
  case 2: {
    const auto r = take<bam_kmod_map_gpu>(p, n);
    const long got = bam_check_map_gpu(&r, max_bytes);
    const long want =
        r.flags ? -EINVAL : expected_range(r.vaddr, r.length, BAM_KMOD_GPU_PAGE_SIZE, r.bus_addr_count, max_bytes);
    if (got != want) fail("MAP_GPU check disagrees with the ABI", r.vaddr, r.length);
    if (got > 0 &&
        (r.vaddr % BAM_KMOD_GPU_PAGE_SIZE != 0 || static_cast<std::uint64_t>(got) * BAM_KMOD_DMA_PAGE_SIZE != r.length))
      fail("MAP_GPU accepted a range that is not whole GPU pages", r.vaddr, r.length);
    break;
  }
  case 3: {
    const auto r = take<bam_kmod_alloc>(p, n);
    const int got = bam_check_alloc(&r, 4096);
    int want = 0;
    if (r.flags || r.pad || r.length == 0 || r.length % 4096 != 0)
      want = -EINVAL;
    else if (r.length > BAM_KMOD_MAX_ALLOC_BYTES)
      want = -E2BIG;
    if (got != want) fail("ALLOC check disagrees with the ABI", r.length, r.flags);
    break;
  }
  case 4: {
    const auto r = take<bam_kmod_unmap>(p, n);
    const int got = bam_check_unmap(&r);
    const int want = (r.handle == 0 || r.handle > 0xffffffffull) ? -EINVAL : 0;
    if (got != want) fail("UNMAP check disagrees with the ABI", r.handle, 0);
    break;
  }
  case 5: {
    const auto r = take<bam_kmod_queue_create>(p, n);
    // CAP.MQES is 16 bits (0-based): at most 65536 entries per queue.
    const std::uint32_t max_depth = 2 + take<std::uint16_t>(p, n) % 65535;
    const int got = bam_check_queue_create(&r, max_depth);
    const bool ok = r.flags == 0 && r.sq_handle != 0 && r.sq_handle <= 0xffffffffull && r.cq_handle != 0 &&
                    r.cq_handle <= 0xffffffffull && r.sq_offset % 4096 == 0 && r.cq_offset % 4096 == 0 &&
                    r.depth >= 2 && r.depth <= max_depth;
    if (got != (ok ? 0 : -EINVAL)) fail("QUEUE_CREATE check disagrees with the ABI", r.sq_handle, r.depth);
    break;
  }
  case 6: {
    const auto r = take<bam_kmod_queue_delete>(p, n);
    const int want = (r.pad || r.qid == 0 || r.qid > 0xffff) ? -EINVAL : 0;
    if (bam_check_queue_delete(&r) != want) fail("QUEUE_DELETE check disagrees with the ABI", r.qid, r.pad);
    break;
  }
  case 7: {
    auto r = take<bam_kmod_admin>(p, n);
    // Mostly real opcodes, so that the classes are reached.
    const std::uint8_t pick = take<std::uint8_t>(p, n);
    if (pick < 200) r.opcode = pick;
    const int got = bam_check_admin(&r);
    static const std::uint32_t reads[] = {0x02, 0x06, 0x0a};
    static const std::uint32_t destructive[] = {0x09, 0x0d, 0x10, 0x11, 0x14, 0x15, 0x80, 0x84};
    const auto in = [](const auto& set, std::uint32_t op) {
      for (auto x : set)
        if (x == op) return true;
      return false;
    };
    int want = 0;
    const std::uint64_t log_bytes = ((std::uint64_t{r.cdw11 & 0xffff} << 16 | (r.cdw10 >> 16)) + 1) * 4;
    const std::uint64_t fw_bytes = (std::uint64_t{r.cdw10} + 1) * 4;
    if (r.flags || r.pad || r.data_len > BAM_KMOD_MAX_ADMIN_DATA || r.timeout_ms > 60000 ||
        (r.data == 0) != (r.data_len == 0) || (r.data_len != 0 && (r.opcode & 3) != 1 && (r.opcode & 3) != 2) ||
        (r.opcode == 0x02 && log_bytes > BAM_KMOD_MAX_ADMIN_DATA) ||
        (r.opcode == 0x11 && fw_bytes > BAM_KMOD_MAX_ADMIN_DATA))
      want = -EINVAL;
    else if (in(reads, r.opcode))
      want = BAM_ADMIN_READ;
    else if (in(destructive, r.opcode))
      want = BAM_ADMIN_DESTRUCTIVE;
    else
      want = -EPERM;
    if (got != want) fail("ADMIN check disagrees with the ABI", r.opcode, static_cast<std::uint64_t>(got));
    // Nothing that creates or deletes queues, aborts or waits for events passes.
    if (got > 0 && (r.opcode == 0x00 || r.opcode == 0x01 || r.opcode == 0x04 || r.opcode == 0x05 || r.opcode == 0x08 ||
                    r.opcode == 0x0c || r.opcode >= 0xc0))
      fail("ADMIN check let a queue, abort, event or vendor command through", r.opcode, 0);
    break;
  }
  default: {
    const auto r = take<bam_kmod_version>(p, n);
    if (bam_check_version(&r) != (r.pad ? -EINVAL : 0)) fail("VERSION check disagrees with the ABI", r.pad, 0);
    break;
  }
  }
  return 0;
}
