/* SPDX-License-Identifier: MIT OR GPL-2.0 */
/*
 * The hook between bam_nvme (core) and bam_nvme_gpu (the NVIDIA
 * peer-to-peer part). The core never references an NVIDIA symbol, so it
 * loads on machines without the NVIDIA driver; bam_nvme_gpu links against
 * nvidia.ko (which modprobe then loads first) and registers these
 * operations at init.
 */
#ifndef BAM_NVME_GPU_H
#define BAM_NVME_GPU_H

#include <linux/module.h>
#include <linux/pci.h>
#include <linux/types.h>

struct bam_gpu_ops {
	struct module *owner;
	/*
	 * Pin [vaddr, vaddr + length) of the calling process's GPU memory and
	 * map it for @pdev. Writes length / 4096 bus addresses to @bus (a
	 * kernel array). Returns 0 and a cookie in *@priv, or -errno.
	 * Called in process context, possibly with the controller's mutex
	 * held: it must not call back into bam_nvme.
	 */
	int (*map)(struct pci_dev *pdev, u64 vaddr, u64 length, u64 *bus, void **priv);
	/* Undo map(). Same context as map(); may sleep. */
	void (*unmap)(struct pci_dev *pdev, void *priv);
};

int bam_nvme_register_gpu(const struct bam_gpu_ops *ops);
void bam_nvme_unregister_gpu(const struct bam_gpu_ops *ops);

#endif /* BAM_NVME_GPU_H */
