/* SPDX-License-Identifier: MIT OR GPL-2.0 */
/*
 * Test-only ABI of bam_test_dmabuf: /dev/bam-test-dmabuf hands out dma-bufs
 * backed by ordinary kernel pages, so that MAP_DMABUF can be tested where
 * no GPU (and no udmabuf) exists. Not installed, not for production.
 */
#ifndef BAM_TEST_DMABUF_H
#define BAM_TEST_DMABUF_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define BAM_TEST_DMABUF_MAX_BYTES (64u << 20)

struct bam_test_dmabuf_create {
  __u64 size;  /* in: bytes, nonzero multiple of 4096, at most 64 MiB */
  __s32 fd;    /* out: dma-buf fd (O_CLOEXEC, mmap-able) */
  __u32 pad;   /* in: zero */
};

#define BAM_TEST_DMABUF_CREATE _IOWR(0xBB, 0x00, struct bam_test_dmabuf_create)

#endif /* BAM_TEST_DMABUF_H */
