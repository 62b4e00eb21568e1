/*
 * LiteIO's C shim over SPDK: raid bdevs: create, delete, members added and removed, the
 * rebuild limit, and what the raid module reports of a raid (its rebuild through SPDK's JSON
 * dump). See shim.h; the includes shared by every shim file are in shim_internal.h.
 */
#include "shim_internal.h"

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
