/*
 * A batch's staging memory: a page-locked host buffer and its device twin
 * (or, where device memory is CPU memory, one unified allocation both sides
 * use in place: mapping__staging_shared), grown as flushes need and kept
 * between them, and the one write / one read that move it.
 */
#include <stdlib.h>
#include "core/ops.h"
#include "transfer/transfer.h"

typedef struct batch_retired {
    struct batch_retired *next;
    void                 *host_staging;
    mapping_buffer       *dev_staging;
} batch_retired;

void mapping__batch_free_staging(mapping_batch *b)
{
    if (b->host_staging && !b->staging_shared)
        mapping__free_cpu(b->dev, b->host_staging);
    if (b->dev_staging)
        mapping__free_gpu(b->dev_staging);
    b->host_staging = NULL;
    b->dev_staging = NULL;
    b->staging_capacity = 0;
    while (b->retired) {
        batch_retired *r = b->retired;
        b->retired = r->next;
        if (r->host_staging) /* NULL: shared staging, freed with its buffer */
            mapping__free_cpu(b->dev, r->host_staging);
        if (r->dev_staging)
            mapping__free_gpu(r->dev_staging);
        free(r);
    }
}

/* Grows the staging (geometrically, so rarely). Runs inside a flush, so it
 * frees nothing: the outgrown staging waits in b->retired for the batch's
 * destruction. */
mapping_status mapping__batch_ensure_staging(mapping_batch *b, size_t bytes)
{
    if (bytes <= b->staging_capacity)
        return MAPPING_OK;
    size_t capacity = 64 << 10;
    while (capacity < bytes)
        capacity *= 2;
    batch_retired *old = NULL;
    if (b->host_staging && !(old = mapping_os_malloc(sizeof *old)))
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_batch_flush: out of memory");
    void *host = NULL;
    mapping_buffer *dev = NULL;
    mapping_status st;
    bool shared = mapping__staging_shared(b->dev);
    if (shared)
        st = mapping__allocate_unified("mapping_batch_flush (staging)", b->dev, capacity, &dev, &host);
    else if ((st = mapping__allocate_cpu(b->dev, capacity, &host)) == MAPPING_OK)
        st = mapping__allocate_gpu(b->dev, capacity, &dev);
    if (st != MAPPING_OK) {
        free(old);
        batch_retired *r = host && !shared ? mapping_os_malloc(sizeof *r) : NULL;
        if (r) { /* freed with the batch, like the rest */
            *r = (batch_retired){b->retired, host, NULL};
            b->retired = r;
        } else if (host && !shared) {
            mapping__free_cpu(b->dev, host);
        }
        return st;
    }
    if (old) {
        *old = (batch_retired){b->retired, b->staging_shared ? NULL : b->host_staging, b->dev_staging};
        b->retired = old;
    }
    b->staging_shared = shared;
    b->host_staging = host;
    b->dev_staging = dev;
    b->staging_capacity = capacity;
    return MAPPING_OK;
}

mapping_status mapping__batch_stage_out(mapping_stream *stream, mapping_batch *b, const void *src, size_t offset,
                                        size_t bytes)
{
    if (!b->staging_shared)
        return mapping__write(stream, src, b->dev_staging, offset, bytes);
    mapping__count_shared_transfer(b->dev, true, bytes);
    return MAPPING_OK;
}

mapping_status mapping__batch_stage_in(mapping_stream *stream, mapping_batch *b, size_t offset, void *dst, size_t bytes)
{
    if (!b->staging_shared)
        return mapping__read(stream, b->dev_staging, offset, dst, bytes);
    mapping__count_shared_transfer(b->dev, false, bytes);
    return MAPPING_OK;
}
