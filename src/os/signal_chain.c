/* Passing a SIGSEGV on to the handler installed before ours (signal_chain.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "os/signal_chain.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static bool is_ours(const struct sigaction *sa, void (*ours)(int, siginfo_t *, void *))
{
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == ours;
}

static bool is_default_or_ignored(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && (sa->sa_handler == SIG_DFL || sa->sa_handler == SIG_IGN);
}

static void fill_ours(struct sigaction *sa, void (*ours)(int, siginfo_t *, void *))
{
    memset(sa, 0, sizeof *sa);
    sa->sa_sigaction = ours;
    sa->sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa->sa_mask);
}

int mapping_os_sigsegv_install(void (*ours)(int, siginfo_t *, void *), struct sigaction *previous)
{
    struct sigaction sa;
    fill_ours(&sa, ours);
    if (sigaction(SIGSEGV, &sa, previous) != 0)
        return -errno;
    /* The handler stays installed for the process's life: the code it
     * points to must too (dlclose of libmapping.so would unmap it). */
    Dl_info self;
    if (dladdr((void *)(uintptr_t)ours, &self) && self.dli_fname)
        (void)dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    return 0;
}

/* After the previous handler returned: if it took ours out (restoring the
 * handler from before its own), install ours again above what is there.
 * Only then: a handler that was installed above ours before the call (one
 * installed after the library, which chained down to us) stays where it is,
 * else it and ours would call each other without end. */
static void stay_installed(struct sigaction *previous, void (*ours)(int, siginfo_t *, void *))
{
    struct sigaction now;
    if (sigaction(SIGSEGV, NULL, &now) != 0 || is_ours(&now, ours) || is_default_or_ignored(&now))
        return; /* still ours; or the fault is to be fatal: let it be */
    struct sigaction sa;
    fill_ours(&sa, ours);
    struct sigaction before;
    if (sigaction(SIGSEGV, &sa, &before) == 0)
        *previous = before;
}

void mapping_os_sigsegv_chain(struct sigaction *previous, void (*ours)(int, siginfo_t *, void *), int sig,
                              siginfo_t *info, void *ctx)
{
    struct sigaction call = *previous, installed;
    bool ours_on_top = sigaction(SIGSEGV, NULL, &installed) == 0 && is_ours(&installed, ours);
    if (is_default_or_ignored(&call) || ((call.sa_flags & SA_SIGINFO) && !call.sa_sigaction)) {
        /* No previous handler: the default action, as without the library
         * (an ignored SIGSEGV from a fault is fatal too). */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGSEGV, &dfl, NULL);
        return;
    }
    /* What the kernel would have done delivering to it: a one-shot handler
     * (SA_RESETHAND) is replaced by the default action for the next fault;
     * its sa_mask, and SIGSEGV itself unless SA_NODEFER, are blocked while
     * it runs (a handler that faults in turn is then killed, not re-entered). */
    if (call.sa_flags & SA_RESETHAND) {
        memset(previous, 0, sizeof *previous);
        previous->sa_handler = SIG_DFL;
        sigemptyset(&previous->sa_mask);
    }
    sigset_t block = call.sa_mask, saved;
    if (!(call.sa_flags & SA_NODEFER))
        sigaddset(&block, SIGSEGV);
    bool masked = pthread_sigmask(SIG_BLOCK, &block, &saved) == 0;
    if (call.sa_flags & SA_SIGINFO)
        call.sa_sigaction(sig, info, ctx);
    else
        call.sa_handler(sig);
    if (masked)
        pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (ours_on_top)
        stay_installed(previous, ours);
}
