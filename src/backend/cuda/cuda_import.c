/*
 * Adopting memory and streams made elsewhere (docs/interop.md). The device
 * runs in the primary context, which the CUDA runtime (and so PyTorch and
 * CuPy) also uses: their pointers and streams are valid here as they are.
 * The library never frees or destroys what it imported.
 *
 * An imported pointer is checked with the driver first
 * (cuPointerGetAttribute): it must be device memory (or managed memory) of
 * this device, allocated in this context (or in none: memory mapped with
 * cuMemMap belongs to no context), and the range must lie inside the
 * allocation. Without the check a tensor of another GPU, or a host address,
 * reached the copy kernel, whose illegal address then stuck to the primary
 * context that PyTorch and CuPy share with the library.
 */
#include "backend/cuda/cuda_device.h"
#include "os/status.h"

/* The driver's word on one attribute of p; false when it has none. */
static bool attribute(const cuda_driver *cu, void *data, int attr, cu_deviceptr p)
{
    return cu->cuPointerGetAttribute(data, attr, p) == CU_SUCCESS;
}

static const char *memory_type_name(unsigned type)
{
    return type == CU_MEMORYTYPE_HOST_ ? "page-locked host memory" : type == 3 ? "a CUDA array" : "memory";
}

/* The type, device and context of p: MAPPING_OK when it is this device's
 * memory. The context is current. */
static mapping_status check_owner(cuda_device *d, cu_deviceptr p)
{
    const cuda_driver *cu = d->cu;
    unsigned type = 0, managed = 0;
    int ordinal = -1;
    cu_context ctx = NULL;
    if (!attribute(cu, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE_, p))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "mapping_import_gpu: 0x%llx is not memory the CUDA driver knows (a host address, a freed "
                             "or made-up pointer): only device memory can be imported",
                             (unsigned long long)p);
    if (type != CU_MEMORYTYPE_DEVICE_ && type != CU_MEMORYTYPE_UNIFIED_)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "mapping_import_gpu: 0x%llx is %s, not device memory: copy it with "
                             "mapping_sync_to_gpu instead",
                             (unsigned long long)p, memory_type_name(type));
    attribute(cu, &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED_, p);
    if (!managed && attribute(cu, &ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL_, p) && ordinal != d->ordinal)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH,
                             "mapping_import_gpu: 0x%llx is memory of CUDA device %d, not of this device (%d): "
                             "import it into a device opened on %d",
                             (unsigned long long)p, ordinal, d->ordinal, ordinal);
    if (!managed && attribute(cu, &ctx, CU_POINTER_ATTRIBUTE_CONTEXT_, p) && ctx && ctx != d->ctx)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH,
                             "mapping_import_gpu: 0x%llx was allocated in another CUDA context than the device's "
                             "primary context, which the library (and the CUDA runtime) use",
                             (unsigned long long)p);
    return MAPPING_OK;
}

/* [p, +bytes) inside the allocation holding p, where the driver says. */
static mapping_status check_extent(cuda_device *d, cu_deviceptr p, size_t bytes)
{
    const cuda_driver *cu = d->cu;
    cu_deviceptr start = 0;
    size_t size = 0;
    if (!attribute(cu, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR_, p) ||
        !attribute(cu, &size, CU_POINTER_ATTRIBUTE_RANGE_SIZE_, p) || size == 0)
        return MAPPING_OK; /* the driver cannot say */
    if (p + bytes > start + size)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE,
                             "mapping_import_gpu: 0x%llx + %zu bytes runs %llu bytes past the end of its allocation "
                             "(0x%llx, %zu bytes)",
                             (unsigned long long)p, bytes, (unsigned long long)(p + bytes - start - size),
                             (unsigned long long)start, size);
    return MAPPING_OK;
}

mapping_status mapping__cuda_buffer_import(void *dev, void *native, size_t offset, size_t bytes, void **mem)
{
    cuda_device *d = dev;
    cu_deviceptr p = cuda_ptr(native);
    if (p > (cu_deviceptr)-1 - offset || p + offset > (cu_deviceptr)-1 - bytes)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "cuda: device pointer 0x%llx + offset %zu + bytes %zu wraps around",
                             (unsigned long long)p, offset, bytes);
    mapping_status st = MAPPING_OK;
    if (d->cu->cuPointerGetAttribute)
        IN_CONTEXT(d, {
            st = check_owner(d, p + offset);
            if (st == MAPPING_OK)
                st = check_extent(d, p + offset, bytes);
        });
    if (st == MAPPING_OK)
        *mem = (void *)(uintptr_t)(p + offset);
    return st;
}

void mapping__cuda_buffer_unimport(void *dev, void *mem)
{
    (void)dev;
    (void)mem;
}

/* A CUstream of the primary context; NULL (0, as CUDA code names the default
 * stream: torch.cuda.default_stream().cuda_stream) is the legacy default
 * stream, by its handle CU_STREAM_LEGACY, never destroyed. */
mapping_status mapping__cuda_stream_import(void *dev, void *native, void **stream)
{
    (void)dev;
    *stream = native ? native : (void *)CU_STREAM_LEGACY_;
    return MAPPING_OK;
}

void mapping__cuda_stream_unimport(void *dev, void *stream)
{
    (void)dev;
    (void)stream;
}
