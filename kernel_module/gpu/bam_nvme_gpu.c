// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * bam_nvme_gpu: GPU memory for bam_nvme through NVIDIA's peer-to-peer API
 * (nvidia_p2p_get_pages + nvidia_p2p_dma_map_pages).
 *
 * Why a second module: bam_nvme must load where no NVIDIA driver exists
 * (CI, QEMU, machines that only use host memory). Resolving nvidia_p2p_* with
 * symbol_get() from the core is not an option: since Linux 6.6 symbol_get()
 * only finds EXPORT_SYMBOL_GPL symbols and NVIDIA exports these with
 * EXPORT_SYMBOL. So this small module links against nvidia.ko directly
 * (modprobe loads nvidia first) and registers its operations with the core;
 * without it MAP_GPU returns -EOPNOTSUPP and everything else works.
 * dma-buf (MAP_DMABUF) is the other way to map GPU memory and needs neither.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/types.h>

#include <bam/transport/kmod_abi.h>

#include "../bam_nvme_gpu.h"
#include "nv-p2p.h"

/* One pinned range. lock serializes unmap against NVIDIA's free callback. */
struct bam_gpu_range {
	struct mutex lock;
	u64 vaddr;
	struct pci_dev *pdev;
	struct nvidia_p2p_page_table *pages;
	struct nvidia_p2p_dma_mapping *dma;
	bool revoked; /* the GPU memory was freed under us; tables are gone */
};

static u64 bam_gpu_page_bytes(u32 type)
{
	switch (type) {
	case NVIDIA_P2P_PAGE_SIZE_4KB:
		return 4096;
	case NVIDIA_P2P_PAGE_SIZE_64KB:
		return 65536;
	case NVIDIA_P2P_PAGE_SIZE_128KB:
		return 131072;
	default:
		return 0;
	}
}

/*
 * NVIDIA calls this when the GPU memory is freed while still pinned (cudaFree
 * or the owning process exiting). The controller must stop using the bus
 * addresses; bam_nvme's release stops the controller before unmapping, and a
 * freed-while-mapped range is a user bug we can only contain. Must not call
 * nvidia_p2p_put_pages here (NVIDIA's rule): free the tables instead.
 */
static void bam_gpu_free_callback(void *data)
{
	struct bam_gpu_range *r = data;

	mutex_lock(&r->lock);
	if (!r->revoked) {
		pr_warn("GPU memory at 0x%llx freed while mapped for %s\n", r->vaddr,
			pci_name(r->pdev));
		nvidia_p2p_free_dma_mapping(r->dma);
		nvidia_p2p_free_page_table(r->pages);
		r->revoked = true;
	}
	mutex_unlock(&r->lock);
}

static int bam_gpu_map(struct pci_dev *pdev, u64 vaddr, u64 length, u64 *bus, void **priv)
{
	struct bam_gpu_range *r;
	u64 page_bytes, done = 0, npages = length / BAM_KMOD_DMA_PAGE_SIZE;
	u32 i;
	int ret;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	mutex_init(&r->lock);
	r->vaddr = vaddr;
	r->pdev = pdev;
	ret = nvidia_p2p_get_pages(0, 0, vaddr, length, &r->pages, bam_gpu_free_callback, r);
	if (ret)
		goto err_free;
	if (!NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(r->pages)) {
		ret = -EPROTO;
		goto err_put;
	}
	ret = nvidia_p2p_dma_map_pages(pdev, r->pages, &r->dma);
	if (ret)
		goto err_put;
	if (!NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(r->dma)) {
		ret = -EPROTO;
		goto err_unmap;
	}
	page_bytes = bam_gpu_page_bytes(r->dma->page_size_type);
	if (page_bytes == 0) {
		ret = -EPROTO;
		goto err_unmap;
	}
	for (i = 0; i < r->dma->entries && done < npages; i++) {
		u64 off;

		for (off = 0; off < page_bytes && done < npages; off += BAM_KMOD_DMA_PAGE_SIZE)
			bus[done++] = r->dma->dma_addresses[i] + off;
	}
	if (done != npages) {
		ret = -EINVAL;
		goto err_unmap;
	}
	*priv = r;
	return 0;

err_unmap:
	nvidia_p2p_dma_unmap_pages(pdev, r->pages, r->dma);
err_put:
	nvidia_p2p_put_pages(0, 0, vaddr, r->pages);
err_free:
	kfree(r);
	return ret;
}

static void bam_gpu_unmap(struct pci_dev *pdev, void *priv)
{
	struct bam_gpu_range *r = priv;

	mutex_lock(&r->lock);
	if (!r->revoked) {
		nvidia_p2p_dma_unmap_pages(pdev, r->pages, r->dma);
		nvidia_p2p_put_pages(0, 0, r->vaddr, r->pages);
		r->revoked = true;
	}
	mutex_unlock(&r->lock);
	kfree(r);
}

static const struct bam_gpu_ops bam_gpu_ops = {
	.owner = THIS_MODULE,
	.map = bam_gpu_map,
	.unmap = bam_gpu_unmap,
};

static int __init bam_gpu_init(void)
{
	return bam_nvme_register_gpu(&bam_gpu_ops);
}

static void __exit bam_gpu_exit(void)
{
	bam_nvme_unregister_gpu(&bam_gpu_ops);
}

module_init(bam_gpu_init);
module_exit(bam_gpu_exit);

MODULE_AUTHOR("bam developers");
MODULE_DESCRIPTION("GPU memory for bam_nvme through nvidia_p2p");
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION("0.1.0");
