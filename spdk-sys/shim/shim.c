/*
 * LiteIO's C shim over SPDK. See shim.h. Compiled against SPDK's source-tree headers
 * (include/spdk_internal and module/bdev/<m>/) because SPDK does not install the bdev
 * module headers; build.rs checks the SPDK version these were written for.
 */
#include <errno.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include "spdk/nvmf.h"
#include "spdk/module/bdev/nvme.h"

#include "spdk/blob.h"
#include "spdk/crc32.h"
#include "spdk/env.h"
#include "spdk/json.h"
#include "spdk/keyring.h"
#include "spdk/keyring_module.h"
#include "spdk/string.h"
#include "spdk/thread.h"
#include "spdk/util.h"
#include "spdk/uuid.h"
#include "spdk/version.h"
#include "spdk_internal/lvolstore.h"

#include "bdev_malloc.h"
#include "bdev_nvme.h"
#include "bdev_null.h"
#include "bdev_raid.h"
#include "vbdev_lvol.h"

#include "shim.h"

static void
copy_str(char *dst, const char *src)
{
	snprintf(dst, LITEIO_NAME_MAX, "%s", src ? src : "");
}

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

int
liteio_raid_create(const char *name, uint32_t strip_size_kb, enum spdk_bdev_raid_level level,
		   uint8_t num_base, const char *const *base_names, bool superblock,
		   const struct spdk_uuid *uuid, void (*cb_fn)(void *, int), void *cb_arg)
{
	/* A zero UUID lets the raid module generate one (it does not accept NULL). */
	struct spdk_uuid id;

	switch (level) {
	case SPDK_BDEV_RAID_LEVEL_CONCAT:
	case SPDK_BDEV_RAID_LEVEL_RAID0:
	case SPDK_BDEV_RAID_LEVEL_RAID1:
		break;
	default:
		return -EINVAL;
	}
	memset(&id, 0, sizeof(id));
	if (uuid != NULL) {
		spdk_uuid_copy(&id, uuid);
	}
	return raid_bdev_create(name, strip_size_kb, num_base, (char **)base_names, level, superblock,
				&id, cb_fn, cb_arg);
}

int
liteio_raid_delete(const char *name, void (*cb_fn)(void *, int), void *cb_arg)
{
	struct raid_bdev *raid = raid_bdev_find_by_name(name);
	if (raid == NULL) {
		return -ENODEV;
	}
	raid_bdev_delete(raid, false, cb_fn, cb_arg);
	return 0;
}

int
liteio_raid_add_base(const char *name, const char *base_name, void (*cb_fn)(void *, int),
		     void *cb_arg)
{
	struct raid_bdev *raid = raid_bdev_find_by_name(name);

	if (raid == NULL) {
		return -ENODEV;
	}
	return raid_bdev_add_base_bdev(raid, base_name, cb_fn, cb_arg);
}

/* The slot of `raid` whose open descriptor is on `bdev`, or NULL. */
static struct raid_base_bdev_info *
raid_base_of(struct raid_bdev *raid, struct spdk_bdev *bdev)
{
	struct raid_base_bdev_info *base;

	RAID_FOR_EACH_BASE_BDEV(raid, base) {
		if (base->desc != NULL && spdk_bdev_desc_get_bdev(base->desc) == bdev) {
			return base;
		}
	}
	return NULL;
}

int
liteio_raid_find_base(const char *base_name, char *raid_out, size_t len, bool *removing)
{
	struct spdk_bdev *bdev = spdk_bdev_get_by_name(base_name);
	struct raid_bdev *raid;

	if (bdev == NULL) {
		return -ENODEV;
	}
	TAILQ_FOREACH(raid, &g_raid_bdev_list, global_link) {
		struct raid_base_bdev_info *base = raid_base_of(raid, bdev);

		if (base != NULL) {
			snprintf(raid_out, len, "%s", raid->bdev.name);
			*removing = base->remove_scheduled;
			return 0;
		}
	}
	return -ENOENT;
}

int
liteio_raid_remove_base(const char *base_name, void (*cb_fn)(void *, int), void *cb_arg)
{
	struct spdk_bdev *bdev = spdk_bdev_get_by_name(base_name);

	if (bdev == NULL) {
		return -ENODEV;
	}
	return raid_bdev_remove_base_bdev(bdev, cb_fn, cb_arg);
}

int
liteio_raid_set_process_limit(uint32_t max_mib_per_sec)
{
	struct spdk_raid_bdev_opts opts;

	raid_bdev_get_opts(&opts);
	opts.process_max_bandwidth_mb_sec = max_mib_per_sec;
	return raid_bdev_set_opts(&opts);
}

/* A growing buffer for SPDK's JSON writer. */
struct json_buf {
	char *data;
	size_t len;
	size_t cap;
};

static int
json_buf_write(void *ctx, const void *data, size_t size)
{
	struct json_buf *b = ctx;

	if (b->len + size > b->cap) {
		size_t cap = spdk_max(b->cap * 2, b->len + size + 256);
		char *d = realloc(b->data, cap);

		if (d == NULL) {
			return -ENOMEM;
		}
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, data, size);
	b->len += size;
	return 0;
}

static void
copy_json_str(char *dst, size_t len, const struct spdk_json_val *v)
{
	char *s = spdk_json_strdup(v);

	snprintf(dst, len, "%s", s ? s : "");
	free(s);
}

/*
 * The raid's background process, as bdev_raid_get_bdevs reports it: the process struct is
 * private to bdev_raid.c, so its facts are read from the JSON that raid_bdev_write_info_json
 * (the function behind that RPC) writes.
 */
static void
raid_process_info(struct raid_bdev *raid, struct liteio_raid_info *out)
{
	struct json_buf buf = { 0 };
	struct spdk_json_write_ctx *w;
	struct spdk_json_val *values = NULL, *process, *progress, *v;
	ssize_t count;

	w = spdk_json_write_begin(json_buf_write, &buf, 0);
	if (w == NULL) {
		return;
	}
	spdk_json_write_object_begin(w);
	raid_bdev_write_info_json(raid, w);
	spdk_json_write_object_end(w);
	if (spdk_json_write_end(w) != 0 || buf.len == 0) {
		goto out;
	}
	count = spdk_json_parse(buf.data, buf.len, NULL, 0, NULL, 0);
	if (count <= 0) {
		goto out;
	}
	values = calloc((size_t)count, sizeof(*values));
	if (values == NULL ||
	    spdk_json_parse(buf.data, buf.len, values, (size_t)count, NULL, 0) != count) {
		goto out;
	}
	if (spdk_json_find(values, "process", NULL, &process, SPDK_JSON_VAL_OBJECT_BEGIN) != 0) {
		goto out;
	}
	if (spdk_json_find_string(process, "type", NULL, &v) == 0) {
		copy_json_str(out->process_type, sizeof(out->process_type), v);
	}
	if (out->process_type[0] == '\0') {
		snprintf(out->process_type, sizeof(out->process_type), "unknown");
	}
	if (spdk_json_find_string(process, "target", NULL, &v) == 0) {
		copy_json_str(out->process_target, sizeof(out->process_target), v);
	}
	if (spdk_json_find(process, "progress", NULL, &progress, SPDK_JSON_VAL_OBJECT_BEGIN) == 0) {
		if (spdk_json_find(progress, "blocks", NULL, &v, SPDK_JSON_VAL_NUMBER) == 0) {
			spdk_json_number_to_uint64(v, &out->process_blocks);
		}
		if (spdk_json_find(progress, "percent", NULL, &v, SPDK_JSON_VAL_NUMBER) == 0) {
			spdk_json_number_to_uint32(v, &out->process_percent);
		}
	}
out:
	free(values);
	free(buf.data);
}

int
liteio_raid_get_info(const char *name, struct liteio_raid_info *info,
		     struct liteio_raid_base *bases, int max)
{
	struct raid_bdev *raid = raid_bdev_find_by_name(name);
	struct raid_base_bdev_info *base;
	int i = 0;

	if (raid == NULL) {
		return -ENODEV;
	}
	memset(info, 0, sizeof(*info));
	copy_str(info->name, raid->bdev.name);
	if (!spdk_uuid_is_null(&raid->bdev.uuid)) {
		spdk_uuid_fmt_lower(info->uuid, sizeof(info->uuid), &raid->bdev.uuid);
	}
	info->level = raid->level;
	info->state = raid->state;
	info->strip_size_kb = raid->strip_size_kb;
	info->block_size = raid->bdev.blocklen;
	info->num_blocks = raid->bdev.blockcnt;
	info->num_base_bdevs = raid->num_base_bdevs;
	info->num_base_bdevs_discovered = raid->num_base_bdevs_discovered;
	info->num_base_bdevs_operational = raid->num_base_bdevs_operational;
	info->min_base_bdevs_operational = raid->min_base_bdevs_operational;
	info->superblock = raid->superblock_enabled;
	info->sb_seq = raid->sb != NULL ? raid->sb->seq_number : 0;
	info->destroying = raid->destroy_started;
	if (raid->process != NULL) {
		raid_process_info(raid, info);
	}
	RAID_FOR_EACH_BASE_BDEV(raid, base) {
		struct liteio_raid_base *b;

		if (i >= max) {
			i++;
			continue;
		}
		b = &bases[i++];
		memset(b, 0, sizeof(*b));
		copy_str(b->name, base->name);
		if (!spdk_uuid_is_null(&base->uuid)) {
			spdk_uuid_fmt_lower(b->uuid, sizeof(b->uuid), &base->uuid);
		}
		b->data_offset = base->data_offset;
		b->data_size = base->data_size;
		b->configured = base->is_configured;
		b->process_target = base->is_process_target;
		b->failed = base->is_failed;
		b->sb_state = LITEIO_RAID_SB_NONE;
		if (raid->sb != NULL) {
			uint8_t j;

			for (j = 0; j < raid->sb->base_bdevs_size; j++) {
				if (raid->sb->base_bdevs[j].slot == i - 1) {
					b->sb_state = raid->sb->base_bdevs[j].state;
					break;
				}
			}
			if (b->sb_state == RAID_SB_BASE_BDEV_FAILED) {
				b->failed = true;
			}
		}
	}
	return i;
}

/* Raid superblocks on bdevs: read one, mark members missing in one, have the raid module
 * examine a bdev. See shim.h. */

static void
sb_event_cb(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *event_ctx)
{
}

/* Open `name` (read-write with `write`) and get an I/O channel on this thread. */
static int
sb_open(const char *name, bool write, struct spdk_bdev_desc **desc, struct spdk_io_channel **ch)
{
	int rc = spdk_bdev_open_ext(name, write, sb_event_cb, NULL, desc);

	if (rc != 0) {
		return rc;
	}
	*ch = spdk_bdev_get_io_channel(*desc);
	if (*ch == NULL) {
		spdk_bdev_close(*desc);
		return -ENOMEM;
	}
	return 0;
}

static void
sb_fill(struct liteio_raid_sb *out, const struct raid_bdev_superblock *sb)
{
	uint8_t i;

	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "%.*s", RAID_BDEV_SB_NAME_SIZE, (const char *)sb->name);
	spdk_uuid_fmt_lower(out->uuid, sizeof(out->uuid), &sb->uuid);
	out->seq_number = sb->seq_number;
	out->raid_size = sb->raid_size;
	out->block_size = sb->block_size;
	out->strip_size = sb->strip_size;
	out->level = (int32_t)sb->level;
	out->num_base_bdevs = sb->num_base_bdevs;
	out->base_bdevs_size = sb->base_bdevs_size;
	for (i = 0; i < sb->base_bdevs_size; i++) {
		const struct raid_bdev_sb_base_bdev *b = &sb->base_bdevs[i];
		struct liteio_raid_sb_base *o = &out->bases[i];

		spdk_uuid_fmt_lower(o->uuid, sizeof(o->uuid), &b->uuid);
		o->data_offset = b->data_offset;
		o->data_size = b->data_size;
		o->state = b->state;
		o->slot = b->slot;
	}
}

struct sb_read_ctx {
	struct spdk_bdev_desc *desc;
	struct spdk_io_channel *ch;
	void (*cb_fn)(void *, struct liteio_raid_sb *, int);
	void *cb_arg;
	struct liteio_raid_sb out;
};

static void
sb_read_done(const struct raid_bdev_superblock *sb, int status, void *arg)
{
	struct sb_read_ctx *ctx = arg;

	if (status == 0) {
		sb_fill(&ctx->out, sb);
	}
	spdk_put_io_channel(ctx->ch);
	spdk_bdev_close(ctx->desc);
	ctx->cb_fn(ctx->cb_arg, status == 0 ? &ctx->out : NULL, status);
	free(ctx);
}

int
liteio_raid_sb_read(const char *bdev_name,
		    void (*cb_fn)(void *, struct liteio_raid_sb *, int), void *cb_arg)
{
	struct spdk_bdev *bdev = spdk_bdev_get_by_name(bdev_name);
	struct sb_read_ctx *ctx;
	int rc;

	if (bdev == NULL) {
		return -ENODEV;
	}
	if (spdk_bdev_get_md_size(bdev) != 0 || spdk_bdev_get_dif_type(bdev) != SPDK_DIF_DISABLE) {
		return -ENOTSUP;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL) {
		return -ENOMEM;
	}
	ctx->cb_fn = cb_fn;
	ctx->cb_arg = cb_arg;
	rc = sb_open(bdev_name, false, &ctx->desc, &ctx->ch);
	if (rc != 0) {
		free(ctx);
		return rc;
	}
	rc = raid_bdev_load_base_bdev_superblock(ctx->desc, ctx->ch, sb_read_done, ctx);
	if (rc != 0) {
		spdk_put_io_channel(ctx->ch);
		spdk_bdev_close(ctx->desc);
		free(ctx);
	}
	return rc;
}

struct sb_mark_ctx {
	struct spdk_bdev_desc *desc;
	struct spdk_io_channel *ch;
	struct spdk_uuid raid_uuid;
	/* Mark: the sequence number the superblock must have. Wipe: it must be lower. */
	uint64_t expect_seq;
	bool wipe;
	struct spdk_uuid *missing;
	int n;
	void *buf;
	void (*cb_fn)(void *, int);
	void *cb_arg;
};

static void
sb_mark_finish(struct sb_mark_ctx *ctx, int status)
{
	spdk_dma_free(ctx->buf);
	spdk_put_io_channel(ctx->ch);
	spdk_bdev_close(ctx->desc);
	ctx->cb_fn(ctx->cb_arg, status);
	free(ctx->missing);
	free(ctx);
}

static void
sb_mark_written(struct spdk_bdev_io *bdev_io, bool success, void *arg)
{
	spdk_bdev_free_io(bdev_io);
	sb_mark_finish(arg, success ? 0 : -EIO);
}

static void
sb_mark_loaded(const struct raid_bdev_superblock *sb, int status, void *arg)
{
	struct sb_mark_ctx *ctx = arg;
	struct spdk_bdev *bdev = spdk_bdev_desc_get_bdev(ctx->desc);
	struct raid_bdev_superblock *copy;
	uint64_t len;
	uint8_t i;
	int j, rc;

	if (status != 0) {
		sb_mark_finish(ctx, status);
		return;
	}
	if (spdk_uuid_compare(&sb->uuid, &ctx->raid_uuid) != 0 || sb->length > RAID_BDEV_SB_MAX_LENGTH ||
	    (ctx->wipe ? sb->seq_number >= ctx->expect_seq : sb->seq_number != ctx->expect_seq)) {
		sb_mark_finish(ctx, -ESTALE);
		return;
	}
	len = SPDK_ALIGN_CEIL(sb->length, spdk_bdev_get_block_size(bdev));
	ctx->buf = spdk_dma_zmalloc(len, spdk_bdev_get_buf_align(bdev), NULL);
	if (ctx->buf == NULL) {
		sb_mark_finish(ctx, -ENOMEM);
		return;
	}
	if (ctx->wipe) {
		/* Zeroes: no valid superblock any more. */
		rc = spdk_bdev_write(ctx->desc, ctx->ch, ctx->buf, 0, len, sb_mark_written, ctx);
		if (rc != 0) {
			sb_mark_finish(ctx, rc);
		}
		return;
	}
	memcpy(ctx->buf, sb, sb->length);
	copy = ctx->buf;
	for (i = 0; i < copy->base_bdevs_size; i++) {
		struct raid_bdev_sb_base_bdev *b = &copy->base_bdevs[i];

		for (j = 0; j < ctx->n; j++) {
			if (b->state == RAID_SB_BASE_BDEV_CONFIGURED &&
			    spdk_uuid_compare(&b->uuid, &ctx->missing[j]) == 0) {
				b->state = RAID_SB_BASE_BDEV_MISSING;
			}
		}
	}
	copy->seq_number++;
	/* As bdev_raid_sb.c does: the CRC over `length` bytes with the field zero. */
	copy->crc = 0;
	copy->crc = spdk_crc32c_update(copy, copy->length, 0);
	rc = spdk_bdev_write(ctx->desc, ctx->ch, ctx->buf, 0, len, sb_mark_written, ctx);
	if (rc != 0) {
		sb_mark_finish(ctx, rc);
	}
}

static int
sb_rewrite(const char *bdev_name, const char *raid_uuid, uint64_t seq, bool wipe,
	   const char *const *missing, int n, void (*cb_fn)(void *, int), void *cb_arg)
{
	struct spdk_bdev *bdev = spdk_bdev_get_by_name(bdev_name);
	struct sb_mark_ctx *ctx;
	int i, rc;

	if (bdev == NULL) {
		return -ENODEV;
	}
	if (spdk_bdev_get_md_size(bdev) != 0 || spdk_bdev_get_dif_type(bdev) != SPDK_DIF_DISABLE) {
		return -ENOTSUP;
	}
	if (n < 0 || n > 255) {
		return -EINVAL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL) {
		return -ENOMEM;
	}
	ctx->missing = calloc(n > 0 ? (size_t)n : 1, sizeof(*ctx->missing));
	if (ctx->missing == NULL) {
		free(ctx);
		return -ENOMEM;
	}
	if (spdk_uuid_parse(&ctx->raid_uuid, raid_uuid) != 0) {
		rc = -EINVAL;
		goto err;
	}
	for (i = 0; i < n; i++) {
		if (spdk_uuid_parse(&ctx->missing[i], missing[i]) != 0) {
			rc = -EINVAL;
			goto err;
		}
	}
	ctx->n = n;
	ctx->expect_seq = seq;
	ctx->wipe = wipe;
	ctx->cb_fn = cb_fn;
	ctx->cb_arg = cb_arg;
	rc = sb_open(bdev_name, true, &ctx->desc, &ctx->ch);
	if (rc != 0) {
		goto err;
	}
	rc = raid_bdev_load_base_bdev_superblock(ctx->desc, ctx->ch, sb_mark_loaded, ctx);
	if (rc != 0) {
		spdk_put_io_channel(ctx->ch);
		spdk_bdev_close(ctx->desc);
		goto err;
	}
	return 0;
err:
	free(ctx->missing);
	free(ctx);
	return rc;
}

int
liteio_raid_sb_mark_missing(const char *bdev_name, const char *raid_uuid, uint64_t expect_seq,
			    const char *const *missing, int n, void (*cb_fn)(void *, int),
			    void *cb_arg)
{
	return sb_rewrite(bdev_name, raid_uuid, expect_seq, false, missing, n, cb_fn, cb_arg);
}

int
liteio_raid_sb_wipe(const char *bdev_name, const char *raid_uuid, uint64_t below_seq,
		    void (*cb_fn)(void *, int), void *cb_arg)
{
	return sb_rewrite(bdev_name, raid_uuid, below_seq, true, NULL, 0, cb_fn, cb_arg);
}

int
liteio_raid_examine(const char *bdev_name)
{
	struct spdk_bdev *bdev = spdk_bdev_get_by_name(bdev_name);
	struct spdk_bdev_module *module;
	bool claimed;

	if (bdev == NULL) {
		return -ENODEV;
	}
	spdk_spin_lock(&bdev->internal.spinlock);
	claimed = bdev->internal.claim_type != SPDK_BDEV_CLAIM_NONE;
	spdk_spin_unlock(&bdev->internal.spinlock);
	if (claimed) {
		return -EBUSY;
	}
	module = spdk_bdev_module_list_find("raid");
	if (module == NULL || module->examine_disk == NULL) {
		return -ENOENT;
	}
	/* What the bdev layer's examine does for each module: count the action, which the
	 * module's spdk_bdev_module_examine_done ends (spdk_bdev_wait_for_examine waits for it). */
	spdk_spin_lock(&module->internal.spinlock);
	module->internal.action_in_progress++;
	spdk_spin_unlock(&module->internal.spinlock);
	module->examine_disk(bdev);
	return 0;
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

struct tcp_add_ctx {
	struct spdk_nvmf_tgt *tgt;
	void (*cb_fn)(void *, int);
	void *cb_arg;
};

static void
tcp_added(void *arg, int status)
{
	struct tcp_add_ctx *ctx = arg;
	ctx->cb_fn(ctx->cb_arg, status);
	free(ctx);
}

static void
tcp_created(void *arg, struct spdk_nvmf_transport *transport)
{
	struct tcp_add_ctx *ctx = arg;
	if (transport == NULL) {
		ctx->cb_fn(ctx->cb_arg, -EINVAL);
		free(ctx);
		return;
	}
	spdk_nvmf_tgt_add_transport(ctx->tgt, transport, tcp_added, ctx);
}

int
liteio_nvmf_tcp_transport_add(struct spdk_nvmf_tgt *tgt, const struct liteio_tcp_opts *in,
			      void (*cb_fn)(void *, int), void *cb_arg)
{
	struct spdk_nvmf_transport_opts opts;
	struct tcp_add_ctx *ctx;
	int rc;

	memset(&opts, 0, sizeof(opts));
	if (!spdk_nvmf_transport_opts_init("TCP", &opts, sizeof(opts))) {
		return -ENOENT;
	}
	if (in->max_queue_depth) { opts.max_queue_depth = in->max_queue_depth; }
	if (in->max_qpairs_per_ctrlr) { opts.max_qpairs_per_ctrlr = in->max_qpairs_per_ctrlr; }
	if (in->in_capsule_data_size) { opts.in_capsule_data_size = in->in_capsule_data_size; }
	if (in->max_io_size) { opts.max_io_size = in->max_io_size; }
	if (in->io_unit_size) { opts.io_unit_size = in->io_unit_size; }
	if (in->num_shared_buffers) { opts.num_shared_buffers = in->num_shared_buffers; }
	if (in->buf_cache_size) { opts.buf_cache_size = in->buf_cache_size; }
	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL) {
		return -ENOMEM;
	}
	ctx->tgt = tgt;
	ctx->cb_fn = cb_fn;
	ctx->cb_arg = cb_arg;
	rc = spdk_nvmf_transport_create_async("TCP", &opts, tcp_created, ctx);
	if (rc != 0) {
		free(ctx);
	}
	return rc;
}

uint32_t
liteio_nvmf_add_ns(struct spdk_nvmf_subsystem *ss, const char *bdev_name, const char *uuid_str)
{
	struct spdk_nvmf_ns_opts opts;

	spdk_nvmf_ns_opts_get_defaults(&opts, sizeof(opts));
	if (uuid_str != NULL && uuid_str[0] != '\0') {
		if (spdk_uuid_parse(&opts.uuid, uuid_str) != 0) {
			return 0;
		}
		memcpy(opts.nguid, &opts.uuid, sizeof(opts.nguid));
	}
	return spdk_nvmf_subsystem_add_ns_ext(ss, bdev_name, &opts, sizeof(opts), NULL);
}

int
liteio_bdev_nvme_detach(const char *name, void (*cb_fn)(void *, int), void *cb_arg)
{
	struct spdk_nvme_path_id path;

	memset(&path, 0, sizeof(path));
	return spdk_bdev_nvme_delete(name, &path, cb_fn, cb_arg);
}

uint32_t
liteio_spdk_version_compiled(void)
{
	return SPDK_VERSION_MAJOR * 10000 + SPDK_VERSION_MINOR * 100 + SPDK_VERSION_PATCH;
}

/*
 * An in-memory keyring module: DH-HMAC-CHAP secrets and TLS PSKs the agent reads from
 * Kubernetes Secrets go straight into SPDK's keyring, without a key file on disk (SPDK's own
 * "file" module reads the file again on every use, so the file could not be removed). The
 * key material lives in the key's context and is wiped when SPDK frees the key.
 */
struct liteio_mem_key {
	size_t len;
	char data[LITEIO_KEY_MAX];
};

static size_t
liteio_mem_ctx_size(void)
{
	return sizeof(struct liteio_mem_key);
}

static int
liteio_mem_add_key(struct spdk_key *key, void *ctx)
{
	const char *secret = ctx;
	struct liteio_mem_key *k = spdk_key_get_ctx(key);
	size_t len = strnlen(secret, LITEIO_KEY_MAX);

	if (len == 0 || len >= LITEIO_KEY_MAX) {
		return -EINVAL;
	}
	memcpy(k->data, secret, len);
	k->len = len;
	return 0;
}

static void
liteio_mem_remove_key(struct spdk_key *key)
{
	struct liteio_mem_key *k = spdk_key_get_ctx(key);

	spdk_memset_s(k, sizeof(*k), 0, sizeof(*k));
}

static int
liteio_mem_get_key(struct spdk_key *key, void *buf, int len)
{
	struct liteio_mem_key *k = spdk_key_get_ctx(key);

	if (len < 0 || (size_t)len < k->len) {
		return -ENOBUFS;
	}
	memcpy(buf, k->data, k->len);
	return (int)k->len;
}

static struct spdk_keyring_module g_liteio_mem_keyring = {
	.name = "liteio_mem",
	.add_key = liteio_mem_add_key,
	.remove_key = liteio_mem_remove_key,
	.get_key = liteio_mem_get_key,
	.get_ctx_size = liteio_mem_ctx_size,
};

SPDK_KEYRING_REGISTER_MODULE(liteio_mem, &g_liteio_mem_keyring);

int
liteio_keyring_add(const char *name, const char *secret)
{
	struct spdk_key_opts opts = {
		.size = sizeof(opts),
		.name = name,
		.module = &g_liteio_mem_keyring,
		.ctx = (void *)secret,
	};

	return spdk_keyring_add_key(&opts);
}

int
liteio_keyring_remove(const char *name)
{
	return spdk_keyring_remove_key(name, &g_liteio_mem_keyring);
}

bool
liteio_keyring_has(const char *name)
{
	struct spdk_key *key = spdk_keyring_get_key(name);

	if (key == NULL) {
		return false;
	}
	spdk_keyring_put_key(key);
	return true;
}

/* Look up the named keys; NULL names give NULL keys. Returns 0, or -ENOKEY with every key
 * that was found put back. */
static int
get_keys(const char *const *names, struct spdk_key **keys, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		keys[i] = NULL;
		if (names[i] == NULL) {
			continue;
		}
		keys[i] = spdk_keyring_get_key(names[i]);
		if (keys[i] == NULL) {
			while (--i >= 0) {
				spdk_keyring_put_key(keys[i]);
			}
			return -ENOKEY;
		}
	}
	return 0;
}

static void
put_keys(struct spdk_key **keys, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		spdk_keyring_put_key(keys[i]);
	}
}

int
liteio_nvmf_add_host(struct spdk_nvmf_subsystem *ss, const char *hostnqn,
		     const char *dhchap_key, const char *dhchap_ctrlr_key, const char *psk)
{
	const char *names[2] = { dhchap_key, dhchap_ctrlr_key };
	struct spdk_key *keys[2];
	struct spdk_nvmf_host_opts opts = { .size = sizeof(opts) };
	struct spdk_json_val *values = NULL;
	char *json = NULL;
	int rc;

	rc = get_keys(names, keys, 2);
	if (rc != 0) {
		return rc;
	}
	if (psk != NULL) {
		struct spdk_key *k = spdk_keyring_get_key(psk);
		ssize_t count;

		if (k == NULL) {
			put_keys(keys, 2);
			return -ENOKEY;
		}
		spdk_keyring_put_key(k);
		/* The TCP transport takes the PSK's key name from the host's JSON parameters. */
		json = spdk_sprintf_alloc("{\"psk\":\"%s\"}", psk);
		if (json == NULL) {
			put_keys(keys, 2);
			return -ENOMEM;
		}
		count = spdk_json_parse(json, strlen(json), NULL, 0, NULL, 0);
		if (count <= 0) {
			rc = -EINVAL;
			goto out;
		}
		values = calloc((size_t)count, sizeof(*values));
		if (values == NULL) {
			rc = -ENOMEM;
			goto out;
		}
		if (spdk_json_parse(json, strlen(json), values, (size_t)count, NULL, 0) != count) {
			rc = -EINVAL;
			goto out;
		}
		opts.params = values;
	}
	opts.dhchap_key = keys[0];
	opts.dhchap_ctrlr_key = keys[1];
	rc = spdk_nvmf_subsystem_add_host_ext(ss, hostnqn, &opts);
out:
	put_keys(keys, 2);
	free(values);
	free(json);
	return rc;
}

int
liteio_nvmf_set_keys(struct spdk_nvmf_subsystem *ss, const char *hostnqn,
		     const char *dhchap_key, const char *dhchap_ctrlr_key)
{
	const char *names[2] = { dhchap_key, dhchap_ctrlr_key };
	struct spdk_key *keys[2];
	struct spdk_nvmf_subsystem_key_opts opts = { .size = sizeof(opts) };
	int rc;

	rc = get_keys(names, keys, 2);
	if (rc != 0) {
		return rc;
	}
	opts.dhchap_key = keys[0];
	opts.dhchap_ctrlr_key = keys[1];
	rc = spdk_nvmf_subsystem_set_keys(ss, hostnqn, &opts);
	put_keys(keys, 2);
	return rc;
}

int
liteio_bdev_nvme_set_keys(const char *name, const char *dhchap_key, const char *dhchap_ctrlr_key,
			  void (*cb_fn)(void *, int), void *cb_arg)
{
	return bdev_nvme_set_keys(name, dhchap_key, dhchap_ctrlr_key, cb_fn, cb_arg);
}

/* Multipath: see shim.h. */

int
liteio_bdev_nvme_paths(const char *name, struct liteio_nvme_path *out, int max)
{
	struct nvme_bdev_ctrlr *nbdev_ctrlr = nvme_bdev_ctrlr_get_by_name(name);
	struct nvme_ctrlr *nvme_ctrlr;
	int n = 0;

	if (nbdev_ctrlr == NULL) {
		return -ENODEV;
	}
	TAILQ_FOREACH(nvme_ctrlr, &nbdev_ctrlr->ctrlrs, tailq) {
		struct liteio_nvme_path *p;
		struct nvme_ns *ns;

		if (n >= max) {
			n++;
			continue;
		}
		p = &out[n++];
		memset(p, 0, sizeof(*p));
		if (nvme_ctrlr->active_path_id != NULL) {
			snprintf(p->traddr, sizeof(p->traddr), "%s", nvme_ctrlr->active_path_id->trid.traddr);
			snprintf(p->trsvcid, sizeof(p->trsvcid), "%s", nvme_ctrlr->active_path_id->trid.trsvcid);
		}
		if (nvme_ctrlr->ctrlr != NULL) {
			p->cntlid = spdk_nvme_ctrlr_get_data(nvme_ctrlr->ctrlr)->cntlid;
		}
		ns = nvme_ctrlr_get_ns(nvme_ctrlr, 1);
		if (ns != NULL) {
			p->ana_state = ns->ana_state;
		}
		p->connected = !nvme_ctrlr->resetting && !nvme_ctrlr->destruct &&
			       !nvme_ctrlr->disabled && !nvme_ctrlr->fast_io_fail_timedout;
	}
	return n;
}

int
liteio_bdev_nvme_detach_path(const char *name, const struct spdk_nvme_transport_id *trid,
			     void (*cb_fn)(void *, int), void *cb_arg)
{
	struct spdk_nvme_path_id path;

	memset(&path, 0, sizeof(path));
	path.trid = *trid;
	return spdk_bdev_nvme_delete(name, &path, cb_fn, cb_arg);
}
