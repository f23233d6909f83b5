/*
 * Passing a SIGSEGV on: the library's SIGSEGV handlers (the race checker,
 * mprotect write tracking) handle only faults on pages they protect and
 * give every other fault to the handler installed before theirs.
 */
#ifndef MAPPING_OS_SIGNAL_CHAIN_H
#define MAPPING_OS_SIGNAL_CHAIN_H

#include <signal.h>

/* Installs `ours` (SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER) for
 * SIGSEGV, saving what was there in *previous, and keeps the library loaded
 * for good (RTLD_NODELETE): a dlclose must not leave the handler pointing
 * at unmapped code. 0 or -errno. */
int mapping_os_sigsegv_install(void (*ours)(int, siginfo_t *, void *), struct sigaction *previous);

/* Calls `previous` (as sigaction saved it) for a fault that is not ours, as
 * the kernel would have delivered it: its sa_mask (and SIGSEGV, unless
 * SA_NODEFER) blocked during the call, and with SA_RESETHAND *previous
 * becomes SIG_DFL first (the next foreign fault is fatal). With no previous
 * handler (SIG_DFL or SIG_IGN) it restores the default action: the faulting
 * instruction runs again and the process dies as it would have without the
 * library. A previous handler that recovers may have put back the handler
 * installed before it (LLVM's, which PoCL loads, does so): then, if ours was
 * the installed handler when the fault came, `ours` is installed again,
 * above that one, which becomes *previous (a handler installed above ours
 * is never replaced). Async-signal-safe. */
void mapping_os_sigsegv_chain(struct sigaction *previous, void (*ours)(int, siginfo_t *, void *), int sig,
                              siginfo_t *info, void *ctx);

#endif
