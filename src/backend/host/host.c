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

/* $MAPPING_HOST_DEVICES = N (1 to HOST_MAX_DEVICES) virtual devices, each
 * with its own memory, so every multi-device path runs without hardware.
 * Read once, when the back end loads. */
enum { HOST_MAX_DEVICES = 64 };
static int host_device_count = 1;

static mapping_status host_load(char *why, size_t why_size, int *device_count)
{
    /* Decimal digits only (no sign, space or suffix): anything else makes
     * the back end unavailable, with the reason (mapping_open names it). */
    const char *env = getenv("MAPPING_HOST_DEVICES");
    if (env && *env) {
        long n = 0;
        for (const char *c = env; *c && n <= HOST_MAX_DEVICES; c++)
            n = *c >= '0' && *c <= '9' ? n * 10 + (*c - '0') : HOST_MAX_DEVICES + 1;
        if (n < 1 || n > HOST_MAX_DEVICES) {
            snprintf(why, why_size, "MAPPING_HOST_DEVICES=\"%s\" is not a count from 1 to %d", env, HOST_MAX_DEVICES);
            return MAPPING_ERR_INVALID_ARGUMENT;
        }
        host_device_count = (int)n;
    }
    *device_count = host_device_count;
    return MAPPING_OK;
}

static mapping_status host_device_info(int index, mapping_device_info *info)
{
    memset(info, 0, sizeof *info);
    strcpy(info->backend, "host");
    info->index = index;
    strcpy(info->kind, "host");
    if (host_device_count > 1)
        snprintf(info->name, sizeof info->name, "host memory (built-in back end), virtual device %d", index);
    else
        strcpy(info->name, "host memory (built-in back end)");
    strcpy(info->vendor, "mapping");
    snprintf(info->driver, sizeof info->driver, "mapping %s", mapping_version());
    info->memory_bytes = mapping_os_physical_memory();
    info->caps = MAPPING_CAP_PINNED_HOST | MAPPING_CAP_ASYNC_COPY | MAPPING_CAP_UNIFIED |
                 MAPPING_CAP_CONCURRENT_UNIFIED | MAPPING_CAP_TIMING | MAPPING_CAP_DEVICE_KERNELS |
                 MAPPING_CAP_CPU_MEMORY;
    return MAPPING_OK;
}

/* $MAPPING_HOST_LINK = "BANDWIDTH[,LATENCY]", bytes per second and seconds
 * as plain numbers, e.g. "25e9,5e-6"; unset or empty: no model. Anything else
 * (units such as "25GB/s", a missing number, nan, values out of range) fails
 * mapping_open. */
static mapping_status link_from_env(host_link *link)
{
    const char *env = getenv("MAPPING_HOST_LINK");
    if (!env || !*env)
        return MAPPING_OK;
    double bandwidth = 0, latency = 0;
    const char *end, *why = NULL;
    if (!mapping_os_parse_double(env, ",", &end, &bandwidth) ||
        (*end == ',' && !mapping_os_parse_double(end + 1, NULL, NULL, &latency)))
        why = "expected BANDWIDTH[,LATENCY] as plain numbers in bytes per second and seconds, e.g. 25e9,5e-6";
    else
        why = mapping_os_link_check(bandwidth, latency);
    if (why)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "mapping_open: MAPPING_HOST_LINK=\"%s\": %s", env, why);
    link->bandwidth = bandwidth;
    link->latency = latency;
    return MAPPING_OK;
}

/* $MAPPING_HOST_POISON: "1" fills new device memory with 0xCD, "0" does not;
 * unset or empty: the build's default. Anything else fails mapping_open. */
static mapping_status poison_from_env(bool *poison)
{
    const char *env = getenv("MAPPING_HOST_POISON");
    if (!env || !*env)
        return MAPPING_OK;
    if (strcmp(env, "0") && strcmp(env, "1"))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "mapping_open: MAPPING_HOST_POISON=\"%s\" is not 0 or 1", env);
    *poison = env[0] == '1';
    return MAPPING_OK;
}

static mapping_status host_device_open(int index, const mapping_device_desc *desc, void **out)
{
    (void)index;
    host_device *d = mapping_os_calloc(1, sizeof *d);
    if (!d)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "host: out of memory");
    d->poison = MAPPING_HOST_POISON_DEFAULT;
    mapping_status st = poison_from_env(&d->poison);
    if (st == MAPPING_OK && (desc->link_bandwidth > 0 || desc->link_latency > 0)) {
        d->link.bandwidth = desc->link_bandwidth; /* checked by mapping_open */
        d->link.latency = desc->link_latency;
    } else if (st == MAPPING_OK) {
        st = link_from_env(&d->link);
    }
    if (st != MAPPING_OK) {
        free(d);
        return st;
    }
    pthread_mutex_init(&d->link.engine[HOST_LINK_H2D], NULL);
    pthread_mutex_init(&d->link.engine[HOST_LINK_D2H], NULL);
    d->link.wake_margin_ns[HOST_LINK_H2D] = d->link.wake_margin_ns[HOST_LINK_D2H] = HOST_LINK_MARGIN_START_NS;
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
    return mapping__host_submit(dev, stream, &op);
}

static mapping_status host_read(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst,
                                const mapping_host_ref *pinned, size_t bytes)
{
    (void)pinned;
    host_op op = {.kind = HOST_OP_COPY, .dst = dst, .src = (const char *)src_mem + src_offset, .bytes = bytes,
                  .link_direction = HOST_LINK_D2H};
    return mapping__host_submit(dev, stream, &op);
}

static mapping_status host_copy(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst_mem,
                                size_t dst_offset, size_t bytes)
{
    host_op op = {.kind = HOST_OP_COPY, .dst = (char *)dst_mem + dst_offset,
                  .src = (const char *)src_mem + src_offset, .bytes = bytes, .link_direction = HOST_LINK_NONE};
    return mapping__host_submit(dev, stream, &op);
}

static mapping_status host_fill(void *dev, void *stream, void *mem, size_t offset, size_t bytes, unsigned char value)
{
    host_op op = {.kind = HOST_OP_FILL, .dst = (char *)mem + offset, .bytes = bytes, .value = value};
    return mapping__host_submit(dev, stream, &op);
}

static mapping_status host_launch_host(void *dev, void *stream, void (*fn)(void *), void *user)
{
    host_op op = {.kind = HOST_OP_FUNCTION, .fn = fn, .user = user};
    return mapping__host_submit(dev, stream, &op);
}

/* Virtual devices share the process's memory: a peer copy is a memcpy on
 * the destination's stream (no link modelled between devices). */
static mapping_status host_peer_copy(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                                     void *dst_mem, size_t dst_offset, size_t bytes)
{
    (void)src_dev;
    return host_copy(dev, stream, src_mem, src_offset, dst_mem, dst_offset, bytes);
}

/* ---- adopting memory made elsewhere: a pointer is the host back end's
 * device memory, used as it is and never freed here. No native queues: its
 * streams are library threads, so there is nothing to import or wait for. */
static mapping_status host_buffer_import(void *dev, void *native, size_t offset, size_t bytes, void **mem)
{
    (void)dev;
    if ((uintptr_t)native > UINTPTR_MAX - offset || (uintptr_t)native + offset > UINTPTR_MAX - bytes)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "host: pointer %p + offset %zu + bytes %zu wraps around", native,
                             offset, bytes);
    *mem = (char *)native + offset;
    return MAPPING_OK;
}

static void host_buffer_unimport(void *dev, void *mem)
{
    (void)dev;
    (void)mem;
}

/* Host memory is the device's: the address is the buffer's own, and
 * blocking calls run inline (nothing queued to wait for). */
static mapping_status host_map(void *dev, void *mem, size_t offset, size_t bytes, void **host)
{
    (void)dev;
    (void)bytes;
    *host = (char *)mem + offset;
    return MAPPING_OK;
}

static mapping_status host_unmap(void *dev, void *mem, void *host)
{
    (void)dev;
    (void)mem;
    (void)host;
    return MAPPING_OK;
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
    .stream_create = mapping__host_stream_create,
    .stream_destroy = mapping__host_stream_destroy,
    .stream_synchronize = mapping__host_stream_synchronize,
    .write = host_write,
    .read = host_read,
    .copy = host_copy,
    .fill = host_fill,
    .scatter = mapping__host_scatter,
    .gather = mapping__host_gather,
    .diff_blocks = mapping__host_diff_blocks,
    .map = host_map,
    .unmap = host_unmap,
    .launch_host = host_launch_host,
    .event_record = mapping__host_event_record,
    .event_wait = mapping__host_event_wait,
    .event_synchronize = mapping__host_event_synchronize,
    .event_query = mapping__host_event_query,
    .event_elapsed = mapping__host_event_elapsed,
    .event_destroy = mapping__host_event_destroy,
    .peer_copy = host_peer_copy,
    .buffer_import = host_buffer_import,
    .buffer_unimport = host_buffer_unimport,
};
