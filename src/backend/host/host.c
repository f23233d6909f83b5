/*
 * The host back end: "device memory" is separate heap memory of this process,
 * and streams are worker threads. It is a real device for everything above
 * src/backend/: memory the caller does not own, poisoned on allocation in
 * test builds (so a missing sync shows up as wrong data), asynchronous
 * streams, events with timestamps, and optionally a modelled link so copies
 * take the time they would over PCIe.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/host/host_queue.h"
#include "os/status.h"
#include "os/os.h"

#ifndef MAPPING_HOST_POISON_DEFAULT
#define MAPPING_HOST_POISON_DEFAULT 0
#endif
enum { HOST_POISON_BYTE = 0xCD };

static mapping_status host_load(char *why, size_t why_size, int *device_count)
{
    (void)why;
    (void)why_size;
    *device_count = 1;
    return MAPPING_OK;
}

static mapping_status host_device_info(int index, mapping_device_info *info)
{
    memset(info, 0, sizeof *info);
    strcpy(info->backend, "host");
    info->index = index;
    strcpy(info->kind, "host");
    strcpy(info->name, "host memory (built-in back end)");
    strcpy(info->vendor, "mapping");
    snprintf(info->driver, sizeof info->driver, "mapping %s", mapping_version());
    info->memory_bytes = mapping_os_physical_memory();
    info->caps = MAPPING_CAP_PINNED_HOST | MAPPING_CAP_ASYNC_COPY | MAPPING_CAP_UNIFIED |
                 MAPPING_CAP_CONCURRENT_UNIFIED | MAPPING_CAP_TIMING | MAPPING_CAP_DEVICE_KERNELS |
                 MAPPING_CAP_CPU_MEMORY;
    return MAPPING_OK;
}

/* $MAPPING_HOST_LINK = "bandwidth,latency", e.g. "25e9,5e-6". */
static void link_from_env(host_link *link)
{
    const char *env = getenv("MAPPING_HOST_LINK");
    double bandwidth = 0, latency = 0;
    if (env && sscanf(env, "%lf,%lf", &bandwidth, &latency) >= 1) {
        link->bandwidth = bandwidth > 0 ? bandwidth : 0;
        link->latency = latency > 0 ? latency : 0;
    }
}

static mapping_status host_device_open(int index, const mapping_device_desc *desc, void **out)
{
    (void)index;
    host_device *d = mapping_os_calloc(1, sizeof *d);
    if (!d)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory");
    const char *poison = getenv("MAPPING_HOST_POISON");
    d->poison = poison && *poison ? atoi(poison) != 0 : MAPPING_HOST_POISON_DEFAULT;
    if (desc->link_bandwidth > 0 || desc->link_latency > 0) {
        d->link.bandwidth = desc->link_bandwidth;
        d->link.latency = desc->link_latency;
    } else {
        link_from_env(&d->link);
    }
    pthread_mutex_init(&d->link.engine[HOST_LINK_H2D], NULL);
    pthread_mutex_init(&d->link.engine[HOST_LINK_D2H], NULL);
    *out = d;
    return MAPPING_OK;
}

static unsigned host_device_open_caps(void *dev)
{
    const host_device *d = dev;
    return d->link.bandwidth > 0 || d->link.latency > 0 ? MAPPING_CAP_LINK_MODEL : 0;
}

static void host_device_close(void *dev)
{
    host_device *d = dev;
    pthread_mutex_destroy(&d->link.engine[HOST_LINK_H2D]);
    pthread_mutex_destroy(&d->link.engine[HOST_LINK_D2H]);
    free(d);
}

static mapping_status host_buffer_alloc(void *dev, size_t bytes, void **mem)
{
    host_device *d = dev;
    /* Page-aligned, so large buffers can be backed by huge pages as a GPU
     * driver's allocations are. */
    size_t align = bytes >= ((size_t)2 << 20) ? ((size_t)2 << 20) : 64;
    size_t rounded = (bytes + align - 1) / align * align;
    void *p = rounded >= bytes ? mapping_os_aligned_alloc(align, rounded) : NULL;
    if (!p)
        return mapping__fail(MAPPING_ERR_OUT_OF_DEVICE_MEMORY, "host: cannot allocate %zu bytes of device memory", bytes);
    mapping_os_advise_huge_pages(p, rounded);
    if (d->poison)
        memset(p, HOST_POISON_BYTE, bytes);
    *mem = p;
    return MAPPING_OK;
}

/* Host "device memory" is CPU memory already: unified by nature. */
static mapping_status host_buffer_alloc_unified(void *dev, size_t bytes, void **mem, void **host)
{
    mapping_status st = host_buffer_alloc(dev, bytes, mem);
    if (st == MAPPING_OK)
        *host = *mem;
    return st;
}

static void host_buffer_free(void *dev, void *mem)
{
    (void)dev;
    free(mem);
}

static mapping_status host_buffer_native(void *dev, void *mem, void **native)
{
    (void)dev;
    *native = mem;
    return MAPPING_OK;
}

/* The cookie remembers the size (munmap needs it) and whether mlock worked. */
typedef struct host_block {
    size_t bytes;
    bool   locked;
} host_block;

static mapping_status host_host_alloc(void *dev, size_t bytes, void **ptr, void **cookie)
{
    (void)dev;
    host_block *b = mapping_os_malloc(sizeof *b);
    if (!b)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory");
    b->bytes = bytes;
    *ptr = mapping_os_alloc_locked(bytes, &b->locked);
    if (!*ptr) {
        free(b);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: cannot map %zu bytes of host memory", bytes);
    }
    *cookie = b;
    return MAPPING_OK;
}

static void host_host_free(void *dev, void *ptr, void *cookie)
{
    (void)dev;
    host_block *b = cookie;
    mapping_os_free_locked(ptr, b->bytes, b->locked);
    free(b);
}

/* ---- transfers: blocking ones run inline, others go to the stream ---- */

static mapping_status host_write(void *dev, void *stream, const void *src, const mapping_host_ref *pinned,
                                 void *dst_mem, size_t dst_offset, size_t bytes)
{
    (void)pinned;
    host_op op = {.kind = HOST_OP_COPY, .dst = (char *)dst_mem + dst_offset, .src = src, .bytes = bytes,
                  .link_direction = HOST_LINK_H2D};
    return host_submit(dev, stream, &op);
}

static mapping_status host_read(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst,
                                const mapping_host_ref *pinned, size_t bytes)
{
    (void)pinned;
    host_op op = {.kind = HOST_OP_COPY, .dst = dst, .src = (const char *)src_mem + src_offset, .bytes = bytes,
                  .link_direction = HOST_LINK_D2H};
    return host_submit(dev, stream, &op);
}

static mapping_status host_copy(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst_mem,
                                size_t dst_offset, size_t bytes)
{
    host_op op = {.kind = HOST_OP_COPY, .dst = (char *)dst_mem + dst_offset,
                  .src = (const char *)src_mem + src_offset, .bytes = bytes, .link_direction = HOST_LINK_NONE};
    return host_submit(dev, stream, &op);
}

static mapping_status host_fill(void *dev, void *stream, void *mem, size_t offset, size_t bytes, unsigned char value)
{
    host_op op = {.kind = HOST_OP_FILL, .dst = (char *)mem + offset, .bytes = bytes, .value = value};
    return host_submit(dev, stream, &op);
}

static mapping_status host_launch_host(void *dev, void *stream, void (*fn)(void *), void *user)
{
    host_op op = {.kind = HOST_OP_FUNCTION, .fn = fn, .user = user};
    return host_submit(dev, stream, &op);
}

const mapping_backend mapping_backend_host = {
    .name = "host",
    .load = host_load,
    .device_info = host_device_info,
    .device_open = host_device_open,
    .device_open_caps = host_device_open_caps,
    .device_close = host_device_close,
    .buffer_alloc = host_buffer_alloc,
    .buffer_free = host_buffer_free,
    .buffer_native = host_buffer_native,
    .buffer_alloc_unified = host_buffer_alloc_unified,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_synchronize = host_stream_synchronize,
    .write = host_write,
    .read = host_read,
    .copy = host_copy,
    .fill = host_fill,
    .scatter = host_scatter,
    .gather = host_gather,
    .launch_host = host_launch_host,
    .event_record = host_event_record,
    .event_wait = host_event_wait,
    .event_synchronize = host_event_synchronize,
    .event_query = host_event_query,
    .event_elapsed = host_event_elapsed,
    .event_destroy = host_event_destroy,
};
