/*
 * The optional features of a mirror family, each a table of hooks
 * (mirror_state.h) with private state, begun when the family is made:
 *   write tracking   MAPPING_MIRROR_TRACK_WRITES   mirror_track.c
 *   device diff      MAPPING_MIRROR_DEVICE_DIFF    mirror_diff.c
 *   unmarked check   MAPPING_CHECK=unmarked        mirror_check.c
 *   unified memory   MAPPING_MIRROR_UNIFIED        mirror_unified.c
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

#endif
