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

/* Page size, and page-aligned host memory that is mlock()ed where the
 * process may lock it (*locked says whether it was). */
size_t mapping_os_page_size(void);
void  *mapping_os_alloc_locked(size_t bytes, bool *locked);
void   mapping_os_free_locked(void *ptr, size_t bytes, bool locked);
/* Asks for transparent huge pages on a large region (a hint). */
void   mapping_os_advise_huge_pages(void *ptr, size_t bytes);
/* Physical memory in bytes (0 if unknown). */
uint64_t mapping_os_physical_memory(void);

/* memcpy with non-temporal stores (x86-64; plain memcpy elsewhere): the
 * destination is written to memory without being read first or kept in the
 * caches. For large copies into memory that is not read again soon; dst and
 * src must not overlap. os/copy.c. */
void mapping_os_copy_streaming(void *dst, const void *src, size_t bytes);

/* dlopen of the first name that loads: `env_override` (an environment
 * variable naming a path) first, then each name of the NULL-terminated list.
 * On failure writes dlerror() of the last try into why and returns NULL. */
void *mapping_os_dlopen_first(const char *env_override, const char *const *names, char *why, size_t why_size);
void *mapping_os_dlsym(void *lib, const char *name);

/* The per-user cache (os/cache_file.c): the path of file `name` in the cache
 * directory ($MAPPING_CACHE_DIR, else $XDG_CACHE_HOME/mapping, else
 * $HOME/.cache/mapping; made if missing), 0; -1 when there is none or it is
 * "off". */
int      mapping_os_cache_path(const char *name, char *out, size_t len);
/* The whole file, malloc'd (NULL if missing, empty, unreadable or over max bytes). */
void    *mapping_os_read_file(const char *path, size_t max, size_t *len);
/* Writes the file through a temporary one and rename(): readers never see half a file. 0 or -1. */
int      mapping_os_write_file_atomic(const char *path, const void *data, size_t len);
/* FNV-1a, continuing from h (start with 0xcbf29ce484222325). */
uint64_t mapping_os_hash64(const void *data, size_t len, uint64_t h);

#endif
