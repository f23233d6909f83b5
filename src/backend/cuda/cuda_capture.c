/*
 * Stream capture (CUDA graphs, cudaStreamBeginCapture / torch.cuda.graph):
 * whether a stream is being captured. Work queued on a capturing stream is
 * not run: it becomes the nodes of a graph, run at each replay. The core
 * asks at the public boundary (core/capture.c) and refuses what cannot be
 * captured correctly; the back end refuses the same again where it would
 * stage host memory or synchronize (for callers inside the library), so a
 * capture is never invalidated behind the caller's back.
 *
 * The status comes from cuStreamGetCaptureInfo (v3, v2 or the first form:
 * with the capture's id) or cuStreamIsCapturing (without). Asked of the
 * legacy stream, the driver answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while
 * a stream that synchronizes with it (created without
 * CU_STREAM_NON_BLOCKING) is capturing: a blocking call's work there would
 * depend on that capture and invalidate it. The question itself
 * invalidates nothing.
 */
#include "backend/cuda/cuda_device.h"
#include "os/status.h"

/* The driver's answer for s: a MAPPING_CAPTURE_* and the capture's id (1
 * when the driver gives none). The context is current. */
static mapping_status query(cuda_device *d, cu_stream s, int *status, uint64_t *id)
{
    const cuda_driver *cu = d->cu;
    int cs = CU_STREAM_CAPTURE_STATUS_NONE_;
    unsigned long long cid = 0;
    cu_result r;
    const char *call;
    if (cu->cuStreamGetCaptureInfo_v3)
        call = "cuStreamGetCaptureInfo_v3", r = cu->cuStreamGetCaptureInfo_v3(s, &cs, &cid, NULL, NULL, NULL, NULL);
    else if (cu->cuStreamGetCaptureInfo_v2)
        call = "cuStreamGetCaptureInfo_v2", r = cu->cuStreamGetCaptureInfo_v2(s, &cs, &cid, NULL, NULL, NULL);
    else if (cu->cuStreamGetCaptureInfo)
        call = "cuStreamGetCaptureInfo", r = cu->cuStreamGetCaptureInfo(s, &cs, &cid);
    else if (cu->cuStreamIsCapturing)
        call = "cuStreamIsCapturing", r = cu->cuStreamIsCapturing(s, &cs), cid = 1;
    else
        return MAPPING_OK; /* a driver before CUDA 10: nothing is ever captured */
    if (r == CU_ERROR_STREAM_CAPTURE_IMPLICIT) {
        *status = MAPPING_CAPTURE_IMPLICIT;
        return MAPPING_OK;
    }
    mapping_status st = mapping__cuda_check(r, call);
    if (st != MAPPING_OK)
        return st;
    *status = cs == CU_STREAM_CAPTURE_STATUS_ACTIVE_        ? MAPPING_CAPTURE_ACTIVE
              : cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED_ ? MAPPING_CAPTURE_INVALIDATED
                                                            : MAPPING_CAPTURE_NONE;
    if (id && *status != MAPPING_CAPTURE_NONE)
        *id = cid ? cid : 1;
    return MAPPING_OK;
}

mapping_status mapping__cuda_stream_capture_status(void *dev, void *stream, int *status, uint64_t *id)
{
    cuda_device *d = dev;
    *status = MAPPING_CAPTURE_NONE;
    if (id)
        *id = 0;
    mapping_status st;
    IN_CONTEXT(d, st = query(d, stream ? (cu_stream)stream : CU_STREAM_LEGACY_, status, id));
    return st;
}

bool mapping__cuda_capturing(cuda_device *d, cu_stream s)
{
    int status = MAPPING_CAPTURE_NONE;
    mapping_error_mark before;
    mapping__error_mark(&before);
    if (query(d, s ? s : CU_STREAM_LEGACY_, &status, NULL) != MAPPING_OK) {
        mapping__error_forget(&before); /* the call that follows reports the driver's error */
        return false;
    }
    return status != MAPPING_CAPTURE_NONE;
}

mapping_status mapping__cuda_capture_refusal(const char *what)
{
    return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                         "cuda: refused during a stream capture (CUDA graph): %s; call it outside the capture", what);
}
