/*
 * Memory for the objects behind public handles (devices, buffers, streams,
 * events, ...) at addresses that are never used again in this process.
 *
 * The public API passes handles as pointers, and the registry of live
 * handles (core/handles.c) knows them by address. Were a freed object's
 * address handed to a new object of the same kind (as malloc does at once),
 * a stale handle would pass for the new object. So objects are carved in
 * order from address space reserved for them (PROT_NONE, MAP_NORESERVE:
 * no memory until used), in chunks of CHUNK bytes; a chunk's pages are made
 * usable when carving reaches it, and given back to the system (the range
 * mapped PROT_NONE again, still reserved) once every object in it has been
 * freed. No address is ever carved twice, so a freed handle stays unknown
 * to the registry for good. Cost: 64-byte granules, one lock per
 * allocation and free, and a chunk's memory stays while any object in it
 * lives.
 *
 * Where the system refuses the reservation (a tight RLIMIT_AS), chunks come
 * from aligned_alloc instead, and addresses may then come back (said once
 * through the log).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "os/os.h"
#include "os/status.h"

#if defined(__SANITIZE_ADDRESS__)
#define HANDLE_ARENA_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HANDLE_ARENA_LSAN 1
#endif
#endif
#ifdef HANDLE_ARENA_LSAN
#include <sanitizer/lsan_interface.h>
#endif

enum { CHUNK = 64 << 10, GRANULE = 64 };

/* The first granule of every chunk. */
typedef struct chunk_head {
    size_t live;     /* objects carved from it and not freed */
    int    borrowed; /* from aligned_alloc: freed with free() */
} chunk_head;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char           *reserved, *reserved_end; /* the current reservation's chunks not carved yet */
static char           *current;                 /* the chunk being carved, or NULL */
static size_t          carved;                  /* bytes of it used, its head included */
static int             reservations_failed;

/* Under the lock: a new reservation, as large as the system allows. */
static int reserve(void)
{
    static const size_t sizes[] = {(size_t)64 << 30, (size_t)4 << 30, (size_t)256 << 20, (size_t)16 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = mmap(NULL, sizes[i] + CHUNK, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            continue;
        uintptr_t base = ((uintptr_t)p + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1);
        reserved = (char *)base;
        reserved_end = reserved + sizes[i];
        return 1;
    }
    return 0;
}

/* Under the lock: a zeroed chunk that no earlier chunk occupied, or NULL. */
static char *chunk_new(void)
{
    if (!reservations_failed && reserved == reserved_end && !reserve()) {
        reservations_failed = 1;
        mapping__log(1, "mapping: no address space to reserve for handles; freed handles' addresses may be "
                        "reused, and a stale handle then taken for a newer object");
    }
    if (!reservations_failed && mprotect(reserved, CHUNK, PROT_READ | PROT_WRITE) == 0) {
        char *c = reserved;
        reserved += CHUNK;
#ifdef HANDLE_ARENA_LSAN
        __lsan_register_root_region(c, CHUNK); /* the objects hold the only pointers to their memory */
#endif
        return c; /* never touched: zero */
    }
    char *c = mapping_os_aligned_alloc(CHUNK, CHUNK);
    if (c) {
        memset(c, 0, CHUNK);
        ((chunk_head *)(void *)c)->borrowed = 1;
    }
    return c;
}

/* Under the lock: gives an empty chunk's memory back, keeping its
 * addresses reserved (so never carved again). */
static void chunk_release(char *c)
{
    if (((chunk_head *)(void *)c)->borrowed) {
        free(c);
        return;
    }
#ifdef HANDLE_ARENA_LSAN
    __lsan_unregister_root_region(c, CHUNK);
#endif
    if (mmap(c, CHUNK, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        madvise(c, CHUNK, MADV_DONTNEED); /* no mapping to spare: at least the memory goes */
}

/* fork(): the lock is held across it, so a child never inherits it taken
 * by a thread that does not exist there. */
static void lock_for_fork(void)
{
    pthread_mutex_lock(&lock);
}

static void unlock_after_fork(void)
{
    pthread_mutex_unlock(&lock);
}

/*
 * Registered when the library loads, not on first use: glibc (2.36 and
 * later) runs a fork's prepare handlers without its atfork lock, and a
 * handler another thread registers meanwhile is left out of that fork
 * (neither prepare nor child handler runs; track/write_track.c).
 * A leaf lock (nothing else is taken under it): priority 150, registered
 * before the write-tracking handlers (201, 202), so its prepare runs after
 * theirs.
 */
__attribute__((constructor(150))) static void fork_handlers_install(void)
{
    (void)pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork); /* without: as before */
}

void *mapping_os_handle_alloc(size_t bytes)
{
    size_t need = (bytes + GRANULE - 1) / GRANULE * GRANULE;
    if (bytes == 0 || need > CHUNK - GRANULE || mapping_os_alloc_fault())
        return NULL;
    pthread_mutex_lock(&lock);
    if (!current || carved + need > CHUNK) {
        char *full = current;
        current = chunk_new();
        carved = GRANULE;
        if (full && ((chunk_head *)(void *)full)->live == 0)
            chunk_release(full);
    }
    char *p = NULL;
    if (current) {
        p = current + carved;
        carved += need;
        ((chunk_head *)(void *)current)->live++;
    }
    pthread_mutex_unlock(&lock);
    return p;
}

void mapping_os_handle_free(void *ptr)
{
    if (!ptr)
        return;
    char *c = (char *)((uintptr_t)ptr & ~(uintptr_t)(CHUNK - 1));
    pthread_mutex_lock(&lock);
    if (--((chunk_head *)(void *)c)->live == 0 && c != current)
        chunk_release(c);
    pthread_mutex_unlock(&lock);
}
