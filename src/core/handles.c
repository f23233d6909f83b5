/*
 * The registry of live handles: one set of pointer values per kind of
 * object (device, buffer, stream, event, mirror, batch, pipeline). A public
 * function looks a handle up here before it reads a single field of it, so
 * a freed, double-freed, foreign (another kind), misaligned or made-up value
 * is refused with MAPPING_ERR_INVALID_HANDLE instead of being dereferenced.
 *
 * Each set is an open-addressing hash table (linear probing) of atomic
 * pointer values. Lookups take no lock: they read the table pointer and a
 * few slots. Insertions and removals take the set's mutex. A removed entry
 * becomes a tombstone, which a later insertion may reuse; slots never go back
 * to empty, so a lookup stops at the first empty slot, or after the longest
 * probe any insertion into this table has made. A table grows (to a new one,
 * published atomically) when half of it is live; the old table is kept,
 * never freed, because a lookup may still be reading it (the tables only
 * double, so all old ones together are smaller than the current one).
 *
 * What this cannot do: make a call that races with the destruction of the
 * same handle on another thread safe. That stays the caller's bug, as it is
 * for free() and use of the same pointer.
 */
#include <stdlib.h>
#include "core/core.h"

enum { SLOT_EMPTY = 0, SLOT_TOMBSTONE = 1, MIN_SLOTS = 64 };

typedef struct handle_table {
    size_t               mask;
    _Atomic size_t       max_probe; /* longest probe an insertion made */
    struct handle_table *older;     /* tables this one replaced (kept: see above) */
    _Atomic uintptr_t    slots[];
} handle_table;

typedef struct handle_set {
    _Atomic(handle_table *) table;
    pthread_mutex_t         lock;
    size_t                  live;
} handle_set;

#define HANDLE_SET_INIT_(kind) {NULL, PTHREAD_MUTEX_INITIALIZER, 0},
static handle_set sets[MAPPING_HANDLE_KINDS] = {MAPPING_HANDLE_KIND_LIST(HANDLE_SET_INIT_)};
#undef HANDLE_SET_INIT_

_Atomic uint64_t mapping__handle_epoch;

static size_t home(uintptr_t key, size_t mask)
{
    uint64_t x = (uint64_t)key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & mask;
}

bool mapping__handle_live(mapping_handle_kind kind, const void *handle)
{
    uintptr_t key = (uintptr_t)handle;
    handle_table *t = atomic_load_explicit(&sets[kind].table, memory_order_acquire);
    if (!t || key <= SLOT_TOMBSTONE)
        return false;
    size_t probes = atomic_load_explicit(&t->max_probe, memory_order_acquire);
    for (size_t i = home(key, t->mask), k = 0; k <= probes; k++, i = (i + 1) & t->mask) {
        uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_acquire);
        if (v == key)
            return true;
        if (v == SLOT_EMPTY)
            return false;
    }
    return false;
}

/* Under the lock: places key in the first free slot of its probe. */
static void table_put(handle_table *t, uintptr_t key)
{
    size_t i = home(key, t->mask), k = 0;
    for (;; k++, i = (i + 1) & t->mask) {
        uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (v == SLOT_EMPTY || v == SLOT_TOMBSTONE)
            break;
    }
    if (k > atomic_load_explicit(&t->max_probe, memory_order_relaxed))
        atomic_store_explicit(&t->max_probe, k, memory_order_release);
    atomic_store_explicit(&t->slots[i], key, memory_order_release);
}

static handle_table *table_new(size_t slots)
{
    handle_table *t = mapping_os_calloc(1, sizeof *t + slots * sizeof t->slots[0]);
    if (t)
        t->mask = slots - 1; /* calloc: every slot SLOT_EMPTY, max_probe 0 */
    return t;
}

/* fork(): a child of a multi-threaded program must not inherit a set's
 * lock taken by a thread it does not have (its first create or destroy
 * would wait forever). The sets are never locked together elsewhere. */
static void sets_lock_all(void)
{
    for (int k = 0; k < MAPPING_HANDLE_KINDS; k++)
        pthread_mutex_lock(&sets[k].lock);
}

static void sets_unlock_all(void)
{
    for (int k = MAPPING_HANDLE_KINDS; k-- > 0;)
        pthread_mutex_unlock(&sets[k].lock);
}

/*
 * Registered when the library loads, not on first use: glibc (2.36 and
 * later) runs a fork's prepare handlers without its atfork lock, and a
 * handler another thread registers meanwhile is left out of that fork
 * (neither prepare nor child handler runs; track/write_track.c).
 * Leaf locks (nothing else is taken under them): priority 150, registered
 * before the write-tracking handlers (201, 202), so their prepare runs
 * after theirs.
 */
__attribute__((constructor(150))) static void fork_handlers_install(void)
{
    (void)pthread_atfork(sets_lock_all, sets_unlock_all, sets_unlock_all); /* without: as before */
}

mapping_status mapping__handle_add(mapping_handle_kind kind, const void *handle)
{
    handle_set *s = &sets[kind];
    mapping_status st = MAPPING_OK;
    pthread_mutex_lock(&s->lock);
    handle_table *t = atomic_load_explicit(&s->table, memory_order_relaxed);
    if (!t || (s->live + 1) * 2 > t->mask + 1) {
        size_t slots = MIN_SLOTS;
        while (slots < (s->live + 1) * 4)
            slots *= 2;
        handle_table *grown = table_new(slots);
        if (!grown) {
            st = MAPPING_ERR_OUT_OF_HOST_MEMORY;
            goto out;
        }
        for (size_t i = 0; t && i <= t->mask; i++) {
            uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
            if (v > SLOT_TOMBSTONE)
                table_put(grown, v);
        }
        grown->older = t;
        atomic_store_explicit(&s->table, grown, memory_order_release);
        t = grown;
    }
    table_put(t, (uintptr_t)handle);
    s->live++;
out:
    pthread_mutex_unlock(&s->lock);
    return st;
}

bool mapping__handle_remove(mapping_handle_kind kind, const void *handle)
{
    handle_set *s = &sets[kind];
    uintptr_t key = (uintptr_t)handle;
    bool found = false;
    pthread_mutex_lock(&s->lock);
    handle_table *t = atomic_load_explicit(&s->table, memory_order_relaxed);
    size_t probes = t ? atomic_load_explicit(&t->max_probe, memory_order_relaxed) : 0;
    for (size_t i = t ? home(key, t->mask) : 0, k = 0; t && key > SLOT_TOMBSTONE && k <= probes;
         k++, i = (i + 1) & t->mask) {
        uintptr_t v = atomic_load_explicit(&t->slots[i], memory_order_relaxed);
        if (v == SLOT_EMPTY)
            break;
        if (v == key) {
            atomic_store_explicit(&t->slots[i], (uintptr_t)SLOT_TOMBSTONE, memory_order_release);
            atomic_fetch_add_explicit(&mapping__handle_epoch, 1, memory_order_release);
            s->live--;
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return found;
}
