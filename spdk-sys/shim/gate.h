/*
 * What the gate's two C files share: the gate bdev module (gate.c: the gate, its data path
 * and its mirror) and the copy engine of hot migration (gate_copy.c). The structures of a
 * gate, its channels and its copy pass, the module, and the few calls the copy engine makes
 * into the module. Private to the shim (bindgen reads shim.h only).
 */
#ifndef LITEIO_SPDK_GATE_H
#define LITEIO_SPDK_GATE_H

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

/* The gate bdev module (gate.c). */
extern struct spdk_bdev_module g_gate_module;

/* The gate named `name` (also one whose unregistration began), or NULL. */
struct gate *gate_find(const char *name);

/* A mirror write failed or the mirror went away: break the mirror (once; any thread). */
void gate_mirror_broke(struct gate *g);

/* The mirror bdev's events (its removal breaks the mirror); `ctx` is the gate. */
void gate_mirror_event(enum spdk_bdev_event_type type, struct spdk_bdev *bdev, void *ctx);

/* Stop mirroring: each channel lets its mirrored writes finish and drops its mirror
 * channel, then the mirror is closed and the copy state settles (on the gate's thread). */
void gate_detach_mirror(struct gate *g);

/* The copy state (enum liteio_copy_state), read on any thread. */
static inline uint32_t
gate_state(struct gate *g)
{
	return __atomic_load_n(&g->state, __ATOMIC_ACQUIRE);
}

static inline void
set_state(struct gate *g, uint32_t s)
{
	__atomic_store_n(&g->state, s, __ATOMIC_RELEASE);
}

/* Add `n` to the counter `c` (any thread). */
static inline void
count(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

#endif /* LITEIO_SPDK_GATE_H */
