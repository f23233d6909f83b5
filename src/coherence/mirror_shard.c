/*
 * Sharded layouts: one host array cut into consecutive slices, each an
 * ordinary mirror (wrapping its slice) on its own device.
 */
#include "coherence/mirror_api.h"
#include "os/os.h"

static mapping_status check_shard_args(const char *fn, mapping_device *const *devices, int count, void *cpu_ptr,
                                       size_t bytes, size_t granule, unsigned flags, mapping_mirror **shards)
{
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "devices", devices)) || (st = mapping__check_ptr(fn, "cpu_ptr", cpu_ptr)) ||
        (st = mapping__check_ptr(fn, "shards", shards)))
        return st;
    if (count < 1)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: count is %d", fn, count);
    if (bytes == 0 || granule == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: %s is 0", fn, bytes ? "granule" : "bytes");
    if (bytes % granule)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: bytes %zu is not a multiple of granule %zu", fn, bytes,
                             granule);
    if (bytes / granule < (size_t)count)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: %zu granules cannot fill %d shards", fn,
                             bytes / granule, count);
    if (flags & ~(unsigned)MIRROR_CREATE_FLAGS)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn,
                             flags & ~(unsigned)MIRROR_CREATE_FLAGS);
    if ((uintptr_t)cpu_ptr + bytes < (uintptr_t)cpu_ptr)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: cpu_ptr %p + %zu bytes wraps around", fn, cpu_ptr, bytes);
    for (int i = 0; i < count; i++)
        if ((st = mapping__check_device(fn, devices[i])))
            return st;
    return MAPPING_OK;
}

/* The length of slice i of n granules over count shards. */
static size_t slice_bytes(size_t n, int count, int i, size_t granule)
{
    size_t base = n / (size_t)count, extra = n % (size_t)count;
    return (base + ((size_t)i < extra)) * granule;
}

/* Tracked shards watch their slices page by page, and two tracked families
 * may not share a page: every slice after the first must start on one. */
static mapping_status check_tracked_slices(const char *fn, void *cpu_ptr, size_t bytes, size_t granule, int count,
                                           unsigned flags)
{
    size_t page = mapping_os_page_size(), n = bytes / granule;
    uintptr_t at = (uintptr_t)cpu_ptr;
    for (int i = 0; (flags & MAPPING_MIRROR_TRACK_WRITES) && i + 1 < count; i++) {
        at += slice_bytes(n, count, i, granule);
        if (at % page)
            return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                 "%s: MAPPING_MIRROR_TRACK_WRITES watches whole pages of %zu bytes, and shards may not "
                                 "share one: shard %d would start at %p, inside a page (make the slices whole pages: "
                                 "a page-aligned cpu_ptr and slices of a multiple of %zu bytes)",
                                 fn, page, i + 1, (void *)at, page);
    }
    return MAPPING_OK;
}

mapping_status mapping_mirror_create_sharded(mapping_device *const *devices, int count, void *cpu_ptr,
                                             size_t bytes, size_t granule, unsigned flags, mapping_mirror **shards)
{
    static const char fn[] = "mapping_mirror_create_sharded";
    mapping_status st;
    if ((st = check_shard_args(fn, devices, count, cpu_ptr, bytes, granule, flags, shards)) ||
        (st = check_tracked_slices(fn, cpu_ptr, bytes, granule, count, flags)))
        return st;
    size_t n = bytes / granule, offset = 0;
    for (int i = 0; i < count; i++) {
        size_t len = slice_bytes(n, count, i, granule);
        st = mapping__mirror_wrap(fn, devices[i], (char *)cpu_ptr + offset, len, flags, &shards[i]);
        if (st != MAPPING_OK) {
            while (i-- > 0) {
                mapping_mirror_destroy(shards[i]);
                shards[i] = NULL;
            }
            return st;
        }
        offset += len;
    }
    return MAPPING_OK;
}
