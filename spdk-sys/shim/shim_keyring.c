/*
 * LiteIO's C shim over SPDK: the in-memory keyring module that holds the secrets of exports
 * and of the initiator. See shim.h; the includes shared by every shim file are in
 * shim_internal.h.
 */
#include "shim_internal.h"

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
