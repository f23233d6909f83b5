/* Which stream's worker thread this is: a back end that runs a stream's
 * host functions on a thread of that stream says so once, when the thread
 * starts, so that core can refuse a host function that would wait for (or
 * destroy) its own stream: that would deadlock. */
#include <signal.h>
#include <stdbool.h>
#include "os/os.h"

/* Initial-exec: MAPPING_CHECK=races' signal handler reads it (track/race_guard.c). */
static _Thread_local __attribute__((tls_model("initial-exec"))) const void *worker_of;

void mapping_os_set_worker_stream(const void *stream_state)
{
    worker_of = stream_state;
}

const void *mapping_os_worker_stream(void)
{
    return worker_of;
}

/* The synchronous signals: raised by a fault in the thread that faults. */
static const int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};

int mapping_os_thread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    sigset_t mask, old;
    sigfillset(&mask);
    for (size_t i = 0; i < sizeof fault_signals / sizeof *fault_signals; i++)
        sigdelset(&mask, fault_signals[i]);
    /* SIG_SETMASK, not SIG_BLOCK: a fault signal the creating thread
     * blocks must not stay blocked in the new one. */
    bool masked = pthread_sigmask(SIG_SETMASK, &mask, &old) == 0;
    int err = pthread_create(thread, attr, fn, arg);
    if (masked)
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}
