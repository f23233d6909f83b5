/* The copy step of a sync (mirror_copy.h). */
#include <errno.h>
#include <sys/mman.h>
#include "coherence/mirror_copy.h"
#include "os/os.h"
#include "track/race_guard.h"

/* Without a device-side scatter (one device copy per staged range), packing
 * only pays on a link whose per-transfer cost exceeds what a pack costs. */
#define MIRROR_BATCH_MIN_LATENCY 1e-6

/* Many ranges, and either a back end that scatters and gathers on the
 * device (a packed range then costs ~10-16 ns on the CPU, a separate
 * transfer at least the library's and the driver's per-call work: 1,000
 * ranges on the host back end sync in 18-29 us packed against 46-78 us one
 * by one) or a slow link. */
bool mapping__mirror_use_batch(const mirror_state *st, size_t n, const mapping_link *link)
{
    if (st->unified || n < MIRROR_BATCH_MIN_RANGES)
        return false;
    return (mapping__can_scatter(st->dev) && mapping__can_gather(st->dev)) || link->latency >= MIRROR_BATCH_MIN_LATENCY;
}

/* Sends a list through the mirror's batch (host offsets; the buffer's are
 * gpu_base higher). The list is sorted, disjoint and within the mirror
 * (the plan's merged ranges, a diff's refined ones, the log): the ranges
 * were checked when they were marked, and the batch layer trusts them
 * (mapping__transfer_sorted_ranges). On failure some may be done or
 * queued: later work orders after all of them, and none becomes valid. */
static mapping_status send_list(mapping_stream *stream, mirror_state *st, int t, unsigned char *host,
                                const mapping_range *list, size_t n, size_t largest)
{
    mapping_status status;
    if (!st->batch && (status = mapping__batch_create(st->dev, &st->batch)) != MAPPING_OK)
        return status;
    status = mapping__transfer_sorted_ranges(stream, st->batch, t == MIRROR_GPU, host, st->gpu, st->gpu_base, list,
                                             n, largest);
    if (status != MAPPING_OK)
        mapping__batch_clear(st->batch);
    return status;
}

mapping_status mapping__mirror_send_sorted(mirror_state *st, int t, const mapping_range *list, size_t n,
                                           size_t largest)
{
    return send_list(NULL, st, t, st->cpu, list, n, largest);
}

/* Wrapped CPU memory (mapping_mirror_wrap, _adopt) is the caller's, and
 * may be read-only: a const array, a PROT_READ mapping, a read-only view.
 * Uploading from it is fine; the first copy into it asks the kernel's list
 * of mappings whether all of it is writable (once per mirror, ~10-200 us),
 * so that such memory fails the sync with a status instead of faulting in
 * the copy. A tracked wrap was asked when its tracking began. */
mapping_status mapping__mirror_check_cpu_writable(mirror_state *st, int t)
{
    if (t != MIRROR_CPU || st->owns_cpu || st->unified || st->cpu_writable)
        return MAPPING_OK;
    /* The race checker's guards of queued copies may make pages read-only
     * for a while: asked as they were before (race_guard.h). */
    int rc = mapping__race_guards_range_access((uintptr_t)st->cpu, (uintptr_t)st->cpu + st->size, PROT_WRITE);
    if (rc == 0 || rc == -ENOENT) { /* no list to ask: taken as writable, as before */
        st->cpu_writable = true;
        return MAPPING_OK;
    }
    return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                         "mirror sync to the CPU: the wrapped memory [%p, +%zu) is %s; nothing was copied into it",
                         (void *)st->cpu, st->size,
                         rc == -EACCES ? "not writable in part or whole (a read-only mapping or constant data)"
                                       : "not mapped in part or whole (freed or unmapped since it was wrapped?)");
}

mapping_status mapping__mirror_copy_ranges(mapping_stream *stream, mirror_state *st, int t,
                                           const mapping_range *ranges, size_t n, size_t *done)
{
    return mapping__mirror_copy_ranges_from(stream, st, t, st->cpu, ranges, n, done);
}

mapping_status mapping__mirror_copy_ranges_from(mapping_stream *stream, mirror_state *st, int t,
                                                unsigned char *host, const mapping_range *ranges, size_t n,
                                                size_t *done)
{
    *done = 0;
    mapping_status status = mapping__mirror_check_cpu_writable(st, t);
    if (status)
        return status;
    mapping_link link = {0, 0};
    if (n >= MIRROR_BATCH_MIN_RANGES && mapping__device_link(st->dev, &link) == MAPPING_OK &&
        mapping__mirror_use_batch(st, n, &link)) {
        size_t largest = 0;
        for (size_t i = 0; i < n; i++)
            largest = ranges[i].hi - ranges[i].lo > largest ? ranges[i].hi - ranges[i].lo : largest;
        status = send_list(stream, st, t, host, ranges, n, largest);
        *done = n; /* some may be queued even on failure: later work orders after all */
        return status;
    }
    for (; *done < n; ++*done) {
        const mapping_range *r = &ranges[*done];
        status = t == MIRROR_GPU ? mapping__write(stream, host + r->lo, st->gpu, st->gpu_base + r->lo, r->hi - r->lo)
                                 : mapping__read(stream, st->gpu, st->gpu_base + r->lo, host + r->lo, r->hi - r->lo);
        if (status != MAPPING_OK)
            return status;
    }
    return MAPPING_OK;
}
