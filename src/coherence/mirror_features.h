/*
 * The optional features of a mirror family, each a table of hooks
 * (mirror_state.h) with private state, begun when the family is made:
 *   write tracking   MAPPING_MIRROR_TRACK_WRITES   mirror_track.c
 *   device diff      MAPPING_MIRROR_DEVICE_DIFF    mirror_diff.c
 *   unmarked check   MAPPING_CHECK=unmarked        mirror_check.c
 *   unified memory   MAPPING_MIRROR_UNIFIED        mirror_unified.c
 *   residency        a device memory budget        mirror_resident.c
 * A begin adds the feature to the family (mapping__mirror_add_feature); its
 * end hook undoes it.
 */
#ifndef MAPPING_MIRROR_FEATURES_H
#define MAPPING_MIRROR_FEATURES_H

#include "coherence/mirror_state.h"

/* Watches st->cpu (whole pages); MAPPING_ERR_UNSUPPORTED or
 * _INVALID_ARGUMENT (recorded) when it cannot. */
mapping_status mapping__mirror_track_begin(const char *fn, mirror_state *st);
/* How many bytes of whole pages a tracked mirror of `bytes` allocates, so
 * that no other data shares its pages. */
size_t         mapping__mirror_track_alloc_bytes(size_t bytes);

/* Turns the diff on for a new family; refuses a bad $MAPPING_DEVICE_DIFF. */
mapping_status mapping__mirror_diff_begin(const char *fn, mirror_state *st);
/* Tests: forces $MAPPING_DEVICE_DIFF (0 auto, 1 on, 2 off, 3 bad; -1 re-read). */
void           mapping__mirror_diff_force_mode(int mode);
/* Tests: bytes whose device shadow is known. */
size_t         mapping__mirror_diff_known_bytes(const mirror_state *st);

/* MAPPING_CHECK=unmarked: watches the family when the check is on. */
void           mapping__mirror_check_begin(mirror_state *st);

/* Allocates unified memory for st (st->gpu, st->cpu) if the back end can
 * and adds the feature; MAPPING_ERR_UNSUPPORTED (recorded) when it cannot. */
mapping_status mapping__mirror_unified_begin(mirror_state *st);

/* Residency under the device's memory budget: the family may be evicted
 * (registered with core's budget) and is made again when a call needs its
 * device side. locked: begun inside a call on the family, which its
 * call_end ends (the family's lock is taken now). */
mapping_status mapping__mirror_resident_begin(const char *fn, mirror_state *st, bool locked);
/* Lets go of the lock a family being made took in resident_begin (locked)
 * once it is whole (mirror.c, finish_family). */
void           mapping__mirror_resident_unlock(mirror_state *st);
/* Evicts the family now (mapping_mirror_evict; in a call on the family):
 * waits for its queued work first; MAPPING_ERR_BUSY while acquired. */
mapping_status mapping__mirror_resident_evict(const char *fn, mirror_state *st);
/* The family ends: off the device's list first, after an eviction running
 * on another thread (nothing when it has no residency, or the device was
 * closed first). */
void           mapping__mirror_resident_retire(mirror_state *st, bool device_closed);
/* MAPPING_RESIDENCY_* for the budget's choice. */
void           mapping__mirror_resident_hint(mirror_state *st, int hint);
/* The device buffer (NULL while evicted), read under the family's lock. */
mapping_buffer *mapping__mirror_resident_gpu(mirror_state *st);
/* Whether the device side is allocated (true without the feature). */
bool           mapping__mirror_resident_is(const mirror_state *st);

#endif
