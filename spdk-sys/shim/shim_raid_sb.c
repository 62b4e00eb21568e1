/*
 * LiteIO's C shim over SPDK: raid superblocks on bdevs: read one, mark a member missing in one
 * or wipe it, and have the raid module examine a bdev. See shim.h; the includes shared by
 * every shim file are in shim_internal.h.
 */
#include "shim_internal.h"

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
