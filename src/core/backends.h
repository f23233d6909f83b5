/* The registry of back ends compiled in (src/core/backends.c). */
#ifndef MAPPING_CORE_BACKENDS_H
#define MAPPING_CORE_BACKENDS_H

#include "core/core.h"

int mapping__backend_count(void);
/* Loads back end i once; NULL when unavailable. info (may be NULL) says why. */
const mapping_backend *mapping__backend_get(int i, mapping_backend_info *info);
/* The back end mapping_open(NULL) takes without $MAPPING_BACKEND: -1 if
 * none is available. */
int mapping__backend_default(void);
/* "host, opencl, cuda": every back end of the table, for messages. */
const char *mapping__backend_names(void);
/* Index of a back end by name, -1 if unknown. */
int mapping__backend_index(const char *name);

#endif
