/*
 * LiteIO's C shim over SPDK: helpers for what bindgen cannot express (option structs of
 * bdev modules whose headers SPDK does not install, internal lvstore/lvol fields, macros).
 * Only public SPDK types appear in this header.
 */
#ifndef LITEIO_SPDK_SHIM_H
#define LITEIO_SPDK_SHIM_H

#include <stdbool.h>
#include <stdint.h>

#include "spdk/bdev.h"
#include "spdk/lvol.h"
#include "spdk/module/bdev/raid.h"
#include "spdk/nvmf.h"
#include "spdk/uuid.h"

#define LITEIO_NAME_MAX 128

/* Facts about an lvstore. */
struct liteio_lvs_info {
	char name[LITEIO_NAME_MAX];
	char uuid[LITEIO_NAME_MAX];
	char base_bdev[LITEIO_NAME_MAX];
	uint64_t cluster_size;
	uint64_t total_data_clusters;
	uint64_t free_clusters;
	uint64_t block_size;
};

/* Facts about an lvol. */
struct liteio_lvol_info {
	char name[LITEIO_NAME_MAX];
	char lvs_name[LITEIO_NAME_MAX];
	char uuid[LITEIO_NAME_MAX];
	char bdev_name[LITEIO_NAME_MAX];
	/* Name of the snapshot this lvol is a clone of; empty when none. */
	char parent[LITEIO_NAME_MAX];
	uint64_t size_bytes;
	uint64_t allocated_bytes;
	/* Blobstore id: increases with creation order (a snapshot's origin keeps its older id). */
	uint64_t blob_id;
	bool thin;
	bool snapshot;
	bool clone;
};

/* The first lvstore known to the lvol module, or NULL. */
struct spdk_lvol_store *liteio_lvs_first(void);
/* The lvstore after `prev`, or NULL. */
struct spdk_lvol_store *liteio_lvs_next(struct spdk_lvol_store *prev);
/* Fill `out` with the lvstore's facts. */
void liteio_lvs_get_info(struct spdk_lvol_store *lvs, struct liteio_lvs_info *out);
/* Fill `out` with the lvol's facts. */
void liteio_lvol_get_info(struct spdk_lvol *lvol, struct liteio_lvol_info *out);
/* Fill `out` for the lvol behind `bdev`; returns false when the bdev is not an lvol. */
bool liteio_bdev_lvol_info(struct spdk_bdev *bdev, struct liteio_lvol_info *out);

/* Create a RAM-backed bdev (tests). Returns 0 or a negative errno. */
int liteio_malloc_create(const char *name, uint64_t num_blocks, uint32_t block_size,
			 const struct spdk_uuid *uuid);
/* Delete a malloc bdev; `cb_fn(cb_arg, errno)` runs on the calling SPDK thread. */
void liteio_malloc_delete(const char *name, void (*cb_fn)(void *, int), void *cb_arg);
/* Create a null bdev (benchmarks). Returns 0 or a negative errno. */
int liteio_null_create(const char *name, uint64_t num_blocks, uint32_t block_size);
/* Delete a null bdev. */
void liteio_null_delete(const char *name, void (*cb_fn)(void *, int), void *cb_arg);
/* Create a raid bdev of `level` (SPDK_BDEV_RAID_LEVEL_CONCAT, _RAID0 or _RAID1) over `num_base`
 * bdevs, with a strip size in KiB (0 for raid1). With `superblock`, the raid keeps its layout
 * in a superblock at the start of every base bdev (its data starts 1 MiB in) and can be
 * assembled again from them; `uuid` is the raid's UUID (NULL or all zero: SPDK makes one).
 * Call on the app thread. Returns 0 when the operation started (`cb_fn(cb_arg, status)` will
 * run, possibly before this returns; on a failure SPDK has removed the raid again by then), or
 * a negative errno (it will not): -EINVAL another level, a bad strip size or too few bases,
 * -EEXIST the name is taken. A base bdev that does not exist leaves the raid "configuring"
 * with `cb_fn(cb_arg, 0)`: the caller checks the bases first and the state after. */
int liteio_raid_create(const char *name, uint32_t strip_size_kb, enum spdk_bdev_raid_level level,
		       uint8_t num_base, const char *const *base_names, bool superblock,
		       const struct spdk_uuid *uuid, void (*cb_fn)(void *, int), void *cb_arg);
/* Delete a raid bdev by name, also one still configuring (not registered as a bdev). Returns
 * 0 when started (`cb_fn(cb_arg, status)` will run; -EALREADY when a delete is under way),
 * or -ENODEV when there is no such raid (it will not). */
int liteio_raid_delete(const char *name, void (*cb_fn)(void *, int), void *cb_arg);

/* Add the bdev `base_name` to an empty slot of the raid bdev `name` (a raid1 that lost a
 * member: SPDK rebuilds onto it). Call on the app thread. Returns 0 when started (`cb_fn(cb_arg,
 * status)` runs once the member is configured or the rebuild has started), or a negative
 * errno (it will not): -ENODEV no such raid or base, -EINVAL no empty slot, -EPERM a
 * background process runs. */
int liteio_raid_add_base(const char *name, const char *base_name, void (*cb_fn)(void *, int),
			 void *cb_arg);
/* Find the raid whose configured member is the bdev `base_name`: writes the raid's name to
 * `raid_out` (`len` bytes) and whether that member is already being removed to `removing`.
 * Returns 0, -ENODEV when there is no such bdev, -ENOENT when no raid holds it. Call on the
 * app thread. */
int liteio_raid_find_base(const char *base_name, char *raid_out, size_t len, bool *removing);
/* Remove the bdev `base_name` from the raid that holds it (a raid1 goes on degraded; its
 * superblock, if any, marks the slot missing on the other members). Call on the app thread.
 * Returns 0 when started (`cb_fn(cb_arg, status)` runs once the member is released), or a
 * negative errno (it will not): -ENODEV no such bdev or no raid holds it. */
int liteio_raid_remove_base(const char *base_name, void (*cb_fn)(void *, int), void *cb_arg);

/* Limit the bandwidth of raid background processes (rebuilds) started from now on, in MiB/s;
 * 0: no limit (SPDK's default). Returns 0 or a negative errno. Call on the app thread. */
int liteio_raid_set_process_limit(uint32_t max_mib_per_sec);

/* One base bdev slot of a raid bdev. */
struct liteio_raid_base {
	/* Name of the base bdev; empty when the slot is missing (never found, or removed). */
	char name[LITEIO_NAME_MAX];
	/* UUID of the base bdev; empty when none was ever seen in this slot. */
	char uuid[SPDK_UUID_STRING_LEN];
	/* Blocks from the start of the base bdev to its data, and of data. */
	uint64_t data_offset;
	uint64_t data_size;
	/* The base bdev is open and part of the array. */
	bool configured;
	/* The base bdev is the target of the background process (a rebuild). */
	bool process_target;
	/* The raid failed the base bdev (an I/O error) and is removing it. */
	bool failed;
	/* State of the slot in the raid's superblock (LITEIO_RAID_SB_*); LITEIO_RAID_SB_NONE
	 * without a superblock. */
	uint32_t sb_state;
};

/* Facts about a raid bdev, read on the app thread. */
struct liteio_raid_info {
	char name[LITEIO_NAME_MAX];
	char uuid[SPDK_UUID_STRING_LEN];
	/* enum spdk_bdev_raid_level */
	int32_t level;
	/* enum spdk_bdev_raid_state */
	uint32_t state;
	uint32_t strip_size_kb;
	/* Block size and blocks of the raid bdev (0 while configuring). */
	uint32_t block_size;
	uint64_t num_blocks;
	uint8_t num_base_bdevs;
	uint8_t num_base_bdevs_discovered;
	uint8_t num_base_bdevs_operational;
	uint8_t min_base_bdevs_operational;
	bool superblock;
	/* The superblock's sequence number (incremented on every superblock update); 0 when
	 * the raid has none (yet). */
	uint64_t sb_seq;
	/* A delete was started. */
	bool destroying;
	/* The background process, when `process_type` is not empty: its type ("rebuild"), the
	 * base bdev it writes, the blocks done and the percentage, as SPDK reports them in
	 * bdev_raid_get_bdevs. */
	char process_type[32];
	char process_target[LITEIO_NAME_MAX];
	uint64_t process_blocks;
	uint32_t process_percent;
};

/* Fill `info` and up to `max` entries of `bases` (slot order) with the facts of the raid bdev
 * `name`. Returns its number of base bdev slots (may exceed `max`), or -ENODEV when there is
 * no such raid. Call on the app thread. */
int liteio_raid_get_info(const char *name, struct liteio_raid_info *info,
			 struct liteio_raid_base *bases, int max);

/* States of a slot in a raid superblock (SPDK's enum raid_bdev_sb_base_bdev_state), and "no
 * superblock". */
#define LITEIO_RAID_SB_MISSING 0
#define LITEIO_RAID_SB_CONFIGURED 1
#define LITEIO_RAID_SB_FAILED 2
#define LITEIO_RAID_SB_SPARE 3
#define LITEIO_RAID_SB_NONE 255

/* One member slot as a raid superblock records it. */
struct liteio_raid_sb_base {
	char uuid[SPDK_UUID_STRING_LEN];
	uint64_t data_offset;
	uint64_t data_size;
	/* LITEIO_RAID_SB_* */
	uint32_t state;
	uint8_t slot;
};

/* The raid superblock found on a bdev. */
struct liteio_raid_sb {
	char name[LITEIO_NAME_MAX];
	char uuid[SPDK_UUID_STRING_LEN];
	uint64_t seq_number;
	/* Blocks of the raid bdev, its block size, strip size in blocks. */
	uint64_t raid_size;
	uint32_t block_size;
	uint32_t strip_size;
	/* enum spdk_bdev_raid_level */
	int32_t level;
	uint8_t num_base_bdevs;
	uint8_t base_bdevs_size;
	struct liteio_raid_sb_base bases[255];
};

/* Read the raid superblock of the bdev `bdev_name` (opened read-only: also a raid's member).
 * Call on the app thread. Returns 0 when started: `cb_fn(cb_arg, sb, status)` runs once, with
 * `sb` valid for that call only: status 0 and the superblock, -EINVAL and NULL when the bdev
 * holds no valid raid superblock, another negative errno (an I/O error). Or returns a
 * negative errno (no callback): -ENODEV no such bdev, -ENOTSUP a bdev with interleaved
 * metadata or DIF. */
int liteio_raid_sb_read(const char *bdev_name,
			void (*cb_fn)(void *, struct liteio_raid_sb *, int), void *cb_arg);

/* Mark the slots of the members whose UUIDs are in `missing` (`n` of them) missing in the raid
 * superblock on the bdev `bdev_name`, bump its sequence number and write it back: what SPDK
 * writes on the other members when one goes, so that a raid assembled from this bdev starts
 * without them and never reads them as current. Refused (-ESTALE) unless the superblock there
 * is the one of `raid_uuid` with sequence number `expect_seq`; -EPERM when the bdev is claimed
 * (by a raid). Call on the app thread. Returns 0 when started (`cb_fn(cb_arg, status)` runs
 * once), or a negative errno (it will not). */
int liteio_raid_sb_mark_missing(const char *bdev_name, const char *raid_uuid, uint64_t expect_seq,
				const char *const *missing, int n, void (*cb_fn)(void *, int),
				void *cb_arg);

/* Zero the raid superblock on the bdev `bdev_name` (no valid superblock is left: a raid takes
 * the bdev as a blank member and rebuilds it), only if it is the superblock of `raid_uuid`
 * with a sequence number below `below_seq` (a stale member of that raid; else -ESTALE);
 * -EPERM when the bdev is claimed. Call on the app thread. Returns 0 when started
 * (`cb_fn(cb_arg, status)` runs once), or a negative errno (it will not). */
int liteio_raid_sb_wipe(const char *bdev_name, const char *raid_uuid, uint64_t below_seq,
			void (*cb_fn)(void *, int), void *cb_arg);

/* Have the raid module examine the bdev `bdev_name` now (read its superblock and create or
 * join the raid it names), whatever the bdev layer's auto-examine setting, also a second
 * time. Completion: spdk_bdev_wait_for_examine. Returns 0 when started, -ENODEV no such
 * bdev, -EBUSY the bdev is claimed, -ENOENT no raid module. Call on the app thread. */
int liteio_raid_examine(const char *bdev_name);

/* Write the name of the module that claimed `bdev` to `out` (`len` bytes) and return true, or
 * return false when no module claimed it. Call on an SPDK thread. */
bool liteio_bdev_claimed_by(struct spdk_bdev *bdev, char *out, size_t len);

/* Tunables of the NVMe/TCP transport; zero keeps SPDK's default. */
struct liteio_tcp_opts {
	uint32_t max_queue_depth;
	uint32_t max_qpairs_per_ctrlr;
	uint32_t in_capsule_data_size;
	uint32_t max_io_size;
	uint32_t io_unit_size;
	uint32_t num_shared_buffers;
	uint32_t buf_cache_size;
};

/* Create the TCP transport with `opts` and add it to `tgt`; `cb_fn(cb_arg, status)` runs when
 * it is added. Returns 0 when the operation started, or a negative errno. */
int liteio_nvmf_tcp_transport_add(struct spdk_nvmf_tgt *tgt, const struct liteio_tcp_opts *opts,
				  void (*cb_fn)(void *, int), void *cb_arg);

/* Add `bdev_name` as a namespace of `ss` with the given UUID (NGUID = the same bytes).
 * Returns the nsid, or 0 on failure. */
uint32_t liteio_nvmf_add_ns(struct spdk_nvmf_subsystem *ss, const char *bdev_name,
			    const char *uuid_str);

/* Detach every path of the NVMe bdev controller `name` (bdev_nvme). Returns 0 when the
 * operation started (`cb_fn` will run), or a negative errno (it will not). */
int liteio_bdev_nvme_detach(const char *name, void (*cb_fn)(void *, int), void *cb_arg);

/* Longest key material the in-memory keyring holds, NUL included (a DHHC-1 secret of a
 * 64-byte key is 101 characters). */
#define LITEIO_KEY_MAX 256

/* Add `secret` (a NUL-terminated DHHC-1 secret or TLS PSK) to SPDK's keyring as `name`,
 * held in memory only. Returns 0, -EEXIST when the name is taken, -EINVAL when the secret is
 * empty or too long. */
int liteio_keyring_add(const char *name, const char *secret);
/* Remove a key added by liteio_keyring_add; users holding it keep it until they let go.
 * Returns 0 or -ENOKEY. */
int liteio_keyring_remove(const char *name);
/* Whether the keyring has a key of that name. */
bool liteio_keyring_has(const char *name);

/* Allow `hostnqn` on `ss` with the named keys (NULL: none). `dhchap_key`: the host must
 * authenticate with DH-HMAC-CHAP; `dhchap_ctrlr_key`: the controller authenticates to the
 * host too; `psk`: the TLS PSK for a secure-channel listener. Returns 0 or a negative errno
 * (-ENOKEY: a key is not in the keyring). */
int liteio_nvmf_add_host(struct spdk_nvmf_subsystem *ss, const char *hostnqn,
			 const char *dhchap_key, const char *dhchap_ctrlr_key, const char *psk);
/* Replace the DH-HMAC-CHAP keys of an allowed host; connected hosts stay connected and new
 * connections need the new keys. Returns 0 or a negative errno. */
int liteio_nvmf_set_keys(struct spdk_nvmf_subsystem *ss, const char *hostnqn,
			 const char *dhchap_key, const char *dhchap_ctrlr_key);

/* Longest host NQN the shim reports, NUL included (SPDK_NVMF_NQN_MAX_LEN + 1). */
#define LITEIO_NQN_MAX 224

/* Write the host NQNs of the controllers connected to `ss` now (each once) into `out`, room
 * for `max` of LITEIO_NQN_MAX bytes each. Returns how many hosts there are (may exceed `max`).
 * Call on the app thread (the subsystem's thread). */
int liteio_nvmf_connected_hosts(struct spdk_nvmf_subsystem *ss, char *out, int max);

/* Give the attached NVMe bdev controller `name` new DH-HMAC-CHAP keys (names in the keyring;
 * NULL: none) and re-authenticate its connected queue pairs with them, without
 * disconnecting. Returns 0 when the operation started (`cb_fn` will run), or a negative
 * errno (it will not). */
int liteio_bdev_nvme_set_keys(const char *name, const char *dhchap_key,
			      const char *dhchap_ctrlr_key, void (*cb_fn)(void *, int), void *cb_arg);

/*
 * The gate (gate.c): a pass-through bdev of LiteIO's own module, "liteio_gate", in front of
 * an exported volume, and the copy engine of hot migration. All functions run on the SPDK
 * thread that created the gate.
 */
typedef void (*liteio_gate_cb)(void *cb_arg, int status);

/* Where a gate's mirror and copy pass stand. */
enum liteio_copy_state {
	/* No copy was ever started. */
	LITEIO_COPY_NONE = 0,
	/* Mirror being attached; the barrier has not passed yet. */
	LITEIO_COPY_STARTING = 1,
	/* The copy pass runs; writes are mirrored. */
	LITEIO_COPY_COPYING = 2,
	/* The copy pass is over and writes are still mirrored: the mirror equals the base. */
	LITEIO_COPY_IN_STEP = 3,
	/* Cancelled; the mirror is being detached. */
	LITEIO_COPY_STOPPING = 4,
	/* Cancelled; the mirror is detached. */
	LITEIO_COPY_CANCELLED = 5,
	/* The copy or a mirrored write failed; the mirror is (being) detached. */
	LITEIO_COPY_FAILED = 6,
	/* In step, then the mirror was detached on request. */
	LITEIO_COPY_FINISHED = 7,
};

/* Options of a copy pass; zero keeps the default. */
struct liteio_copy_opts {
	/* Bytes per chunk (default 1 MiB); a multiple of the block size. */
	uint64_t chunk_bytes;
	/* Chunks in flight (default 4, at most 32). */
	uint32_t queue_depth;
	/* Copy only what SEEK_DATA/SEEK_HOLE report allocated. Only for a base whose holes
	 * read zeroes (a thin lvol that is not a clone: a clone's holes read its snapshot). */
	bool skip_holes;
};

/* Counters of a gate's last copy pass. */
struct liteio_copy_progress {
	char base[LITEIO_NAME_MAX];
	uint32_t state; /* enum liteio_copy_state */
	int32_t status; /* 0, or the negative errno the pass ended with */
	bool mirror_attached;
	uint64_t size_bytes;
	uint64_t scanned_bytes;
	uint64_t copied_bytes;
	uint64_t mirrored_writes;
	uint64_t mirror_errors;
	uint64_t elapsed_us;
};

/* Create a gate over `base_name` and write its name ("<base bdev name>-gate") to
 * `out_name`. Returns 0 or a negative errno (-ENODEV: no such base; -EPERM: the base is
 * claimed by another module). */
int liteio_gate_create(const char *base_name, char *out_name, size_t out_len);
/* Unregister the gate `name` (a copy in flight is cancelled first); `cb_fn` runs when it
 * is gone. Returns 0 when started, -ENODEV when there is no such gate. */
int liteio_gate_delete(const char *name, liteio_gate_cb cb_fn, void *cb_arg);
/* Attach `mirror_name` to the gate and start the copy pass; `cb_fn(cb_arg, status)` runs once
 * when the pass ends: 0 = in step (the mirror stays attached), else the error (the mirror is
 * detached by then). Returns 0 when started (`cb_fn` will run), or a negative errno (it will
 * not): -ENODEV no gate or mirror, -EBUSY a mirror is attached, -EINVAL a mirror of another
 * block size, smaller than the gate, or the gate's own base. */
int liteio_gate_start_copy(const char *name, const char *mirror_name,
			   const struct liteio_copy_opts *opts, liteio_gate_cb cb_fn, void *cb_arg);
/* Detach the mirror: a copy pass in flight is cancelled (its callback gets -ECANCELED),
 * mirrored writes in flight finish, and `cb_fn(cb_arg, 0)` runs once the mirror is closed.
 * With `require_in_step`, refuse (-EAGAIN) unless the copy pass ended in step. Returns 0
 * when `cb_fn` will run (it may have run already), or a negative errno. */
int liteio_gate_stop_mirror(const char *name, bool require_in_step, liteio_gate_cb cb_fn,
			    void *cb_arg);
/* Fill `out` with the gate's counters. Returns 0 or -ENODEV. */
int liteio_gate_progress(const char *name, struct liteio_copy_progress *out);

/* SPDK's version as major * 10000 + minor * 100 + patch, as compiled. */
uint32_t liteio_spdk_version_compiled(void);

/* Multipath (the switch-over of a hot migration): the paths of an NVMe bdev controller. */

/* One path (controller) of a multipath NVMe bdev controller, as the initiator sees it. */
struct liteio_nvme_path {
	char traddr[SPDK_NVMF_TRADDR_MAX_LEN + 1];
	char trsvcid[SPDK_NVMF_TRSVCID_MAX_LEN + 1];
	/* Controller ID the target handed out. */
	uint16_t cntlid;
	/* ANA state of namespace 1 on this path as last read (enum spdk_nvme_ana_state);
	 * 0 when the path has no namespace 1. */
	uint32_t ana_state;
	/* The controller is connected: not resetting, failed or being deleted. */
	bool connected;
};

/* Fill `out` (room for `max`) with the paths of the NVMe bdev controller `name`. Returns
 * how many paths it has (may be more than `max`), or -ENODEV when there is no such
 * controller. Call on the app thread. */
int liteio_bdev_nvme_paths(const char *name, struct liteio_nvme_path *out, int max);

/* Detach one path of the NVMe bdev controller `name`: the controller connected to `trid`
 * (its transport type, address family, address and service id are compared). The last path
 * takes the controller and its bdevs with it. Returns 0 when the operation started (`cb_fn`
 * will run), or a negative errno (it will not; -ENXIO: no such path, -ENODEV: no such
 * controller). */
int liteio_bdev_nvme_detach_path(const char *name, const struct spdk_nvme_transport_id *trid,
				 void (*cb_fn)(void *, int), void *cb_arg);

#endif
