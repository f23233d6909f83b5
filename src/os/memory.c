#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "os/os.h"

static bool alloc_fails(void);

size_t mapping_os_page_size(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

static size_t round_to_pages(size_t bytes)
{
    size_t page = mapping_os_page_size();
    return (bytes + page - 1) / page * page;
}

void *mapping_os_alloc_locked(size_t bytes, bool *locked)
{
    *locked = false;
    size_t rounded = round_to_pages(bytes);
    if (rounded < bytes || alloc_fails())
        return NULL;
    void *ptr = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED)
        return NULL;
    mapping_os_advise_huge_pages(ptr, rounded);
    /* mlock also faults the pages in, so the first copy does not pay for it.
     * It fails without CAP_IPC_LOCK beyond RLIMIT_MEMLOCK: then the memory is
     * still page-aligned, only not locked. */
    *locked = mlock(ptr, rounded) == 0;
    return ptr;
}

void *mapping_os_alloc_pages(size_t bytes)
{
    size_t rounded = round_to_pages(bytes);
    if (rounded < bytes || alloc_fails())
        return NULL;
    void *ptr = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED)
        return NULL;
    mapping_os_advise_huge_pages(ptr, rounded);
#ifdef MADV_POPULATE_WRITE
    if (madvise(ptr, rounded, MADV_POPULATE_WRITE) == 0)
        return ptr;
#endif
    memset(ptr, 0, rounded); /* older kernels: fault every page in now */
    return ptr;
}

void mapping_os_free_pages(void *ptr, size_t bytes)
{
    if (ptr)
        munmap(ptr, round_to_pages(bytes));
}

void mapping_os_free_locked(void *ptr, size_t bytes, bool locked)
{
    if (!ptr)
        return;
    size_t rounded = round_to_pages(bytes);
    if (locked)
        munlock(ptr, rounded);
    munmap(ptr, rounded);
}

void mapping_os_advise_huge_pages(void *ptr, size_t bytes)
{
    /* Fewer TLB misses on large transfers; only a hint, so errors (no THP
     * support, unaligned start) are ignored. */
    if (bytes >= ((size_t)2 << 20))
        (void)madvise(ptr, bytes, MADV_HUGEPAGE);
}

uint64_t mapping_os_physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    return pages > 0 ? (uint64_t)pages * mapping_os_page_size() : 0;
}

/* ---- the allocators of the library, with a fault hook for tests ---- */

static _Atomic long alloc_countdown; /* > 0: that many more allocations succeed */
static _Atomic int  alloc_armed;

void mapping_os_inject_alloc_fault(long n)
{
    if (n < 0) {
        atomic_store(&alloc_armed, 0);
        return;
    }
    atomic_store(&alloc_countdown, n);
    atomic_store(&alloc_armed, 1);
}

long mapping_os_alloc_fault_remaining(void)
{
    if (!atomic_load(&alloc_armed))
        return -1;
    long n = atomic_load(&alloc_countdown);
    return n > 0 ? n : 0;
}

/* True when this allocation is the one to fail (one per arming). */
static bool alloc_fails(void)
{
    if (!atomic_load_explicit(&alloc_armed, memory_order_relaxed))
        return false;
    if (atomic_fetch_sub(&alloc_countdown, 1) > 0)
        return false;
    int armed = 1;
    return atomic_compare_exchange_strong(&alloc_armed, &armed, 0);
}

bool mapping_os_alloc_fault(void)
{
    return alloc_fails();
}

void *mapping_os_malloc(size_t bytes)
{
    return alloc_fails() ? NULL : malloc(bytes);
}

void *mapping_os_calloc(size_t count, size_t size)
{
    return alloc_fails() ? NULL : calloc(count, size);
}

void *mapping_os_realloc(void *ptr, size_t bytes)
{
    return alloc_fails() ? NULL : realloc(ptr, bytes);
}

void *mapping_os_aligned_alloc(size_t alignment, size_t bytes)
{
    return alloc_fails() ? NULL : aligned_alloc(alignment, bytes);
}
