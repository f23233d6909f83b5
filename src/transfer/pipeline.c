/*
 * Pipelines: a host array through device work in chunks. Chunk i goes to
 * slot i % depth; each slot has its own stream and device buffers, and runs
 * upload -> step -> download for its chunks in order. The slots' streams run
 * concurrently, so while slot 0 computes chunk 0, slot 1 uploads chunk 1 and
 * slot 2 downloads (later) chunk -1: with depth 3 all three overlap.
 *
 * A slot's stream is in order, so its buffers can take the next chunk as
 * soon as the previous one's download is queued: the caller runs LAPS
 * chunks ahead per slot, so that a stream goes on to its next chunk without
 * waiting for the caller's thread to wake up. Before queueing a slot's chunk
 * i the caller waits for the slot's chunk i - LAPS * depth (an event), which
 * bounds the work in flight and frees the staging-copy records it used.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/ops.h"
#include "os/os.h"
#include "transfer/transfer.h"
#include "transfer/transfer_observe.h"

enum { MAX_DEPTH = 3, LAPS = 2 };

/* A staging copy run on the slot's stream (pageable <-> page-locked). */
typedef struct staging_copy {
    void       *dst;
    const void *src;
    size_t      bytes;
} staging_copy;

typedef struct pipeline_slot {
    mapping_stream *stream;
    mapping_buffer *input, *output;
    void           *stage_in, *stage_out; /* page-locked, allocated when first needed */
    staging_copy    copy_in[LAPS], copy_out[LAPS];
    mapping_event  *done[LAPS]; /* end of the chunk queued in that lap */
} pipeline_slot;

struct mapping_pipeline {
    mapping_device       *dev;
    uint64_t              dev_serial; /* dev->serial when created */
    bool                  running;    /* in mapping_pipeline_run: a step must not re-enter it */
    mapping_pipeline_desc desc; /* resolved: no zero fields */
    bool                  chunk_from_link;
    pipeline_slot         slots[MAX_DEPTH];
};

static void run_staging_copy(void *arg)
{
    staging_copy *c = arg;
    memcpy(c->dst, c->src, c->bytes);
}

static size_t round_pow2(double bytes)
{
    size_t p = 1;
    while ((double)p * 1.5 < bytes && p < ((size_t)1 << 40))
        p *= 2;
    return p;
}

/* Where "device memory" is CPU memory (the host back end, OpenCL CPU
 * devices), every copy is a CPU memcpy and the chunk buffers compete for the
 * CPU's caches: at most HOST_CHUNK_MAX per chunk keeps the pipeline's six
 * chunk buffers (12 MiB) in a last-level cache, from the copy that writes
 * one to the work that reads it, so each copy touches DRAM on the host
 * array's side only. Chunks of 16 MiB (what a 25 GB/s, 5 us link alone
 * gives) were slower, and so were chunks of 1 MiB (more per-chunk thread
 * wake-ups): BENCHMARKS-archive.md, "Lab notes: batching and pipeline history".
 * Other devices have their own memory: there the chunk only has
 * to hide the per-transfer latency. */
enum { HOST_CHUNK_MAX = 2 << 20 };

static bool memory_is_cpu_memory(const mapping_device *dev)
{
    return (dev->info.caps & MAPPING_CAP_CPU_MEMORY) != 0;
}

/* Big enough that the per-transfer latency is about 0.5% of a chunk; on a
 * device whose memory is CPU memory, at most HOST_CHUNK_MAX. */
static size_t chunk_from_link(mapping_device *dev)
{
    mapping_link link;
    double bytes = 0;
    if (mapping__device_link(dev, &link) == MAPPING_OK)
        bytes = 200 * link.latency * link.bandwidth;
    size_t chunk = round_pow2(bytes);
    const size_t lo = (size_t)256 << 10, hi = memory_is_cpu_memory(dev) ? HOST_CHUNK_MAX : (size_t)64 << 20;
    return chunk < lo ? lo : chunk > hi ? hi : chunk;
}

static mapping_status check_pipeline(const char *fn, const mapping_pipeline *p)
{
    if (!p)
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: pipeline is NULL", fn);
    if (!mapping__handle_live(MAPPING_HANDLE_PIPELINE, p))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: pipeline %p is not a live pipeline", fn,
                             (const void *)p);
    if (!mapping__device_alive(p->dev, p->dev_serial))
        return mapping__fail(MAPPING_ERR_INVALID_HANDLE, "%s: the device of pipeline %p was closed before it", fn,
                             (const void *)p);
    return MAPPING_OK;
}

static mapping_status check_idle(const char *fn, const mapping_pipeline *p)
{
    if (p->running)
        return mapping__fail(MAPPING_ERR_BUSY,
                             "%s: pipeline %p is running (called from its own step): one run at a time", fn,
                             (const void *)p);
    return MAPPING_OK;
}

static void pipeline_free(mapping_pipeline *p)
{
    for (int i = 0; i < MAX_DEPTH; i++) {
        pipeline_slot *s = &p->slots[i];
        if (s->stream)
            mapping__stream_destroy(s->stream); /* waits for its work */
        if (s->input)
            mapping__free_gpu(s->input);
        if (s->output)
            mapping__free_gpu(s->output);
        if (s->stage_in)
            mapping__free_cpu(p->dev, s->stage_in);
        if (s->stage_out)
            mapping__free_cpu(p->dev, s->stage_out);
    }
    mapping_os_handle_free(p);
}

void mapping_pipeline_destroy(mapping_pipeline *p)
{
    static const char fn[] = "mapping_pipeline_destroy";
    if (!p)
        return;
    mapping_status st = check_pipeline(fn, p);
    if (st == MAPPING_ERR_INVALID_HANDLE && mapping__handle_live(MAPPING_HANDLE_PIPELINE, p)) {
        /* Its device was closed first and took the streams and buffers. */
        mapping__handle_remove(MAPPING_HANDLE_PIPELINE, p);
        mapping_os_handle_free(p);
        return;
    }
    if (st != MAPPING_OK || check_idle(fn, p) != MAPPING_OK)
        return;
    for (int i = 0; i < p->desc.depth; i++)
        if (mapping__check_not_in_host_fn(fn, p->slots[i].stream) != MAPPING_OK)
            return;
    if (!mapping__handle_remove(MAPPING_HANDLE_PIPELINE, p))
        return;
    pipeline_free(p);
}

mapping_status mapping_pipeline_create(mapping_device *dev, const mapping_pipeline_desc *desc, mapping_pipeline **out)
{
    static const char fn[] = "mapping_pipeline_create";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    mapping_pipeline_desc d = desc ? *desc : (mapping_pipeline_desc){0};
    if (d.depth < 0 || d.depth > MAX_DEPTH)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: depth %d is not 0 (default), 1, 2 or 3", fn, d.depth);
    mapping_pipeline *p = mapping_os_handle_alloc(sizeof *p); /* see os/handle_arena.c */
    if (!p)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    p->dev = dev;
    p->dev_serial = dev->serial;
    if (!d.depth)
        d.depth = MAX_DEPTH;
    if (!d.element_bytes)
        d.element_bytes = 1;
    p->chunk_from_link = d.chunk_bytes == 0;
    if (!d.chunk_bytes)
        d.chunk_bytes = chunk_from_link(dev);
    d.chunk_bytes = d.chunk_bytes / d.element_bytes * d.element_bytes;
    if (!d.chunk_bytes)
        d.chunk_bytes = d.element_bytes;
    p->desc = d;
    for (int i = 0; i < d.depth && st == MAPPING_OK; i++) {
        pipeline_slot *s = &p->slots[i];
        if ((st = mapping__stream_create(dev, &s->stream)) == MAPPING_OK &&
            (st = mapping__allocate_gpu(dev, d.chunk_bytes, &s->input)) == MAPPING_OK)
            st = mapping__allocate_gpu(dev, d.chunk_bytes, &s->output);
        /* Given to the step: the public free / destroy refuse them. */
        if (s->stream)
            s->stream->owner = "pipeline";
        if (s->input)
            s->input->owner = "pipeline";
        if (s->output)
            s->output->owner = "pipeline";
    }
    if (st == MAPPING_OK && mapping__handle_add(MAPPING_HANDLE_PIPELINE, p) != MAPPING_OK)
        st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    if (st != MAPPING_OK) {
        pipeline_free(p);
        return st;
    }
    *out = p;
    return MAPPING_OK;
}

mapping_status mapping_pipeline_get_desc(const mapping_pipeline *p, mapping_pipeline_desc *out)
{
    static const char fn[] = "mapping_pipeline_get_desc";
    mapping_status st;
    if ((st = check_pipeline(fn, p)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = p->desc;
    return MAPPING_OK;
}

/* Page-locked staging for the slots, on the first run that needs it. */
static mapping_status ensure_staging(mapping_pipeline *p, bool in, bool out)
{
    mapping_status st = MAPPING_OK;
    for (int i = 0; i < p->desc.depth && st == MAPPING_OK; i++) {
        pipeline_slot *s = &p->slots[i];
        if (in && !s->stage_in)
            st = mapping__allocate_cpu(p->dev, p->desc.chunk_bytes, &s->stage_in);
        if (out && !s->stage_out && st == MAPPING_OK)
            st = mapping__allocate_cpu(p->dev, p->desc.chunk_bytes, &s->stage_out);
    }
    return st;
}

static mapping_status enqueue_chunk(pipeline_slot *s, size_t lap, const mapping_pipeline_chunk *chunk,
                                    const char *src, char *dst, bool src_locked, bool dst_locked,
                                    mapping_pipeline_fn step, void *user)
{
    mapping_status st;
    const char *from = src + chunk->offset;
    if (!src_locked) {
        s->copy_in[lap] = (staging_copy){s->stage_in, from, chunk->bytes};
        if ((st = mapping__launch_host(s->stream, run_staging_copy, &s->copy_in[lap])) != MAPPING_OK)
            return st;
        from = s->stage_in;
    }
    if ((st = mapping__write(s->stream, from, s->input, 0, chunk->bytes)) != MAPPING_OK)
        return st;
    unsigned long long errors = mapping__error_count();
    if ((st = step(s->stream, chunk, user)) != MAPPING_OK) {
        /* The step's own error: say so, with the step's message if it recorded one. */
        if (mapping__error_count() == errors)
            return mapping__fail(st, "mapping_pipeline_run: the step returned %s for chunk %zu (offset %zu, %zu bytes)",
                                 mapping__status_name(st), chunk->index, chunk->offset, chunk->bytes);
        char inner[384];
        snprintf(inner, sizeof inner, "%s", mapping__last_message());
        return mapping__fail(st, "mapping_pipeline_run: the step returned %s for chunk %zu (offset %zu, %zu bytes): %s",
                             mapping__status_name(st), chunk->index, chunk->offset, chunk->bytes, inner);
    }
    /* A step that began a capture on the pipeline's stream (CUDA graphs):
     * the run's own work would be captured, not run. */
    if ((st = mapping__stream_refuse_capture_why(s->stream->dev, s->stream, "mapping_pipeline_run",
                                                 "the step left the pipeline's stream capturing; the run copies and "
                                                 "waits on it")) != MAPPING_OK)
        return st;
    if (!dst) /* still recorded: the next chunk of this slot and lap reuses copy_in[lap] */
        return mapping__event_record(s->stream, &s->done[lap]);
    char *to = dst_locked ? dst + chunk->offset : s->stage_out;
    if ((st = mapping__read(s->stream, s->output, 0, to, chunk->bytes)) != MAPPING_OK)
        return st;
    if (!dst_locked) {
        s->copy_out[lap] = (staging_copy){dst + chunk->offset, s->stage_out, chunk->bytes};
        st = mapping__launch_host(s->stream, run_staging_copy, &s->copy_out[lap]);
    }
    return st == MAPPING_OK ? mapping__event_record(s->stream, &s->done[lap]) : st;
}

mapping_status mapping_pipeline_run(mapping_pipeline *p, const void *cpu_src, void *cpu_dst, size_t bytes,
                                    mapping_pipeline_fn step, void *user)
{
    static const char fn[] = "mapping_pipeline_run";
    mapping_status st;
    if ((st = check_pipeline(fn, p)) || (st = check_idle(fn, p)) || (st = mapping__check_ptr(fn, "cpu_src", cpu_src)) ||
        (st = mapping__check_ptr(fn, "step", (const void *)(uintptr_t)step)))
        return st;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    if (bytes % p->desc.element_bytes)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: bytes %zu is not a multiple of element_bytes %zu", fn,
                             bytes, p->desc.element_bytes);
    /* In place (cpu_dst == cpu_src) is safe: a chunk is read before its
     * output lands at the same offset. Any other overlap is not: a chunk's
     * output would land where a later chunk is still to be read (or an
     * earlier one's input was), with a result that depends on the depth. */
    uintptr_t s0 = (uintptr_t)cpu_src, d0 = (uintptr_t)cpu_dst;
    if (cpu_dst && d0 != s0 && (uintptr_t)(bytes - 1) > UINTPTR_MAX - (s0 > d0 ? s0 : d0))
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: cpu_src or cpu_dst + %zu bytes wraps around", fn, bytes);
    if (cpu_dst && d0 != s0 && d0 < s0 + bytes && s0 < d0 + bytes)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: cpu_dst %p overlaps cpu_src %p (%zu bytes) without being it: only in place "
                             "(cpu_dst == cpu_src) or disjoint arrays are allowed",
                             fn, cpu_dst, cpu_src, bytes);
    mapping_device *dev = p->dev;
    bool src_locked = mapping__host_registry_find(&dev->host_blocks, cpu_src, bytes, &(mapping_host_ref){0});
    bool dst_locked = cpu_dst && mapping__host_registry_find(&dev->host_blocks, cpu_dst, bytes, &(mapping_host_ref){0});
    if ((st = ensure_staging(p, !src_locked, cpu_dst && !dst_locked)) != MAPPING_OK)
        return st;

    /* A default chunk is also at most 1/8 of the array, so short arrays still overlap. */
    size_t chunk_bytes = p->desc.chunk_bytes;
    if (p->chunk_from_link && bytes / 8 < chunk_bytes) {
        size_t e = p->desc.element_bytes, eighth = (bytes / 8 + e - 1) / e * e;
        chunk_bytes = eighth > (size_t)64 << 10 ? eighth : ((size_t)64 << 10) / e * e;
        if (chunk_bytes > p->desc.chunk_bytes || chunk_bytes == 0)
            chunk_bytes = p->desc.chunk_bytes;
    }
    mapping_status first = MAPPING_OK;
    size_t index = 0;
    p->running = true;
    atomic_fetch_add(&dev->running_pipelines, 1);
    for (size_t offset = 0; offset < bytes && first == MAPPING_OK; offset += chunk_bytes, index++) {
        size_t depth = (size_t)p->desc.depth, lap = index / depth % LAPS;
        pipeline_slot *s = &p->slots[index % depth];
        if (s->done[lap]) { /* the slot's chunk index - LAPS * depth */
            first = mapping__event_synchronize(s->done[lap]);
            mapping__event_destroy(s->done[lap]);
            s->done[lap] = NULL;
            if (first != MAPPING_OK)
                break;
        }
        size_t n = bytes - offset < chunk_bytes ? bytes - offset : chunk_bytes;
        mapping_pipeline_chunk chunk = {index, offset, n, s->input, 0, s->output, 0};
        mapping_trace_span span = mapping__trace_begin();
        first = enqueue_chunk(s, lap, &chunk, cpu_src, cpu_dst, src_locked, dst_locked, step, user);
        mapping__pipeline_chunk_done(&span, dev, s->stream, &chunk, first);
    }
    for (int i = 0; i < p->desc.depth; i++) {
        st = mapping__stream_synchronize(p->slots[i].stream);
        if (st != MAPPING_OK) /* a failed wait may not have waited: the slot's records are reused next run */
            (void)mapping__stream_synchronize(p->slots[i].stream);
        if (first == MAPPING_OK)
            first = st;
        for (int lap = 0; lap < LAPS; lap++) {
            if (p->slots[i].done[lap])
                mapping__event_destroy(p->slots[i].done[lap]);
            p->slots[i].done[lap] = NULL;
        }
    }
    atomic_fetch_sub(&dev->running_pipelines, 1);
    p->running = false;
    return first;
}
