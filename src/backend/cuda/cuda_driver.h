/*
 * The part of the CUDA driver API the cuda back end uses, declared here so
 * the library builds on machines without the CUDA toolkit (the toolkit's
 * cuda.h is never included). Values and signatures follow cuda.h of CUDA 13.0;
 * every one used here has been stable since the driver version noted.
 *
 * The entry points live in one table, filled by cuda_loader.c from the
 * libcuda it dlopen()s. Where cuda.h maps a name to a versioned symbol
 * (cuMemAlloc -> cuMemAlloc_v2), the table holds the versioned symbol: the
 * unversioned export keeps the old ABI (32-bit sizes) for old binaries.
 */
#ifndef MAPPING_CUDA_DRIVER_H
#define MAPPING_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int                cu_result; /* CUresult */
typedef int                cu_device; /* CUdevice */
typedef unsigned long long cu_deviceptr;
typedef struct cu_ctx_st  *cu_context;
typedef struct cu_stream_st *cu_stream;
typedef struct cu_event_st *cu_event;
typedef struct cu_module_st *cu_module;
typedef struct cu_func_st *cu_function;
typedef void (*cu_host_fn)(void *user);

/* CUresult values the back end treats specially (the rest are named by
 * mapping__cuda_error_name()). */
enum {
    CU_SUCCESS = 0,
    CU_ERROR_INVALID_VALUE = 1,
    CU_ERROR_OUT_OF_MEMORY = 2,
    CU_ERROR_NOT_INITIALIZED = 3,
    CU_ERROR_STUB_LIBRARY = 34,
    CU_ERROR_NO_DEVICE = 100,
    CU_ERROR_INVALID_PTX = 218,
    CU_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CU_ERROR_NOT_READY = 600,
    CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CU_ERROR_NOT_SUPPORTED = 801,
    CU_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CU_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CU_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
};

/* CUdevice_attribute values. */
enum {
    CU_ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_ATTR_COMPUTE_CAPABILITY_MINOR = 76,
    CU_ATTR_MANAGED_MEMORY = 83,
    CU_ATTR_CONCURRENT_MANAGED_ACCESS = 89,
    CU_ATTR_HOST_REGISTER_SUPPORTED = 99,
};

enum {
    CU_MEMHOSTALLOC_PORTABLE_ = 0x01,
    CU_MEMHOSTREGISTER_PORTABLE_ = 0x01,
    CU_STREAM_NON_BLOCKING_ = 0x1,
    CU_EVENT_DEFAULT_ = 0x0,
    CU_EVENT_DISABLE_TIMING_ = 0x2,
    CU_MEM_ATTACH_GLOBAL_ = 0x1,
    CU_MEM_LOCATION_TYPE_DEVICE_ = 0x1,
    CU_MEM_LOCATION_TYPE_HOST_ = 0x2,
    CU_MEMCPY_SRC_ACCESS_ORDER_STREAM_ = 0x1,
    CU_DEVICE_CPU_ = -1,
    /* CUstreamCaptureStatus, CUstreamCaptureMode (CUDA 10.0 / 10.1) */
    CU_STREAM_CAPTURE_STATUS_NONE_ = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE_ = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED_ = 2,
    CU_STREAM_CAPTURE_MODE_RELAXED_ = 2,
    /* CUpointer_attribute, CUmemorytype */
    CU_POINTER_ATTRIBUTE_CONTEXT_ = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE_ = 2,
    CU_POINTER_ATTRIBUTE_IS_MANAGED_ = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL_ = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR_ = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE_ = 12,
    CU_MEMORYTYPE_HOST_ = 1,
    CU_MEMORYTYPE_DEVICE_ = 2,
    CU_MEMORYTYPE_UNIFIED_ = 4,
    /* CUjit_option: the error log of cuModuleLoadDataEx */
    CU_JIT_ERROR_LOG_BUFFER_ = 5,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES_ = 6,
};

/* Special stream handles (CUDA 7.0), valid wherever a CUstream is: the
 * legacy default stream, and the calling thread's per-thread default stream.
 * Never created, so never destroyed. */
#define CU_STREAM_LEGACY_ ((cu_stream)(uintptr_t)0x1)
#define CU_STREAM_PER_THREAD_ ((cu_stream)(uintptr_t)0x2)

/* CUmemLocation (CUDA 11.2). */
typedef struct cu_mem_location {
    int type; /* CU_MEM_LOCATION_TYPE_* */
    int id;
} cu_mem_location;

/* CUmemcpyAttributes (CUDA 12.8). */
typedef struct cu_memcpy_attributes {
    int             src_access_order; /* CU_MEMCPY_SRC_ACCESS_ORDER_* */
    cu_mem_location src_loc_hint;
    cu_mem_location dst_loc_hint;
    unsigned int    flags;
} cu_memcpy_attributes;

/* The entry points, declared once: X(name, (parameters)); each returns
 * cu_result. These lists generate the table below and the loader's symbol
 * list (cuda_loader.c), so the two cannot disagree. */

/* Every one must resolve, or the back end is unavailable. The newest is
 * cuDevicePrimaryCtxRelease_v2 (CUDA 11.0, driver R450): the minimum. */
#define CUDA_REQUIRED_ENTRY_POINTS(X)                                                                      \
    X(cuInit, (unsigned flags))                                                                             \
    X(cuDriverGetVersion, (int *version))                                                                   \
    X(cuDeviceGetCount, (int *count))                                                                       \
    X(cuDeviceGet, (cu_device *dev, int ordinal))                                                           \
    X(cuDeviceGetName, (char *name, int len, cu_device dev))                                                \
    X(cuDeviceTotalMem_v2, (size_t *bytes, cu_device dev))                                                  \
    X(cuDeviceGetAttribute, (int *value, int attribute, cu_device dev))                                     \
    X(cuDevicePrimaryCtxRetain, (cu_context *ctx, cu_device dev))                                           \
    X(cuDevicePrimaryCtxRelease_v2, (cu_device dev)) /* CUDA 11.0 */                                       \
    X(cuCtxGetCurrent, (cu_context *ctx))                                                                   \
    X(cuCtxPushCurrent_v2, (cu_context ctx))                                                                \
    X(cuCtxPopCurrent_v2, (cu_context *ctx))                                                                \
    X(cuMemAlloc_v2, (cu_deviceptr *ptr, size_t bytes))                                                     \
    X(cuMemFree_v2, (cu_deviceptr ptr))                                                                     \
    X(cuMemHostAlloc, (void **ptr, size_t bytes, unsigned flags))                                           \
    X(cuMemFreeHost, (void *ptr))                                                                           \
    X(cuMemHostRegister_v2, (void *ptr, size_t bytes, unsigned flags))                                      \
    X(cuMemHostUnregister, (void *ptr))                                                                     \
    X(cuMemcpyHtoD_v2, (cu_deviceptr dst, const void *src, size_t bytes))                                   \
    X(cuMemcpyDtoH_v2, (void *dst, cu_deviceptr src, size_t bytes))                                         \
    X(cuMemcpyDtoD_v2, (cu_deviceptr dst, cu_deviceptr src, size_t bytes))                                  \
    X(cuMemcpyHtoDAsync_v2, (cu_deviceptr dst, const void *src, size_t bytes, cu_stream s))                 \
    X(cuMemcpyDtoHAsync_v2, (void *dst, cu_deviceptr src, size_t bytes, cu_stream s))                       \
    X(cuMemcpyDtoDAsync_v2, (cu_deviceptr dst, cu_deviceptr src, size_t bytes, cu_stream s))                \
    X(cuMemsetD8_v2, (cu_deviceptr dst, unsigned char value, size_t bytes))                                 \
    X(cuMemsetD8Async, (cu_deviceptr dst, unsigned char value, size_t bytes, cu_stream s))                  \
    X(cuStreamCreate, (cu_stream *s, unsigned flags))                                                       \
    X(cuStreamDestroy_v2, (cu_stream s))                                                                    \
    X(cuStreamSynchronize, (cu_stream s))                                                                   \
    X(cuLaunchHostFunc, (cu_stream s, cu_host_fn fn, void *user)) /* CUDA 10.0 */                          \
    X(cuEventCreate, (cu_event *e, unsigned flags))                                                         \
    X(cuEventDestroy_v2, (cu_event e))                                                                      \
    X(cuEventRecord, (cu_event e, cu_stream s))                                                             \
    X(cuEventQuery, (cu_event e))                                                                           \
    X(cuEventSynchronize, (cu_event e))                                                                     \
    X(cuStreamWaitEvent, (cu_stream s, cu_event e, unsigned flags))

/* Required, resolved from name_v2 where the driver exports it (same
 * signature, later fixes), else from name. */
#define CUDA_REQUIRED_PREFER_V2_ENTRY_POINTS(X)                                                            \
    X(cuEventElapsedTime, (float *ms, cu_event start, cu_event end)) /* _v2: CUDA 12.8 */

/* NULL when the driver does not export them. */
#define CUDA_OPTIONAL_ENTRY_POINTS(X)                                                                      \
    X(cuGetErrorName, (cu_result error, const char **name))                                                 \
    X(cuMemAllocManaged, (cu_deviceptr *ptr, size_t bytes, unsigned flags))                                 \
    /* CUDA 12.2; the CUDA 13 cuMemPrefetchAsync */                                                         \
    X(cuMemPrefetchAsync_v2, (cu_deviceptr ptr, size_t bytes, cu_mem_location to, unsigned flags, cu_stream s)) \
    /* The CUDA 8 signature, used when _v2 is absent */                                                     \
    X(cuMemPrefetchAsync, (cu_deviceptr ptr, size_t bytes, cu_device to, cu_stream s))                      \
    /* CUDA 13.0, no failIdx ... */                                                                         \
    X(cuMemcpyBatchAsync_v2, (cu_deviceptr *dsts, cu_deviceptr *srcs, size_t *sizes, size_t count,          \
                              cu_memcpy_attributes *attrs, size_t *attr_idxs, size_t num_attrs, cu_stream s)) \
    /* ... else CUDA 12.8, with failIdx */                                                                  \
    X(cuMemcpyBatchAsync, (cu_deviceptr *dsts, cu_deviceptr *srcs, size_t *sizes, size_t count,             \
                           cu_memcpy_attributes *attrs, size_t *attr_idxs, size_t num_attrs, size_t *fail_idx, \
                           cu_stream s))                                                                    \
    X(cuModuleLoadData, (cu_module *module, const void *image))                                             \
    X(cuModuleUnload, (cu_module module))                                                                   \
    X(cuModuleGetFunction, (cu_function *fn, cu_module module, const char *name))                           \
    /* CUDA 12.4: loads a function now, not at its first launch (lazy loading) */                           \
    X(cuFuncLoad, (cu_function fn))                                                                         \
    X(cuLaunchKernel, (cu_function fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                       unsigned bz, unsigned shared_bytes, cu_stream s, void **params, void **extra))        \
    /* Several devices (cuda_peer.c) */                                                                    \
    X(cuDeviceCanAccessPeer, (int *can, cu_device dev, cu_device peer))                                     \
    X(cuCtxEnablePeerAccess, (cu_context peer, unsigned flags))                                             \
    X(cuMemcpyPeerAsync, (cu_deviceptr dst, cu_context dst_ctx, cu_deviceptr src, cu_context src_ctx,       \
                          size_t bytes, cu_stream s))                                                       \
    /* Stream capture (CUDA graphs): the status (10.0), with the capture's id (v3: 12.3, v2: 11.3, the   \
     * first form 10.1), and this thread's capture mode (10.1) */                                         \
    X(cuStreamIsCapturing, (cu_stream s, int *status))                                                      \
    X(cuStreamGetCaptureInfo_v3, (cu_stream s, int *status, unsigned long long *id, void **graph,          \
                                  const void **deps, const void **edges, size_t *count))                   \
    X(cuStreamGetCaptureInfo_v2, (cu_stream s, int *status, unsigned long long *id, void **graph,          \
                                  const void **deps, size_t *count))                                       \
    X(cuStreamGetCaptureInfo, (cu_stream s, int *status, unsigned long long *id))                           \
    X(cuThreadExchangeStreamCaptureMode, (int *mode))                                                       \
    /* Loading the kernels with the JIT's error log (CUDA 5.5) */                                          \
    X(cuModuleLoadDataEx, (cu_module *module, const void *image, unsigned count, int *options, void **values)) \
    /* What memory a pointer is (CUDA 4.0): imports, and page-locked memory made elsewhere */              \
    X(cuPointerGetAttribute, (void *data, int attribute, cu_deviceptr ptr))                                 \
    X(cuMemHostGetFlags, (unsigned *flags, void *ptr))                                                      \
    /* Copies a captured graph replays with new ranges (cuda_graph.c): the device's address of page-locked \
     * memory (3.2), and user objects a graph holds (11.3) */                                              \
    X(cuMemHostGetDevicePointer_v2, (cu_deviceptr *dptr, void *ptr, unsigned flags))                        \
    X(cuUserObjectCreate, (void **obj, void *ptr, cu_host_fn destroy, unsigned initial, unsigned flags))    \
    X(cuUserObjectRelease, (void *obj, unsigned count))                                                     \
    X(cuGraphRetainUserObject, (void *graph, void *obj, unsigned count, unsigned flags))

typedef struct cuda_driver {
    void *lib;
    int   version; /* cuDriverGetVersion: 12080 = CUDA 12.8 */
#define CUDA_DRIVER_FIELD_(name, params) cu_result(*name) params;
    CUDA_REQUIRED_ENTRY_POINTS(CUDA_DRIVER_FIELD_)
    CUDA_REQUIRED_PREFER_V2_ENTRY_POINTS(CUDA_DRIVER_FIELD_)
    CUDA_OPTIONAL_ENTRY_POINTS(CUDA_DRIVER_FIELD_)
#undef CUDA_DRIVER_FIELD_
} cuda_driver;

/* The process's driver, loaded once (cuda_loader.c). Returns NULL and writes
 * a one-line reason into why when there is no usable driver. */
const cuda_driver *mapping__cuda_driver_load(char *why, size_t why_size);
/* The loaded driver (NULL before a successful mapping__cuda_driver_load). */
const cuda_driver *mapping__cuda_driver_get(void);
/* "CUDA_ERROR_OUT_OF_MEMORY": the driver's name for a CUresult when it has
 * one, else the name from our own table, else "unknown CUresult". Never NULL
 * (works before any driver is loaded). */
const char *mapping__cuda_error_name(cu_result code);
/* Does the driver offer batched copies (cuMemcpyBatchAsync)? */
bool mapping__cuda_driver_has_batch_copy(const cuda_driver *cu);
/* Can the driver load and launch the library's own kernels? */
bool mapping__cuda_driver_has_kernels(const cuda_driver *cu);

#endif /* MAPPING_CUDA_DRIVER_H */
