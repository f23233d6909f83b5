/*
 * MAPPING_CHECK=races: host memory that an asynchronous copy uses is
 * protected while the copy is queued, so that the first racing CPU access
 * stops the program with a report (race_guard.c):
 * - host to device: the source range is read-only from enqueue until the
 *   copy has completed (a CPU write would change what the device gets);
 * - device to host: the destination range is inaccessible from enqueue
 *   until the copy starts (a read would see old bytes, a write would be
 *   overwritten); during the copy itself it is writable, because a driver
 *   may write it with CPU stores (the host back end, PoCL, CUDA's pageable
 *   path), and the library cannot tell those stores from the program's.
 * Only whole pages inside a range are protected (mprotect works on pages):
 * the bytes of a range's first and last partial page are not checked.
 * Off (the default), the hooks cost one predicted branch per async copy.
 */
#ifndef MAPPING_RACE_GUARD_H
#define MAPPING_RACE_GUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 0 not read yet, 1 off, 2 on ($MAPPING_CHECK holds "races"). */
extern _Atomic int mapping__race_mode __attribute__((visibility("hidden")));
int mapping__race_mode_read(void);
static inline bool mapping__race_check_on(void)
{
    int mode = atomic_load_explicit(&mapping__race_mode, memory_order_relaxed);
    if (__builtin_expect(mode == 1, 1))
        return false;
    return (mode ? mode : mapping__race_mode_read()) == 2;
}

enum { MAPPING_RACE_H2D = 1, MAPPING_RACE_D2H = 2 };
typedef struct mapping_race_guard mapping_race_guard;
/* Protects the whole pages of [ptr, ptr + bytes) for a copy of kind op
 * queued on `stream` (named in the report; `worker`: the identity its
 * threads give mapping_os_worker_stream, whose faults are the stream's own
 * work, not races), unless an earlier copy not yet
 * done touches one of the pages this one touches (then the guard stays open:
 * no check). A copy with no whole page gets an open guard (so later copies
 * see it). NULL when nothing is recorded (0 bytes, table full, pages
 * watched by mprotect write tracking): no check. */
mapping_race_guard *mapping__race_guard_begin(const void *ptr, size_t bytes, int op, const void *stream,
                                              const void *worker);
/* The copy starts (device to host): its range becomes writable for it. */
void                mapping__race_guard_started(void *guard);
/* The copy completed (or was never queued): the protection goes. */
void                mapping__race_guard_end(void *guard);
/* Write tracking beside the guards (write_track.c): tracking begins under
 * the guards' lock (lock order: the guards', then the tracker's), asks the
 * memory's protection without the guards' (guarded pages were plain
 * read-write memory), and takes over guarded pages for good (mprotect: a
 * guard's end would make a tracked page writable, and its writes unseen). */
void mapping__race_guards_lock(void);
void mapping__race_guards_unlock(void);
void mapping__race_guards_yield_locked(uintptr_t lo, uintptr_t hi);
/* mprotect tracking watches [lo, hi) from now on (guards yield it, and no
 * new guard protects it): 0 or -ENOMEM; until unwatch. */
int  mapping__race_guards_watch_locked(uintptr_t lo, uintptr_t hi);
void mapping__race_guards_unwatch_locked(uintptr_t lo, uintptr_t hi);
int  mapping__race_guards_range_access_locked(uintptr_t lo, uintptr_t hi, int prot, int *exec);
/* mapping_os_range_access over [lo, hi) with guarded pages taken as they
 * were before their guard (read-write); takes the lock. */
int  mapping__race_guards_range_access(uintptr_t lo, uintptr_t hi, int prot);

/* Around a host function queued on `stream`: its accesses to that stream's
 * guarded ranges are stream-ordered, not races; they are let through, and
 * the protection comes back when it returns. */
void                mapping__race_stream_fn_enter(const void *stream);
void                mapping__race_stream_fn_leave(void);

#endif
