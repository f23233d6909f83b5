/*
 * mapping.h: move data between CPU memory and accelerator memory, and know
 * where each byte is valid.
 *
 * One header is the whole public surface of libmapping. Every symbol is
 * prefixed mapping_ / MAPPING_. The header compiles as C99 (and as C++);
 * only the library itself is built as C11.
 *
 * ---------------------------------------------------------------------------
 * Step by step
 * ---------------------------------------------------------------------------
 * 1. Open a device: mapping_open(NULL, &dev) picks the best back end (CUDA,
 *    then an OpenCL GPU, then the host back end), or $MAPPING_BACKEND.
 * 2. Allocate: mapping_allocate_gpu for device memory, mapping_allocate_cpu
 *    for page-locked host memory (the fast path of every copy; any host
 *    memory works).
 * 3. Sync to the GPU: mapping_sync_to_gpu (whole buffer) or
 *    mapping_sync_to_gpu_range (any range, blocking or on a stream).
 * 4. Run your work on the device: your kernel on the back end's own queue
 *    (mapping_device_native / mapping_buffer_native give the driver
 *    objects), or mapping_copy_gpu / mapping_fill_gpu.
 * 5. Sync back: mapping_sync_to_cpu / mapping_sync_to_cpu_range.
 * 6. Overlap: create streams (mapping_stream_create), queue copies on them,
 *    join them with events, wait with mapping_stream_synchronize.
 * 7. Errors: every fallible call returns a mapping_status;
 *    mapping_last_error_message() says what went wrong on this thread.
 * 8. Close: free what you allocated, then mapping_close.
 * Then, as the program grows: mirrors (a host array and its device twin
 * whose valid bytes the library tracks, so a sync moves only what changed),
 * batches (many small copies, few transfers), pipelines, several devices.
 *
 * The header in that order: the core first (status codes; back ends and
 * devices; allocation and the seed's four functions; streams and events),
 * then the extensions: device-side operations, statistics, tracing and
 * checks, mirrors, several devices (peer copies, multimirrors), batches and
 * pipelines, and last adopting memory and queues made elsewhere (interop).
 * Deprecated names sit beside their replacements.
 *
 * ---------------------------------------------------------------------------
 * Quick start: the seed's scenario
 * ---------------------------------------------------------------------------
 *
 *     mapping_device *dev;
 *     mapping_open(NULL, &dev);                    // best back end, or $MAPPING_BACKEND
 *
 *     float cpu_data[3] = {1.0f, 2.0f, 3.0f};
 *     mapping_buffer *gpu_tensor;
 *     mapping_allocate_gpu(dev, sizeof cpu_data, &gpu_tensor);
 *     mapping_sync_to_gpu(cpu_data, gpu_tensor);   // CPU -> GPU (HtoD)
 *
 *     // ... device work on gpu_tensor (your kernel, or mapping_copy_gpu) ...
 *
 *     float *cpu_result;
 *     mapping_allocate_cpu(dev, sizeof cpu_data, (void **)&cpu_result); // page-locked
 *     mapping_sync_to_cpu(gpu_tensor, cpu_result); // GPU -> CPU (DtoH)
 *     printf("%g %g %g\n", cpu_result[0], cpu_result[1], cpu_result[2]);
 *
 *     mapping_free_cpu(dev, cpu_result);
 *     mapping_free_gpu(gpu_tensor);
 *     mapping_close(dev);
 *
 * ---------------------------------------------------------------------------
 * Conventions
 * ---------------------------------------------------------------------------
 * - Fallible functions return mapping_status: MAPPING_OK (0) or a negative
 *   error. mapping_status_string() names it; mapping_last_error_message()
 *   says what exactly went wrong on this thread (which argument, which
 *   driver call and its raw code).
 * - Handles are opaque pointers. Every destroy/free function accepts NULL
 *   as a no-op. A void function that detects misuse (say, freeing a pointer
 *   it does not own) changes nothing, and records the error for
 *   mapping_last_error() on the calling thread.
 * - A handle that is not a live object of its kind (freed, destroyed twice,
 *   of another kind, misaligned, made up, or a mirror, batch or pipeline
 *   whose device was closed) is refused with MAPPING_ERR_INVALID_HANDLE
 *   without being read; getters return 0 / NULL / "" for it. (Destroying a
 *   mirror, batch or pipeline after its device was closed frees its own host
 *   memory and records that error.) A call that races with the destruction
 *   of the same handle on another thread stays undefined.
 * - A freed handle stays refused for the rest of the process, however many
 *   objects are made after it: the objects behind handles (devices,
 *   buffers, streams, events, mirrors, batches, pipelines, multimirrors)
 *   live at addresses the library never uses again (reserved address
 *   space; the memory itself is given back), so a stale pointer is never
 *   taken for a newer object. Only where the system refuses to reserve
 *   address space (a tight RLIMIT_AS; said once through the log) may an
 *   address come back.
 * - An operation that can run on a stream takes `mapping_stream *stream`
 *   first. stream == NULL means blocking: the call returns when the work is
 *   done. Non-NULL: the call returns once the work is queued; host memory the
 *   work reads or writes must stay valid (and, for a source, unchanged) until
 *   the stream has reached it. Work on one stream runs in order; work on two
 *   streams is unordered unless joined by mapping_stream_wait_event().
 * - Source comes before destination in every copy.
 * - Zero sizes are errors (MAPPING_ERR_ZERO_SIZE) everywhere: an empty copy
 *   or allocation is nearly always a bug in the caller's arithmetic.
 * - A refused call (bad arguments) touches nothing, and the source of any
 *   copy is never modified. A call that fails part-way changes only what its
 *   own documentation says: a batch flush keeps the copies it did
 *   (mapping_batch_flush), and a mirror sync may already have written
 *   correct source data into some of the target's stale bytes, which stay
 *   stale (mapping_mirror_sync_to_gpu). Bytes valid on the target, and
 *   bytes outside the call's ranges, are never written.
 *
 * Thread safety (per function below, summarised here):
 * - A device and everything made from it may be used from several threads at
 *   once: allocations, copies, streams, events. Two threads may enqueue on the
 *   same stream; the order between them is the order the calls were made.
 * - A mirror and a batch are not internally locked: one thread at a time per
 *   mirror (or per mirror family: a parent and its views) and per batch.
 * - mapping_open / mapping_close of different devices may run concurrently.
 * - fork(): a child has none of its parent's threads. On the host back end a
 *   stream made before the fork (and an event it had not reached) is refused
 *   in the child with MAPPING_ERR_INVALID_HANDLE, naming fork(); destroying
 *   it, or closing the device, returns at once. Make new streams there.
 */
#ifndef MAPPING_H
#define MAPPING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MAPPING_API
#else
#define MAPPING_API __attribute__((visibility("default")))
#endif
/* Deprecated names stay declared and exported (programs built against them
 * keep working); define MAPPING_WARN_DEPRECATED before including this header
 * to have the compiler warn at each use. */
#if defined(MAPPING_WARN_DEPRECATED) && (defined(__GNUC__) || defined(__clang__))
#define MAPPING_DEPRECATED(use) __attribute__((deprecated("use " use)))
#else
#define MAPPING_DEPRECATED(use)
#endif

#define MAPPING_VERSION_MAJOR 0
#define MAPPING_VERSION_MINOR 2
#define MAPPING_VERSION_PATCH 0
/* One number for compile-time checks: major * 10000 + minor * 100 + patch,
 * e.g. #if MAPPING_VERSION >= 100 (0.1.0). */
#define MAPPING_VERSION (MAPPING_VERSION_MAJOR * 10000 + MAPPING_VERSION_MINOR * 100 + MAPPING_VERSION_PATCH)
MAPPING_API const char *mapping_version(void); /* "0.2.0" */

/* ===========================================================================
 * Status codes
 * ======================================================================== */

/* One list generates the enum, the names and the messages. */
#define MAPPING_STATUS_LIST(X)                                                               \
    X(OK, 0, "success")                                                                      \
    X(ERR_NULL_ARGUMENT, -1, "a required pointer or handle argument is NULL")               \
    X(ERR_INVALID_ARGUMENT, -2, "an argument has a value outside its domain")               \
    X(ERR_ZERO_SIZE, -3, "a size is zero")                                                   \
    X(ERR_OUT_OF_RANGE, -4, "offset + bytes lies past the end of the object (or overflows)") \
    X(ERR_INVALID_HANDLE, -5, "the handle is not a live object of this library")            \
    X(ERR_DEVICE_MISMATCH, -6, "the objects belong to different devices")                    \
    X(ERR_NOT_OWNED, -7, "the host pointer was not returned by mapping_allocate_cpu on this device") \
    X(ERR_OUT_OF_HOST_MEMORY, -8, "out of host memory")                                      \
    X(ERR_OUT_OF_DEVICE_MEMORY, -9, "out of device memory")                                  \
    X(ERR_NO_BACKEND, -10, "the back end is unknown, not compiled in, or could not load")   \
    X(ERR_NO_DEVICE, -11, "no device with that index")                                      \
    X(ERR_UNSUPPORTED, -12, "the back end or device does not support this")                 \
    X(ERR_DRIVER, -13, "the driver reported an error")                                      \
    X(ERR_NOT_READY, -14, "the work has not completed yet")                                 \
    X(ERR_OVERLAP, -15, "source and destination ranges overlap in one buffer")              \
    X(ERR_CONFLICT, -16, "the range is modified on both sides")                             \
    X(ERR_FAULT_INJECTED, -17, "a fault injected for testing")                              \
    X(ERR_BUSY, -18, "the object is in use by queued work or by other objects")             \
    X(ERR_INTERNAL, -19, "internal error (a bug in mapping: please report it)")             \
    X(ERR_IO, -20, "a file could not be written (the message names the system's error)")

typedef enum mapping_status {
#define MAPPING_STATUS_ENUM_(name, value, message) MAPPING_##name = value,
    MAPPING_STATUS_LIST(MAPPING_STATUS_ENUM_)
#undef MAPPING_STATUS_ENUM_
} mapping_status;

/* Short fixed message for a status; never NULL ("unknown status" for others).
 * Thread-safe. */
MAPPING_API const char *mapping_status_string(mapping_status status);
/* The enumerator's name without prefix, e.g. "ERR_OUT_OF_RANGE"; never NULL. */
MAPPING_API const char *mapping_status_name(mapping_status status);

/* The status of the last call on this thread that failed, void functions
 * included, and a sentence saying exactly what failed (the argument and its
 * value, or the driver call with its raw error code and name). MAPPING_OK and
 * "" when nothing has failed since the last mapping_clear_last_error().
 * Thread-local: never NULL, valid until the next failing call on the thread. */
MAPPING_API mapping_status mapping_last_error(void);
MAPPING_API const char    *mapping_last_error_message(void);
MAPPING_API void           mapping_clear_last_error(void);

/* Optional log callback; the library is silent without one. level: 0 error,
 * 1 warning, 2 info. Process-wide; set it before opening devices. The
 * callback may call the library: the thread's last error is saved before
 * and restored after it, and failures inside it are not logged (the
 * callback is never re-entered on one thread). */
typedef void (*mapping_log_fn)(int level, const char *message, void *user);
MAPPING_API void mapping_set_log(mapping_log_fn fn, void *user);

/* ===========================================================================
 * Back ends and devices
 * ======================================================================== */

typedef struct mapping_device mapping_device;
typedef struct mapping_buffer mapping_buffer; /* device ("GPU") memory */
typedef struct mapping_stream mapping_stream;
typedef struct mapping_event  mapping_event;

/* Desc structs: zero always means default, so (mapping_device_desc){0} is
 * always valid and new fields never break callers (mapping_open passes the
 * desc's size: see mapping_open_sized). */
typedef struct mapping_device_desc {
    /* "host", "opencl", "cuda". NULL = $MAPPING_BACKEND if set, else the best
     * available: CUDA, then an OpenCL GPU or accelerator, then host (an
     * OpenCL CPU device such as PoCL is used only when asked for). */
    const char *backend;
    /* Index among that back end's devices; 0 = first. When desc is NULL,
     * $MAPPING_DEVICE applies. OpenCL indexes devices across all platforms. */
    int device;
    /* Host back end only: model a link (PCIe, say) so copies between host and
     * device memory take latency + bytes / bandwidth. 0 = no model, or
     * $MAPPING_HOST_LINK ("25e9,5e-6": bytes/s,seconds) when set. Checked
     * on every back end: finite, bandwidth 0 or 1e3..1e15 bytes/s, latency
     * 0..1 s (MAPPING_ERR_INVALID_ARGUMENT otherwise).
     * Environment variables are parsed strictly: every open (mapping_open,
     * mapping_open_opencl) checks every MAPPING_* variable that is set, for
     * any back end, and a value not accepted makes it fail with
     * MAPPING_ERR_INVALID_ARGUMENT naming the variable and the values it
     * accepts (docs/environment.md lists them all). For example
     * $MAPPING_DEVICE decimal digits; $MAPPING_HOST_LINK "BANDWIDTH[,LATENCY]"
     * as plain numbers (no units: "25GB/s" is refused), in the ranges above;
     * $MAPPING_HOST_POISON "0" or "1"; $MAPPING_CUDA_SCATTER auto, batch,
     * kernel or copies; $MAPPING_COPY_THREADS decimal digits, 0 to 64 (the
     * helper threads that share the memcpy of a large copy of pageable memory
     * through page-locked staging on a GPU; default half the online CPUs
     * less one, at most 5; docs/cuda.md). An empty variable counts as unset. */
    double link_bandwidth; /* bytes per second */
    double link_latency;   /* seconds per transfer */
    /* Device memory budget in bytes (0.2.0): the device sides of mirrors and
     * multimirrors, a diff mirror's shadow, and the buffers the program
     * allocates (mapping_allocate_gpu) count against it; when an allocation
     * or a mirror sync would exceed it, the device sides of other mirrors
     * are evicted, least recently used first (docs/mirrors.md, "Larger than
     * the device"). 0 = no budget, or $MAPPING_MEMORY_BUDGET when set
     * (decimal digits, bytes, 0 to 2^60: 0 is no budget). Change it later
     * with mapping_device_set_memory_budget. */
    uint64_t memory_budget;
} mapping_device_desc;

/* Capability bits (mapping_device_info.caps).
 *
 * One list generates the enum (MAPPING_CAP_<name> = 1u << bit) and the names
 * that `mapping info` prints (mapping_capability_name()). Each entry is
 * X(name, bit, label): the enumerator's name without the MAPPING_CAP_ prefix,
 * its bit number, and a lower-case hyphenated label. To list a device's
 * capabilities:
 *
 *     #define PRINT_CAP(name, bit, label) \
 *         if (info.caps & MAPPING_CAP_##name) printf("%s\n", label);
 *     MAPPING_CAP_LIST(PRINT_CAP)
 */
#define MAPPING_CAP_LIST(X)                                                                              \
    X(PINNED_HOST, 0, "pinned-host")               /* mapping_allocate_cpu returns page-locked memory */ \
    X(ASYNC_COPY, 1, "async-copy")                 /* copies on streams overlap with the caller */       \
    X(UNIFIED, 2, "unified")                       /* one allocation usable by CPU and device (managed / \
                                                      SVM / host) */                                     \
    X(CONCURRENT_UNIFIED, 3, "concurrent-unified") /* CPU and device may touch unified memory            \
                                                      concurrently */                                    \
    X(BATCH_COPY, 4, "batch-copy")                 /* the driver moves a list of copies in one call */   \
    X(HOST_REGISTER, 5, "host-register")           /* user memory can be page-locked in place */         \
    X(TIMING, 6, "timing")                         /* events measure elapsed time on the device */       \
    X(DEVICE_KERNELS, 7, "device-kernels")         /* the library can run its own kernels (scatter /     \
                                                      gather) */                                         \
    X(LINK_MODEL, 8, "link-model")                 /* a modelled link is active (host back end) */       \
    X(CPU_MEMORY, 9, "cpu-memory")                 /* device memory is the CPU's own memory (host back   \
                                                      end, OpenCL CPU devices): every copy is a memcpy */

typedef enum mapping_capability {
#define MAPPING_CAP_ENUM_(name, bit, label) MAPPING_CAP_##name = 1u << (bit),
    MAPPING_CAP_LIST(MAPPING_CAP_ENUM_)
#undef MAPPING_CAP_ENUM_
} mapping_capability;

/* The label of one capability bit, e.g. "pinned-host" for
 * MAPPING_CAP_PINNED_HOST; NULL for anything else (0, several bits, a bit not
 * in MAPPING_CAP_LIST). Thread-safe. */
MAPPING_API const char *mapping_capability_name(mapping_capability cap);

typedef struct mapping_device_info {
    char     backend[16];   /* "host", "opencl", "cuda" */
    int      index;         /* index within the back end */
    char     kind[16];      /* "gpu", "cpu", "accelerator" (OpenCL CPU devices say "cpu"), "host" */
    char     name[128];     /* device name as the driver reports it */
    char     vendor[64];
    char     driver[128];   /* driver / platform version */
    uint64_t memory_bytes;  /* device memory; for host, physical RAM */
    unsigned caps;          /* MAPPING_CAP_* bits */
} mapping_device_info;

typedef struct mapping_backend_info {
    char name[16];      /* "host", "opencl", "cuda" */
    int  compiled;      /* 1 if built into this library */
    int  available;     /* 1 if its driver loaded and it has at least one device */
    int  device_count;
    char reason[256];   /* why it is unavailable ("" when available) */
} mapping_backend_info;

/* Lists back ends in a fixed order (host, opencl, cuda). Writes at most `max`
 * entries into out (out may be NULL when max is 0) and the total into *count.
 * Loads drivers on first use (once per process). Thread-safe. */
MAPPING_API mapping_status mapping_list_backends(mapping_backend_info *out, int max, int *count);
/* Lists the devices of one back end, like mapping_list_backends. */
MAPPING_API mapping_status mapping_list_devices(const char *backend, mapping_device_info *out,
                                                int max, int *count);

/* Opens a device. desc NULL = all defaults with $MAPPING_BACKEND and
 * $MAPPING_DEVICE applied. Each call returns a new, independent device
 * object (opening the same index twice gives two objects whose buffers must
 * not be mixed). Thread-safe. */
MAPPING_API mapping_status mapping_open(const mapping_device_desc *desc, mapping_device **out);
/* ABI: mapping_device_desc grows (fields are appended, never inserted,
 * reordered or removed) while the soname stays libmapping.so.0, so the
 * library is told how large the caller's desc is: mapping_open is a macro
 * (as mapping_device_stats is) that passes sizeof(mapping_device_desc) of
 * the header the caller was compiled with to mapping_open_sized, which
 * reads exactly desc_size bytes of *desc and takes the fields past them as
 * 0 (their defaults). The exported function mapping_open itself (a program
 * built before the macro, or a call written (mapping_open)(desc, out))
 * reads the 0.1.0 layout only: backend, device, link_bandwidth,
 * link_latency (32 bytes on LP64). desc_size must be at least that 0.1.0
 * size and at most 4096 (MAPPING_ERR_INVALID_ARGUMENT); ignored when desc
 * is NULL. Bytes of a desc longer than this library knows must be 0 (a
 * newer header's fields this library cannot honour): else
 * MAPPING_ERR_UNSUPPORTED, naming the first such byte. */
MAPPING_API mapping_status mapping_open_sized(const mapping_device_desc *desc, mapping_device **out, size_t desc_size);
/* Variadic, so that a compound literal with several fields passes as one
 * argument: mapping_open(&(mapping_device_desc){.backend = "host", .device = 1}, &dev). */
#define mapping_open(...) mapping_open_sized(__VA_ARGS__, sizeof(mapping_device_desc))
/* Waits for all of the device's streams, and for the work queued on other
 * devices' streams that reads this device's memory (a mapping_copy_peer from
 * one of its buffers, a multimirror sync that copies from its replica), so
 * that no queued copy reads freed memory; then frees what is still
 * allocated on it (streams, events, buffers, page-locked host memory;
 * reported as leaks through the log callback), and closes it. Handles of
 * those objects are invalid afterwards. Mirrors, batches and pipelines are
 * not freed: destroy them first. Called from a host function (host and
 * OpenCL back ends) running on one of the device's streams, or on another
 * device's stream with such a copy not known to have completed (it may be
 * queued after the function), it would wait for itself: it changes nothing
 * and records MAPPING_ERR_BUSY. The same while a pipeline of the device is
 * running (mapping_pipeline_run, its step included).
 * NULL: no-op. Must not race with other calls on the device. */
MAPPING_API void           mapping_close(mapping_device *dev);
MAPPING_API const char    *mapping_backend_name(const mapping_device *dev); /* "host", ...; "" for NULL */
MAPPING_API mapping_status mapping_device_get_info(const mapping_device *dev, mapping_device_info *out);

/* The link between host and device memory as the library sees it: the
 * per-transfer cost and the bandwidth used to decide when merging two ranges
 * into one copy beats two copies, and to size pipeline chunks. Measured on
 * the device the first time it is asked for (a few milliseconds), unless set.
 * mapping_device_set_link with 0 fields re-measures them on next use; other
 * values must be finite, bandwidth 1e3..1e15 bytes/s, latency 0..1 s
 * (MAPPING_ERR_INVALID_ARGUMENT). */
typedef struct mapping_link {
    double latency;   /* seconds per blocking transfer */
    double bandwidth; /* bytes per second, host to device, page-locked */
} mapping_link;
MAPPING_API mapping_status mapping_device_link(mapping_device *dev, mapping_link *out);
MAPPING_API mapping_status mapping_device_set_link(mapping_device *dev, const mapping_link *link);

/* The device memory budget (see mapping_device_desc.memory_budget and
 * docs/mirrors.md, "Larger than the device"). What counts against it, in
 * "resident" bytes: the device side of every mirror that is resident (not
 * evicted), a diff mirror's shadow and flags, every multimirror replica,
 * and every buffer from mapping_allocate_gpu. Not counted: the library's
 * own working memory (batch staging, pipeline chunk buffers, the link
 * probe), imported buffers and unified memory. Without a budget (0, the
 * default) nothing is ever evicted; resident bytes are still counted.
 *
 * mapping_device_set_memory_budget sets it (0: none). A budget below what
 * is resident evicts what it can now, least recently used first, and
 * succeeds: later allocations fail until enough is freed. bytes above 2^60 is MAPPING_ERR_INVALID_ARGUMENT.
 * mapping_device_memory_budget gives the budget and the resident bytes
 * (either pointer may be NULL). Thread-safe. */
MAPPING_API mapping_status mapping_device_set_memory_budget(mapping_device *dev, uint64_t bytes);
MAPPING_API mapping_status mapping_device_memory_budget(const mapping_device *dev, uint64_t *budget,
                                                        uint64_t *resident);

/* Native handles, so users run their own kernels on the library's objects.
 *   OpenCL: context = cl_context, device = cl_device_id, platform = cl_platform_id,
 *           queue = the device's internal blocking cl_command_queue
 *   CUDA:   context = CUcontext, device = (CUdevice)(intptr_t)device, platform = NULL,
 *           queue = NULL (the legacy default stream)
 *   host:   all NULL */
typedef struct mapping_native_device {
    void *context;
    void *device;
    void *platform;
    void *queue;
} mapping_native_device;
MAPPING_API mapping_status mapping_device_native(const mapping_device *dev, mapping_native_device *out);
/* OpenCL: a cl_mem; CUDA: the CUdeviceptr, as (void *)(uintptr_t)ptr; host: the
 * address of the buffer's memory. Valid until the buffer is freed. */
MAPPING_API mapping_status mapping_buffer_native(const mapping_buffer *buf, void **out);
/* OpenCL: a cl_command_queue (in order); CUDA: a CUstream; host: NULL with
 * MAPPING_OK (work on the host back end is submitted with mapping_launch_host). */
MAPPING_API mapping_status mapping_stream_native(const mapping_stream *stream, void **out);
/* Deprecated synonyms of the three above, in the old word order (every other
 * getter, and Python's Device.native, Buffer.native, Stream.native, name the
 * object first); errors name the function called. */
MAPPING_API MAPPING_DEPRECATED("mapping_device_native") mapping_status
mapping_native_device_handles(const mapping_device *dev, mapping_native_device *out);
MAPPING_API MAPPING_DEPRECATED("mapping_buffer_native") mapping_status
mapping_native_buffer(const mapping_buffer *buf, void **out);
MAPPING_API MAPPING_DEPRECATED("mapping_stream_native") mapping_status
mapping_native_stream(const mapping_stream *stream, void **out);

/* ===========================================================================
 * The seed's four functions: allocate, sync to the GPU, sync to the CPU
 * ======================================================================== */

/* Allocates `bytes` of device memory. Its content is undefined (in test
 * builds of the host back end it is filled with a poison pattern, 0xCD, so a
 * missing sync shows up as wrong data). Thread-safe. */
MAPPING_API mapping_status mapping_allocate_gpu(mapping_device *dev, size_t bytes, mapping_buffer **out);
/* Frees device memory. The caller must have waited for work that uses it.
 * NULL: no-op. A buffer a library object owns and hands out (a mirror's or
 * multimirror's GPU side, a pipeline's chunk buffers) is refused: nothing
 * freed, MAPPING_ERR_NOT_OWNED recorded (destroy its owner instead). */
MAPPING_API void           mapping_free_gpu(mapping_buffer *buf);
/* Size in bytes; 0 for NULL. O(1). */
MAPPING_API size_t         mapping_buffer_size(const mapping_buffer *buf);
MAPPING_API mapping_device *mapping_buffer_device(const mapping_buffer *buf);

/* Allocates `bytes` of host memory for fast transfers: page-locked where the
 * back end can (CUDA: cuMemHostAlloc; OpenCL: a mapped CL_MEM_ALLOC_HOST_PTR
 * buffer; host: mlock where allowed), always page-aligned. Copies to and from
 * it take the fastest path. Thread-safe. */
MAPPING_API mapping_status mapping_allocate_cpu(mapping_device *dev, size_t bytes, void **out);
/* Frees memory from mapping_allocate_cpu on the same device. NULL: no-op. Any
 * other pointer (a mirror's or multimirror's CPU side included) is refused
 * (nothing freed, MAPPING_ERR_NOT_OWNED recorded for mapping_last_error()). */
MAPPING_API void           mapping_free_cpu(mapping_device *dev, void *cpu_ptr);

/* Copies of pageable host memory (malloc, numpy) go through page-locked
 * staging: two CPU copies, slower than the link on a GPU. Memory page-locked
 * elsewhere (torch.Tensor.pin_memory, cudaHostAlloc, cudaHostRegister by
 * another library) is recognised on CUDA and copied directly.
 * mapping_device_set_host_registration (opt-in; off by default) page-locks
 * pageable memory in place instead: a copy of at least min_bytes registers
 * its host range (CUDA: cuMemHostRegister, in chunks of at most 64 MiB cut on
 * 2 MiB boundaries, on up to 8 threads, halved where the driver refuses a
 * size) and keeps the registration, so it and later copies of the same
 * memory are DMAs; registrations beyond cache_bytes are dropped least
 * recently used first. What cannot be registered (read-only memory, a
 * locked-memory limit) is staged as before. While the cache holds a range,
 * it must stay mapped: call mapping_host_registration_forget(dev, ptr,
 * bytes) before freeing (munmap, free of a large block) memory that was
 * copied, or turn registration off (0, 0), or close the device. min_bytes
 * at least a page and cache_bytes >= min_bytes, or both 0 (off: everything
 * is unregistered); MAPPING_ERR_UNSUPPORTED where the back end cannot
 * page-lock in place (OpenCL). Thread-safe. */
MAPPING_API mapping_status mapping_device_set_host_registration(mapping_device *dev, size_t min_bytes,
                                                                size_t cache_bytes);
/* Unregisters what the cache holds of [ptr, +bytes) (whole pages); waits for
 * nothing: the caller has waited for the copies of that memory. */
MAPPING_API mapping_status mapping_host_registration_forget(mapping_device *dev, const void *ptr, size_t bytes);

/* Whole buffer (mapping_buffer_size(gpu) bytes), blocking. Thread-safe. */
MAPPING_API mapping_status mapping_sync_to_gpu(const void *cpu_src, mapping_buffer *gpu_dst);
MAPPING_API mapping_status mapping_sync_to_cpu(const mapping_buffer *gpu_src, void *cpu_dst);

/* Any range; stream NULL = blocking. gpu_offset + bytes must lie within the
 * buffer. Thread-safe. */
MAPPING_API mapping_status mapping_sync_to_gpu_range(mapping_stream *stream, const void *cpu_src,
                                                     mapping_buffer *gpu_dst, size_t gpu_offset,
                                                     size_t bytes);
MAPPING_API mapping_status mapping_sync_to_cpu_range(mapping_stream *stream, const mapping_buffer *gpu_src,
                                                     size_t gpu_offset, void *cpu_dst, size_t bytes);

/* ===========================================================================
 * Streams and events
 * ======================================================================== */

/* An in-order queue of work (CUDA stream, OpenCL in-order command queue, a
 * worker thread on the host back end). Thread-safe. */
MAPPING_API mapping_status mapping_stream_create(mapping_device *dev, mapping_stream **out);
/* Waits for the stream's queued work, then destroys it. NULL: no-op. A
 * pipeline's stream (given to its step) is refused: nothing destroyed,
 * MAPPING_ERR_NOT_OWNED recorded. */
MAPPING_API void           mapping_stream_destroy(mapping_stream *stream);
/* Waits until all queued work is done. Returns the first error of that work
 * (and forgets it), MAPPING_OK otherwise. Thread-safe. */
MAPPING_API mapping_status mapping_stream_synchronize(mapping_stream *stream);
/* Queues fn(user) to run on a library thread once earlier work on the stream
 * is done; later work waits for it to return. fn must not wait for work on
 * the same stream. Portable code does not call the library from fn at all:
 * CUDA runs fn as a driver host function (cuLaunchHostFunc), in which driver
 * calls are forbidden (host and OpenCL run fn on a thread of their own,
 * where calls on other streams are fine). On host and OpenCL, fn calling
 * mapping_stream_synchronize or mapping_stream_destroy on its own stream,
 * mapping_event_synchronize on an event recorded there after fn, a mirror
 * call that would wait for a copy of that mirror queued there after fn, or
 * mapping_close on its device, gets MAPPING_ERR_BUSY instead of waiting
 * for itself (mapping_mirror_destroy, which cannot fail, waits: do not
 * destroy such a mirror from fn). stream NULL: runs fn now, on this thread. */
MAPPING_API mapping_status mapping_launch_host(mapping_stream *stream, void (*fn)(void *user), void *user);

/* Creates an event that completes when the stream reaches this point, and
 * takes a timestamp there. Destroy it with mapping_event_destroy. */
MAPPING_API mapping_status mapping_event_record(mapping_stream *stream, mapping_event **out);
/* Later work on `stream` waits until `event` has completed (the event may
 * belong to another stream of the same device). Does not block the caller. */
MAPPING_API mapping_status mapping_stream_wait_event(mapping_stream *stream, mapping_event *event);
/* Blocks until the event has completed. MAPPING_ERR_BUSY, without waiting,
 * from a host function running on the event's own stream when the event is
 * not complete (recorded after the function: it would wait for itself). */
MAPPING_API mapping_status mapping_event_synchronize(mapping_event *event);
/* MAPPING_OK if the event has completed, MAPPING_ERR_NOT_READY if not. */
MAPPING_API mapping_status mapping_event_query(const mapping_event *event);
/* Seconds between two completed events of the same device
 * (MAPPING_ERR_NOT_READY if either has not completed). */
MAPPING_API mapping_status mapping_event_elapsed(const mapping_event *start, const mapping_event *end,
                                                 double *seconds);
MAPPING_API void           mapping_event_destroy(mapping_event *event); /* NULL: no-op */
/* *capturing = 1 if `stream` is being captured into a CUDA graph (work
 * queued on it becomes graph nodes, run at each replay), else 0; always 0
 * on back ends without graphs. Asks the driver; invalidates nothing (a
 * capture whose invalidation is pending counts as capturing).
 * MAPPING_ERR_NULL_ARGUMENT for a NULL stream or out. Thread-safe. */
MAPPING_API mapping_status mapping_stream_capturing(mapping_stream *stream, int *capturing);

/* Stream capture (CUDA graphs: cuStreamBeginCapture, torch.cuda.graph). Work
 * queued on a stream being captured does not run: it becomes graph nodes,
 * run at each replay. Every call that takes or uses a stream asks the driver
 * first and either records correct nodes or fails with
 * MAPPING_ERR_UNSUPPORTED naming the call and the capture, before anything
 * is queued: the capture is never invalidated behind the caller's back, and
 * no graph replays the bytes of capture time. On a capturing stream:
 * - recorded: mapping_sync_to_gpu_range / mapping_sync_to_cpu_range from or
 *   into page-locked memory (mapping_allocate_cpu, a MAPPING_MIRROR_PIN
 *   mirror's, memory CUDA or torch pinned) as copy nodes that read or write
 *   it at each replay; mapping_copy_gpu, mapping_fill_gpu,
 *   mapping_launch_host (a host node; refused under MAPPING_CHECK=races),
 *   mapping_event_record (the event marks a point of the graph: it can be
 *   waited for by streams of the same capture only, and never synchronized,
 *   queried or timed: UNSUPPORTED), mapping_stream_wait_event on an event of
 *   the same capture;
 * - refused: copies of pageable memory (they would be staged now),
 *   mapping_stream_synchronize, mapping_stream_destroy (nothing destroyed),
 *   mapping_stream_wait_event on an event outside the capture,
 *   mapping_copy_peer, mapping_batch_flush (packs host memory now),
 *   multimirror syncs and mirror access intents (their bookkeeping would
 *   happen once, at capture), mapping_device_wait_native;
 * - mirror syncs (mapping_mirror_sync_to_gpu / _to_cpu) are recorded as
 *   graph syncs: each replay moves what is stale then
 *   (mapping_mirror_sync_in_graph, below the mirror calls).
 * A blocking call (stream NULL) runs now on the device's native queue (the
 * legacy stream): it is refused while a stream that synchronizes with that
 * queue (created without CU_STREAM_NON_BLOCKING) is being captured, and
 * runs as usual beside captures of non-blocking streams, in any capture
 * mode (the library makes its driver calls in the relaxed mode). An
 * invalidated capture is refused until it ends. Back ends without graphs
 * never refuse. docs/cuda.md lists every call. */

/* ===========================================================================
 * Device-side operations
 * ======================================================================== */

/* Device-to-device copy. Within one buffer the ranges must not overlap
 * (MAPPING_ERR_OVERLAP). Thread-safe. */
MAPPING_API mapping_status mapping_copy_gpu(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                            mapping_buffer *dst, size_t dst_offset, size_t bytes);
/* Sets `bytes` bytes at `offset` to `value`. Thread-safe. */
MAPPING_API mapping_status mapping_fill_gpu(mapping_stream *stream, mapping_buffer *dst, size_t offset,
                                            size_t bytes, unsigned char value);

/* ===========================================================================
 * Statistics
 * ======================================================================== */

/* Counters of everything the device moved since it was opened (or reset).
 * Read with relaxed atomics: exact once the device is idle.
 *
 * One list generates the struct's fields (each a uint64_t, in list order),
 * the library's internal counters and the keys of mapping_device_stats_json
 * (the field names). Each entry is X(field). To print every counter:
 *
 *     #define PRINT_STAT(field) printf(#field " %llu\n", (unsigned long long)s.field);
 *     MAPPING_STATS_LIST(PRINT_STAT)
 *
 * Two kinds of "bytes moved":
 * - h2d_bytes / d2h_bytes: what the library handed the driver, every
 *   transfer: a batch's packed staging with its scatter table, gaps a sync
 *   merged rather than pay another transfer, a device-side diff's flags.
 * - h2d_payload_bytes / d2h_payload_bytes: what the caller's operations
 *   asked for and got, counted when the call succeeds: a plain copy's size
 *   (mapping_sync_to_gpu/_cpu and their _range forms), the copies of a
 *   flushed batch, and the stale bytes a mirror sync made valid (those a
 *   device-side diff found unchanged included). A multimirror's syncs, peer
 *   copies and a failed call's partial work are not payload.
 * So for plain copies the two agree; h2d_bytes - h2d_payload_bytes is what
 * packing and merging cost in transfer volume.
 */
#define MAPPING_STATS_LIST(X)                                                                       \
    X(h2d_bytes) X(h2d_copies)             /* host to device (driver transfers) */                  \
    X(d2h_bytes) X(d2h_copies)             /* device to host */                                     \
    X(d2d_bytes) X(d2d_copies)             /* device to device */                                   \
    X(fill_bytes) X(fills)                                                                          \
    X(sync_skipped_bytes)                  /* bytes a mirror sync did not move: already valid */    \
    X(conflicts)                           /* marks refused as conflicts */                         \
    X(batch_flushes)                       /* mapping_batch_flush calls that moved data */          \
    X(batch_copies)                        /* copies queued in batches */                           \
    X(peer_bytes) X(peer_copies)           /* copies from another device into this one               \
                                              (mapping_copy_peer), counted on the destination */    \
    X(blocking_ns)                         /* nanoseconds spent in blocking host<->device transfers \
                                              of 64 KiB or more (smaller ones are not timed:        \
                                              reading the clock would cost more than they do) */    \
    X(h2d_payload_bytes)                   /* bytes delivered to the device as asked (below) */     \
    X(d2h_payload_bytes)                   /* bytes delivered to the host as asked */               \
    X(tracked_pages)                       /* pages write tracking found written (or opened ahead   \
                                              of a stream) at syncs of tracked mirrors */           \
    X(tracking_walks)                      /* such syncs that walked a whole mirror's page table    \
                                              (uffd, when the fault log could not name the pages) */ \
    X(graph_sync_runs)                     /* mirror syncs run by replays of CUDA graphs            \
                                              (mapping_mirror_sync_in_graph) */                     \
    X(graph_sync_overflows)                /* of those, runs whose stale ranges did not fit the     \
                                              table even joined: the rest stayed stale */           \
    X(evictions)                           /* device sides of mirrors evicted (memory budget, or     \
                                              mapping_mirror_evict), multimirror replicas included */ \
    X(evict_writeback_bytes)               /* bytes evictions wrote back to the CPU first: exactly   \
                                              the bytes stale there (the device's modifications) */  \
    X(evict_reupload_bytes)                /* bytes uploaded again into a device side because an     \
                                              eviction had dropped them (valid there before it, not  \
                                              changed on the CPU since) */                           \
    X(peak_resident_bytes)                 /* the most bytes resident at once (see                   \
                                              mapping_device_memory_budget); a reset starts it again \
                                              from the bytes resident then */

typedef struct mapping_stats {
#define MAPPING_STATS_FIELD_(field) uint64_t field;
    MAPPING_STATS_LIST(MAPPING_STATS_FIELD_)
#undef MAPPING_STATS_FIELD_
} mapping_stats;

/* ABI: mapping_stats grows (new counters are appended to MAPPING_STATS_LIST,
 * never inserted, reordered or removed; every field is a uint64_t) while the
 * library's soname stays libmapping.so.0. So the library is told how large
 * the caller's struct is: mapping_device_stats is a macro (like zlib's
 * deflateInit) that passes sizeof(mapping_stats) of the header the caller
 * was compiled with to mapping_device_stats_sized, which writes exactly
 * out_size bytes: the fields that size holds (a program built against an
 * older, shorter struct is never written past its end), then zeros for
 * fields this library does not know (a program built against a newer
 * header and run with an older library reads 0 there). out_size must be a
 * non-zero multiple of 8 (MAPPING_ERR_INVALID_ARGUMENT). The exported
 * function mapping_device_stats itself (a program built before the macro,
 * or a call written (mapping_device_stats)(dev, out)) writes the 15 fields
 * of the 0.1.0 layout, h2d_bytes to blocking_ns (120 bytes), never more.
 * Thread-safe. */
MAPPING_API mapping_status mapping_device_stats_sized(const mapping_device *dev, mapping_stats *out, size_t out_size);
MAPPING_API mapping_status mapping_device_stats(const mapping_device *dev, mapping_stats *out);
#define mapping_device_stats(dev, out) mapping_device_stats_sized((dev), (out), sizeof(mapping_stats))
MAPPING_API void           mapping_device_stats_reset(mapping_device *dev);
/* Writes the statistics as one JSON object into buf (NUL-terminated, cut to
 * size) and the length it needs (without the NUL) into *needed (may be NULL).
 * Keys: "backend" and "device" (strings, escaped as JSON requires), then one
 * per MAPPING_STATS_LIST field, in list order, named as the field. */
MAPPING_API mapping_status mapping_device_stats_json(const mapping_device *dev, char *buf, size_t size,
                                                     size_t *needed);

/* ===========================================================================
 * Tracing
 * ======================================================================== */

/* A timeline of what the library did, as Chrome Trace Event JSON: open the
 * file in Perfetto (ui.perfetto.dev) or chrome://tracing. Each device is a
 * process, with one track for its blocking calls and one per stream. The
 * trace holds every driver transfer ("write" = host to device, "read",
 * "copy", "fill", "scatter", "gather": with bytes, direction, buffer), host
 * functions queued on streams, every mirror sync (ranges stale, merged and
 * moved; bytes moved and skipped), every batch flush (its plan; the pack,
 * transfer and scatter steps appear inside it) and every pipeline chunk.
 * An event on a stream spans the time to queue the work, not the device's
 * time. Instant events "statistics reset" and "device closed" carry the
 * device's transfer counters, so a trace can be checked against them.
 *
 * Also without code: MAPPING_TRACE=out.json ./app traces from the first
 * mapping_open and writes the file at exit (mapping_open fails with
 * MAPPING_ERR_INVALID_ARGUMENT, naming the variable, when the file cannot be
 * created; it is ignored, with a level-1 log line, when the program already
 * records a trace of its own then).
 *
 * Cost: off (the default), one predicted branch per operation; on, well under
 * a microsecond per event on the host back end, and 224 bytes of memory per
 * event until the trace is written. Memory is bounded: at most
 * $MAPPING_TRACE_MAX_EVENTS events are kept (default 1000000; 0: no limit;
 * read at each start, another value than decimal digits up to 10^12 makes
 * the start fail with MAPPING_ERR_INVALID_ARGUMENT). Once full, each new
 * event replaces the oldest; the file's "otherData" counts them
 * ("dropped_events"), an instant "trace events dropped" marks the gap, and
 * the log hears it at level 1. Process-wide and thread-safe. */

/* Starts recording; the trace is written to `path` by mapping_trace_stop or
 * at exit. Whether a file can be created there is checked now
 * (MAPPING_ERR_INVALID_ARGUMENT when it cannot); MAPPING_ERR_BUSY while a
 * trace is being recorded (decided under one lock: of two threads starting
 * at once, exactly one records). */
MAPPING_API mapping_status mapping_trace_start(const char *path);
/* Stops recording and writes the file: to a temporary file beside it
 * (created exclusively), renamed over it, so a failed write leaves what was
 * there; a link is followed (its file replaced, or created when the link
 * dangles). A path that is not a regular file (a FIFO: its reader must run
 * at start) or that reaches its file through /proc (/dev/stdout) is written
 * in place, through a descriptor opened by mapping_trace_start (a copy of
 * the process's own descriptor for /dev/stdout, /dev/fd/N: the trace follows
 * what the program wrote there, stdout flushed first; one open for reading
 * only, /dev/stdin, is refused). A forked child never writes its parent's
 * recording.
 * MAPPING_ERR_IO,
 * with a message naming errno, when it cannot be written (a full disk).
 * MAPPING_OK when no trace was being recorded (nothing written). */
MAPPING_API mapping_status mapping_trace_stop(void);
/* 1 while a trace is being recorded, else 0. */
MAPPING_API int            mapping_trace_active(void);

/* Two more ways to see what the library did (docs/observability.md):
 * - The log callback (mapping_set_log) hears, at level 2 (info), one line per
 *   mirror sync (ranges stale, merged, copied; bytes moved and skipped) and
 *   per batch flush (its plan: groups packed and straight through, per
 *   direction, and the staging size). Nothing is formatted without a callback.
 * - MAPPING_CHECK=unmarked (read once, at the first mirror sync) makes every
 *   sync to the GPU check that the host bytes outside the marked ranges have
 *   not changed since the last sync: a change fails the sync with
 *   MAPPING_ERR_CONFLICT, naming the 4 KiB pages ("pages 5 to 6 (bytes 20480
 *   to 28672 ...)"), and nothing is copied. Pages that hold marked bytes are
 *   not checked. Cost: 9 bytes per 4 KiB page, and a hash per page to
 *   judge: where the process tracks writes with userfaultfd
 *   (mapping_write_tracking() is MAPPING_TRACK_UFFD) only the pages written
 *   since their last hash are judged (the CPU side is watched: a fault per
 *   first write to a page), elsewhere every page of the synced view (a few
 *   GB/s): for debugging. Writes the kernel makes (read(2)) count as
 *   changes either way. Another value of MAPPING_CHECK
 *   fails mapping_open (set only after the open: every sync to the GPU)
 *   with MAPPING_ERR_INVALID_ARGUMENT.
 *   Checks combine with commas: MAPPING_CHECK=unmarked,races.
 * - MAPPING_CHECK=races (read once, at the first async copy) protects the
 *   host memory of every asynchronous copy (a non-NULL stream): the source
 *   of a host-to-device copy is read-only until the copy has completed; the
 *   destination of a device-to-host copy is inaccessible until the copy
 *   starts (then writable: a driver may write it with CPU stores). The first
 *   CPU access that races one stops the program (abort(), like a
 *   sanitizer) after writing to stderr the address, read or write, the copy
 *   (direction, host range) and the stream. Only the whole pages inside a
 *   copy's range are protected: the first and last partial page are not
 *   checked. Not reported: host functions queued on the copy's own stream
 *   (ordered with it), the library's worker threads, a copy whose range an
 *   earlier, still queued copy uses (it is ordered after that one), pages of
 *   mirrors tracked with mprotect. It installs a SIGSEGV handler that
 *   chains to the one installed before. Off, the cost is one predicted
 *   branch per async copy; on, a few mprotect calls and a host function per
 *   copy: for debugging. mapping_device_set_checks turns it on for one
 *   device from code. */

/* Debug checks of one device, as $MAPPING_CHECK gives them to the whole
 * process: checks is 0 (off: the environment still applies) or
 * MAPPING_DEVICE_CHECK_RACES (MAPPING_CHECK=races above, for the
 * asynchronous copies queued on this device's streams after the call).
 * MAPPING_ERR_INVALID_ARGUMENT for an unknown bit (nothing changes).
 * mapping_device_checks gives the bits set (0 for an invalid device).
 * Thread-safe. */
enum { MAPPING_DEVICE_CHECK_RACES = 1u << 0 };
MAPPING_API mapping_status mapping_device_set_checks(mapping_device *dev, unsigned checks);
MAPPING_API unsigned       mapping_device_checks(mapping_device *dev);

/* ==== Mirrors (src/coherence/) ==== */

/*
 * A mirror is a host array and its device twin whose validity the library
 * tracks per byte range, so that a sync moves only what is stale.
 *
 * Memory model. Every byte of a mirror is, on each side (MAPPING_CPU,
 * MAPPING_GPU), valid or stale; a byte is never stale on both sides.
 * - create/wrap: the CPU side is valid (its content is the initial content,
 *   not a modification), the GPU side is stale.
 * - mark_X_modified(range): "I wrote X in this range". X becomes valid there,
 *   the other side Y stale, and the range counts as modified on X until a sync
 *   copies it to Y.
 * - Conflict: marking X where Y holds marked, not yet synced modifications
 *   fails with MAPPING_ERR_CONFLICT, changes nothing, and counts in
 *   mapping_stats.conflicts. (The GPU side's initial staleness is not a
 *   modification: an output buffer may be written on the GPU first.)
 * - sync_to_X copies exactly the stale ranges of X from Y. Two stale ranges
 *   separated by a gap are copied as one when gap / link.bandwidth <
 *   link.latency (mapping_device_link) and the gap is valid on the source.
 *   From 16 ranges on (a mirror that is not unified), when the back end
 *   scatters and gathers on the device (host, OpenCL and CUDA all do) or
 *   the link's transfers cost at least 1 us each, they are packed into one
 *   batch instead, where only gaps under 64 bytes are worth copying.
 *   A clean mirror syncs in O(log n) with no transfer. Bytes a sync did not
 *   move count in mapping_stats.sync_skipped_bytes.
 * - Async: with a stream, a range becomes valid on X when its copy completes,
 *   not when it is queued. Any later call touching that range orders itself
 *   after it: a call with another stream chains on it (no host wait); a
 *   blocking call, a mark, and mapping_mirror_stale_bytes wait for it.
 *   As everywhere, host memory a queued copy reads or writes must not be
 *   touched by the caller until the stream reaches it (acquire_cpu does this
 *   for you). A copy refused when it is queued leaves its ranges stale. A
 *   queued copy that fails later (mapping_stream_synchronize reports it)
 *   cannot be told apart from one that succeeded, so its ranges count as
 *   valid: after such an error, mark the source side modified over the
 *   mirror again so the next sync recopies it.
 * - Views share their parent's state: marking or syncing a view changes
 *   exactly its bytes of the family, siblings and the rest are untouched.
 *
 *            offset 0                                          size
 *     CPU    [ valid      | stale (GPU modified) | valid           ]
 *     GPU    [ stale      | valid                | valid           ]
 *             sync_to_gpu copies the first range; sync_to_cpu the second.
 *
 * Lifetimes. A mirror family (a root and its views, views of views) shares
 * one state, reference-counted: each handle keeps it alive. Destroying the
 * root while views live is allowed: the root handle is gone, the views keep
 * working, and the memory is freed with the last handle. Destroy every mirror
 * before closing its device.
 *
 * Thread safety: none inside a family. One thread at a time per mirror family
 * (the root and all its views); different families may be used concurrently.
 * A call on the family from inside one of its syncs (a log callback) gets
 * MAPPING_ERR_BUSY.
 */
typedef struct mapping_mirror mapping_mirror;
typedef enum mapping_side { MAPPING_CPU = 1, MAPPING_GPU = 2 } mapping_side;

/* Flags of mapping_mirror_create / _wrap. */
enum {
    /* One unified / managed allocation serves both sides where the device
     * supports it (host back end: always; CUDA managed; OpenCL SVM); syncs
     * become prefetch hints or nothing. Elsewhere an ordinary mirror: not an
     * error, see mapping_mirror_is_unified. Ignored by _wrap (user memory). */
    MAPPING_MIRROR_UNIFIED = 1u << 0,
    /* _wrap only: page-lock the caller's memory in place for the mirror's
     * lifetime where the back end can (CUDA cuMemHostRegister, ...), so its
     * transfers take the fast path; elsewhere ignored (see
     * mapping_mirror_is_pinned). Ignored by _create (its memory is
     * page-locked already where the back end can). */
    MAPPING_MIRROR_PIN = 1u << 1,
    /* _adopt only: the GPU side holds the data; the CPU side starts stale. */
    MAPPING_MIRROR_GPU_VALID = 1u << 2,
    /* Write tracking (create, wrap, adopt): the library watches the CPU
     * side's pages, and every sync (and mapping_mirror_stale_bytes) first
     * counts the pages written since the last look as marked on the CPU,
     * where the CPU side is valid: no mark needed. Explicit marks still
     * work (exact ranges; a mark never hurts). Granularity: a page
     * (mapping_write_tracking). MAPPING_ERR_UNSUPPORTED when the process
     * has no mechanism, or the pages are tracked already by another family
     * (a wrapped array must not share a page with another tracked one), or
     * (mprotect) 256 families are tracked already, or part of the memory
     * is executable and part not. MAPPING_ERR_INVALID_ARGUMENT when a page
     * of it is not mapped, or not readable and writable (PROT_READ memory,
     * a const array, a PROT_NONE guard page: a sync to the CPU could not
     * write it); its protection is left as it was (executable memory
     * stays executable).
     * Writes that cause no page fault in this mapping are not seen and
     * must be marked: writes through another mapping of the same memory
     * (a memfd or shared memory mapped twice, another process), DMA into
     * pages pinned earlier (io_uring fixed buffers, RDMA), pages zeroed by
     * madvise(MADV_DONTNEED / MADV_FREE / MADV_REMOVE); with mprotect also
     * writes through /proc/self/mem. A copy from the device into the CPU
     * side is the library's own write, forgotten when it completes (on a
     * stream: when the stream gets there), never the program's.
     * See docs/mirrors.md "Write tracking" for the mechanisms, system calls
     * writing the memory, signal handlers, fork(), page-locked and
     * hugetlbfs memory, and costs. */
    MAPPING_MIRROR_TRACK_WRITES = 1u << 3,
    /* Device-side diff (create, wrap, adopt): a sync to the CPU of bytes the
     * device modified (mark_gpu_modified, acquire_gpu with WRITE) reads back
     * only the 4096-byte blocks (MAPPING_DIFF_BLOCK_BYTES, from byte 0 of
     * the mirror) whose content differs from what both sides last agreed
     * on, found by a kernel comparing the buffer with a device-side shadow
     * copy; the rest of the stale bytes become valid without a copy.
     * Costs: device memory for the shadow (the mirror's size) and a flag
     * per block; syncs to the GPU also refresh the shadow (a device copy);
     * a sync to the CPU waits for its stream up to the comparison (the
     * flags come back to the host). Chosen per sync by the link: the
     * first large comparison measures how fast the device compares, and
     * the diff is used only where comparing costs less than reading over
     * the link (mapping_device_link); $MAPPING_DEVICE_DIFF=on / off forces
     * it. The compare kernel: host (XOR over the cores), OpenCL (in the
     * back end's program), CUDA (in its PTX, loaded at open); a device
     * where it could not be loaded (MAPPING_CUDA_SCATTER=copies) and
     * unified mirrors read as without the flag. Marks stay exact: bytes
     * that are not stale are never read. */
    MAPPING_MIRROR_DEVICE_DIFF = 1u << 4
};
/* The block of MAPPING_MIRROR_DEVICE_DIFF. */
#define MAPPING_DIFF_BLOCK_BYTES 4096

/* How tracked mirrors see CPU writes in this process, chosen once from
 * $MAPPING_TRACK (auto, uffd, mprotect, none) and what the kernel offers:
 * - MAPPING_TRACK_UFFD: userfaultfd write-protect in asynchronous mode and
 *   the PAGEMAP_SCAN ioctl (Linux >= 6.7). Writes the kernel makes for the
 *   process (read(2) into the array) are tracked like any other. A sync
 *   scans only the pages the process faulted on when a fault log (perf
 *   page-fault samples) provably holds every fault since the last scan,
 *   else the whole mirror ($MAPPING_TRACK_SCAN = faulted, changed,
 *   always); with several threads, that proof (and the clean sync's "no
 *   fault since") needs perf to count every thread's faults as they begin,
 *   kernel-mode ones included (CAP_PERFMON or perf_event_paranoid <= 1),
 *   else such a process walks at every sync. A run of 8 MiB or more written in two sync periods in a row
 *   (a repeated stream) is left writable and counted written at every
 *   sync until a sync to the device finds fewer than half of its sample
 *   pages (one per 2 MiB) written ($MAPPING_TRACK_STREAMS = on, off, or the smallest
 *   run in bytes: a power of two of at least 4 pages; another value makes
 *   MAPPING_MIRROR_TRACK_WRITES fail with MAPPING_ERR_INVALID_ARGUMENT):
 *   a stream then faults 512 times less, and a sync may move pages nobody
 *   wrote, never miss one. After fork(), a child counts an inherited tracked mirror
 *   written in full once, then watches it itself; the parent's watch is
 *   left alone.
 * - MAPPING_TRACK_MPROTECT: read-only pages and a SIGSEGV handler (chained
 *   to the one installed before, called as the kernel would: its sa_mask
 *   blocked, SA_RESETHAND honoured; install yours first, or chain to ours;
 *   once installed, libmapping.so stays loaded). A system call that
 *   writes a protected page fails with EFAULT: mark the range (or
 *   mapping_mirror_acquire_cpu with MAPPING_WRITE) before the call; a mark
 *   makes its pages writable until the next sync. A thread that blocks
 *   SIGSEGV (or a signal handler whose mask blocks it) must not write a
 *   tracked array: the kernel kills the process. The program must not
 *   mprotect a tracked array itself.
 * - MAPPING_TRACK_NONE: MAPPING_MIRROR_TRACK_WRITES is refused.
 * *granularity (may be NULL): the bytes one written byte makes a sync move
 * at most (the base page, 4096 on x86-64). Thread-safe. */
typedef enum mapping_track_mechanism {
    MAPPING_TRACK_NONE = 0,
    MAPPING_TRACK_UFFD = 1,
    MAPPING_TRACK_MPROTECT = 2
} mapping_track_mechanism;
MAPPING_API mapping_track_mechanism mapping_write_tracking(size_t *granularity);
/* "uffd", "mprotect" or "none", and why (e.g. "mprotect: ...; uffd: the
 * kernel offers no UFFD_FEATURE_WP_ASYNC"); never NULL. Thread-safe. */
MAPPING_API const char *mapping_write_tracking_description(void);

/* Access intents for mapping_mirror_acquire_cpu / _gpu. */
typedef enum mapping_access {
    MAPPING_READ  = 1, /* sync the side before use */
    MAPPING_WRITE = 2  /* mark the side modified; alone (no READ) it discards */
} mapping_access;

/* Creates a mirror of `bytes`: zero-filled CPU memory (page-locked, from
 * mapping_allocate_cpu) and a device buffer; the GPU side starts stale.
 * flags: 0, MAPPING_MIRROR_UNIFIED, MAPPING_MIRROR_TRACK_WRITES,
 * MAPPING_MIRROR_DEVICE_DIFF. Thread-safe (the device is). */
MAPPING_API mapping_status mapping_mirror_create(mapping_device *dev, size_t bytes, unsigned flags,
                                                 mapping_mirror **out);
/* Mirrors the caller's memory cpu_ptr[0, bytes) (not copied, not freed; must
 * outlive the mirror and stay mapped readable). Read-only memory (constant
 * data, a PROT_READ mapping) may be wrapped and uploaded; the first sync
 * that would copy into the CPU side (mapping_mirror_sync_to_cpu,
 * mapping_mirror_acquire_cpu with MAPPING_READ) checks that all of it is
 * writable (Linux: /proc/self/maps, once per mirror) and otherwise fails
 * with MAPPING_ERR_INVALID_ARGUMENT, copying nothing and leaving the CPU
 * side stale. With MAPPING_MIRROR_TRACK_WRITES the memory must be readable
 * and writable when wrapped, else the wrap is refused with
 * MAPPING_ERR_INVALID_ARGUMENT. The GPU side starts stale. flags: 0 or MAPPING_MIRROR_PIN, MAPPING_MIRROR_TRACK_WRITES, MAPPING_MIRROR_DEVICE_DIFF
 * (MAPPING_MIRROR_UNIFIED is accepted and ignored). */
MAPPING_API mapping_status mapping_mirror_wrap(mapping_device *dev, void *cpu_ptr, size_t bytes, unsigned flags,
                                               mapping_mirror **out);
/* A mirror over both sides supplied by the caller: cpu_ptr[0, bytes) (not
 * copied, not freed) and gpu[gpu_offset, +bytes) (any buffer of dev, an
 * imported one included; not freed: free it after the mirror). Both must
 * outlive the mirror. Views, syncs, marks and access intents work as for any
 * mirror; mapping_mirror_gpu is `gpu` and mapping_mirror_gpu_offset includes
 * gpu_offset. The CPU side starts valid and the GPU side stale, or with
 * MAPPING_MIRROR_GPU_VALID the other way round (the device holds the data).
 * cpu_ptr's memory is checked as for mapping_mirror_wrap.
 * flags: 0, MAPPING_MIRROR_PIN, MAPPING_MIRROR_GPU_VALID, MAPPING_MIRROR_TRACK_WRITES,
 * MAPPING_MIRROR_DEVICE_DIFF. Thread-safe. */
MAPPING_API mapping_status mapping_mirror_adopt(mapping_device *dev, void *cpu_ptr, mapping_buffer *gpu,
                                                size_t gpu_offset, size_t bytes, unsigned flags,
                                                mapping_mirror **out);
/* Destroys a handle (root or view); the shared memory goes with the last
 * handle of the family, after its queued copies complete (if waiting for one
 * fails twice, the memory is left to mapping_close). NULL: no-op. */
MAPPING_API void            mapping_mirror_destroy(mapping_mirror *m);
/* Bytes of this mirror or view; 0 for NULL. O(1). */
MAPPING_API size_t          mapping_mirror_size(const mapping_mirror *m);
/* Host address of the first byte of this mirror or view; no sync. NULL for
 * a NULL or invalid handle. */
MAPPING_API void           *mapping_mirror_cpu(mapping_mirror *m);
/* The family's device buffer; no sync. A view starts at
 * mapping_mirror_gpu_offset(view) within it. NULL for NULL, and while the
 * device side is evicted (memory budgets, below: a buffer made again is a
 * new one, so take it from mapping_mirror_acquire_gpu each time). */
MAPPING_API mapping_buffer *mapping_mirror_gpu(mapping_mirror *m);
MAPPING_API size_t          mapping_mirror_gpu_offset(const mapping_mirror *m);
/* 1 if one unified allocation serves both sides, 0 otherwise (or NULL). */
MAPPING_API int             mapping_mirror_is_unified(const mapping_mirror *m);
/* 1 if wrapped memory was page-locked in place (MAPPING_MIRROR_PIN). */
MAPPING_API int             mapping_mirror_is_pinned(const mapping_mirror *m);
/* 1 if the family's CPU writes are tracked (MAPPING_MIRROR_TRACK_WRITES). */
MAPPING_API int             mapping_mirror_is_tracked(const mapping_mirror *m);

/* "I wrote [offset, offset+bytes) of this side": the other side becomes
 * stale there. MAPPING_ERR_CONFLICT if the other side holds unsynced
 * modifications in the range (nothing changes). Waits for queued copies of
 * the family that touch the range. Offsets are relative to the view. */
MAPPING_API mapping_status  mapping_mirror_mark_cpu_modified(mapping_mirror *m, size_t offset, size_t bytes);
MAPPING_API mapping_status  mapping_mirror_mark_gpu_modified(mapping_mirror *m, size_t offset, size_t bytes);
/* Copies the stale ranges of the target side (only those, merged by the
 * link model; from 16 ranges on, where the back end scatters on the device
 * or the link's transfers cost at least 1 us, packed into one staged
 * transfer and scattered on the device, as mapping_batch_flush does).
 * stream NULL: complete on return. Otherwise queued; the ranges become
 * valid when the stream reaches the end of the copies. The stream must
 * belong to the mirror's device (MAPPING_ERR_DEVICE_MISMATCH).
 * On failure no range becomes valid: every byte stale on the target stays
 * stale, and the next sync copies it again. Copies done (or queued) before
 * the failure may already have written the source's current bytes into
 * some of those stale target bytes; nothing else is written (bytes valid on
 * the target, and the source, are untouched), so no data is lost. */
MAPPING_API mapping_status  mapping_mirror_sync_to_gpu(mapping_stream *stream, mapping_mirror *m);
MAPPING_API mapping_status  mapping_mirror_sync_to_cpu(mapping_stream *stream, mapping_mirror *m);
/* A sync recorded in a CUDA graph (docs/cuda.md, "Mirror syncs in CUDA
 * graphs"). On a stream being captured (cuStreamBeginCapture,
 * torch.cuda.graph), mapping_mirror_sync_to_gpu / _to_cpu do this with
 * max_ranges 0; this form takes the table's size. Nothing is copied now and
 * the mirror's state does not change now: each replay of the graph (each
 * cudaGraphLaunch of an executable made from it) moves, in the graph's
 * order, exactly the bytes of this mirror or view stale on side `to` at
 * that replay (nothing when none is: a kernel that reads a count of 0), and
 * they become valid on `to` at that replay. Up to max_ranges (0: 4096, at
 * most 524280) ranges per replay; more are joined over gaps valid on both
 * sides, and what still does not fit stays stale for the next sync
 * (counted in mapping_stats.graph_sync_overflows; each replay's run counts
 * graph_sync_runs, and the bytes as a sync's: h2d_bytes / h2d_payload_bytes
 * or d2h_...).
 * Rules: the mirror belongs to the graph while a replay runs: call nothing
 * on its family meanwhile, and order the launch after work on its memory
 * (your kernels, copies the library queued on other streams: same stream or
 * an event), as for any stream work; replays of it run one at a time. The
 * graph holds the family: mapping_mirror_destroy while the graph (or an
 * executable of it) exists frees the handle, and the family's memory goes
 * once the graph and its executables are destroyed (at the next mirror
 * create or destroy, or graph sync, or mapping_close). Copies of the
 * family queued on streams are waited for at the call.
 * The CPU side must be page-locked (mapping_mirror_create, a wrap with
 * MAPPING_MIRROR_PIN, memory pinned by CUDA or torch): a replay copies it
 * directly, zero-copy over the link. MAPPING_ERR_UNSUPPORTED for pageable
 * memory, unified mirrors, mirrors with write tracking, the device diff or
 * MAPPING_CHECK=unmarked (their work cannot run in a graph), back ends
 * without graphs (host, OpenCL), and an invalidated capture;
 * MAPPING_ERR_INVALID_ARGUMENT for a stream not being captured (or NULL),
 * a side other than MAPPING_CPU / MAPPING_GPU, max_ranges too large;
 * MAPPING_ERR_DEVICE_MISMATCH for a stream of another device. */
MAPPING_API mapping_status  mapping_mirror_sync_in_graph(mapping_stream *stream, mapping_mirror *m,
                                                         mapping_side to, size_t max_ranges);
/* Stale bytes of `side` within this mirror or view. This WAITS (blocks the
 * calling thread) for queued copies of the family touching the range, so
 * the answer is exact; to ask "is a sync due?" without waiting, use
 * mapping_mirror_needs_sync. 0 for a NULL or invalid handle or side (error
 * recorded). O(log n + ranges in the view). */
MAPPING_API size_t          mapping_mirror_stale_bytes(const mapping_mirror *m, mapping_side side);
/* *out = 1 if a sync of this mirror or view to `side` would copy something
 * now, else 0 (Kokkos' need_sync_host / need_sync_device): some byte of the
 * view is stale on `side` and no queued copy to `side` covers it. Never
 * waits and never touches the device. A copy queued on a stream and not yet
 * complete counts as done (its bytes report 0 here, while stale_bytes waits
 * for it and then reports them valid); if such a copy later fails, see
 * "Async" above. Copies queued to the other side do not matter here. Cost:
 * O(log n) without queued copies to `side`, else O(log n) per stale range in
 * the view until one is found that no queued copy covers (marks made since
 * the last call, and a tracked mirror's pages written since the last look,
 * are applied first, as a sync applies them). Errors
 * (*out = 0 where out is not NULL): NULL or invalid handle, side neither
 * MAPPING_CPU nor MAPPING_GPU, out NULL, MAPPING_ERR_BUSY from inside the
 * family's own sync. Thread safety: as any call on the mirror family. */
MAPPING_API mapping_status  mapping_mirror_needs_sync(const mapping_mirror *m, mapping_side side, int *out);
/* A view of parent[offset, offset+bytes) sharing its state (see above). A
 * view of a view is a view of the root at the summed offset. Destroy it with
 * mapping_mirror_destroy. */
MAPPING_API mapping_status  mapping_mirror_view(mapping_mirror *parent, size_t offset, size_t bytes,
                                                mapping_mirror **out);

/* Access intents: the library syncs before a read and marks after a write.
 * - READ: sync the side first (CPU: blocking; GPU: on `stream`).
 * - WRITE (with READ): the side is marked modified over the whole view.
 * - WRITE alone: discard. The whole view will be overwritten, so nothing is
 *   copied, and unsynced modifications of the other side in the view are
 *   dropped (never a conflict).
 * acquire_cpu is blocking: on return every queued copy touching the view has
 * completed and *ptr (the view's host address) may be read / written.
 * acquire_gpu orders everything on `stream` (NULL: blocking); launch your work
 * on the same stream after it, on *buf at mapping_mirror_gpu_offset(m). Then
 * call mapping_mirror_release_gpu(stream, m) after your work is queued: later
 * calls that use other streams or block order themselves after it. (Without
 * release, only later work on the same stream is ordered.) access must be a
 * non-empty combination of MAPPING_READ | MAPPING_WRITE. */
MAPPING_API mapping_status  mapping_mirror_acquire_cpu(mapping_mirror *m, unsigned access, void **ptr);
MAPPING_API mapping_status  mapping_mirror_acquire_gpu(mapping_stream *stream, mapping_mirror *m, unsigned access,
                                                       mapping_buffer **buf);
MAPPING_API mapping_status  mapping_mirror_release_gpu(mapping_stream *stream, mapping_mirror *m);

/* Mirrors larger than the device (docs/mirrors.md, "Larger than the
 * device"). On a device with a memory budget (mapping_device_desc
 * .memory_budget, mapping_device_set_memory_budget), an allocation or a
 * mirror sync that would exceed it first evicts the device sides of other
 * mirror families of the device, least recently used first (a family is
 * used by every call on any of its handles). An eviction:
 * - writes back to the CPU exactly the bytes stale there (the device's
 *   modifications; with MAPPING_MIRROR_DEVICE_DIFF only the changed
 *   blocks), as a blocking sync to the CPU would;
 * - frees the device side (and a diff mirror's shadow): the family is then
 *   valid on the CPU everywhere and stale on the GPU everywhere, as at
 *   create (not a modification: marks and conflicts are as before), and
 *   mapping_mirror_gpu gives NULL;
 * - is undone by the next call that needs the device side: a sync to the
 *   GPU or mapping_mirror_acquire_gpu allocates the family's whole buffer
 *   again (mapping_mirror_gpu_offset of every view is unchanged) and
 *   uploads what that call needs (the view's stale bytes; nothing for a
 *   write-only acquire). mapping_mirror_mark_gpu_modified of a family whose
 *   device side is not resident is refused with MAPPING_ERR_INVALID_ARGUMENT
 *   (there are no device bytes to mark: acquire it first).
 * Never evicted automatically: a family acquired for the GPU and not
 * released (mapping_mirror_acquire_gpu until mapping_mirror_release_gpu),
 * one with work queued on any stream not known to be complete, one being
 * called on another thread (when nothing else can go, the allocation waits
 * up to 100 ms for that call to return, then evicts it), one hinted
 * MAPPING_RESIDENCY_KEEP; until the graph is destroyed, one a CUDA graph
 * syncs (mapping_mirror_sync_in_graph: its nodes address the device
 * side); never at all: unified mirrors and adopted ones
 * (mapping_mirror_adopt: the buffer is the caller's), which do not count
 * against the budget. So a kernel that uses several mirrors should acquire
 * them (a plain sync does not keep a device side resident until the
 * kernel runs; the buffer of an evicted family is freed). Evictions are
 * advisory: they never change the data a program reads. An allocation
 * that eviction cannot make room for fails with
 * MAPPING_ERR_OUT_OF_DEVICE_MEMORY, naming the budget and what holds it;
 * a failed materialization leaves the family as it was (valid on the CPU).
 * Counted in mapping_stats.evictions, evict_writeback_bytes,
 * evict_reupload_bytes and peak_resident_bytes; each eviction is a trace
 * event ("mirror eviction"). */
typedef enum mapping_residency {
    MAPPING_RESIDENCY_DEFAULT = 0,    /* evicted least recently used first */
    MAPPING_RESIDENCY_KEEP = 1,       /* never evicted automatically (mapping_mirror_evict still does) */
    MAPPING_RESIDENCY_EVICT_FIRST = 2 /* evicted before the others (least recently used first among them) */
} mapping_residency;
/* A residency hint for the family of m (every handle of it): advisory, it
 * never changes results. Also on a device without a budget (it applies
 * once one is set). MAPPING_ERR_INVALID_ARGUMENT for another value;
 * MAPPING_ERR_UNSUPPORTED for a unified or adopted mirror. */
MAPPING_API mapping_status mapping_mirror_set_residency(mapping_mirror *m, mapping_residency hint);
/* Evicts the family's device side now (as above), whatever its hint and
 * whether or not the device has a budget: waits for the work queued on the
 * family first (blocking), writes back the bytes stale on the CPU, frees
 * the device memory. MAPPING_OK with nothing done when it is not resident.
 * MAPPING_ERR_BUSY while the family is acquired for the GPU (not
 * released) or synced by a CUDA graph not yet destroyed;
 * MAPPING_ERR_UNSUPPORTED for a unified or adopted mirror; a
 * failed write-back returns its status and leaves the family resident and
 * unchanged. */
MAPPING_API mapping_status mapping_mirror_evict(mapping_mirror *m);
/* 1 when the family's device side is allocated (not evicted), 0 when not
 * or for a bad handle. Never waits. */
MAPPING_API int            mapping_mirror_is_resident(const mapping_mirror *m);

/* Several devices (see also mapping_copy_peer, mapping_multimirror_*).
 * A sharded layout, for the data-parallel case: the caller's host array
 * cpu_ptr[0, bytes) cut into `count` consecutive slices, slice i a mirror of
 * it on devices[i] (as mapping_mirror_wrap with `flags`: the memory is not
 * copied and must outlive the shards). bytes is a multiple of `granule`
 * (an element's or row's bytes, > 0), never split: of n = bytes / granule
 * granules, the first n % count slices get one more than the others.
 * shards[0 .. count-1] receive the mirrors (count >= 1, n >= count); each is
 * an ordinary mirror (mark, sync, views, access intents), destroyed with
 * mapping_mirror_destroy. On failure none is left. With
 * MAPPING_MIRROR_TRACK_WRITES each shard watches whole pages and shards may
 * not share one: every slice but the first must start on a page (else
 * MAPPING_ERR_INVALID_ARGUMENT, saying so). */
MAPPING_API mapping_status mapping_mirror_create_sharded(mapping_device *const *devices, int count, void *cpu_ptr,
                                                         size_t bytes, size_t granule, unsigned flags,
                                                         mapping_mirror **shards);


/* ===========================================================================
 * Several devices
 * ======================================================================== */

/* Devices of one process: each mapping_open of another device index gives a
 * device with its own memory (the host back end exposes
 * $MAPPING_HOST_DEVICES = N virtual devices, 1 to 64, read once when it
 * loads, so multi-device code runs anywhere; any other value, 0 included,
 * makes mapping_open of host, and of the default back end, fail naming the
 * variable, rather than choose another back end; PoCL exposes several with
 * POCL_DEVICES="pthread pthread"). mapping_list_devices lists them.
 *
 * Peer copy: src[src_offset, +bytes), a buffer of one device, to
 * dst[dst_offset, +bytes), a buffer of another (or the same: then it is
 * mapping_copy_gpu). Source before destination, as in every copy (and the
 * same arguments as mapping_copy_gpu). The stream belongs to the DESTINATION's device
 * (MAPPING_ERR_DEVICE_MISMATCH otherwise); NULL = blocking.
 *
 * Ordering across the two devices: the copy runs when `stream` reaches it
 * and reads src then. Work of src's device is not ordered with it: work
 * that writes src must have completed before the call (synchronize the src
 * device's stream or an event of it), and src must not be written again
 * until the copy has completed (synchronize `stream`, or an event recorded
 * on it after the copy). Work queued on `stream` after the copy sees dst
 * written.
 *
 * How: devices of one back end copy directly (CUDA cuMemcpyPeerAsync; OpenCL
 * clEnqueueCopyBuffer between devices of one platform, which share a
 * context, else staged through page-locked host memory in pipelined chunks;
 * host: memcpy on the stream). Devices of different back ends: staged
 * through page-locked host memory, blocking (the call first waits for
 * `stream`'s earlier work and returns when the copy is done). Counted in the
 * destination device's mapping_stats.peer_bytes / peer_copies. Thread-safe. */
MAPPING_API mapping_status mapping_copy_peer(mapping_stream *stream, const mapping_buffer *src, size_t src_offset,
                                             mapping_buffer *dst, size_t dst_offset, size_t bytes);

/* Mirrors with several device sides (replicas): one host array and a replica
 * on each of `count` devices (1 to MAPPING_MULTIMIRROR_MAX_DEVICES). Sides:
 * the CPU, and device sides 0 .. count-1 (in the order of `devices`).
 *
 * Validity is tracked per byte range for every side, as in a mirror:
 * - create: the CPU side is valid (zeroed), every device side stale.
 * - mark (CPU or device j, a range): that side becomes valid there and every
 *   other side stale; the range counts as that side's modification.
 *   MAPPING_ERR_CONFLICT (nothing changes; counted in the marking device's
 *   mapping_stats.conflicts, the first device's for the CPU) when the
 *   marking side is stale somewhere in the range where another side holds
 *   unsynced modifications: it would overwrite a version it has not seen.
 * - sync to device j copies exactly j's stale ranges, each part from the
 *   cheapest side valid there: the CPU (device j's link) or another device
 *   (a direct peer copy, its link measured once per pair; a staged peer copy
 *   costs both devices' links). So a replica is refreshed from a peer when
 *   that link is faster, from the host otherwise. sync to the CPU copies
 *   the CPU's stale ranges from the device with the cheapest link to the
 *   host, blocking.
 * - Copies are queued on `stream` (of device j; NULL: blocking). The
 *   multimirror orders itself after them: a mark, a stale count, destroy,
 *   and a sync to another side or on another stream first wait for the
 *   syncs queued earlier, so copies land before anything reads or
 *   overwrites their bytes. Your own work that reads the replica goes on
 *   `stream` after the sync (or waits for it). A peer copy reads the source
 *   replica when the stream reaches it (see mapping_copy_peer): your work
 *   that wrote that replica must have completed, as for mapping_copy_peer.
 * A byte is never stale on every side. Not locked: one thread at a time per
 * multimirror. Destroy it before closing its devices. A device closed first
 * takes its replica with it (the getters then give NULL for it, and for the
 * CPU array once device 0 is closed; other calls fail with
 * MAPPING_ERR_INVALID_HANDLE); the host array is the library's own
 * page-locked pages (registered with device 0 where it can), so an address
 * the program took before stays valid until mapping_multimirror_destroy.
 * With mapping_multimirror_track_writes, a CPU write is a CPU mark of the
 * bytes it changed, made at the next call on the multimirror (as for
 * MAPPING_MIRROR_TRACK_WRITES). */
typedef struct mapping_multimirror mapping_multimirror;
enum { MAPPING_MULTIMIRROR_MAX_DEVICES = 16 };
MAPPING_API mapping_status mapping_multimirror_create(mapping_device *const *devices, int count, size_t bytes,
                                                      mapping_multimirror **out);
MAPPING_API void            mapping_multimirror_destroy(mapping_multimirror *m); /* NULL: no-op */
MAPPING_API size_t          mapping_multimirror_size(const mapping_multimirror *m);   /* 0 for NULL */
/* The host array (page-locked on the first device), and device j's replica;
 * NULL for a bad handle or index. */
MAPPING_API void           *mapping_multimirror_cpu(mapping_multimirror *m);
MAPPING_API mapping_buffer *mapping_multimirror_gpu(mapping_multimirror *m, int device);
MAPPING_API mapping_status  mapping_multimirror_mark_cpu_modified(mapping_multimirror *m, size_t offset, size_t bytes);
MAPPING_API mapping_status  mapping_multimirror_mark_gpu_modified(mapping_multimirror *m, int device, size_t offset,
                                                                  size_t bytes);
MAPPING_API mapping_status  mapping_multimirror_sync_to_gpu(mapping_stream *stream, mapping_multimirror *m, int device);
MAPPING_API mapping_status  mapping_multimirror_sync_to_cpu(mapping_multimirror *m);
/* Stale bytes of the CPU side (device = -1) or of device side `device`;
 * 0 for a bad handle or index (error recorded). */
MAPPING_API size_t          mapping_multimirror_stale_bytes(const mapping_multimirror *m, int device);
/* Write tracking for the CPU side, as MAPPING_MIRROR_TRACK_WRITES does for a
 * mirror: from now on every sync and stale count first marks the CPU pages
 * written since the last look (where the CPU side is valid). Once on, on
 * for the multimirror's life; calling it again is a no-op.
 * MAPPING_ERR_UNSUPPORTED without a mechanism (mapping_write_tracking). */
MAPPING_API mapping_status  mapping_multimirror_track_writes(mapping_multimirror *m);
/* Memory budgets (see mapping_mirror_evict): the replica on a device with
 * a budget (when the multimirror was made, or from its next call after the
 * budget was set) counts against it and may be evicted, least recently
 * used first, when its device needs room (never while a sync of the
 * multimirror is queued and not complete; a call on it on another thread
 * is waited for, as for a mirror). An eviction of replica j writes the
 * bytes only j holds (stale on the CPU, valid on j) back to the CPU, frees
 * j's buffer (mapping_multimirror_gpu gives NULL) and leaves j stale
 * everywhere; the next sync to j makes it again (all of its bytes then
 * move, each from the cheapest side) or fails with
 * MAPPING_ERR_OUT_OF_DEVICE_MEMORY changing nothing; a mark of j is refused
 * with MAPPING_ERR_INVALID_ARGUMENT meanwhile. mapping_multimirror_evict
 * evicts replica `device` now, on any device, after the syncs queued on the
 * multimirror (it waits); MAPPING_OK with nothing done when it is not
 * resident. mapping_multimirror_is_resident: 1 when replica `device` has
 * its buffer, 0 when not or for a bad handle or index (error recorded). */
MAPPING_API mapping_status  mapping_multimirror_evict(mapping_multimirror *m, int device);
MAPPING_API int             mapping_multimirror_is_resident(const mapping_multimirror *m, int device);


/* ==== Batches and pipelines (src/transfer/) ==== */

/* ---------------------------------------------------------------------------
 * Batches: many copies, few driver transfers
 * ---------------------------------------------------------------------------
 * A batch collects host-to-device and device-to-host copies of any size, to
 * and from any buffers of one device, and mapping_batch_flush moves them with
 * as few driver transfers as it can:
 * - copies into (or out of) one buffer whose ranges overlap or touch are
 *   merged into one range;
 * - small ranges are packed into one page-locked staging buffer, moved in ONE
 *   transfer, and scattered on the device in one step (gathered, for
 *   device-to-host, then read in one transfer and unpacked on the CPU);
 * - large ranges (above a size derived from mapping_device_link) go straight
 *   through, unstaged.
 * docs/batching.md explains the plan a flush makes.
 *
 * When the host memory is read and written. Adding a copy records its
 * pointers only; the batch never touches host memory at add time. A flush
 * reads the sources of its host-to-device copies and writes the destinations
 * of its device-to-host copies in stream order: no earlier than the point the
 * stream reaches the flush (stream NULL: during the call), no later than the
 * end of the flush's work. Until then the sources must stay valid and
 * unchanged and the destinations valid, as for any stream operation.
 *
 * Order inside one flush: all host-to-device copies take effect before all
 * device-to-host copies (a device-to-host copy sees the data the same flush
 * wrote). Host-to-device copies that overlap in a buffer: the one added later
 * wins. Device-to-host copies whose host destinations overlap: the bytes
 * there are unspecified (one of them wins).
 *
 * Lifetime: mapping_batch_create -> add copies -> mapping_batch_flush (as
 * often as wanted: a successful flush empties the batch) -> mapping_batch_destroy.
 * The buffers a queued copy names must stay allocated until it is flushed.
 *
 * Thread safety: a batch is not locked: one thread at a time per batch. A
 * call on a batch from inside its own flush (a log callback) gets
 * MAPPING_ERR_BUSY.
 * Different batches (of one device) may be used from different threads. */
typedef struct mapping_batch mapping_batch;

/* Creates an empty batch for dev. Staging memory is allocated by the first
 * flush that needs it and kept (grown when needed) for later flushes. */
MAPPING_API mapping_status mapping_batch_create(mapping_device *dev, mapping_batch **out);
/* Waits for the batch's last flush to complete (its staging memory is in use
 * until then), drops copies still queued, and frees the batch. NULL: no-op.
 * If that wait fails twice, the memory the flush may still use is not freed
 * (its staging memory goes with mapping_close). */
MAPPING_API void           mapping_batch_destroy(mapping_batch *b);

/* Adds (records) a copy of `bytes` bytes from cpu_src to
 * gpu_dst[gpu_offset, +bytes) for the next flush; moves nothing. Validated
 * now (the same errors as mapping_sync_to_gpu_range; the buffer must be of
 * the batch's device); nothing is read until the flush. O(1) amortised. */
MAPPING_API mapping_status mapping_batch_add_to_gpu(mapping_batch *b, const void *cpu_src, mapping_buffer *gpu_dst,
                                                    size_t gpu_offset, size_t bytes);
/* Adds a copy of gpu_src[gpu_offset, +bytes) to cpu_dst. As above. */
MAPPING_API mapping_status mapping_batch_add_to_cpu(mapping_batch *b, const mapping_buffer *gpu_src,
                                                    size_t gpu_offset, void *cpu_dst, size_t bytes);
/* Deprecated names of mapping_batch_add_to_gpu / _to_cpu (a batch's "sync"
 * only recorded a copy, unlike every other sync): the same functions, kept
 * and exported for programs written or built against them; errors name the
 * function called (MAPPING_WARN_DEPRECATED: see MAPPING_DEPRECATED). */
MAPPING_API MAPPING_DEPRECATED("mapping_batch_add_to_gpu") mapping_status
mapping_batch_sync_to_gpu(mapping_batch *b, const void *cpu_src, mapping_buffer *gpu_dst, size_t gpu_offset,
                          size_t bytes);
MAPPING_API MAPPING_DEPRECATED("mapping_batch_add_to_cpu") mapping_status
mapping_batch_sync_to_cpu(mapping_batch *b, const mapping_buffer *gpu_src, size_t gpu_offset, void *cpu_dst,
                          size_t bytes);
/* Number of copies queued (0 after a successful flush). O(1). 0 for NULL. */
MAPPING_API size_t         mapping_batch_count(const mapping_batch *b);
/* Drops every queued copy without moving anything. NULL: no-op. */
MAPPING_API void           mapping_batch_clear(mapping_batch *b);

/* Moves every queued copy. stream NULL: returns when all are done. Otherwise
 * returns once the work is queued on `stream` (of the batch's device); errors
 * of the queued work come from mapping_stream_synchronize, as for any
 * stream operation. A flush of an empty batch does nothing and returns
 * MAPPING_OK. If the batch's previous flush was on a stream and has not
 * completed, this call first waits for it (the staging memory is reused); if
 * that wait fails, this call fails with its status before doing anything
 * (copy 0 is named, every copy stays queued).
 *
 * On failure (a transfer, scatter or gather could not be done or queued):
 * - the return value is that step's status, and mapping_last_error_message()
 *   names the first copy that was not done, by its index in the order the
 *   copies were added ("copy 17 of 10000 (host-to-device, 64 bytes at offset
 *   4096 of buffer 0x...) was not done: ..."), and how many were done;
 * - copies done before the failure stay done (nothing is undone; on a
 *   stream, "done" means queued, and they complete as usual); the
 *   destination ranges of copies not done are untouched by this flush;
 * - the batch then holds exactly the copies that were not done, in the order
 *   they were added (mapping_batch_count says how many): flushing again
 *   retries them, mapping_batch_clear drops them.
 * - One exception, stream NULL: a blocking flush queues its steps on the
 *   device's queue and waits once (one round trip, not one per step). If
 *   that wait itself fails, which copies completed is unknown: the message
 *   says so, every copy stays queued, and a destination range holds its old
 *   bytes or the copied ones (a retry makes it the copied ones). The next
 *   flush (or mapping_batch_destroy) waits for those steps again first, as
 *   for a previous flush on a stream.
 * Counts one flush in mapping_stats.batch_flushes when it moved data; the
 * driver transfers it makes are counted in h2d_/d2h_copies as usual. */
MAPPING_API mapping_status mapping_batch_flush(mapping_stream *stream, mapping_batch *b);

/* ---------------------------------------------------------------------------
 * Pipelines: transfers overlapped with compute
 * ---------------------------------------------------------------------------
 * A pipeline runs a host array of any size through device work in chunks:
 * while the caller's compute runs on chunk i, chunk i+1 is being uploaded and
 * chunk i-1 downloaded. It owns `depth` streams and, per stream, a device
 * input and output buffer of chunk_bytes each, plus page-locked staging used
 * when the caller's host arrays are not page-locked (from
 * mapping_allocate_cpu memory the copies go straight through).
 *
 * Lifetime: mapping_pipeline_create -> mapping_pipeline_run (any number of
 * times, any sizes) -> mapping_pipeline_destroy. Not locked: one thread at a
 * time per pipeline; mapping_pipeline_run or _destroy called from the
 * pipeline's own step gets MAPPING_ERR_BUSY. */
typedef struct mapping_pipeline mapping_pipeline;

typedef struct mapping_pipeline_desc {
    /* Bytes per chunk; 0 = from mapping_device_link() (big enough that the
     * per-transfer latency costs about 0.5% of a chunk, a power of two between
     * 256 KiB and 64 MiB, at most 2 MiB where device memory is CPU memory
     * (host back end, OpenCL CPU devices: chunk buffers that stay in the
     * CPU's cache); a run of a short array uses chunks of 1/8 of it,
     * but not under 64 KiB, so that it still overlaps). Rounded down to a
     * multiple of element_bytes. */
    size_t chunk_bytes;
    /* Streams and chunk buffers in flight, 1 to 3; 0 = 3 (upload, compute
     * and download all overlap; 2 lets two of them overlap; 1 runs the chunks
     * one after another, a baseline to compare with). */
    int depth;
    /* Chunks never split an element of this many bytes; 0 = 1. The array
     * size given to mapping_pipeline_run must be a multiple of it. */
    size_t element_bytes;
} mapping_pipeline_desc;

/* What the compute step is given for one chunk. */
typedef struct mapping_pipeline_chunk {
    size_t          index;         /* 0, 1, ... in array order */
    size_t          offset;        /* of the chunk in the host arrays, bytes */
    size_t          bytes;         /* of this chunk (the last may be shorter) */
    mapping_buffer *input;         /* holds the chunk's input at input_offset */
    size_t          input_offset;
    mapping_buffer *output;        /* the step writes its result at output_offset */
    size_t          output_offset; /* (bytes bytes are downloaded from there) */
} mapping_pipeline_chunk;

/* The caller's compute step: enqueue the work for one chunk on `stream` (a
 * kernel through mapping_stream_native, mapping_copy_gpu, or on the host
 * back end mapping_launch_host) and return; do not wait for it. The chunk
 * struct is valid during the call only. Called on the thread that called
 * mapping_pipeline_run, in chunk order, up to 2 x depth chunks ahead of the
 * device: when the step is called for chunk i, all work of chunks up to
 * i - 2 x depth has completed (so per-chunk data the step hands to its
 * queued work may live in a ring of 2 x depth entries). Chunks i and
 * i + depth use the same stream and buffers. A non-OK return stops the run. */
typedef mapping_status (*mapping_pipeline_fn)(mapping_stream *stream, const mapping_pipeline_chunk *chunk,
                                              void *user);

/* Creates a pipeline on dev. desc NULL = all defaults. Allocates its streams
 * and buffers now. */
MAPPING_API mapping_status mapping_pipeline_create(mapping_device *dev, const mapping_pipeline_desc *desc,
                                                   mapping_pipeline **out);
/* Waits for the pipeline's work and frees it. NULL: no-op. */
MAPPING_API void           mapping_pipeline_destroy(mapping_pipeline *p);
/* Chunk size and depth in use. */
MAPPING_API mapping_status mapping_pipeline_get_desc(const mapping_pipeline *p, mapping_pipeline_desc *out);

/* Runs cpu_src[0, bytes) through `step` chunk by chunk and downloads each
 * chunk's output into cpu_dst at the same offset (cpu_dst may equal cpu_src;
 * any other overlap of the two is refused with MAPPING_ERR_INVALID_ARGUMENT;
 * NULL = no download, for steps that keep their results on the device).
 * Blocking: returns when every chunk is done. On failure returns the first
 * error (of the step, a transfer, or queued work; a step's own error is
 * recorded as "the step returned ... for chunk i", with the step's message
 * if it recorded one); chunks already downloaded
 * stay in cpu_dst, others are unspecified there. Reads cpu_src and writes
 * cpu_dst only in chunks as the pipeline reaches them. */
MAPPING_API mapping_status mapping_pipeline_run(mapping_pipeline *p, const void *cpu_src, void *cpu_dst,
                                                size_t bytes, mapping_pipeline_fn step, void *user);

/* ===========================================================================
 * Adopting memory and queues made elsewhere (docs/interop.md)
 * ======================================================================== */

/* The NULL-stream contract. A call with stream == NULL is ordered after all
 * work enqueued before it on the device's native queue
 * (mapping_device_native: OpenCL `queue`; CUDA the legacy default
 * stream, which also follows every blocking stream of the context), your own
 * kernels included, and returns when its own work is done. In particular
 * mapping_mirror_release_gpu(NULL, m) waits for that queue, and a blocking
 * sync to the CPU of a unified mirror (or mapping_mirror_acquire_cpu) waits
 * for it before the CPU reads the shared memory. Work on other native queues
 * is ordered only through an imported stream (below) or your own sync. The
 * host back end has no native queue: its blocking calls are complete on
 * return. */

/* Opens a device on an OpenCL context made elsewhere (PyOpenCL, CLBlast, any
 * OpenCL program), so its cl_mem objects can be imported. cl_context and
 * cl_device_id are required (the device must belong to the context and be
 * one the OpenCL back end lists); cl_command_queue (in order, of that context
 * and device) becomes the device's native queue, or NULL makes a new one.
 * All three are retained (clRetain*) until mapping_close, which releases
 * them. The device is otherwise like one from mapping_open. Thread-safe.
 * CUDA needs no such call: the CUDA back end runs in the device's primary
 * context, which the CUDA runtime, PyTorch and CuPy share, so their pointers
 * and streams are valid for mapping_import_gpu / mapping_import_stream of a
 * device from mapping_open. */
MAPPING_API mapping_status mapping_open_opencl(void *cl_context, void *cl_device_id, void *cl_command_queue,
                                               mapping_device **out);

/* Device memory the caller owns as a buffer of `bytes` bytes: native[offset,
 * +bytes), where native is a cl_mem (OpenCL, of the device's context;
 * retained; a non-zero offset makes a sub-buffer and must be a multiple of
 * the device's CL_DEVICE_MEM_BASE_ADDR_ALIGN), a CUdeviceptr as
 * (void *)(uintptr_t)ptr (CUDA), or a pointer to memory that stays valid (host
 * back end). The buffer works in every copy, fill, batch and mirror like one
 * from mapping_allocate_gpu; mapping_buffer_native gives the cl_mem (or the
 * sub-buffer), the pointer + offset. mapping_free_gpu (or mapping_close)
 * releases only the library's handle, never the memory, and then calls
 * release(user) if release is not NULL (on the thread that frees). The caller
 * keeps the memory alive until then. Thread-safe. MAPPING_ERR_UNSUPPORTED
 * where the back end cannot import, and for a non-zero offset into a cl_mem
 * that is itself a sub-buffer (OpenCL makes no sub-buffer of a sub-buffer;
 * the message names the parent and the offset to import it at). */
MAPPING_API mapping_status mapping_import_gpu(mapping_device *dev, void *native, size_t offset, size_t bytes,
                                              void (*release)(void *user), void *user, mapping_buffer **out);

/* A native queue the caller owns as a stream: an in-order cl_command_queue of
 * the device's context and device (OpenCL; retained), or a CUstream of the
 * primary context (CUDA; NULL, as CUDA code names the default stream 0:
 * the legacy default stream, torch.cuda.default_stream().cuda_stream). The
 * library's work on it is ordered with the
 * caller's kernels on the same queue. mapping_stream_destroy waits for the
 * queue's work and releases only the library's handle. Events recorded on an
 * OpenCL queue made without CL_QUEUE_PROFILING_ENABLE cannot be timed.
 * MAPPING_ERR_UNSUPPORTED on the host back end (its streams are library
 * threads). Thread-safe. */
MAPPING_API mapping_status mapping_import_stream(mapping_device *dev, void *native_queue, mapping_stream **out);

/* Every stream of the device (those that exist and those made later) waits,
 * on the device, for the work queued so far on native_queue: a CUstream of
 * the primary context, or NULL for the device's default native queue (CUDA:
 * the legacy default stream, which a DLPack producer orders its work before
 * when the consumer names it). Call it after importing memory that work on
 * that queue writes (mapping_import_gpu of a DLPack or CUDA array interface
 * tensor), so that the library's copies on its own (non-blocking) streams
 * come after it; the host never waits. MAPPING_ERR_UNSUPPORTED while the
 * queue or a stream of the device is being captured into a CUDA graph, and
 * for a native_queue on a back end without native queues (host: NULL is
 * MAPPING_OK, there is nothing to wait for); MAPPING_ERR_NULL_ARGUMENT for
 * NULL where the back end has no default native queue (OpenCL). Thread-safe. */
MAPPING_API mapping_status mapping_device_wait_native(mapping_device *dev, void *native_queue);

#ifdef __cplusplus
}
#endif
#endif /* MAPPING_H */
