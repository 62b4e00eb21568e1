/*
 * LiteIO's C shim over SPDK: the NVMe-oF target: the TCP transport, a subsystem's namespace,
 * and its hosts with their DH-HMAC-CHAP keys and PSK (looked up in the keyring). See shim.h;
 * the includes shared by every shim file are in shim_internal.h.
 */
#include "shim_internal.h"

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
