/*
 * Adopting what other libraries made: a device opened on the caller's driver
 * context (mapping_open_opencl), device memory (mapping_import_gpu) and
 * queues (mapping_import_stream) the caller owns. The objects are ordinary
 * devices, buffers and streams (made by the same internal functions), so
 * every operation takes them; only freeing differs: the library drops its
 * own handle and leaves the caller's object alive. docs/interop.md.
 */
#include <stdlib.h>
#include "core/backends.h"
#include "core/ops.h"
#include "os/settings.h"

mapping_status mapping_open_opencl(void *cl_context, void *cl_device_id, void *cl_command_queue,
                                   mapping_device **out)
{
    static const char fn[] = "mapping_open_opencl";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if ((st = mapping__check_ptr(fn, "cl_context", cl_context)) ||
        (st = mapping__check_ptr(fn, "cl_device_id", cl_device_id)) ||
        (st = mapping__settings_check(fn))) /* every MAPPING_* variable, as mapping_open */
        return st;
    uint64_t budget;
    if (!mapping__budget_from_env(&budget))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "%s: MAPPING_MEMORY_BUDGET=\"%s\" is not a memory budget (decimal digits, bytes, 0 to "
                             "2^60; 0: none)", fn, getenv("MAPPING_MEMORY_BUDGET"));
    int which = mapping__backend_index("opencl");
    mapping_backend_info binfo;
    const mapping_backend *be = which >= 0 ? mapping__backend_get(which, &binfo) : NULL;
    if (!be)
        return mapping__fail(MAPPING_ERR_NO_BACKEND, "%s: the opencl back end is unavailable: %s", fn,
                             which >= 0 ? binfo.reason : "not compiled in");
    const mapping_native_device native = {cl_context, cl_device_id, NULL, cl_command_queue};
    mapping_device *dev = mapping_os_handle_alloc(sizeof *dev);
    if (!dev)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    dev->be = be;
    int index = -1;
    if ((st = mapping__op_device_adopt(be, &native, &index, &dev->state)) != MAPPING_OK) {
        mapping_os_handle_free(dev);
        return st;
    }
    if ((st = mapping__op_device_info(be, index, &dev->info)) != MAPPING_OK) {
        mapping__op_device_close(dev);
        mapping_os_handle_free(dev);
        return st;
    }
    return mapping__device_finish(dev, out);
}

mapping_status mapping_import_gpu(mapping_device *dev, void *native, size_t offset, size_t bytes,
                                  void (*release)(void *user), void *user, mapping_buffer **out)
{
    static const char fn[] = "mapping_import_gpu";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    if ((st = mapping__check_ptr(fn, "native", native)))
        return st;
    if (bytes == 0)
        return mapping__fail(MAPPING_ERR_ZERO_SIZE, "%s: bytes is 0", fn);
    if (offset > SIZE_MAX - bytes)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "%s: offset %zu + bytes %zu overflows", fn, offset, bytes);
    return mapping__import_gpu(dev, native, offset, bytes, release, user, out);
}

mapping_status mapping_import_stream(mapping_device *dev, void *native_queue, mapping_stream **out)
{
    static const char fn[] = "mapping_import_stream";
    mapping_status st;
    if ((st = mapping__check_device(fn, dev)) || (st = mapping__check_ptr(fn, "out", out)))
        return st;
    *out = NULL;
    /* NULL (0): the default native queue, where the back end has one (CUDA:
     * the legacy default stream, torch.cuda.default_stream().cuda_stream). */
    if (!native_queue && mapping__can_import_default_stream(dev))
        return mapping__import_stream(dev, NULL, out);
    if (!native_queue && mapping__can_import_stream(dev))
        return mapping__fail(MAPPING_ERR_NULL_ARGUMENT,
                             "%s: native_queue is NULL, and back end %s has no default native queue to take for it", fn,
                             dev->be->name);
    if ((st = mapping__check_ptr(fn, "native_queue", native_queue)))
        return st;
    return mapping__import_stream(dev, native_queue, out);
}
