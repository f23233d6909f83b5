/*
 * Copies between two CUDA devices (mapping_backend.peer_copy): direct access
 * is enabled once per pair where cuDeviceCanAccessPeer allows it (then the
 * copy goes over NVLink / PCIe peer to peer), and cuMemcpyPeerAsync moves the
 * bytes on the destination's stream (the driver stages through the host
 * where the devices cannot reach each other). Without cuMemcpyPeerAsync the
 * copy is a cuMemcpyDtoDAsync, which unified addressing routes between
 * devices.
 */
#include <pthread.h>
#include "backend/cuda/cuda_device.h"
#include "os/status.h"

enum { CU_ERROR_PEER_ACCESS_ALREADY_ENABLED_ = 704 };

/* Context pairs already tried (enabled or refused): the driver is asked once
 * per pair and process. Primary contexts live as long as the process uses
 * the device, so the pointers stay meaningful. */
enum { TRIED_MAX = 256 };
static struct {
    cu_context from, to;
} tried[TRIED_MAX];
static int tried_count;
static pthread_mutex_t tried_lock = PTHREAD_MUTEX_INITIALIZER;

static bool first_try(cu_context from, cu_context to)
{
    bool first = true;
    pthread_mutex_lock(&tried_lock);
    for (int i = 0; i < tried_count && first; i++)
        first = !(tried[i].from == from && tried[i].to == to);
    if (first && tried_count < TRIED_MAX)
        tried[tried_count++] = (__typeof__(tried[0])){from, to};
    pthread_mutex_unlock(&tried_lock);
    return first;
}

/* Best effort: a refusal leaves the driver's staged path. With dst's context
 * current. */
static void enable_peer_access(cuda_device *d, cuda_device *s)
{
    const cuda_driver *cu = d->cu;
    int can = 0;
    if (d->ctx == s->ctx || !cu->cuDeviceCanAccessPeer || !cu->cuCtxEnablePeerAccess || !first_try(d->ctx, s->ctx) ||
        cu->cuDeviceCanAccessPeer(&can, d->device, s->device) != CU_SUCCESS || !can)
        return;
    cu_result r = cu->cuCtxEnablePeerAccess(s->ctx, 0);
    if (r != CU_SUCCESS && r != CU_ERROR_PEER_ACCESS_ALREADY_ENABLED_)
        mapping__log(2, "cuda: peer access from device %d to %d not enabled (%s); copies are staged by the driver",
                     d->ordinal, s->ordinal, mapping__cuda_error_name(r));
}

mapping_status mapping__cuda_peer_copy(void *dev, void *stream, void *src_dev, void *src_mem, size_t src_offset,
                              void *dst_mem, size_t dst_offset, size_t bytes)
{
    cuda_device *d = dev, *s = src_dev;
    const cuda_driver *cu = d->cu;
    cu_deviceptr src = cuda_ptr(src_mem) + src_offset, dst = cuda_ptr(dst_mem) + dst_offset;
    cu_stream on = stream ? (cu_stream)stream : d->internal;
    cuda_scope scope;
    mapping_status st = mapping__cuda_enter(d, &scope);
    if (st != MAPPING_OK)
        return st;
    enable_peer_access(d, s);
    /* Blocking: after what the native queues (the legacy streams of both
     * devices' contexts) hold, as the legacy stream itself would be. */
    if (!stream)
        st = mapping__cuda_after_legacy(d);
    if (st == MAPPING_OK && !stream && s->ctx != d->ctx) {
        /* s's legacy stream is s's context's: record there, wait here. */
        cuda_scope s_scope;
        if ((st = mapping__cuda_enter(s, &s_scope)) == MAPPING_OK) {
            st = mapping__cuda_check(cu->cuEventRecord(s->legacy_mark, (cu_stream)0), "cuEventRecord");
            mapping__cuda_leave(s, &s_scope);
        }
        if (st == MAPPING_OK)
            st = mapping__cuda_check(cu->cuStreamWaitEvent(on, s->legacy_mark, 0), "cuStreamWaitEvent");
    }
    if (st != MAPPING_OK) {
        mapping__cuda_leave(d, &scope);
        return st;
    }
    if (cu->cuMemcpyPeerAsync)
        st = mapping__cuda_check(cu->cuMemcpyPeerAsync(dst, d->ctx, src, s->ctx, bytes, on), "cuMemcpyPeerAsync");
    else
        st = mapping__cuda_check(cu->cuMemcpyDtoDAsync_v2(dst, src, bytes, on), "cuMemcpyDtoDAsync_v2");
    if (st == MAPPING_OK && !stream)
        st = mapping__cuda_check(cu->cuStreamSynchronize(on), "cuStreamSynchronize");
    mapping__cuda_leave(d, &scope);
    return st;
}
