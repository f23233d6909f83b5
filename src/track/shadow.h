/*
 * A shadow of tracked memory (shadow.c): a copy of its content as of the
 * last look, so that a page the tracker reports written can be told apart
 * byte by byte (which bytes the program changed, which it did not).
 *
 * Write tracking reports pages; the mirror above it needs bytes: a page
 * holding a CPU write and a device result must not turn the device's bytes
 * into CPU marks (a false conflict). The shadow answers that exactly: a
 * changed byte is one whose content differs from the shadow. In a page the
 * program changed in more than MAPPING_TRACK_SHADOW_RUNS places, runs
 * closer than MAPPING_TRACK_SHADOW_GAP bytes are joined (the gap's bytes
 * count as changed), so that a dense update (every int incremented) gives
 * one range rather than one per element.
 *
 * Memory: the tracked size again, faulted in when the shadow is made (so a
 * collect never takes a page fault writing it).
 */
#ifndef MAPPING_TRACK_SHADOW_H
#define MAPPING_TRACK_SHADOW_H

#include <stdbool.h>
#include <stddef.h>

enum { MAPPING_TRACK_SHADOW_RUNS = 64, MAPPING_TRACK_SHADOW_GAP = 64 };
/* From this size on a shadow is whole pages of its own (mmap), which a
 * driver can page-lock in place; below it, a heap block. */
enum { MAPPING_TRACK_SHADOW_LOCK_MIN = 1 << 20 };

typedef struct mapping_track_shadow {
    unsigned char *bytes;
    size_t         size;
} mapping_track_shadow;

/* A shadow of size bytes holding content (NULL: zeros). 0 or -ENOMEM. */
int  mapping_track_shadow_init(mapping_track_shadow *s, const void *content, size_t size);
void mapping_track_shadow_free(mapping_track_shadow *s);
/* Called with each run [lo, hi) of changed bytes (offsets), ascending. */
typedef void (*mapping_track_shadow_fn)(void *user, size_t lo, size_t hi);
/* Compares mem[lo, hi) with the shadow page by page (page: the tracker's
 * granularity, a power of two): fn for each run of changed bytes, and the
 * shadow takes the new content there. */
void mapping_track_shadow_diff(mapping_track_shadow *s, const unsigned char *mem, size_t lo, size_t hi, size_t page,
                               mapping_track_shadow_fn fn, void *user);
/* The shadow takes mem[lo, hi) (writes that are not the program's). */
void mapping_track_shadow_take(mapping_track_shadow *s, const unsigned char *mem, size_t lo, size_t hi);

#endif
