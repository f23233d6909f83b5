/*
 * A family's queued work (mirror_queue.c): an event recorded on a stream
 * after each queued copy (or the caller's device work between acquire_gpu
 * and release_gpu), with the ranges it makes valid when it completes.
 * Only the entries and their events live here; waiting for them and folding
 * them into the state is mirror_state.c's.
 */
#ifndef MAPPING_MIRROR_QUEUE_H
#define MAPPING_MIRROR_QUEUE_H

#include "coherence/mirror_state.h"

/* Room for one more entry. */
mapping_status mapping__mirror_queue_reserve(mirror_queue *q);
/* Records the current end of `stream` as an entry over [lo, hi) whose
 * ranges become valid on target when it completes (MIRROR_ACCESS: orders
 * only). Takes ownership of ranges on success only; room reserved first. */
mapping_status mapping__mirror_queue_push(mirror_queue *q, mapping_stream *stream, size_t lo, size_t hi, int target,
                                          mapping_range *ranges, size_t n);
/* Reserve and push an entry that folds nothing. */
mapping_status mapping__mirror_queue_access(mirror_queue *q, mapping_stream *stream, size_t lo, size_t hi);
/* Destroys entry i's event and ranges, and removes it. */
void           mapping__mirror_queue_release(mirror_queue *q, size_t i);
/* Frees the entries' ranges and the array (their events went with the
 * device, or were released first). */
void           mapping__mirror_queue_free(mirror_queue *q);

#endif
