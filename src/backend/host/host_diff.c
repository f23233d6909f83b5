/*
 * The host back end's device-side diff (see mapping_backend.diff_blocks):
 * memcmp of each block against the shadow, a flag per block, and the
 * changed blocks copied into the shadow, in stream order. The "device"
 * memory is host memory, so this runs at the CPU's memory speed.
 */
#include <stdlib.h>
#include <string.h>
#include "backend/host/host_queue.h"
#include "os/os.h"
#include "os/status.h"

typedef struct host_diff_job {
    const unsigned char *mem;
    unsigned char       *shadow, *flags;
    size_t               blocks;
} host_diff_job;

static void run_diff(const host_diff_job *job)
{
    for (size_t i = 0; i < job->blocks; i++) {
        const unsigned char *a = job->mem + i * MAPPING_DIFF_BLOCK;
        unsigned char *b = job->shadow + i * MAPPING_DIFF_BLOCK;
        bool changed = memcmp(a, b, MAPPING_DIFF_BLOCK) != 0;
        if (changed)
            memcpy(b, a, MAPPING_DIFF_BLOCK);
        job->flags[i] = changed;
    }
}

static void run_job(void *arg)
{
    run_diff(arg);
    free(arg);
}

mapping_status mapping__host_diff_blocks(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                         size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset)
{
    host_diff_job now = {.mem = (const unsigned char *)mem + mem_offset,
                         .shadow = (unsigned char *)shadow_mem + shadow_offset,
                         .flags = (unsigned char *)flags_mem + flags_offset,
                         .blocks = bytes / MAPPING_DIFF_BLOCK};
    if (!stream) {
        run_diff(&now);
        return MAPPING_OK;
    }
    host_diff_job *job = mapping_os_malloc(sizeof *job);
    if (!job)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory for a diff of %zu bytes", bytes);
    *job = now;
    host_op op = {.kind = HOST_OP_FUNCTION, .fn = run_job, .user = job};
    mapping_status st = mapping__host_submit(dev, stream, &op);
    if (st != MAPPING_OK)
        free(job);
    return st;
}
