/*
 * The gate: LiteIO's pass-through bdev in front of every exported volume, and the copy
 * engine of hot migration. See docs/migration.md ("Copy engine") and shim.h.
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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spdk/bdev.h"
#include "spdk/bdev_module.h"
#include "spdk/env.h"
#include "spdk/queue.h"
#include "spdk/string.h"
#include "spdk/thread.h"
#include "spdk/uuid.h"

#include "shim.h"

#define GATE_SUFFIX "-gate"
#define GATE_MAX_QD 32

struct gate;

/* One chunk of the copy pass in flight. */
struct copy_slot {
	struct gate *g;
	void *buf;
	uint64_t off;
	uint64_t len;
	bool busy;
	/* The step to run again when the bdev_io pool was empty. */
	void (*step)(struct copy_slot *);
	struct spdk_bdev_io_wait_entry wait;
};

struct copy {
	struct spdk_io_channel *base_ch;
	struct spdk_io_channel *mirror_ch;
	uint64_t total;      /* blocks to cover (the base's size when the copy started) */
	uint64_t cursor;     /* next block to look at */
	uint64_t region_end; /* [cursor, region_end) is known to hold data */
	uint64_t chunk;      /* blocks per chunk */
	uint32_t qd;
	uint32_t inflight;
	bool seeking;   /* a seek is in flight (or the barrier has not passed yet) */
	bool seek_hole; /* the seek in flight looks for a hole */
	bool seek_supported;
	bool ending;
	int status;
	struct copy_slot slots[GATE_MAX_QD];
	struct spdk_bdev_io_wait_entry seek_wait;
};

struct gate {
	struct spdk_bdev bdev;
	struct spdk_bdev *base;
	struct spdk_bdev_desc *base_desc;
	struct spdk_thread *thread;

	/* The mirror (NULL when none) and its state. */
	struct spdk_bdev_desc *mirror_desc;
	bool mirror_on;     /* new writes are mirrored (read on every thread) */
	bool mirror_broken; /* a mirror write failed (read on every thread) */
	bool detaching;
	uint32_t state;     /* enum liteio_copy_state */
	struct copy *copy;  /* the copy pass in flight, or NULL */

	/* Counters, written on any thread with atomics. */
	uint64_t size_bytes;
	uint64_t scanned_bytes;
	uint64_t copied_bytes;
	uint64_t mirrored_writes;
	uint64_t mirror_errors;
	uint64_t start_ticks;
	uint64_t end_ticks;
	int status;

	/* Called once when the copy pass ends (in step, failed, cancelled). */
	liteio_gate_cb done_fn;
	void *done_arg;
	/* Called once the mirror is detached (cancel or finish). */
	liteio_gate_cb detached_fn;
	void *detached_arg;
	bool destructing;
	/* This shim began its unregistration (counted in g_leaving until gate_final). */
	bool leaving;

	TAILQ_ENTRY(gate) link;
};

struct gate_channel {
	struct gate *g;
	struct spdk_io_channel *base_ch;
	struct spdk_io_channel *mirror_ch;
	uint64_t mirror_inflight;
	/* A detach waiting for this channel's mirrored writes to finish. */
	struct spdk_io_channel_iter *detach_iter;
};

/* Per-I/O context (the bdev layer's driver_ctx). */
struct gate_io {
	struct gate_channel *ch;
	int pending;
	bool base_ok;
	struct spdk_bdev_io_wait_entry wait;
};

static TAILQ_HEAD(, gate) g_gates = TAILQ_HEAD_INITIALIZER(g_gates);
/* Gates in g_gates whose unregistration this shim began: SPDK finds a bdev by name only
 * until its unregistration starts, so gate_find walks the list for these, and only while
 * there are any (a walk per look-up made every export O(gates)). */
static uint32_t g_leaving;

static int gate_module_init(void);
static int gate_ctx_size(void);

static struct spdk_bdev_module g_gate_module = {
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

static struct gate *
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

static uint32_t
gate_state(struct gate *g)
{
	return __atomic_load_n(&g->state, __ATOMIC_ACQUIRE);
}

static void
set_state(struct gate *g, uint32_t s)
{
	__atomic_store_n(&g->state, s, __ATOMIC_RELEASE);
}

static void
count(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

static void detach_mirror(struct gate *g);
static void after_detach(struct gate *g);
static void mirror_broke(struct gate *g);

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
		mirror_broke(ch->g);
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
		mirror_broke(io->ch->g);
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
			mirror_broke(g);
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
			detach_mirror(g);
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
		detach_mirror(g);
	}
}

static void
mirror_broke(struct gate *g)
{
	if (!__atomic_exchange_n(&g->mirror_broken, true, __ATOMIC_ACQ_REL)) {
		spdk_thread_send_msg(g->thread, mirror_broke_msg, g);
	}
}

static void
mirror_event(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *ctx)
{
	if (type == SPDK_BDEV_EVENT_REMOVE) {
		mirror_broke(ctx);
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
static void
detach_mirror(struct gate *g)
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

/* ---- the copy pass ------------------------------------------------------------------- */

static void pump(struct gate *g);

static void
copy_fail(struct gate *g, int rc)
{
	if (g->copy->status == 0) {
		g->copy->status = rc;
	}
	g->copy->ending = true;
}

static bool
wait_for_io(struct gate *g, struct spdk_bdev *bdev, struct spdk_io_channel *ch,
	    struct spdk_bdev_io_wait_entry *w, spdk_bdev_io_wait_cb fn, void *arg)
{
	w->bdev = bdev;
	w->cb_fn = fn;
	w->cb_arg = arg;
	return spdk_bdev_queue_io_wait(bdev, ch, w) == 0;
}

static void slot_end(struct copy_slot *s);

static void
slot_unquiesced(void *arg, int status)
{
	struct copy_slot *s = arg;

	if (status != 0) {
		copy_fail(s->g, status);
	}
	slot_end(s);
}

static void
slot_unquiesce(struct copy_slot *s)
{
	int rc = spdk_bdev_unquiesce_range(&s->g->bdev, &g_gate_module, s->off, s->len,
					   slot_unquiesced, s);
	if (rc != 0) {
		copy_fail(s->g, rc);
		slot_end(s);
	}
}

static void
slot_written(struct spdk_bdev_io *bdev_io, bool success, void *arg)
{
	struct copy_slot *s = arg;

	spdk_bdev_free_io(bdev_io);
	if (success) {
		count(&s->g->copied_bytes, s->len * s->g->bdev.blocklen);
	} else {
		count(&s->g->mirror_errors, 1);
		mirror_broke(s->g);
		copy_fail(s->g, -EIO);
	}
	slot_unquiesce(s);
}

static void slot_step(void *arg);

static void
slot_write(struct copy_slot *s)
{
	struct copy *c = s->g->copy;
	int rc = spdk_bdev_write_blocks(s->g->mirror_desc, c->mirror_ch, s->buf, s->off, s->len,
					slot_written, s);
	if (rc == -ENOMEM && wait_for_io(s->g, spdk_bdev_desc_get_bdev(s->g->mirror_desc),
					 c->mirror_ch, &s->wait, slot_step, s)) {
		return;
	}
	if (rc != 0) {
		copy_fail(s->g, rc);
		slot_unquiesce(s);
	}
}

static void
slot_read(struct spdk_bdev_io *bdev_io, bool success, void *arg)
{
	struct copy_slot *s = arg;

	spdk_bdev_free_io(bdev_io);
	if (!success || s->g->copy->ending) {
		if (!success) {
			copy_fail(s->g, -EIO);
		}
		slot_unquiesce(s);
		return;
	}
	s->step = slot_write;
	slot_write(s);
}

static void
slot_start_read(struct copy_slot *s)
{
	struct copy *c = s->g->copy;
	int rc = spdk_bdev_read_blocks(s->g->base_desc, c->base_ch, s->buf, s->off, s->len,
				       slot_read, s);
	if (rc == -ENOMEM && wait_for_io(s->g, s->g->base, c->base_ch, &s->wait, slot_step, s)) {
		return;
	}
	if (rc != 0) {
		copy_fail(s->g, rc);
		slot_unquiesce(s);
	}
}

static void
slot_step(void *arg)
{
	struct copy_slot *s = arg;

	s->step(s);
}

static void
slot_quiesced(void *arg, int status)
{
	struct copy_slot *s = arg;

	if (status != 0) {
		copy_fail(s->g, status);
		slot_end(s);
		return;
	}
	if (s->g->copy->ending) {
		slot_unquiesce(s);
		return;
	}
	s->step = slot_start_read;
	slot_start_read(s);
}

static void
slot_end(struct copy_slot *s)
{
	struct gate *g = s->g;

	s->busy = false;
	g->copy->inflight--;
	pump(g);
}

static void
copy_chunk(struct gate *g, uint64_t off, uint64_t len)
{
	struct copy *c = g->copy;
	struct copy_slot *s = NULL;
	uint32_t i;
	int rc;

	for (i = 0; i < c->qd; i++) {
		if (!c->slots[i].busy) {
			s = &c->slots[i];
			break;
		}
	}
	if (s == NULL) {
		copy_fail(g, -EFAULT);
		return;
	}
	s->busy = true;
	s->off = off;
	s->len = len;
	c->inflight++;
	rc = spdk_bdev_quiesce_range(&g->bdev, &g_gate_module, off, len, slot_quiesced, s);
	if (rc != 0) {
		s->busy = false;
		c->inflight--;
		copy_fail(g, rc);
	}
}

static void seek_step(void *arg);

static void
seek_done(struct spdk_bdev_io *bdev_io, bool success, void *arg)
{
	struct gate *g = arg;
	struct copy *c = g->copy;
	uint64_t at = spdk_bdev_io_get_seek_offset(bdev_io);

	spdk_bdev_free_io(bdev_io);
	if (!success) {
		c->seeking = false;
		copy_fail(g, -EIO);
		pump(g);
		return;
	}
	if (at > c->total) {
		at = c->total;
	}
	if (!c->seek_hole) {
		/* Holes are skipped: the destination is a fresh thin volume that reads zeroes
		 * there, and every write to them since the barrier was mirrored. */
		c->cursor = at;
		__atomic_store_n(&g->scanned_bytes, at * g->bdev.blocklen, __ATOMIC_RELAXED);
		if (at >= c->total) {
			c->seeking = false;
			pump(g);
			return;
		}
		c->seek_hole = true;
		seek_step(g);
		return;
	}
	c->region_end = at > c->cursor ? at : c->total;
	c->seeking = false;
	pump(g);
}

/* One seek from the cursor: SEEK_DATA to find the next data, then SEEK_HOLE for its end. */
static void
seek_step(void *arg)
{
	struct gate *g = arg;
	struct copy *c = g->copy;
	int rc;

	if (c->seek_hole) {
		rc = spdk_bdev_seek_hole(g->base_desc, c->base_ch, c->cursor, seek_done, g);
	} else {
		rc = spdk_bdev_seek_data(g->base_desc, c->base_ch, c->cursor, seek_done, g);
	}
	if (rc == -ENOMEM && wait_for_io(g, g->base, c->base_ch, &c->seek_wait, seek_step, g)) {
		return;
	}
	if (rc != 0) {
		c->seeking = false;
		copy_fail(g, rc);
		pump(g);
	}
}

static void copy_end(struct gate *g);

static void
pump(struct gate *g)
{
	struct copy *c = g->copy;
	uint64_t len;

	if (__atomic_load_n(&g->mirror_broken, __ATOMIC_ACQUIRE)) {
		copy_fail(g, -EIO);
	}
	while (!c->ending && !c->seeking && c->inflight < c->qd && c->cursor < c->total) {
		if (c->cursor < c->region_end) {
			len = c->region_end - c->cursor;
			if (len > c->chunk) {
				len = c->chunk;
			}
			copy_chunk(g, c->cursor, len);
			c->cursor += len;
			if (c->cursor >= c->total) {
				__atomic_store_n(&g->scanned_bytes, c->total * g->bdev.blocklen,
						 __ATOMIC_RELAXED);
			}
			continue;
		}
		if (!c->seek_supported) {
			c->region_end = c->total;
			continue;
		}
		c->seeking = true;
		c->seek_hole = false;
		seek_step(g);
	}
	if (!c->seeking && c->inflight == 0 && (c->ending || c->cursor >= c->total)) {
		copy_end(g);
	}
}

static void
copy_end(struct gate *g)
{
	struct copy *c = g->copy;
	uint32_t i;

	g->copy = NULL;
	g->end_ticks = spdk_get_ticks();
	spdk_put_io_channel(c->base_ch);
	spdk_put_io_channel(c->mirror_ch);
	for (i = 0; i < c->qd; i++) {
		spdk_dma_free(c->slots[i].buf);
	}
	g->status = c->status;
	if (g->status == 0 && (c->cursor < c->total || g->destructing)) {
		g->status = -ECANCELED;
	}
	free(c);
	if (g->status == 0 && !g->destructing) {
		/* In step: the mirror stays until finish or cancel. */
		set_state(g, LITEIO_COPY_IN_STEP);
		if (g->done_fn != NULL) {
			liteio_gate_cb fn = g->done_fn;
			g->done_fn = NULL;
			fn(g->done_arg, 0);
		}
		if (g->detached_fn != NULL) {
			detach_mirror(g);
		}
		return;
	}
	if (g->status == -ECANCELED) {
		set_state(g, LITEIO_COPY_STOPPING);
	} else {
		set_state(g, LITEIO_COPY_FAILED);
	}
	detach_mirror(g);
}

/* The start-up (attach, barrier) is over: let the pump run. */
static void
barrier_end(struct gate *g, int status)
{
	if (status != 0) {
		copy_fail(g, status);
	}
	g->copy->seeking = false;
	if (gate_state(g) == LITEIO_COPY_STARTING) {
		set_state(g, LITEIO_COPY_COPYING);
	}
	pump(g);
}

static void
barrier_released(void *arg, int status)
{
	barrier_end(arg, status);
}

static void
barrier_reached(void *arg, int status)
{
	struct gate *g = arg;
	int rc;

	if (status != 0) {
		barrier_end(g, status);
		return;
	}
	rc = spdk_bdev_unquiesce(&g->bdev, &g_gate_module, barrier_released, g);
	if (rc != 0) {
		barrier_end(g, rc);
	}
}

static void
attach_channel(struct spdk_io_channel_iter *iter)
{
	struct gate_channel *ch = spdk_io_channel_get_ctx(spdk_io_channel_iter_get_channel(iter));
	struct gate *g = ch->g;

	if (ch->mirror_ch == NULL) {
		ch->mirror_ch = spdk_bdev_get_io_channel(g->mirror_desc);
	}
	spdk_for_each_channel_continue(iter, ch->mirror_ch == NULL ? -ENOMEM : 0);
}

static void
attach_done(struct spdk_io_channel_iter *iter, int status)
{
	struct gate *g = spdk_io_channel_iter_get_io_device(iter);
	int rc;

	if (status != 0) {
		barrier_end(g, status);
		return;
	}
	/* A barrier: every write submitted before the mirror was on has completed once the
	 * whole gate is quiesced; every later one is mirrored. */
	rc = spdk_bdev_quiesce(&g->bdev, &g_gate_module, barrier_reached, g);
	if (rc != 0) {
		barrier_end(g, rc);
	}
}

int
liteio_gate_start_copy(const char *name, const char *mirror_name,
		       const struct liteio_copy_opts *opts, liteio_gate_cb cb_fn, void *cb_arg)
{
	struct gate *g = gate_find(name);
	struct spdk_bdev *m;
	struct copy *c;
	uint64_t chunk_bytes = opts->chunk_bytes ? opts->chunk_bytes : (1u << 20);
	uint32_t qd = opts->queue_depth ? opts->queue_depth : 4;
	uint32_t i;
	int rc;

	if (g == NULL || g->destructing) {
		return -ENODEV;
	}
	if (g->mirror_desc != NULL || g->copy != NULL) {
		return -EBUSY;
	}
	if (qd > GATE_MAX_QD || chunk_bytes % g->bdev.blocklen != 0) {
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		return -ENOMEM;
	}
	rc = spdk_bdev_open_ext(mirror_name, true, mirror_event, g, &g->mirror_desc);
	if (rc != 0) {
		g->mirror_desc = NULL;
		free(c);
		return rc;
	}
	m = spdk_bdev_desc_get_bdev(g->mirror_desc);
	if (spdk_bdev_get_block_size(m) != g->bdev.blocklen ||
	    spdk_bdev_get_num_blocks(m) < g->bdev.blockcnt) {
		rc = -EINVAL;
	} else if (m == g->base || m == &g->bdev) {
		rc = -EINVAL;
	} else {
		rc = spdk_bdev_module_claim_bdev(m, g->mirror_desc, &g_gate_module);
	}
	if (rc != 0) {
		spdk_bdev_close(g->mirror_desc);
		g->mirror_desc = NULL;
		free(c);
		return rc;
	}
	c->base_ch = spdk_bdev_get_io_channel(g->base_desc);
	c->mirror_ch = spdk_bdev_get_io_channel(g->mirror_desc);
	c->qd = qd;
	rc = (c->base_ch == NULL || c->mirror_ch == NULL) ? -ENOMEM : 0;
	for (i = 0; i < qd && rc == 0; i++) {
		c->slots[i].g = g;
		c->slots[i].buf = spdk_dma_malloc(chunk_bytes, g->bdev.required_alignment ?
						  (1u << g->bdev.required_alignment) : 4096, NULL);
		if (c->slots[i].buf == NULL) {
			rc = -ENOMEM;
		}
	}
	if (rc != 0) {
		for (i = 0; i < qd; i++) {
			spdk_dma_free(c->slots[i].buf);
		}
		if (c->base_ch != NULL) {
			spdk_put_io_channel(c->base_ch);
		}
		if (c->mirror_ch != NULL) {
			spdk_put_io_channel(c->mirror_ch);
		}
		spdk_bdev_module_release_bdev(m);
		spdk_bdev_close(g->mirror_desc);
		g->mirror_desc = NULL;
		free(c);
		return rc;
	}
	c->total = g->bdev.blockcnt;
	c->chunk = chunk_bytes / g->bdev.blocklen;
	c->seek_supported = opts->skip_holes &&
			    spdk_bdev_io_type_supported(g->base, SPDK_BDEV_IO_TYPE_SEEK_DATA) &&
			    spdk_bdev_io_type_supported(g->base, SPDK_BDEV_IO_TYPE_SEEK_HOLE);
	/* Held until the barrier passed (barrier_end). */
	c->seeking = true;

	g->copy = c;
	g->size_bytes = c->total * g->bdev.blocklen;
	g->scanned_bytes = 0;
	g->copied_bytes = 0;
	g->mirrored_writes = 0;
	g->mirror_errors = 0;
	g->status = 0;
	g->start_ticks = spdk_get_ticks();
	g->end_ticks = 0;
	g->done_fn = cb_fn;
	g->done_arg = cb_arg;
	__atomic_store_n(&g->mirror_broken, false, __ATOMIC_RELEASE);
	set_state(g, LITEIO_COPY_STARTING);
	__atomic_store_n(&g->mirror_on, true, __ATOMIC_RELEASE);
	spdk_for_each_channel(g, attach_channel, NULL, attach_done);
	return 0;
}

int
liteio_gate_stop_mirror(const char *name, bool require_in_step, liteio_gate_cb cb_fn,
			void *cb_arg)
{
	struct gate *g = gate_find(name);

	if (g == NULL) {
		return -ENODEV;
	}
	if (g->detached_fn != NULL) {
		return -EBUSY;
	}
	if (require_in_step && (g->copy != NULL || gate_state(g) != LITEIO_COPY_IN_STEP ||
				g->mirror_desc == NULL)) {
		return -EAGAIN;
	}
	if (g->mirror_desc == NULL) {
		cb_fn(cb_arg, 0);
		return 0;
	}
	g->detached_fn = cb_fn;
	g->detached_arg = cb_arg;
	if (g->copy != NULL) {
		g->copy->ending = true;
		return 0;
	}
	if (!g->detaching) {
		detach_mirror(g);
	}
	return 0;
}

int
liteio_gate_progress(const char *name, struct liteio_copy_progress *out)
{
	struct gate *g = gate_find(name);
	uint64_t end;

	if (g == NULL) {
		return -ENODEV;
	}
	memset(out, 0, sizeof(*out));
	snprintf(out->base, sizeof(out->base), "%s", spdk_bdev_get_name(g->base));
	out->state = gate_state(g);
	out->status = g->status;
	out->size_bytes = g->size_bytes;
	out->scanned_bytes = __atomic_load_n(&g->scanned_bytes, __ATOMIC_RELAXED);
	out->copied_bytes = __atomic_load_n(&g->copied_bytes, __ATOMIC_RELAXED);
	out->mirrored_writes = __atomic_load_n(&g->mirrored_writes, __ATOMIC_RELAXED);
	out->mirror_errors = __atomic_load_n(&g->mirror_errors, __ATOMIC_RELAXED);
	out->mirror_attached = g->mirror_desc != NULL;
	if (g->start_ticks != 0) {
		end = g->end_ticks != 0 ? g->end_ticks : spdk_get_ticks();
		out->elapsed_us = (end - g->start_ticks) * 1000000 / spdk_get_ticks_hz();
	}
	return 0;
}
