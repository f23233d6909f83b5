/* Passing a SIGSEGV on to the handler installed before ours (signal_chain.h). */
#include "os/signal_chain.h"

#include <string.h>

/* After the previous handler returned: if it took ours out (restoring the
 * handler from before its own), install ours again above what is there. */
static void stay_installed(struct sigaction *previous, void (*ours)(int, siginfo_t *, void *))
{
    struct sigaction now;
    if (sigaction(SIGSEGV, NULL, &now) != 0 || ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == ours))
        return;
    if (!(now.sa_flags & SA_SIGINFO) && (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN))
        return; /* the fault is fatal: let it be */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = ours;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    struct sigaction before;
    if (sigaction(SIGSEGV, &sa, &before) == 0)
        *previous = before;
}

void mapping_os_sigsegv_chain(struct sigaction *previous, void (*ours)(int, siginfo_t *, void *), int sig,
                              siginfo_t *info, void *ctx)
{
    if (previous->sa_flags & SA_SIGINFO) {
        if (previous->sa_sigaction) {
            previous->sa_sigaction(sig, info, ctx);
            stay_installed(previous, ours);
            return;
        }
    } else if (previous->sa_handler != SIG_DFL && previous->sa_handler != SIG_IGN) {
        previous->sa_handler(sig);
        stay_installed(previous, ours);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGSEGV, &dfl, NULL);
}
