/*
 * Passing a SIGSEGV on: the library's SIGSEGV handlers (the race checker,
 * mprotect write tracking) handle only faults on pages they protect and
 * give every other fault to the handler installed before theirs, as the
 * kernel would have delivered it without the library.
 *
 * Everything here that a handler calls is async-signal-safe: system calls
 * (sigaction, pthread_sigmask, madvise, tgkill), atomics, no lock, no
 * allocation, no stdio; errno is left as it was found.
 */
#ifndef MAPPING_TRACK_SIGNAL_CHAIN_H
#define MAPPING_TRACK_SIGNAL_CHAIN_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { MAPPING_TRACK_SIGACTION_WORDS = (sizeof(struct sigaction) + sizeof(unsigned long) - 1) / sizeof(unsigned long) };

/* One library handler's place in the chain: the handler, and the one
 * installed before it. Handlers on any thread read (and rarely replace)
 * the previous handler without a lock: two copies, the current one named
 * by `state` (a version, times 2, plus 1 while a writer fills the other
 * copy), so a reader never waits and never sees a half-written one.
 * Zero-initialised (static storage) before install. */
typedef struct mapping_track_sigchain {
    void (*ours)(int, siginfo_t *, void *);
    _Atomic unsigned      state;
    _Atomic unsigned long previous[2][MAPPING_TRACK_SIGACTION_WORDS];
} mapping_track_sigchain;

/* Installs `ours` for SIGSEGV (SA_SIGINFO | SA_NODEFER, with the previous
 * handler's SA_ONSTACK and SA_RESTART: where the kernel runs it, on which
 * stack, and whether a system call it interrupts restarts, stay the
 * program's choice), recording the handler that was there, and keeps the
 * library loaded for good (RTLD_NODELETE): a dlclose must not leave the
 * handler pointing at unmapped code. 0 or -errno. Not async-signal-safe;
 * once per chain. */
int mapping_track_sigsegv_install(mapping_track_sigchain *chain, void (*ours)(int, siginfo_t *, void *));

/* For a SIGSEGV that is not ours: does what the kernel would have done
 * without our handler.
 * - The previous handler is called with its own arguments (SA_SIGINFO or
 *   not), its sa_mask (and SIGSEGV, unless SA_NODEFER) blocked while it
 *   runs; with SA_RESETHAND it is called once (the first caller takes it,
 *   on any thread), the default action standing in from then on.
 * - The default action, or an ignored SIGSEGV raised by a fault (the
 *   kernel forces the default action on those): the process dies by
 *   SIGSEGV at once, the signal queued again with its siginfo to be
 *   delivered as the handler returns (the core shows the faulting
 *   instruction), whether or not the access would fault again.
 * - An ignored SIGSEGV sent by kill, tgkill or sigqueue (si_code <= 0):
 *   discarded.
 * - A previous handler that recovers may replace the installed handler
 *   (LLVM's takes itself out and puts back the one from before it): the
 *   handler that was installed when the fault came is put back, and the
 *   one the previous handler installed becomes our previous handler.
 *   Nothing else is ever installed by this, so a handler installed above
 *   ours that chains to it is never put below ours (they would call each
 *   other without end). */
void mapping_track_sigsegv_chain(mapping_track_sigchain *chain, int sig, siginfo_t *info, void *ctx);

/* Whether the access that raised this SEGV_ACCERR fault would pass if run
 * again now: on x86-64, a data read or write (the page-fault error code in
 * ctx) whose page madvise(MADV_POPULATE_READ / _WRITE) can fault in with
 * that access (Linux 5.14). For a fault whose protection one of our
 * handlers lifted between the fault and the handler (a thread preempted
 * there): retrying it is what the program's access needs. False where it
 * cannot tell (other architectures, an older kernel, an instruction
 * fetch) and after many passes for one page in a short time (something
 * protects it again each time: not a loop). page: the base page size. */
bool mapping_track_fault_passes_now(const siginfo_t *info, void *ctx, size_t page);

/* Where one of our handlers protected pages at some time: a set of 2 MiB
 * chunks (hashed, 4096 bits: a false hit costs one madvise). A late fault
 * is only taken for ours (mapping_track_fault_passes_now) inside it, so that
 * a fault far from our memory goes to the program's handler exactly as
 * without the library, even one whose cause another thread removed
 * meanwhile. Zero-initialised; add is not async-signal-safe-critical (it
 * only sets bits), has is. */
typedef struct mapping_track_fault_history {
    _Atomic uint64_t bits[64];
} mapping_track_fault_history;
void mapping_track_fault_history_add(mapping_track_fault_history *h, uintptr_t lo, uintptr_t hi);
bool mapping_track_fault_history_has(const mapping_track_fault_history *h, uintptr_t addr);

#endif
