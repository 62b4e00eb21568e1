/*
 * The copy engine of hot migration, on the gate (gate.c; shared structures in gate.h). See
 * docs/migration.md ("Copy engine") and shim.h.
 *
 * Start: open the mirror, attach it to every channel of the gate (new writes are mirrored
 * from then on), then pass a barrier so that no write started before the mirror is missed.
 * The copy pass walks the base's allocated ranges chunk by chunk (skipping holes when asked
 * and the base can seek them): quiesce the chunk on the gate (only the gate's module may),
 * read it from the base, write it to the mirror, unquiesce. At the end the gate stays in
 * step (every write mirrored) until the caller stops the mirror; a failure or a cancel
 * detaches it.
 */
#include "gate.h"

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
		gate_mirror_broke(s->g);
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
			gate_detach_mirror(g);
		}
		return;
	}
	if (g->status == -ECANCELED) {
		set_state(g, LITEIO_COPY_STOPPING);
	} else {
		set_state(g, LITEIO_COPY_FAILED);
	}
	gate_detach_mirror(g);
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
	rc = spdk_bdev_open_ext(mirror_name, true, gate_mirror_event, g, &g->mirror_desc);
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
		gate_detach_mirror(g);
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
