/*
 * The gate: LiteIO's pass-through bdev in front of every exported volume (this file: the
 * module, its data path and its mirror), and the copy engine of hot migration (gate_copy.c;
 * what both share is in gate.h). See docs/migration.md ("Copy engine") and shim.h.
 *
 * A gate claims its base bdev and forwards every I/O to it. While a mirror is attached,
 * writes, write-zeroes and unmaps also go to the mirror and complete when both did; a
 * failed mirror write breaks the mirror (the caller gets the base's status). The copy pass
 * walks the base's allocated ranges chunk by chunk: quiesce the chunk on the gate (only the
 * gate's module may), read it from the base, write it to the mirror, unquiesce.
 *
 * Threads: a gate is created, copied, detached and destroyed on the thread that created it
 * (SPDK's application thread); its I/O channels live on every thread that submits I/O.
 */
#include "gate.h"

static TAILQ_HEAD(, gate) g_gates = TAILQ_HEAD_INITIALIZER(g_gates);
/* Gates in g_gates whose unregistration this shim began: SPDK finds a bdev by name only
 * until its unregistration starts, so gate_find walks the list for these, and only while
 * there are any (a walk per look-up made every export O(gates)). */
static uint32_t g_leaving;

static int gate_module_init(void);
static int gate_ctx_size(void);

struct spdk_bdev_module g_gate_module = {
	.name = "liteio_gate",
	.module_init = gate_module_init,
	.get_ctx_size = gate_ctx_size,
};

SPDK_BDEV_MODULE_REGISTER(liteio_gate, &g_gate_module)

static int
gate_module_init(void)
{
	return 0;
}

static int
gate_ctx_size(void)
{
	return sizeof(struct gate_io);
}

struct gate *
gate_find(const char *name)
{
	struct spdk_bdev *b = spdk_bdev_get_by_name(name);
	struct gate *g;

	if (b != NULL && b->module == &g_gate_module) {
		return b->ctxt;
	}
	if (g_leaving == 0) {
		return NULL;
	}
	TAILQ_FOREACH(g, &g_gates, link) {
		if (strcmp(g->bdev.name, name) == 0) {
			return g;
		}
	}
	return NULL;
}

static void after_detach(struct gate *g);

/* ---- the data path ------------------------------------------------------------------- */

static void
io_part_done(struct spdk_bdev_io *parent)
{
	struct gate_io *io = (struct gate_io *)parent->driver_ctx;

	if (--io->pending == 0) {
		spdk_bdev_io_complete(parent, io->base_ok ? SPDK_BDEV_IO_STATUS_SUCCESS :
				      SPDK_BDEV_IO_STATUS_FAILED);
	}
}

static void
base_done(struct spdk_bdev_io *child, bool success, void *arg)
{
	struct spdk_bdev_io *parent = arg;
	struct gate_io *io = (struct gate_io *)parent->driver_ctx;

	if (parent->type == SPDK_BDEV_IO_TYPE_SEEK_DATA ||
	    parent->type == SPDK_BDEV_IO_TYPE_SEEK_HOLE) {
		parent->u.bdev.seek.offset = spdk_bdev_io_get_seek_offset(child);
	}
	io->base_ok = success;
	spdk_bdev_free_io(child);
	io_part_done(parent);
}

static void
channel_mirror_idle(struct gate_channel *ch)
{
	struct spdk_io_channel_iter *iter = ch->detach_iter;

	if (iter == NULL || ch->mirror_inflight != 0) {
		return;
	}
	ch->detach_iter = NULL;
	spdk_put_io_channel(ch->mirror_ch);
	ch->mirror_ch = NULL;
	spdk_for_each_channel_continue(iter, 0);
}

static void
mirror_done(struct spdk_bdev_io *child, bool success, void *arg)
{
	struct spdk_bdev_io *parent = arg;
	struct gate_io *io = (struct gate_io *)parent->driver_ctx;
	struct gate_channel *ch = io->ch;

	spdk_bdev_free_io(child);
	if (success) {
		count(&ch->g->mirrored_writes, 1);
	} else {
		count(&ch->g->mirror_errors, 1);
		gate_mirror_broke(ch->g);
	}
	ch->mirror_inflight--;
	io_part_done(parent);
	channel_mirror_idle(ch);
}

static int
submit_mirror_part(struct spdk_bdev_io *parent)
{
	struct gate_io *io = (struct gate_io *)parent->driver_ctx;
	struct gate_channel *ch = io->ch;
	struct spdk_bdev_desc *desc = ch->g->mirror_desc;
	uint64_t off = parent->u.bdev.offset_blocks, n = parent->u.bdev.num_blocks;

	switch (parent->type) {
	case SPDK_BDEV_IO_TYPE_WRITE:
		return spdk_bdev_writev_blocks(desc, ch->mirror_ch, parent->u.bdev.iovs,
					       parent->u.bdev.iovcnt, off, n, mirror_done, parent);
	case SPDK_BDEV_IO_TYPE_WRITE_ZEROES:
		return spdk_bdev_write_zeroes_blocks(desc, ch->mirror_ch, off, n, mirror_done, parent);
	case SPDK_BDEV_IO_TYPE_UNMAP:
		/* A mirror that cannot unmap gets zeroes: the base reads zeroes there too. */
		if (spdk_bdev_io_type_supported(spdk_bdev_desc_get_bdev(desc), SPDK_BDEV_IO_TYPE_UNMAP)) {
			return spdk_bdev_unmap_blocks(desc, ch->mirror_ch, off, n, mirror_done, parent);
		}
		return spdk_bdev_write_zeroes_blocks(desc, ch->mirror_ch, off, n, mirror_done, parent);
	default:
		return -EINVAL;
	}
}

static void
retry_mirror_part(void *arg)
{
	struct spdk_bdev_io *parent = arg;
	struct gate_io *io = (struct gate_io *)parent->driver_ctx;
	int rc = submit_mirror_part(parent);

	if (rc == -ENOMEM) {
		io->wait.bdev = spdk_bdev_desc_get_bdev(io->ch->g->mirror_desc);
		io->wait.cb_fn = retry_mirror_part;
		io->wait.cb_arg = parent;
		if (spdk_bdev_queue_io_wait(io->wait.bdev, io->ch->mirror_ch, &io->wait) == 0) {
			return;
		}
	}
	if (rc != 0) {
		count(&io->ch->g->mirror_errors, 1);
		gate_mirror_broke(io->ch->g);
		io->ch->mirror_inflight--;
		io_part_done(parent);
		channel_mirror_idle(io->ch);
	}
}

static int
submit_base(struct gate_channel *ch, struct spdk_bdev_io *bdev_io)
{
	struct spdk_bdev_desc *d = ch->g->base_desc;
	uint64_t off = bdev_io->u.bdev.offset_blocks, n = bdev_io->u.bdev.num_blocks;

	switch (bdev_io->type) {
	case SPDK_BDEV_IO_TYPE_READ:
		return spdk_bdev_readv_blocks(d, ch->base_ch, bdev_io->u.bdev.iovs,
					      bdev_io->u.bdev.iovcnt, off, n, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_WRITE:
		return spdk_bdev_writev_blocks(d, ch->base_ch, bdev_io->u.bdev.iovs,
					       bdev_io->u.bdev.iovcnt, off, n, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_WRITE_ZEROES:
		return spdk_bdev_write_zeroes_blocks(d, ch->base_ch, off, n, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_UNMAP:
		return spdk_bdev_unmap_blocks(d, ch->base_ch, off, n, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_FLUSH:
		return spdk_bdev_flush_blocks(d, ch->base_ch, off, n, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_RESET:
		return spdk_bdev_reset(d, ch->base_ch, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_SEEK_DATA:
		return spdk_bdev_seek_data(d, ch->base_ch, off, base_done, bdev_io);
	case SPDK_BDEV_IO_TYPE_SEEK_HOLE:
		return spdk_bdev_seek_hole(d, ch->base_ch, off, base_done, bdev_io);
	default:
		return -ENOTSUP;
	}
}

static void
submit(struct gate_channel *ch, struct spdk_bdev_io *bdev_io)
{
	struct gate_io *io = (struct gate_io *)bdev_io->driver_ctx;
	struct gate *g = ch->g;
	bool mirrored = false;
	int rc;

	io->ch = ch;
	io->pending = 1;
	io->base_ok = false;
	if (ch->mirror_ch != NULL && ch->detach_iter == NULL &&
	    __atomic_load_n(&g->mirror_on, __ATOMIC_ACQUIRE) &&
	    !__atomic_load_n(&g->mirror_broken, __ATOMIC_ACQUIRE)) {
		mirrored = bdev_io->type == SPDK_BDEV_IO_TYPE_WRITE ||
			   bdev_io->type == SPDK_BDEV_IO_TYPE_WRITE_ZEROES ||
			   bdev_io->type == SPDK_BDEV_IO_TYPE_UNMAP;
	}
	rc = submit_base(ch, bdev_io);
	if (rc != 0) {
		/* The bdev layer queues a NOMEM I/O and submits it again later. */
		spdk_bdev_io_complete(bdev_io, rc == -ENOMEM ? SPDK_BDEV_IO_STATUS_NOMEM :
				      SPDK_BDEV_IO_STATUS_FAILED);
		return;
	}
	if (mirrored) {
		io->pending++;
		ch->mirror_inflight++;
		retry_mirror_part(bdev_io);
	}
}

static void
read_buf_ready(struct spdk_io_channel *_ch, struct spdk_bdev_io *bdev_io, bool success)
{
	if (!success) {
		spdk_bdev_io_complete(bdev_io, SPDK_BDEV_IO_STATUS_FAILED);
		return;
	}
	submit(spdk_io_channel_get_ctx(_ch), bdev_io);
}

static void
gate_submit_request(struct spdk_io_channel *_ch, struct spdk_bdev_io *bdev_io)
{
	if (bdev_io->type == SPDK_BDEV_IO_TYPE_READ) {
		spdk_bdev_io_get_buf(bdev_io, read_buf_ready,
				     bdev_io->u.bdev.num_blocks * bdev_io->bdev->blocklen);
		return;
	}
	submit(spdk_io_channel_get_ctx(_ch), bdev_io);
}

static bool
gate_io_type_supported(void *ctx, enum spdk_bdev_io_type type)
{
	struct gate *g = ctx;

	switch (type) {
	case SPDK_BDEV_IO_TYPE_READ:
	case SPDK_BDEV_IO_TYPE_WRITE:
	case SPDK_BDEV_IO_TYPE_WRITE_ZEROES:
	case SPDK_BDEV_IO_TYPE_UNMAP:
	case SPDK_BDEV_IO_TYPE_FLUSH:
	case SPDK_BDEV_IO_TYPE_RESET:
	case SPDK_BDEV_IO_TYPE_SEEK_DATA:
	case SPDK_BDEV_IO_TYPE_SEEK_HOLE:
		return spdk_bdev_io_type_supported(g->base, type);
	default:
		return false;
	}
}

static struct spdk_io_channel *
gate_get_io_channel(void *ctx)
{
	return spdk_get_io_channel(ctx);
}

static int
channel_create(void *io_device, void *ctx_buf)
{
	struct gate *g = io_device;
	struct gate_channel *ch = ctx_buf;

	memset(ch, 0, sizeof(*ch));
	ch->g = g;
	ch->base_ch = spdk_bdev_get_io_channel(g->base_desc);
	if (ch->base_ch == NULL) {
		return -ENOMEM;
	}
	if (g->mirror_desc != NULL && __atomic_load_n(&g->mirror_on, __ATOMIC_ACQUIRE)) {
		ch->mirror_ch = spdk_bdev_get_io_channel(g->mirror_desc);
		if (ch->mirror_ch == NULL) {
			/* Not fatal for the volume: this thread's writes cannot be mirrored. */
			gate_mirror_broke(g);
		}
	}
	return 0;
}

static void
channel_destroy(void *io_device, void *ctx_buf)
{
	struct gate_channel *ch = ctx_buf;

	if (ch->mirror_ch != NULL) {
		spdk_put_io_channel(ch->mirror_ch);
	}
	spdk_put_io_channel(ch->base_ch);
}

/* ---- lifecycle ----------------------------------------------------------------------- */

static void
close_desc_msg(void *arg)
{
	spdk_bdev_close(arg);
}

static void
close_on_owner(struct gate *g, struct spdk_bdev_desc *desc)
{
	if (g->thread != spdk_get_thread()) {
		spdk_thread_send_msg(g->thread, close_desc_msg, desc);
	} else {
		spdk_bdev_close(desc);
	}
}

static void
gate_free(void *io_device)
{
	struct gate *g = io_device;

	free(g->bdev.name);
	free(g);
}

/* Unregisters the gate's bdev; from here on only the list finds it (see g_leaving). */
static void
gate_unregister(struct gate *g, spdk_bdev_unregister_cb cb_fn, void *cb_arg)
{
	if (!g->leaving) {
		g->leaving = true;
		g_leaving++;
	}
	spdk_bdev_unregister(&g->bdev, cb_fn, cb_arg);
}

static void
gate_final(struct gate *g, bool async)
{
	if (g->leaving) {
		g_leaving--;
	}
	TAILQ_REMOVE(&g_gates, g, link);
	spdk_bdev_module_release_bdev(g->base);
	close_on_owner(g, g->base_desc);
	if (async) {
		spdk_bdev_destruct_done(&g->bdev, 0);
	}
	spdk_io_device_unregister(g, gate_free);
}

static int
gate_destruct(void *ctx)
{
	struct gate *g = ctx;

	g->destructing = true;
	if (g->copy != NULL) {
		/* The copy ends, detaches the mirror and then finishes the destruction. */
		g->copy->ending = true;
		return 1;
	}
	if (g->mirror_desc != NULL) {
		if (!g->detaching) {
			gate_detach_mirror(g);
		}
		return 1;
	}
	gate_final(g, false);
	return 0;
}

static int
gate_dump_info_json(void *ctx, struct spdk_json_write_ctx *w)
{
	return 0;
}

static const struct spdk_bdev_fn_table g_gate_fn_table = {
	.destruct = gate_destruct,
	.submit_request = gate_submit_request,
	.io_type_supported = gate_io_type_supported,
	.get_io_channel = gate_get_io_channel,
	.dump_info_json = gate_dump_info_json,
};

static void
base_event(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *ctx)
{
	struct gate *g = ctx;

	switch (type) {
	case SPDK_BDEV_EVENT_RESIZE:
		spdk_bdev_notify_blockcnt_change(&g->bdev, spdk_bdev_get_num_blocks(bdev));
		break;
	case SPDK_BDEV_EVENT_REMOVE:
		if (!g->destructing) {
			gate_unregister(g, NULL, NULL);
		}
		break;
	default:
		break;
	}
}

int
liteio_gate_create(const char *base_name, char *out_name, size_t out_len)
{
	/* Gates' UUIDs are derived from their base's, in a namespace of their own. */
	static const char *ns_str = "4c3b2a19-0e8f-4d7c-9b6a-5f4e3d2c1b0a";
	struct spdk_uuid ns;
	struct spdk_bdev *base;
	struct gate *g;
	int rc;

	if (strlen(base_name) + sizeof(GATE_SUFFIX) > out_len) {
		return -ENAMETOOLONG;
	}
	g = calloc(1, sizeof(*g));
	if (g == NULL) {
		return -ENOMEM;
	}
	rc = spdk_bdev_open_ext(base_name, true, base_event, g, &g->base_desc);
	if (rc != 0) {
		free(g);
		return rc;
	}
	base = spdk_bdev_desc_get_bdev(g->base_desc);
	g->base = base;
	g->thread = spdk_get_thread();
	g->bdev.name = spdk_sprintf_alloc("%s" GATE_SUFFIX, spdk_bdev_get_name(base));
	if (g->bdev.name == NULL) {
		spdk_bdev_close(g->base_desc);
		free(g);
		return -ENOMEM;
	}
	snprintf(out_name, out_len, "%s", g->bdev.name);
	g->bdev.product_name = "LiteIO gate";
	spdk_uuid_parse(&ns, ns_str);
	spdk_uuid_generate_sha1(&g->bdev.uuid, &ns, (const char *)spdk_bdev_get_uuid(base),
				sizeof(struct spdk_uuid));
	g->bdev.write_cache = base->write_cache;
	g->bdev.required_alignment = base->required_alignment;
	g->bdev.optimal_io_boundary = base->optimal_io_boundary;
	g->bdev.split_on_optimal_io_boundary = base->split_on_optimal_io_boundary;
	g->bdev.blocklen = base->blocklen;
	g->bdev.blockcnt = base->blockcnt;
	g->bdev.numa = base->numa;
	g->bdev.ctxt = g;
	g->bdev.fn_table = &g_gate_fn_table;
	g->bdev.module = &g_gate_module;

	rc = spdk_bdev_module_claim_bdev(base, g->base_desc, &g_gate_module);
	if (rc != 0) {
		spdk_bdev_close(g->base_desc);
		free(g->bdev.name);
		free(g);
		return rc;
	}
	spdk_io_device_register(g, channel_create, channel_destroy, sizeof(struct gate_channel),
				g->bdev.name);
	TAILQ_INSERT_TAIL(&g_gates, g, link);
	rc = spdk_bdev_register(&g->bdev);
	if (rc != 0) {
		TAILQ_REMOVE(&g_gates, g, link);
		spdk_bdev_module_release_bdev(base);
		spdk_bdev_close(g->base_desc);
		spdk_io_device_unregister(g, gate_free);
		return rc;
	}
	return 0;
}

int
liteio_gate_delete(const char *name, liteio_gate_cb cb_fn, void *cb_arg)
{
	struct gate *g = gate_find(name);

	if (g == NULL || g->destructing) {
		return -ENODEV;
	}
	gate_unregister(g, cb_fn, cb_arg);
	return 0;
}

/* ---- the mirror ---------------------------------------------------------------------- */

static void
mirror_broke_msg(void *arg)
{
	struct gate *g;

	/* The gate may be gone by the time this message runs. */
	TAILQ_FOREACH(g, &g_gates, link) {
		if (g == arg) {
			break;
		}
	}
	if (g == NULL) {
		return;
	}

	/* During a copy pass the pass ends and detaches; otherwise detach now. */
	if (g->copy == NULL && g->mirror_desc != NULL && !g->detaching) {
		if (gate_state(g) == LITEIO_COPY_IN_STEP) {
			g->status = -EIO;
			set_state(g, LITEIO_COPY_FAILED);
		}
		gate_detach_mirror(g);
	}
}

void
gate_mirror_broke(struct gate *g)
{
	if (!__atomic_exchange_n(&g->mirror_broken, true, __ATOMIC_ACQ_REL)) {
		spdk_thread_send_msg(g->thread, mirror_broke_msg, g);
	}
}

void
gate_mirror_event(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *ctx)
{
	if (type == SPDK_BDEV_EVENT_REMOVE) {
		gate_mirror_broke(ctx);
	}
}

static void
detach_channel(struct spdk_io_channel_iter *iter)
{
	struct gate_channel *ch = spdk_io_channel_get_ctx(spdk_io_channel_iter_get_channel(iter));

	if (ch->mirror_ch == NULL) {
		spdk_for_each_channel_continue(iter, 0);
		return;
	}
	ch->detach_iter = iter;
	channel_mirror_idle(ch);
}

static void
detach_done(struct spdk_io_channel_iter *iter, int status)
{
	struct gate *g = spdk_io_channel_iter_get_io_device(iter);

	spdk_bdev_module_release_bdev(spdk_bdev_desc_get_bdev(g->mirror_desc));
	spdk_bdev_close(g->mirror_desc);
	g->mirror_desc = NULL;
	g->detaching = false;
	after_detach(g);
}

/* Stop mirroring: no new write is mirrored, each channel lets its mirrored writes finish
 * and drops its mirror channel, then the mirror is closed. */
void
gate_detach_mirror(struct gate *g)
{
	g->detaching = true;
	__atomic_store_n(&g->mirror_on, false, __ATOMIC_RELEASE);
	spdk_for_each_channel(g, detach_channel, NULL, detach_done);
}

static void
after_detach(struct gate *g)
{
	liteio_gate_cb fn;

	if (gate_state(g) == LITEIO_COPY_STOPPING) {
		set_state(g, LITEIO_COPY_CANCELLED);
	} else if (gate_state(g) == LITEIO_COPY_IN_STEP) {
		set_state(g, LITEIO_COPY_FINISHED);
	}
	if (g->done_fn != NULL) {
		fn = g->done_fn;
		g->done_fn = NULL;
		fn(g->done_arg, g->status);
	}
	if (g->detached_fn != NULL) {
		fn = g->detached_fn;
		g->detached_fn = NULL;
		fn(g->detached_arg, 0);
	}
	if (g->destructing) {
		gate_final(g, true);
	}
}
