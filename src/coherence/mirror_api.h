/*
 * What the public mirror functions share: the handle check every call
 * makes once (mirror_call.c), and the internal twins one public function
 * calls for another (a sync for an access intent, a wrap for a shard).
 */
#ifndef MAPPING_MIRROR_API_H
#define MAPPING_MIRROR_API_H

#include "coherence/mirror_state.h"

/* The handle is a live mirror of an open device, and its family is not
 * being synced (re-entry from a callback is MAPPING_ERR_BUSY). */
mapping_status mapping__mirror_check(const char *fn, const mapping_mirror *m);
/* The sync of mapping_mirror_sync_to_gpu / _cpu (mirror_sync.c) on checked
 * arguments, after mapping__mirror_enter. */
mapping_status mapping__mirror_sync_checked(const char *fn, mapping_stream *stream, mapping_mirror *m, int t);
/* mapping_mirror_wrap on a checked device (mirror.c); errors name fn. */
mapping_status mapping__mirror_wrap(const char *fn, mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                    mapping_mirror **out);

#endif
