/*
 * What the shim's C files (shim_*.c) share and shim.h, the header bindgen reads, must not
 * carry: SPDK's private and module headers (from SPDK's source tree, because SPDK does not
 * install the bdev module headers; build.rs checks the SPDK version these were written
 * for) and a small string helper. Not for bindgen.
 */
#ifndef LITEIO_SPDK_SHIM_INTERNAL_H
#define LITEIO_SPDK_SHIM_INTERNAL_H

#include <errno.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include "spdk/nvmf.h"
#include "spdk/module/bdev/nvme.h"

#include "spdk/blob.h"
#include "spdk/crc32.h"
#include "spdk/env.h"
#include "spdk/json.h"
#include "spdk/keyring.h"
#include "spdk/keyring_module.h"
#include "spdk/string.h"
#include "spdk/thread.h"
#include "spdk/util.h"
#include "spdk/uuid.h"
#include "spdk/version.h"
#include "spdk_internal/lvolstore.h"

#include "bdev_malloc.h"
#include "bdev_nvme.h"
#include "bdev_null.h"
#include "bdev_raid.h"
#include "vbdev_lvol.h"

#include "shim.h"

/* Copy a name SPDK owns into a LITEIO_NAME_MAX buffer, truncated; NULL gives "". */
static inline void
copy_str(char *dst, const char *src)
{
	snprintf(dst, LITEIO_NAME_MAX, "%s", src ? src : "");
}

#endif /* LITEIO_SPDK_SHIM_INTERNAL_H */
