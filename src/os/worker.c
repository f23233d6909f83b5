/* Which stream's worker thread this is: a back end that runs a stream's
 * host functions on a thread of that stream says so once, when the thread
 * starts, so that core can refuse a host function that would wait for (or
 * destroy) its own stream: that would deadlock. */
#include "os/os.h"

/* Initial-exec: MAPPING_CHECK=races' signal handler reads it (os/race_guard.c). */
static _Thread_local __attribute__((tls_model("initial-exec"))) const void *worker_of;

void mapping_os_set_worker_stream(const void *stream_state)
{
    worker_of = stream_state;
}

const void *mapping_os_worker_stream(void)
{
    return worker_of;
}
