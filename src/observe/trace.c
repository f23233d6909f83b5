/* Tracing, the public side: start and stop a Chrome Trace Event JSON
 * timeline (the recorder is os/trace.c). */
#include "core/core.h"
#include "os/trace.h"

mapping_status mapping_trace_start(const char *path)
{
    static const char fn[] = "mapping_trace_start";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "path", path)))
        return st;
    if (!*path)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: path is empty", fn);
    return mapping__trace_start(fn, path);
}

mapping_status mapping_trace_stop(void)
{
    return mapping__trace_stop();
}

int mapping_trace_active(void)
{
    return atomic_load_explicit(&mapping__trace_active, memory_order_relaxed) ? 1 : 0;
}
