/*
 * Adopting OpenCL objects made elsewhere (PyOpenCL, CLBlast, any OpenCL
 * program): a cl_mem as a buffer, an in-order cl_command_queue as a stream,
 * both retained for as long as the library holds them (the device on a
 * caller's context is opencl_device_adopt in opencl.c). The caller's objects
 * are never destroyed here: unimport releases only the library's reference.
 */
#include <stdlib.h>
#include "backend/opencl/opencl_internal.h"
#include "os/os.h"
#include "os/status.h"
#ifdef MAPPING_OPENCL_HEADERS

bool mapping__opencl_can_import(void)
{
    return mapping__opencl_driver.clRetainContext && mapping__opencl_driver.clRetainCommandQueue && mapping__opencl_driver.clRetainMemObject &&
           mapping__opencl_driver.clGetContextInfo && mapping__opencl_driver.clGetCommandQueueInfo && mapping__opencl_driver.clCreateSubBuffer;
}

/* The device's own queue takes the library's blocking calls and, per the
 * NULL-stream contract, the caller's work too: finishing it waits for both. */
mapping_status mapping__opencl_device_synchronize(void *dev)
{
    cl_int err = mapping__opencl_driver.clFinish(((opencl_device *)dev)->queue);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clFinish (device queue)", err);
}

/* A sub-range of a cl_mem is a sub-buffer, and OpenCL makes sub-buffers of
 * buffers only (clCreateSubBuffer on a sub-buffer is CL_INVALID_MEM_OBJECT):
 * say so, and what works instead. */
static mapping_status refuse_sub_buffer_of_sub_buffer(cl_mem mem, size_t offset)
{
    cl_mem parent = NULL;
    size_t origin = 0;
    if (mapping__opencl_driver.clGetMemObjectInfo(mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) !=
            CL_SUCCESS ||
        !parent)
        return MAPPING_OK; /* a buffer: clCreateSubBuffer decides */
    mapping__opencl_driver.clGetMemObjectInfo(mem, CL_MEM_OFFSET, sizeof origin, &origin, NULL);
    return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                         "opencl: cl_mem %p is a sub-buffer (of cl_mem %p at offset %zu), and OpenCL cannot make a "
                         "sub-buffer of a sub-buffer: import it with offset 0, or import its parent at offset %zu",
                         (void *)mem, (void *)parent, origin, origin + offset);
}

/* native[offset, +bytes): the cl_mem itself (retained) when offset is 0,
 * else a sub-buffer (whose origin must be aligned to the device's
 * CL_DEVICE_MEM_BASE_ADDR_ALIGN). */
mapping_status mapping__opencl_buffer_import(void *dev, void *native, size_t offset, size_t bytes, void **out)
{
    opencl_device *d = dev;
    if (!mapping__opencl_can_import())
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "opencl: the OpenCL library lacks clRetainMemObject and friends");
    cl_mem mem = native;
    cl_context context = NULL;
    size_t size = 0;
    cl_mem_object_type type = 0;
    cl_int err;
    mapping_status st;
    if ((err = mapping__opencl_driver.clGetMemObjectInfo(mem, CL_MEM_TYPE, sizeof type, &type, NULL)) ||
        (err = mapping__opencl_driver.clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof context, &context, NULL)) ||
        (err = mapping__opencl_driver.clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL)))
        return mapping__fail_driver(err == CL_INVALID_MEM_OBJECT ? MAPPING_ERR_INVALID_HANDLE : mapping__opencl_status_of(err),
                                    "opencl", "clGetMemObjectInfo (import)", err, mapping__opencl_error_name(err));
    if (type != CL_MEM_OBJECT_BUFFER)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "opencl: cl_mem %p is an image, not a buffer", native);
    if (context != d->context)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH,
                             "opencl: cl_mem %p belongs to another cl_context (open the device on it with "
                             "mapping_open_opencl)",
                             native);
    if (offset > size || bytes > size - offset)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "opencl: offset %zu + bytes %zu is past the end of cl_mem %p (%zu bytes)",
                             offset, bytes, native, size);
    if (offset != 0 && (st = refuse_sub_buffer_of_sub_buffer(mem, offset)) != MAPPING_OK)
        return st;
    opencl_buffer *b = mapping_os_malloc(sizeof *b);
    if (!b)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    b->svm = NULL;
    if (offset == 0) {
        mapping__opencl_driver.clRetainMemObject(mem);
        b->mem = mem;
    } else {
        cl_buffer_region region = {offset, bytes};
        b->mem = mapping__opencl_driver.clCreateSubBuffer(mem, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
        if (err != CL_SUCCESS) {
            free(b);
            if (err == CL_MISALIGNED_SUB_BUFFER_OFFSET) {
                cl_uint bits = 0;
                mapping__opencl_driver.clGetDeviceInfo(d->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL);
                return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                     "opencl: clCreateSubBuffer (import) failed: CL_MISALIGNED_SUB_BUFFER_OFFSET "
                                     "(%d): offset %zu is not a multiple of the device's base address alignment "
                                     "(%u bytes)",
                                     (int)err, offset, bits / 8);
            }
            return mapping__opencl_fail("clCreateSubBuffer (import)", err);
        }
    }
    *out = b;
    return MAPPING_OK;
}

void mapping__opencl_buffer_unimport(void *dev, void *mem)
{
    mapping__opencl_buffer_free(dev, mem); /* releases the library's reference; no SVM behind it */
}

mapping_status mapping__opencl_check_queue(cl_command_queue queue, cl_context context, cl_device_id device)
{
    cl_context qcontext = NULL;
    cl_device_id qdevice = NULL;
    cl_command_queue_properties props = 0;
    cl_int err;
    if ((err = mapping__opencl_driver.clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qcontext, &qcontext, NULL)) ||
        (err = mapping__opencl_driver.clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdevice, &qdevice, NULL)) ||
        (err = mapping__opencl_driver.clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL)))
        return mapping__fail_driver(err == CL_INVALID_COMMAND_QUEUE ? MAPPING_ERR_INVALID_HANDLE : mapping__opencl_status_of(err),
                                    "opencl", "clGetCommandQueueInfo", err, mapping__opencl_error_name(err));
    if (qcontext != context || qdevice != device)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH,
                             "opencl: cl_command_queue %p belongs to another context or device", (void *)queue);
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "opencl: cl_command_queue %p is out of order; the library's queues are in order", (void *)queue);
    return MAPPING_OK;
}

mapping_status mapping__opencl_stream_import(void *dev, void *native, void **out)
{
    opencl_device *d = dev;
    if (!mapping__opencl_can_import())
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "opencl: the OpenCL library lacks clRetainCommandQueue and friends");
    cl_command_queue queue = native;
    mapping_status st = mapping__opencl_check_queue(queue, d->context, d->device);
    if (st != MAPPING_OK)
        return st;
    opencl_stream *s = mapping_os_calloc(1, sizeof *s);
    if (!s)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    mapping__opencl_driver.clRetainCommandQueue(queue);
    s->queue = queue;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    *out = s;
    return MAPPING_OK;
}

void mapping__opencl_stream_unimport(void *dev, void *stream)
{
    mapping__opencl_stream_destroy(dev, stream); /* finishes the queue, releases the library's reference */
}
#endif /* MAPPING_OPENCL_HEADERS */
