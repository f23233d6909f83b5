/*
 * The operating-system layer: clocks, threads, page-locked memory and
 * dynamic loading. Nothing here knows about devices.
 */
#ifndef MAPPING_OS_H
#define MAPPING_OS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Monotonic clock in nanoseconds and seconds. */
uint64_t mapping_os_now_ns(void);
double   mapping_os_now(void);
/* Sleeps until the monotonic clock reads `deadline_ns` (spins for the last
 * few microseconds, so short modelled latencies are kept). */
void     mapping_os_sleep_until_ns(uint64_t deadline_ns);
/* Sleeps (never spins) until the deadline, with a 1 us timer slack for the sleep only. */
void     mapping_os_nap_until_ns(uint64_t deadline_ns);
/* A 1 us timer slack for the calling thread, for good: the library's own
 * worker threads call it once, so their naps need no syscalls around them. */
void     mapping_os_fine_timer_slack(void);

/* Page size, and page-aligned host memory that is mlock()ed where the
 * process may lock it (*locked says whether it was). */
size_t mapping_os_page_size(void);
void  *mapping_os_alloc_locked(size_t bytes, bool *locked);
void   mapping_os_free_locked(void *ptr, size_t bytes, bool locked);
/* Whole pages of zeroed memory, faulted in at once (huge pages where the
 * kernel gives them), so that writing them later costs no page fault: for
 * large arrays written a little at a time (a tracked mirror's shadow).
 * NULL when out of memory (an injected allocation fault included). */
void  *mapping_os_alloc_pages(size_t bytes);
void   mapping_os_free_pages(void *ptr, size_t bytes);
/* The library allocates through these (malloc, calloc, realloc,
 * aligned_alloc; free() frees), so tests can make an allocation fail:
 * mapping_os_inject_alloc_fault(n) makes the (n+1)th allocation from now on
 * (these four and mapping_os_alloc_locked, on any thread) return NULL, once;
 * n < 0 disarms. mapping_os_alloc_fault_remaining(): -1 when no fault is
 * armed (or it has fired), else how many allocations still succeed before
 * it. Process-wide; for tests (testing/test_hooks.h). */
void *mapping_os_malloc(size_t bytes);
void *mapping_os_calloc(size_t count, size_t size);
void *mapping_os_realloc(void *ptr, size_t bytes);
void *mapping_os_aligned_alloc(size_t alignment, size_t bytes);
void  mapping_os_inject_alloc_fault(long n);
long  mapping_os_alloc_fault_remaining(void);
/* For allocators of their own (os/handle_arena.c): true when the
 * allocation being made is the one to fail. */
bool  mapping_os_alloc_fault(void);
/* Zeroed, 64-byte aligned memory (at most 64 KiB - 64) for an object behind
 * a public handle, at an address that no object had before and none gets
 * after: a stale handle is never another object's (os/handle_arena.c).
 * NULL when out of memory. Freed with mapping_os_handle_free (NULL: no-op). */
void *mapping_os_handle_alloc(size_t bytes);
void  mapping_os_handle_free(void *ptr);
/* Whether the process may access all of [lo, hi) with `prot` (PROT_READ
 * and/or PROT_WRITE), from the kernel's list of its mappings (os/maps.c,
 * /proc/self/maps; ~10-200 us, by the number of mappings): 0; -EFAULT
 * where part of it is not mapped; -EACCES where part lacks the access;
 * -ENOENT when there is no list to read (unknown). *exec (may be NULL):
 * PROT_EXEC when every mapping in it is executable, -1 when only some are,
 * else 0. */
int mapping_os_range_access(uintptr_t lo, uintptr_t hi, int prot, int *exec);
/* Asks for transparent huge pages on a large region (a hint). */
void   mapping_os_advise_huge_pages(void *ptr, size_t bytes);
/* Physical memory in bytes (0 if unknown). */
uint64_t mapping_os_physical_memory(void);

/* memcpy with non-temporal stores (x86-64; plain memcpy elsewhere): the
 * destination is written to memory without being read first or kept in the
 * caches. For large copies into memory that is not read again soon; dst and
 * src must not overlap. os/copy.c. */
void mapping_os_copy_streaming(void *dst, const void *src, size_t bytes);

/* A memcpy shared by the copy threads (os/copy_pool.c) when it is large
 * (2 MiB or more) and there are any; else memcpy. Returns when all of it is
 * copied. dst and src must not overlap. */
void mapping_os_copy_parallel(void *dst, const void *src, size_t bytes);
/* $MAPPING_COPY_THREADS: the helper threads a large copy may use, 0..64
 * (digits only); unset or empty: mapping_os_copy_threads_default(), half
 * the online CPUs less one, at most 5. False (and *out the default) when
 * the value is anything else. */
bool mapping_os_copy_threads_from_env(int *out);
int  mapping_os_copy_threads_default(void);
/* The count in force: set by mapping_open from $MAPPING_COPY_THREADS
 * (clamped to 0..64), read without a lock; before any set, the variable's
 * value (0 when it is refused). */
void mapping_os_copy_threads_set(int n);
int  mapping_os_copy_threads(void);

/* dlopen of the first name that loads: `env_override` (an environment
 * variable naming a path) first, then each name of the NULL-terminated list.
 * On failure writes dlerror() of the last try into why and returns NULL. */
void *mapping_os_dlopen_first(const char *env_override, const char *const *names, char *why, size_t why_size);
void *mapping_os_dlsym(void *lib, const char *name);

/* The stream (a back end's stream state) whose worker thread this is, or
 * NULL: set once by a back end's worker thread that runs host functions
 * (os/worker.c). */
void        mapping_os_set_worker_stream(const void *stream_state);
const void *mapping_os_worker_stream(void);
/* pthread_create for the library's own threads (stream workers, copy
 * helpers): every asynchronous signal is blocked in the new thread (they
 * go to the program's threads), and the fault signals (SIGSEGV, SIGBUS,
 * SIGFPE, SIGILL) are not, whatever the creating thread blocks: a write
 * of the library's into a page that write tracking or the race checker
 * protects must reach their handler (with SIGSEGV blocked, the kernel
 * kills the process instead). os/worker.c. */
int mapping_os_thread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

/* Link values, os/link.c. Bandwidth in bytes per second: 0 (default) or
 * 1e3..1e15; latency in seconds: 0..1; both finite. NULL when valid, else a
 * sentence saying which rule is broken. */
#define MAPPING_OS_LINK_MIN_BANDWIDTH 1e3
#define MAPPING_OS_LINK_MAX_BANDWIDTH 1e15
#define MAPPING_OS_LINK_MAX_LATENCY 1.0
const char *mapping_os_link_check(double bandwidth, double latency);
/* A plain non-negative number as strtod reads it ("25e9", "5e-6", "0.5"; no
 * sign, space, hex, inf or nan), finite, followed by the end of the text or
 * one of end_chars (*end then points there). */
bool mapping_os_parse_double(const char *text, const char *end_chars, const char **end, double *out);
/* The per-user cache (os/cache_file.c): the path of file `name` in the cache
 * directory ($MAPPING_CACHE_DIR, else $XDG_CACHE_HOME/mapping, else
 * $HOME/.cache/mapping; made 0700 if missing), 0; -1 when there is none, it
 * is "off", or it is not a directory of this user's that only this user may
 * write (logged once per process). */
int      mapping_os_cache_path(const char *name, char *out, size_t len);
/* The whole file, malloc'd: NULL if missing, empty, unreadable, over max
 * bytes, not a regular file (opened without blocking or following a link),
 * not owned by this user or writable by group or others. */
void    *mapping_os_read_file(const char *path, size_t max, size_t *len);
/* Writes the file (mode 0600) through a temporary one and rename(): readers never see half a file. 0 or -1. */
int      mapping_os_write_file_atomic(const char *path, const void *data, size_t len);
/* FNV-1a, continuing from h (start with 0xcbf29ce484222325). */
uint64_t mapping_os_hash64(const void *data, size_t len, uint64_t h);

#endif
