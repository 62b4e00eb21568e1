/*
 * LiteIO's C shim over SPDK: the NVMe-oF initiator (SPDK's bdev_nvme): detaching a controller
 * or one path, new DH-HMAC-CHAP keys, and the paths of a multipath bdev. See shim.h; the
 * includes shared by every shim file are in shim_internal.h.
 */
#include "shim_internal.h"

int
liteio_bdev_nvme_detach(const char *name, void (*cb_fn)(void *, int), void *cb_arg)
{
	struct spdk_nvme_path_id path;

	memset(&path, 0, sizeof(path));
	return spdk_bdev_nvme_delete(name, &path, cb_fn, cb_arg);
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
