/*
 * LiteIO's C shim over SPDK: bdevs of SPDK's modules: lvstore and lvol facts, RAM and null
 * bdevs (tests), which module claims a bdev, and the SPDK version compiled in. See shim.h; the
 * includes shared by every shim file are in shim_internal.h.
 */
#include "shim_internal.h"

struct spdk_lvol_store *
liteio_lvs_first(void)
{
	struct lvol_store_bdev *b = vbdev_lvol_store_first();
	return b ? b->lvs : NULL;
}

struct spdk_lvol_store *
liteio_lvs_next(struct spdk_lvol_store *prev)
{
	struct lvol_store_bdev *b = vbdev_get_lvs_bdev_by_lvs(prev);
	if (b == NULL) {
		return NULL;
	}
	b = vbdev_lvol_store_next(b);
	return b ? b->lvs : NULL;
}

void
liteio_lvs_get_info(struct spdk_lvol_store *lvs, struct liteio_lvs_info *out)
{
	struct lvol_store_bdev *b = vbdev_get_lvs_bdev_by_lvs(lvs);

	memset(out, 0, sizeof(*out));
	copy_str(out->name, lvs->name);
	spdk_uuid_fmt_lower(out->uuid, sizeof(out->uuid), &lvs->uuid);
	if (b != NULL && b->bdev != NULL) {
		copy_str(out->base_bdev, spdk_bdev_get_name(b->bdev));
	}
	out->cluster_size = spdk_bs_get_cluster_size(lvs->blobstore);
	out->total_data_clusters = spdk_bs_total_data_cluster_count(lvs->blobstore);
	out->free_clusters = spdk_bs_free_cluster_count(lvs->blobstore);
	out->block_size = spdk_bs_get_io_unit_size(lvs->blobstore);
}

void
liteio_lvol_get_info(struct spdk_lvol *lvol, struct liteio_lvol_info *out)
{
	struct spdk_blob_store *bs = lvol->lvol_store->blobstore;
	uint64_t cluster = spdk_bs_get_cluster_size(bs);
	spdk_blob_id parent;

	memset(out, 0, sizeof(*out));
	copy_str(out->name, lvol->name);
	copy_str(out->lvs_name, lvol->lvol_store->name);
	copy_str(out->uuid, lvol->uuid_str);
	if (lvol->bdev != NULL) {
		copy_str(out->bdev_name, spdk_bdev_get_name(lvol->bdev));
	}
	out->size_bytes = spdk_blob_get_num_clusters(lvol->blob) * cluster;
	out->allocated_bytes = spdk_blob_get_num_allocated_clusters(lvol->blob) * cluster;
	out->blob_id = lvol->blob_id;
	out->thin = spdk_blob_is_thin_provisioned(lvol->blob);
	out->snapshot = spdk_blob_is_snapshot(lvol->blob);
	out->clone = spdk_blob_is_clone(lvol->blob);
	parent = spdk_blob_get_parent_snapshot(bs, lvol->blob_id);
	if (parent != SPDK_BLOBID_INVALID) {
		struct spdk_lvol *p;
		TAILQ_FOREACH(p, &lvol->lvol_store->lvols, link) {
			if (p->blob_id == parent) {
				copy_str(out->parent, p->name);
				break;
			}
		}
	}
}

bool
liteio_bdev_lvol_info(struct spdk_bdev *bdev, struct liteio_lvol_info *out)
{
	struct spdk_lvol *lvol;

	if (strcmp(spdk_bdev_get_product_name(bdev), "Logical Volume") != 0) {
		return false;
	}
	lvol = vbdev_lvol_get_from_bdev(bdev);
	if (lvol == NULL) {
		return false;
	}
	liteio_lvol_get_info(lvol, out);
	return true;
}

int
liteio_malloc_create(const char *name, uint64_t num_blocks, uint32_t block_size,
		     const struct spdk_uuid *uuid)
{
	struct malloc_bdev_opts opts;
	struct spdk_bdev *bdev = NULL;

	memset(&opts, 0, sizeof(opts));
	opts.name = (char *)name;
	opts.num_blocks = num_blocks;
	opts.block_size = block_size;
	opts.physical_block_size = block_size;
	opts.numa_id = SPDK_ENV_NUMA_ID_ANY;
	if (uuid != NULL) {
		spdk_uuid_copy(&opts.uuid, uuid);
	}
	return create_malloc_disk(&bdev, &opts);
}

void
liteio_malloc_delete(const char *name, void (*cb_fn)(void *, int), void *cb_arg)
{
	delete_malloc_disk(name, cb_fn, cb_arg);
}

int
liteio_null_create(const char *name, uint64_t num_blocks, uint32_t block_size)
{
	struct null_bdev_opts opts;
	struct spdk_bdev *bdev = NULL;

	memset(&opts, 0, sizeof(opts));
	opts.name = (char *)name;
	opts.num_blocks = num_blocks;
	opts.block_size = block_size;
	opts.physical_block_size = block_size;
	return bdev_null_create(&bdev, &opts);
}

void
liteio_null_delete(const char *name, void (*cb_fn)(void *, int), void *cb_arg)
{
	bdev_null_delete(name, cb_fn, cb_arg);
}

bool
liteio_bdev_claimed_by(struct spdk_bdev *bdev, char *out, size_t len)
{
	const char *module = NULL;
	bool claimed;

	spdk_spin_lock(&bdev->internal.spinlock);
	claimed = bdev->internal.claim_type != SPDK_BDEV_CLAIM_NONE;
	if (bdev->internal.claim_type == SPDK_BDEV_CLAIM_EXCL_WRITE) {
		if (bdev->internal.claim.v1.module != NULL) {
			module = bdev->internal.claim.v1.module->name;
		}
	} else if (claimed) {
		struct spdk_bdev_module_claim *c = TAILQ_FIRST(&bdev->internal.claim.v2.claims);

		if (c != NULL && c->module != NULL) {
			module = c->module->name;
		}
	}
	if (claimed) {
		snprintf(out, len, "%s", module ? module : "unknown");
	}
	spdk_spin_unlock(&bdev->internal.spinlock);
	return claimed;
}

uint32_t
liteio_spdk_version_compiled(void)
{
	return SPDK_VERSION_MAJOR * 10000 + SPDK_VERSION_MINOR * 100 + SPDK_VERSION_PATCH;
}
