/*
 * The host back end's scatter and gather (see mapping_backend.scatter): a
 * loop of memcpy between the staging buffer and one buffer, run in stream
 * order. The table is copied into the queued job, because the caller's host
 * table is readable only during the call.
 */
#include <stdlib.h>
#include <string.h>
#include "backend/host/host_queue.h"
#include "os/os.h"
#include "os/status.h"

typedef struct host_scatter_job {
    char                 *staging;
    char                 *buffer;
    bool                  gather; /* buffer -> staging */
    size_t                count;
    mapping_scatter_entry table[];
} host_scatter_job;

static void run_job(void *arg)
{
    host_scatter_job *job = arg;
    for (size_t i = 0; i < job->count; i++) {
        const mapping_scatter_entry *e = &job->table[i];
        if (job->gather)
            memcpy(job->staging + e->staging_offset, job->buffer + e->buffer_offset, e->bytes);
        else
            memcpy(job->buffer + e->buffer_offset, job->staging + e->staging_offset, e->bytes);
    }
    free(job);
}

static mapping_status submit_job(void *dev, void *stream, void *staging, void *buffer, bool gather,
                                 const mapping_scatter_entry *table, size_t count)
{
    host_scatter_job *job = mapping_os_malloc(sizeof *job + count * sizeof *table);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory for a %s of %zu entries",
                             gather ? "gather" : "scatter", count);
    job->staging = staging;
    job->buffer = buffer;
    job->gather = gather;
    job->count = count;
    memcpy(job->table, table, count * sizeof *table);
    host_op op = {.kind = HOST_OP_FUNCTION, .fn = run_job, .user = job};
    mapping_status st = mapping__host_submit(dev, stream, &op);
    if (st != MAPPING_OK)
        free(job);
    return st;
}

mapping_status mapping__host_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                            const mapping_scatter_entry *table, size_t count, void *dst_mem)
{
    (void)table_offset; /* the host table is the same memory's content */
    return submit_job(dev, stream, staging_mem, dst_mem, false, table, count);
}

mapping_status mapping__host_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count)
{
    (void)table_offset;
    return submit_job(dev, stream, staging_mem, src_mem, true, table, count);
}
