/*
 * The host back end's scatter and gather (see mapping_backend.scatter): a
 * loop of memcpy between the staging buffer and one buffer, run in stream
 * order.
 *
 * The table is read where a device kernel reads it: in the staging buffer at
 * table_offset, written there by earlier work on the same stream and kept
 * until this work is done. So a queued job is a few pointers, not a copy of
 * the table (a million-entry table is 24 MB). A blocking call runs at once
 * from the caller's table. Only a table offset that is not aligned for the
 * entries makes the job copy the caller's table.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backend/host/host_queue.h"
#include "os/os.h"
#include "os/status.h"

typedef struct host_scatter_job {
    char                        *staging;
    char                        *buffer;
    bool                         gather; /* buffer -> staging */
    size_t                       count;
    const mapping_scatter_entry *table;
    mapping_scatter_entry        copy[]; /* the table, when it cannot be read in staging */
} host_scatter_job;

static void run_entries(const host_scatter_job *job)
{
    const mapping_scatter_entry *t = job->table;
    if (job->gather)
        for (size_t i = 0; i < job->count; i++)
            memcpy(job->staging + t[i].staging_offset, job->buffer + t[i].buffer_offset, t[i].bytes);
    else
        for (size_t i = 0; i < job->count; i++)
            memcpy(job->buffer + t[i].buffer_offset, job->staging + t[i].staging_offset, t[i].bytes);
}

static void run_job(void *arg)
{
    host_scatter_job *job = arg;
    run_entries(job);
    free(job);
}

static mapping_status submit_job(void *dev, void *stream, char *staging, size_t table_offset, void *buffer,
                                 bool gather, const mapping_scatter_entry *table, size_t count)
{
    host_scatter_job now = {.staging = staging, .buffer = buffer, .gather = gather, .count = count, .table = table};
    if (!stream || count == 0) {
        run_entries(&now);
        return MAPPING_OK;
    }
    bool in_staging = (uintptr_t)(staging + table_offset) % _Alignof(mapping_scatter_entry) == 0;
    size_t copied = in_staging ? 0 : count;
    host_scatter_job *job = mapping_os_malloc(sizeof *job + copied * sizeof *table);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory for a %s of %zu entries",
                             gather ? "gather" : "scatter", count);
    *job = now;
    if (in_staging) {
        job->table = (const mapping_scatter_entry *)(const void *)(staging + table_offset);
    } else {
        memcpy(job->copy, table, count * sizeof *table);
        job->table = job->copy;
    }
    host_op op = {.kind = HOST_OP_FUNCTION, .fn = run_job, .user = job};
    mapping_status st = mapping__host_submit(dev, stream, &op);
    if (st != MAPPING_OK)
        free(job);
    return st;
}

mapping_status mapping__host_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                                     const mapping_scatter_entry *table, size_t count, void *dst_mem)
{
    return submit_job(dev, stream, staging_mem, table_offset, dst_mem, false, table, count);
}

mapping_status mapping__host_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                                    const mapping_scatter_entry *table, size_t count)
{
    return submit_job(dev, stream, staging_mem, table_offset, src_mem, true, table, count);
}
