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

/* Largest queue id: the spec's 16-bit QID, 0 being the admin queue. */
#define BAM_ARGS_MAX_QID 0xffffu

/*
 * QUEUE_CREATE: nonzero 32-bit handles, 4 KiB aligned offsets, a depth of
 * 2..@max_depth (CAP.MQES + 1) entries, zero flags. Whether the handles
 * exist and the rings fit in them is the module's business.
 */
static inline int bam_check_queue_create(const struct bam_kmod_queue_create *r, u32 max_depth)
{
	if (r->flags || r->sq_handle == 0 || r->sq_handle > BAM_ARGS_U32_MAX || r->cq_handle == 0 ||
	    r->cq_handle > BAM_ARGS_U32_MAX)
		return -EINVAL;
	if (!bam_args_aligned(r->sq_offset, BAM_KMOD_DMA_PAGE_SIZE) ||
	    !bam_args_aligned(r->cq_offset, BAM_KMOD_DMA_PAGE_SIZE))
		return -EINVAL;
	if (r->depth < 2 || r->depth > max_depth)
		return -EINVAL;
	return 0;
}

static inline int bam_check_queue_delete(const struct bam_kmod_queue_delete *r)
{
	if (r->pad || r->qid == 0 || r->qid > BAM_ARGS_MAX_QID)
		return -EINVAL;
	return 0;
}

/* What an ADMIN passthrough command may do, by opcode. */
enum bam_admin_class {
	BAM_ADMIN_REFUSED,	/* never through passthrough */
	BAM_ADMIN_READ,		/* reads the controller's state: any file */
	BAM_ADMIN_DESTRUCTIVE,	/* changes the device for everyone: CAP_SYS_ADMIN, sole file */
};

/* Admin opcodes (NVMe base specification, Figure "Opcodes for Admin Commands"). */
#define BAM_ADMIN_GET_LOG_PAGE 0x02
#define BAM_ADMIN_IDENTIFY 0x06
#define BAM_ADMIN_SET_FEATURES 0x09
#define BAM_ADMIN_GET_FEATURES 0x0a
#define BAM_ADMIN_NS_MANAGEMENT 0x0d
#define BAM_ADMIN_FW_COMMIT 0x10
#define BAM_ADMIN_FW_DOWNLOAD 0x11
#define BAM_ADMIN_SELF_TEST 0x14
#define BAM_ADMIN_NS_ATTACHMENT 0x15
#define BAM_ADMIN_FORMAT_NVM 0x80
#define BAM_ADMIN_SANITIZE 0x84

static inline enum bam_admin_class bam_admin_class_of(u32 opcode)
{
	switch (opcode) {
	case BAM_ADMIN_GET_LOG_PAGE:
	case BAM_ADMIN_IDENTIFY:
	case BAM_ADMIN_GET_FEATURES:
		return BAM_ADMIN_READ;
	case BAM_ADMIN_SET_FEATURES:
	case BAM_ADMIN_NS_MANAGEMENT:
	case BAM_ADMIN_FW_COMMIT:
	case BAM_ADMIN_FW_DOWNLOAD:
	case BAM_ADMIN_SELF_TEST:
	case BAM_ADMIN_NS_ATTACHMENT:
	case BAM_ADMIN_FORMAT_NVM:
	case BAM_ADMIN_SANITIZE:
		return BAM_ADMIN_DESTRUCTIVE;
	default:
		return BAM_ADMIN_REFUSED;
	}
}

/*
 * ADMIN: zero flags and pad, a transfer of at most BAM_KMOD_MAX_ADMIN_DATA
 * bytes with a pointer exactly when it is nonzero, in a direction the
 * opcode has (bits 1:0: 01 to the controller, 10 from it), a timeout of at
 * most a minute, and no command that sizes its own transfer (Get Log Page
 * NUMD, Firmware Image Download NUMD) beyond BAM_KMOD_MAX_ADMIN_DATA: the
 * controller moves the data through the module's one page. Returns the
 * opcode's class (> 0) or -errno; refused opcodes are -EPERM.
 */
#define BAM_ARGS_MAX_ADMIN_TIMEOUT_MS 60000u
static inline int bam_check_admin(const struct bam_kmod_admin *r)
{
	enum bam_admin_class c;

	if (r->flags || r->pad || r->data_len > BAM_KMOD_MAX_ADMIN_DATA ||
	    r->timeout_ms > BAM_ARGS_MAX_ADMIN_TIMEOUT_MS)
		return -EINVAL;
	if ((r->data == 0) != (r->data_len == 0))
		return -EINVAL;
	if (r->data_len && (r->opcode & 3) != 1 && (r->opcode & 3) != 2)
		return -EINVAL;
	/* Transfers the command itself sizes must fit the module's page. */
	if (r->opcode == BAM_ADMIN_GET_LOG_PAGE &&
	    ((((u64)(r->cdw11 & 0xffff) << 16) | (r->cdw10 >> 16)) + 1) * 4 > BAM_KMOD_MAX_ADMIN_DATA)
		return -EINVAL;
	if (r->opcode == BAM_ADMIN_FW_DOWNLOAD && ((u64)r->cdw10 + 1) * 4 > BAM_KMOD_MAX_ADMIN_DATA)
		return -EINVAL;
	c = bam_admin_class_of(r->opcode);
	return c == BAM_ADMIN_REFUSED ? -EPERM : (int)c;
}

#endif /* BAM_NVME_ARGS_H */
