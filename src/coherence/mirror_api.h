/*
 * What the public mirror functions share: the handle check every call
 * makes once (mirror_call.c), and the internal twins one public function
 * calls for another (a sync for an access intent, a wrap for a shard).
 */
#ifndef MAPPING_MIRROR_API_H
#define MAPPING_MIRROR_API_H

#include "coherence/mirror_state.h"

/* The mirror this thread last checked (a loop of marks checks the same
 * one): initial-exec thread-local, a load rather than a call (mirror_call.c). */
extern _Thread_local MAPPING_TLS_FAST mapping_live_memo mapping__mirror_check_memo;
/* The refusals of mapping__mirror_check, recorded (mirror_call.c). */
mapping_status mapping__mirror_check_failed(const char *fn, const mapping_mirror *m, uint64_t removals);

/* The handle is a live mirror of an open device, and its family is not
 * being synced (re-entry from a callback is MAPPING_ERR_BUSY). Inline: the
 * common case (the handle this thread checked last, nothing removed since)
 * is a few loads. */
static inline mapping_status mapping__mirror_check(const char *fn, const mapping_mirror *m)
{
    uint64_t removals = mapping__handle_removals_any(); /* before the lookups it vouches for */
    if (__builtin_expect(m && mapping__handle_live_memo(&mapping__mirror_check_memo, MAPPING_HANDLE_MIRROR, m, removals) &&
                             removals == m->st->dev_checked_removals && !m->st->busy,
                         1))
        return MAPPING_OK;
    return mapping__mirror_check_failed(fn, m, removals);
}
/* The sync of mapping_mirror_sync_to_gpu / _cpu (mirror_sync.c) on checked
 * arguments, after mapping__mirror_enter. */
mapping_status mapping__mirror_sync_checked(const char *fn, mapping_stream *stream, mapping_mirror *m, int t);
/* A blocking sync of the whole family to t, with its report, inside a call
 * on the family: an eviction's write-back (mirror_sync.c). It leaves busy
 * alone: an eviction may run on another thread than the family's calls,
 * whose handle checks read busy without a lock. */
mapping_status mapping__mirror_sync_family(const char *fn, mirror_state *st, int t);
/* mapping_mirror_wrap on a checked device (mirror.c); errors name fn. */
mapping_status mapping__mirror_wrap(const char *fn, mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                    mapping_mirror **out);

#endif
