/*
 * Sharded layouts: one host array cut into consecutive slices, each an
 * ordinary mirror (wrapping its slice) on its own device.
 */
#include "coherence/mirror_internal.h"

mapping_status mapping_mirror_create_sharded(mapping_device *const *devices, int count, void *cpu_ptr,
                                             size_t bytes, size_t granule, unsigned flags, mapping_mirror **shards)
{
    static const char fn[] = "mapping_mirror_create_sharded";
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
    size_t n = bytes / granule;
    if (n < (size_t)count)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: %zu granules cannot fill %d shards", fn, n, count);
    for (int i = 0; i < count; i++)
        if ((st = mapping__check_device(fn, devices[i])))
            return st;
    size_t base = n / (size_t)count, extra = n % (size_t)count, offset = 0;
    for (int i = 0; i < count; i++) {
        size_t len = (base + ((size_t)i < extra)) * granule;
        st = mapping_mirror_wrap(devices[i], (char *)cpu_ptr + offset, len, flags, &shards[i]);
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
