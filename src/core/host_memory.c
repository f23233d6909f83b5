/*
 * Page-locked host memory: mapping_allocate_cpu / mapping_free_cpu, and the
 * per-device registry that lets every copy find out, in O(log n), whether its
 * host side lies in such memory (and hand the back end its cookie).
 */
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"

void mapping__host_registry_init(mapping_host_registry *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
}

/* Index of the first block whose start is > p. */
static size_t upper_bound(const mapping_host_registry *r, uintptr_t p)
{
    size_t lo = 0, hi = r->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->blocks[mid].start <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

mapping_status mapping__host_registry_add(mapping_host_registry *r, void *ptr, size_t bytes, void *cookie, bool registered)
{
    pthread_mutex_lock(&r->lock);
    mapping_status st = MAPPING_OK;
    uintptr_t start = (uintptr_t)ptr;
    size_t at = upper_bound(r, start);
    /* Refuse overlaps: with the previous block, or the next one. */
    if ((at > 0 && r->blocks[at - 1].start + r->blocks[at - 1].bytes > start) ||
        (at < r->count && start + bytes > r->blocks[at].start)) {
        st = mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "host memory %p (%zu bytes) overlaps memory already registered",
                           ptr, bytes);
        goto out;
    }
    if (r->count == r->capacity) {
        size_t capacity = r->capacity ? r->capacity * 2 : 16;
        mapping_host_block *blocks = mapping_os_realloc(r->blocks, capacity * sizeof *blocks);
        if (!blocks) {
            st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host memory registry: out of memory");
            goto out;
        }
        r->blocks = blocks;
        r->capacity = capacity;
    }
    memmove(&r->blocks[at + 1], &r->blocks[at], (r->count - at) * sizeof *r->blocks);
    r->blocks[at] = (mapping_host_block){start, bytes, cookie, registered, !registered};
    r->count++;
    atomic_store(&r->published_count, r->count);
out:
    pthread_mutex_unlock(&r->lock);
    return st;
}

bool mapping__host_registry_remove(mapping_host_registry *r, void *ptr, mapping_host_block *removed)
{
    pthread_mutex_lock(&r->lock);
    size_t at = upper_bound(r, (uintptr_t)ptr);
    bool found = at > 0 && r->blocks[at - 1].start == (uintptr_t)ptr;
    if (found) {
        *removed = r->blocks[at - 1];
        memmove(&r->blocks[at - 1], &r->blocks[at], (r->count - at) * sizeof *r->blocks);
        r->count--;
        atomic_store(&r->published_count, r->count);
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

bool mapping__host_registry_find(mapping_host_registry *r, const void *ptr, size_t bytes, mapping_host_ref *ref)
{
    if (atomic_load_explicit(&r->published_count, memory_order_relaxed) == 0)
        return false;
    uintptr_t p = (uintptr_t)ptr;
    bool found = false;
    pthread_mutex_lock(&r->lock);
    size_t at = upper_bound(r, p);
    if (at > 0) {
        const mapping_host_block *b = &r->blocks[at - 1];
        if (p - b->start < b->bytes && bytes <= b->bytes - (p - b->start)) {
            ref->cookie = b->cookie;
            ref->offset = p - b->start;
            found = true;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

void mapping__host_registry_destroy(mapping_device *dev)
{
    mapping_host_registry *r = &dev->host_blocks;
    for (size_t i = 0; i < r->count; i++) {
        mapping_host_block *b = &r->blocks[i];
        mapping__log(1, "mapping_close: host memory %p (%zu bytes) was never freed; freeing it", (void *)b->start,
                     b->bytes);
        if (b->registered)
            mapping__op_host_unregister(dev, (void *)b->start, b->cookie);
        else
            mapping__op_host_free(dev, (void *)b->start, b->cookie);
    }
    free(r->blocks);
    pthread_mutex_destroy(&r->lock);
    memset(r, 0, sizeof *r);
}

mapping_status mapping__allocate_cpu(mapping_device *dev, size_t bytes, void **out)
{
    *out = NULL;
    void *ptr = NULL, *cookie = NULL;
    mapping_status st = mapping__op_host_alloc(dev, bytes, &ptr, &cookie);
    if (st != MAPPING_OK)
        return st;
    if ((st = mapping__host_registry_add(&dev->host_blocks, ptr, bytes, cookie, false)) != MAPPING_OK) {
        mapping__op_host_free(dev, ptr, cookie);
        return st;
    }
    *out = ptr;
    return MAPPING_OK;
}

bool mapping__free_cpu(mapping_device *dev, void *cpu_ptr)
{
    mapping_host_block block = {0};
    bool found = mapping__host_registry_remove(&dev->host_blocks, cpu_ptr, &block);
    if (!found || block.registered) {
        if (block.registered) /* put the registration back: it is not ours to end here */
            mapping__host_registry_add(&dev->host_blocks, cpu_ptr, block.bytes, block.cookie, true);
        return false;
    }
    mapping__op_host_free(dev, cpu_ptr, block.cookie);
    return true;
}

/* The program's memory from now on (mapping_allocate_cpu): mapping_free_cpu
 * may free it. Blocks start as the library's own (mapping__allocate_cpu). */
static void give_to_program(mapping_host_registry *r, void *ptr)
{
    pthread_mutex_lock(&r->lock);
    size_t at = upper_bound(r, (uintptr_t)ptr);
    if (at > 0 && r->blocks[at - 1].start == (uintptr_t)ptr)
        r->blocks[at - 1].owned = false;
    pthread_mutex_unlock(&r->lock);
}

/* 1: ptr starts a block the library allocated for one of its objects. */
static bool owned_by_an_object(mapping_host_registry *r, void *ptr)
{
    pthread_mutex_lock(&r->lock);
    size_t at = upper_bound(r, (uintptr_t)ptr);
    bool owned = at > 0 && r->blocks[at - 1].start == (uintptr_t)ptr && r->blocks[at - 1].owned;
    pthread_mutex_unlock(&r->lock);
    return owned;
}

mapping_status mapping_allocate_cpu(mapping_device *dev, size_t bytes, void **out)
{
    static const char fn[] = "mapping_allocate_cpu";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    if ((st = mapping__allocate_cpu(dev, bytes, out)) == MAPPING_OK)
        give_to_program(&dev->host_blocks, *out);
    return st;
}

void mapping_free_cpu(mapping_device *dev, void *cpu_ptr)
{
    static const char fn[] = "mapping_free_cpu";
    if (!cpu_ptr)
        return;
    if (mapping__check_device(fn, dev) != MAPPING_OK)
        return;
    if (owned_by_an_object(&dev->host_blocks, cpu_ptr)) {
        mapping__fail(MAPPING_ERR_NOT_OWNED, "%s: %p belongs to a library object (a mirror's CPU side, a pipeline's "
                                             "or a batch's staging): destroy that object instead; not freed",
                      fn, cpu_ptr);
        return;
    }
    if (!mapping__free_cpu(dev, cpu_ptr))
        mapping__fail(MAPPING_ERR_NOT_OWNED, "%s: %p was not returned by mapping_allocate_cpu on this device; not freed",
                      fn, cpu_ptr);
}

/* For mapping_mirror_wrap(MAPPING_MIRROR_PIN) (src/coherence/mirror.c):
 * page-locks user memory in place through the back end's host_register and records it
 * so transfers take the fast path. MAPPING_ERR_UNSUPPORTED (not recorded)
 * when the back end cannot. Pinning is optional: a driver's refusal (a
 * locked-memory limit, memory already page-locked) is logged as a warning
 * and not left as the thread's last error, since the caller goes on and
 * returns OK. */
mapping_status mapping__host_register(mapping_device *dev, void *ptr, size_t bytes)
{
    if (!mapping__can_register_host(dev))
        return MAPPING_ERR_UNSUPPORTED;
    void *cookie = NULL;
    mapping_error_mark before;
    mapping__error_mark(&before);
    mapping_status st = mapping__op_host_register(dev, ptr, bytes, &cookie);
    if (st != MAPPING_OK) {
        mapping__log(1, "cannot page-lock %zu bytes at %p in place (%s); its copies are staged", bytes, ptr,
                     mapping__last_message());
        mapping__error_forget(&before);
        return st;
    }
    if ((st = mapping__host_registry_add(&dev->host_blocks, ptr, bytes, cookie, true)) != MAPPING_OK)
        mapping__op_host_unregister(dev, ptr, cookie);
    return st;
}

void mapping__host_unregister(mapping_device *dev, void *ptr)
{
    mapping_host_block block = {0};
    if (mapping__host_registry_remove(&dev->host_blocks, ptr, &block))
        mapping__op_host_unregister(dev, ptr, block.cookie);
}
