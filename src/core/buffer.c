/* Device memory: mapping_allocate_gpu / mapping_free_gpu and friends. */
#include <stdlib.h>
#include "core/ops.h"

/* Wraps memory from one of the back end's allocators as a live buffer:
 * ordinary (host == NULL) or unified (*host gets its CPU address). */
/* What buffer_new wraps when it imports instead of allocating. */
typedef struct buffer_import {
    void  *native;
    size_t offset;
} buffer_import;

/* How a new buffer counts against the device's memory budget (budget.c). */
typedef enum { UNCOUNTED, COUNTED, COUNTED_PLAIN } buffer_count;

static mapping_status buffer_new(const char *fn, mapping_device *dev, size_t bytes, void **host,
                                 const buffer_import *import, buffer_count count, mapping_buffer **out)
{
    /* Room in the budget first (it may evict mirrors): nothing to undo there. */
    mapping_status st = count ? mapping__budget_reserve(fn, dev, bytes, count == COUNTED_PLAIN) : MAPPING_OK;
    if (st != MAPPING_OK)
        return st;
    mapping_buffer *buf = mapping_os_handle_alloc(sizeof *buf); /* see os/handle_arena.c */
    if (!buf) {
        if (count)
            mapping__budget_release(dev, bytes, count == COUNTED_PLAIN);
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    }
    st = mapping__fault_check(dev, fn);
    if (st == MAPPING_OK)
        st = import ? mapping__op_buffer_import(dev, import->native, import->offset, bytes, &buf->mem)
             : host ? mapping__op_buffer_alloc_unified(dev, bytes, &buf->mem, host)
                    : mapping__op_buffer_alloc(dev, bytes, &buf->mem);
    buf->imported = import != NULL;
    buf->owner = NULL;
    if (st == MAPPING_OK && mapping__handle_add(MAPPING_HANDLE_BUFFER, buf) != MAPPING_OK) {
        if (import)
            mapping__op_buffer_unimport(dev, buf->mem);
        else
            mapping__op_buffer_free(dev, buf->mem);
        st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    }
    if (st != MAPPING_OK) {
        mapping_os_handle_free(buf);
        if (count)
            mapping__budget_release(dev, bytes, count == COUNTED_PLAIN);
        return st;
    }
    buf->dev = dev;
    buf->size = bytes;
    buf->counted = count ? bytes : 0;
    buf->plain = count == COUNTED_PLAIN;
    mapping__list_add(dev, &dev->buffers, &buf->node);
    *out = buf;
    return MAPPING_OK;
}

mapping_status mapping__allocate_gpu(mapping_device *dev, size_t bytes, mapping_buffer **out)
{
    *out = NULL;
    return buffer_new("mapping_allocate_gpu", dev, bytes, NULL, NULL, UNCOUNTED, out);
}

mapping_status mapping__allocate_gpu_counted(const char *fn, mapping_device *dev, size_t bytes, mapping_buffer **out)
{
    *out = NULL;
    return buffer_new(fn, dev, bytes, NULL, NULL, COUNTED, out);
}

void mapping__free_gpu(mapping_buffer *buf)
{
    if (!mapping__handle_remove(MAPPING_HANDLE_BUFFER, buf))
        return; /* another thread freed it first: exactly one free goes ahead */
    mapping_device *dev = buf->dev;
    mapping__list_remove(dev, &buf->node);
    if (buf->imported) {
        mapping__op_buffer_unimport(dev, buf->mem);
        if (buf->release)
            buf->release(buf->release_user);
    } else {
        mapping__op_buffer_free(dev, buf->mem);
    }
    if (buf->counted)
        mapping__budget_release(dev, buf->counted, buf->plain);
    mapping_os_handle_free(buf);
}

mapping_status mapping_allocate_gpu(mapping_device *dev, size_t bytes, mapping_buffer **out)
{
    static const char fn[] = "mapping_allocate_gpu";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    return buffer_new(fn, dev, bytes, NULL, NULL, COUNTED_PLAIN, out);
}

void mapping_free_gpu(mapping_buffer *buf)
{
    if (!buf || mapping__check_buffer("mapping_free_gpu", "buffer", buf) != MAPPING_OK)
        return;
    if (buf->owner) {
        mapping__fail(MAPPING_ERR_NOT_OWNED, "mapping_free_gpu: buffer %p belongs to a %s: destroy the %s instead; "
                                             "not freed",
                      (void *)buf, buf->owner, buf->owner);
        return;
    }
    mapping__free_gpu(buf);
}

size_t mapping_buffer_size(const mapping_buffer *buf)
{
    return mapping__handle_live(MAPPING_HANDLE_BUFFER, buf) ? buf->size : 0;
}

mapping_device *mapping_buffer_device(const mapping_buffer *buf)
{
    return mapping__handle_live(MAPPING_HANDLE_BUFFER, buf) ? buf->dev : NULL;
}

mapping_status mapping_native_buffer(const mapping_buffer *buf, void **out)
{
    static const char fn[] = "mapping_native_buffer";
    mapping_status st;
    if ((st = mapping__check_buffer(fn, "buffer", buf)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    return mapping__op_buffer_native(buf->dev, buf->mem, out);
}

/* For unified mirrors (src/coherence/mirror_unified.c) and shared batch
 * staging (mapping__staging_shared): memory from the back
 * end's buffer_alloc_unified as an ordinary buffer, freed by
 * mapping_free_gpu (or mapping__free_gpu); *host is its CPU address. MAPPING_ERR_UNSUPPORTED when the
 * back end has no unified memory. */
mapping_status mapping__allocate_unified(const char *fn, mapping_device *dev, size_t bytes, mapping_buffer **out,
                                         void **host)
{
    if (!mapping__can_allocate_unified(dev))
        return MAPPING_ERR_UNSUPPORTED;
    return buffer_new(fn, dev, bytes, host, NULL, UNCOUNTED, out);
}

/* Memory the caller owns as a buffer (src/core/import.c validates). */
mapping_status mapping__import_gpu(mapping_device *dev, void *native, size_t offset, size_t bytes,
                                   void (*release)(void *user), void *user, mapping_buffer **out)
{
    *out = NULL;
    if (!mapping__can_import_buffer(dev))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "mapping_import_gpu: back end %s cannot import device memory",
                             dev->be->name);
    const buffer_import import = {native, offset};
    mapping_status st = buffer_new("mapping_import_gpu", dev, bytes, NULL, &import, UNCOUNTED, out);
    if (st == MAPPING_OK) {
        (*out)->release = release;
        (*out)->release_user = user;
    }
    return st;
}
