/* SPDX-License-Identifier: MIT OR GPL-2.0 */
/*
 * Argument checks of the bam_nvme ioctls: pure functions over the ABI
 * structs, with no kernel calls, so that the module and a user-space fuzzing
 * harness (tests/fuzz/fuzz_kmod_args.cpp) run the same code. Each returns 0
 * (or a page count) when the request may go on, else a negative errno.
 */
#ifndef BAM_NVME_ARGS_H
#define BAM_NVME_ARGS_H

#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/types.h>
#else
#include <errno.h>
#include <linux/types.h>
typedef __u64 u64;
typedef __u32 u32;
#endif

#include <bam/transport/kmod_abi.h>

#define BAM_ARGS_U32_MAX 0xffffffffu

/* True if @v is a multiple of @align (a power of two). */
static inline int bam_args_aligned(u64 v, u64 align)
{
	return (v & (align - 1)) == 0;
}

/*
 * A (start, length) pair of a MAP request: nonzero, aligned to @align, at
 * most @max_bytes, not wrapping, and with room for the bus addresses.
 * Returns the number of 4 KiB pages or -errno.
 */
static inline long bam_check_range(u64 start, u64 length, u64 align, u32 bus_count, u64 max_bytes)
{
	u64 npages;

	if (length == 0 || !bam_args_aligned(start, align) || !bam_args_aligned(length, align))
		return -EINVAL;
	if (length > max_bytes)
		return -E2BIG;
	if (start + length < start)
		return -EINVAL;
	npages = length / BAM_KMOD_DMA_PAGE_SIZE;
	if (bus_count < npages)
		return -EINVAL;
	return (long)npages;
}

static inline long bam_check_map_host(const struct bam_kmod_map_host *r, u64 max_bytes)
{
	if (r->flags)
		return -EINVAL;
	return bam_check_range(r->vaddr, r->length, BAM_KMOD_DMA_PAGE_SIZE, r->bus_addr_count, max_bytes);
}

static inline long bam_check_map_dmabuf(const struct bam_kmod_map_dmabuf *r, u64 max_bytes)
{
	if (r->flags || r->pad)
		return -EINVAL;
	return bam_check_range(r->offset, r->length, BAM_KMOD_DMA_PAGE_SIZE, r->bus_addr_count, max_bytes);
}

static inline long bam_check_map_gpu(const struct bam_kmod_map_gpu *r, u64 max_bytes)
{
	if (r->flags)
		return -EINVAL;
	return bam_check_range(r->vaddr, r->length, BAM_KMOD_GPU_PAGE_SIZE, r->bus_addr_count, max_bytes);
}

/* ALLOC: @cpu_page is the CPU page size (mmap granularity). */
static inline int bam_check_alloc(const struct bam_kmod_alloc *r, u64 cpu_page)
{
	if (r->flags || r->pad || r->length == 0 || !bam_args_aligned(r->length, cpu_page))
		return -EINVAL;
	if (r->length > BAM_KMOD_MAX_ALLOC_BYTES)
		return -E2BIG;
	return 0;
}

/* UNMAP: handles are nonzero 32-bit numbers. */
static inline int bam_check_unmap(const struct bam_kmod_unmap *r)
{
	if (r->handle == 0 || r->handle > BAM_ARGS_U32_MAX)
		return -EINVAL;
	return 0;
}

static inline int bam_check_version(const struct bam_kmod_version *r)
{
	return r->pad ? -EINVAL : 0;
}

#endif /* BAM_NVME_ARGS_H */
