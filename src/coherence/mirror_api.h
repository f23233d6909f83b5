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
/* A mirror call on a stream that is being captured into a CUDA graph (or,
 * with stream NULL, a blocking call while a blocking stream is captured) is
 * refused with MAPPING_ERR_UNSUPPORTED naming the call: its bookkeeping
 * would be done once, at capture, instead of at each replay. */
static inline mapping_status mapping__mirror_refuse_capture(const char *fn, mapping_device *dev,
                                                            mapping_stream *stream)
{
    if (__builtin_expect(!mapping__can_capture(dev), 1))
        return MAPPING_OK;
    return mapping__stream_refuse_capture_why(dev, stream, fn,
                                              "a mirror's state would follow the capture, not each replay of the "
                                              "graph");
}

/* The sync of mapping_mirror_sync_to_gpu / _cpu (mirror_sync.c) on checked
 * arguments, after mapping__mirror_enter. */
mapping_status mapping__mirror_sync_checked(const char *fn, mapping_stream *stream, mapping_mirror *m, int t);
/* The flags mapping_mirror_create, _wrap and _create_sharded know. */
enum {
    MIRROR_CREATE_FLAGS =
        MAPPING_MIRROR_UNIFIED | MAPPING_MIRROR_PIN | MAPPING_MIRROR_TRACK_WRITES | MAPPING_MIRROR_DEVICE_DIFF
};

/* A hold on the family that is not a handle (a CUDA graph's, mirror_graph.c)
 * let go: the last hold frees the family, as mapping_mirror_destroy would
 * (mirror.c). */
void           mapping__mirror_family_release(mirror_state *st);
/* A sync of the handle's bytes to t recorded on `stream`, which is being
 * captured into a CUDA graph: each replay moves what is stale then
 * (mirror_graph.c); max_ranges 0: the default table. Checked arguments. */
mapping_status mapping__mirror_graph_sync(const char *fn, mapping_stream *stream, mapping_mirror *m, int t,
                                          size_t max_ranges);

/* A blocking sync of the whole family to t, with its report, inside a call
 * on the family: an eviction's write-back (mirror_sync.c). It leaves busy
 * alone: an eviction may run on another thread than the family's calls,
 * whose handle checks read busy without a lock. */
mapping_status mapping__mirror_sync_family(const char *fn, mirror_state *st, int t);
/* mapping_mirror_wrap on a checked device (mirror.c); errors name fn. */
mapping_status mapping__mirror_wrap(const char *fn, mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                    mapping_mirror **out);

#endif
