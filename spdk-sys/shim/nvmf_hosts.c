/*
 * LiteIO's C shim: the hosts connected to an NVMe-oF subsystem. SPDK has no public call that
 * lists a subsystem's controllers (its nvmf_subsystem_get_controllers RPC reads them from the
 * library's private header), so this file alone includes lib/nvmf/nvmf_internal.h from
 * SPDK's source tree; build.rs checks the SPDK version it was written for. See shim.h.
 */
#include <string.h>
#include <stdio.h>

#include "nvmf_internal.h"

#include "shim.h"

int
liteio_nvmf_connected_hosts(struct spdk_nvmf_subsystem *ss, char *out, int max)
{
	struct spdk_nvmf_ctrlr *ctrlr;
	int n = 0, i;

	TAILQ_FOREACH(ctrlr, &ss->ctrlrs, link) {
		bool seen = false;

		for (i = 0; i < n && i < max; i++) {
			if (strncmp(&out[(size_t)i * LITEIO_NQN_MAX], ctrlr->hostnqn, LITEIO_NQN_MAX) == 0) {
				seen = true;
				break;
			}
		}
		if (seen) {
			continue;
		}
		if (n < max) {
			snprintf(&out[(size_t)n * LITEIO_NQN_MAX], LITEIO_NQN_MAX, "%s", ctrlr->hostnqn);
		}
		n++;
	}
	return n;
}
