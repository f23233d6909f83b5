/*
 * The SIGSEGV handling behind mprotect write tracking (and the race
 * checker, which shares its chaining): a fault that is not the library's
 * must behave exactly as it would without the library, and the library's
 * own faults must never crash, hang or lose a write, whatever the program
 * does with signals (handlers installed before or after the library, masks,
 * alternate stacks, siglongjmp, faults inside other signal handlers,
 * threads).
 *
 * Every test forces MAPPING_TRACK=mprotect (set before this process's first
 * call into the library, which chooses the mechanism once) and runs on the
 * host back end only: signal handling does not depend on the back end.
 * A case that installs process-wide handlers or ends in a crash runs in a
 * forked child, which reports by its exit status (0: as expected) and dies
 * by SIGALRM if a handler loops.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"

static size_t pg(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* mprotect tracking for this process, on the host back end. */
static void use_mprotect(void)
{
    if (strcmp(test_backend(), "host") != 0)
        test_skip("signal handling does not depend on the back end: run on host");
    setenv("MAPPING_TRACK", "mprotect", 1); /* before the first call: the choice is made once */
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_MPROTECT)
        test_skip("no mprotect tracking here: %s", mapping_write_tracking_description());
}

/* ThreadSanitizer runs a program's handler for an asynchronous signal
 * later, from its own runtime, with every signal blocked (a tracked
 * write there is killed), and sets errno to 99 around handlers: the
 * tests of those cases do not apply under it. */
static void not_under_tsan(void)
{
    if (TEST_TSAN)
        test_skip("ThreadSanitizer delivers asynchronous signals itself, later, with all signals blocked");
}

static void *map_pages(size_t n, int prot)
{
    void *p = mmap(NULL, n * pg(), prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int install(int sig, void (*info)(int, siginfo_t *, void *), void (*plain)(int), int flags,
                   const sigset_t *mask, struct sigaction *previous)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    if (info)
        sa.sa_sigaction = info;
    else
        sa.sa_handler = plain;
    sa.sa_flags = flags | (info ? SA_SIGINFO : 0);
    if (mask)
        sa.sa_mask = *mask;
    else
        sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, previous);
}

/* Calls a handler saved by sigaction, as a handler that chains does. */
static void call_saved(const struct sigaction *sa, int sig, siginfo_t *info, void *ctx)
{
    if (sa->sa_flags & SA_SIGINFO)
        sa->sa_sigaction(sig, info, ctx);
    else if (sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN)
        sa->sa_handler(sig);
}

/* ---- children ---- */

/* Runs fn in a forked child (a hang ends as SIGALRM, no core file) and
 * returns its wait status. */
static int in_child(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        _exit(fn());
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    return status;
}

static void check_exited_0(int status)
{
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail(__FILE__, __LINE__, "the child: %s %d, expected exit status 0",
                  WIFEXITED(status) ? "exit status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static void check_killed_by(int status, int sig)
{
    if (!WIFSIGNALED(status) || WTERMSIG(status) != sig)
        test_fail(__FILE__, __LINE__, "the child: %s %d, expected death by signal %d",
                  WIFEXITED(status) ? "exit status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                  sig);
}

static mapping_device  *child_dev;
static mapping_mirror  *child_m;
enum { CHILD_PAGES = 16 };

/* In a child: a tracked mirror of CHILD_PAGES pages, synced (so protected). 0 or 3. */
static int child_mirror(void)
{
    mapping_device_desc desc = {.backend = "host"};
    if (mapping_open(&desc, &child_dev) ||
        mapping_mirror_create(child_dev, CHILD_PAGES * pg(), MAPPING_MIRROR_TRACK_WRITES, &child_m) ||
        mapping_mirror_sync_to_gpu(NULL, child_m))
        return 3;
    return 0;
}

/* In a child: writes v at page p of the mirror (a tracked fault), syncs,
 * and checks that the device has it. 0 or 4. */
static int child_tracked_write(size_t p, unsigned char v)
{
    unsigned char *cpu = mapping_mirror_cpu(child_m), got = 0;
    ((volatile unsigned char *)cpu)[p * pg() + 7] = v;
    if (mapping_mirror_sync_to_gpu(NULL, child_m) ||
        mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(child_m), mapping_mirror_gpu_offset(child_m) + p * pg() + 7,
                                  &got, 1) ||
        got != v)
        return 4;
    return 0;
}

/* ---- the default action and an ignored SIGSEGV ---- */

static int real_fault_after_tracked_writes(bool unmapped)
{
    volatile unsigned char *closed = map_pages(1, PROT_NONE);
    if (!closed || child_mirror() || child_tracked_write(3, 0x31))
        return 3;
    if (unmapped)
        munmap((void *)closed, pg());
    closed[1] = 1; /* a genuine crash: SEGV_ACCERR, or SEGV_MAPERR where unmapped */
    return 5;
}

/* The default action before the library: said explicitly, as a
 * sanitizer's runtime may have installed a handler of its own. */
static void default_segv(void)
{
    signal(SIGSEGV, SIG_DFL);
}

static int accerr_with_default(void)
{
    default_segv();
    return real_fault_after_tracked_writes(false);
}

static int maperr_with_default(void)
{
    default_segv();
    return real_fault_after_tracked_writes(true);
}

static int accerr_with_ignored(void)
{
    signal(SIGSEGV, SIG_IGN); /* before the library: its previous handler */
    return real_fault_after_tracked_writes(false);
}

/* With no handler before the library's, a genuine fault kills the process
 * by SIGSEGV, once (no loop): as without the library. An ignored SIGSEGV
 * does not survive a fault either (the kernel forces the default action
 * for a synchronous SIGSEGV that is ignored or blocked). */
TEST(signal_chain_real_fault_kills_by_sigsegv_with_the_default_or_an_ignored_action)
{
    use_mprotect();
    check_killed_by(in_child(accerr_with_default), SIGSEGV);
    check_killed_by(in_child(maperr_with_default), SIGSEGV);
    check_killed_by(in_child(accerr_with_ignored), SIGSEGV);
}

static int sent_by_kill(void)
{
    default_segv();
    if (child_mirror() || child_tracked_write(2, 0x21))
        return 3;
    kill(getpid(), SIGSEGV);
    return 5; /* survived */
}

static int sent_by_pthread_kill(void)
{
    default_segv();
    if (child_mirror() || child_tracked_write(2, 0x21))
        return 3;
    pthread_kill(pthread_self(), SIGSEGV);
    return 5;
}

static int sent_by_sigqueue(void)
{
    default_segv();
    if (child_mirror() || child_tracked_write(2, 0x21))
        return 3;
    sigqueue(getpid(), SIGSEGV, (union sigval){.sival_int = 7});
    return 5;
}

/* A SIGSEGV sent by kill(2) (or pthread_kill, sigqueue) is not a fault:
 * nothing runs again after the handler returns. With the default action
 * before the library's handler, it must still end the process by SIGSEGV
 * (the library used to restore the default action and return: the
 * process went on, without the library's handler, and its next tracked
 * write killed it). */
TEST(signal_chain_sigsegv_sent_by_kill_ends_the_process_with_the_default_action)
{
    use_mprotect();
    check_killed_by(in_child(sent_by_kill), SIGSEGV);
    check_killed_by(in_child(sent_by_pthread_kill), SIGSEGV);
    check_killed_by(in_child(sent_by_sigqueue), SIGSEGV);
}

static int ignored_sent_by_kill(void)
{
    signal(SIGSEGV, SIG_IGN);
    if (child_mirror() || child_tracked_write(2, 0x21))
        return 3;
    kill(getpid(), SIGSEGV);
    pthread_kill(pthread_self(), SIGSEGV);
    return child_tracked_write(5, 0x55) ? 6 : 0; /* tracking goes on */
}

/* An ignored SIGSEGV sent by kill is discarded (as the kernel does), and
 * the library's handler stays: tracked writes go on working (the library
 * used to put the default action in its place: the next tracked write
 * killed the process). */
TEST(signal_chain_ignored_sigsegv_sent_by_kill_is_discarded_and_tracking_goes_on)
{
    use_mprotect();
    check_exited_0(in_child(ignored_sent_by_kill));
}

/* ---- the previous handler: mask, flags, arguments ---- */

static volatile unsigned char *closed_page;
static volatile sig_atomic_t seen_calls, seen_sig, seen_usr_blocked, seen_other_blocked, seen_segv_blocked, seen_code,
    seen_ctx, seen_on_altstack, seen_addr_ok;

/* usr: in the handler's sa_mask; other: not (so not blocked while it runs). */
static void record_and_open(int sig, siginfo_t *info, void *ctx, int usr, int other)
{
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, NULL, &now);
    stack_t ss;
    seen_calls++;
    seen_sig = sig;
    seen_usr_blocked = sigismember(&now, usr);
    seen_other_blocked = sigismember(&now, other) || sigismember(&now, SIGALRM);
    seen_segv_blocked = sigismember(&now, SIGSEGV);
    seen_on_altstack = sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK);
    if (info) {
        seen_code = info->si_code;
        seen_addr_ok = (uintptr_t)info->si_addr == (uintptr_t)closed_page + 5;
    }
    seen_ctx = ctx != NULL;
    mprotect((void *)closed_page, pg(), PROT_READ | PROT_WRITE);
}

static void info_handler(int sig, siginfo_t *info, void *ctx)
{
    record_and_open(sig, info, ctx, SIGUSR1, SIGUSR2);
}

static void plain_handler(int sig)
{
    record_and_open(sig, NULL, NULL, SIGUSR2, SIGUSR1);
}

/* The mask after the fault: the handler's mask is gone again. */
static bool mask_clean(void)
{
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, NULL, &now);
    return !sigismember(&now, SIGSEGV) && !sigismember(&now, SIGUSR1) && !sigismember(&now, SIGUSR2);
}

static int previous_with_siginfo_and_mask(void)
{
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGUSR1);
    closed_page = map_pages(1, PROT_NONE);
    if (!closed_page || install(SIGSEGV, info_handler, NULL, 0, &mask, NULL) || child_mirror() ||
        child_tracked_write(1, 1))
        return 3;
    closed_page[5] = 9;
    if (seen_calls != 1 || seen_sig != SIGSEGV || !seen_usr_blocked || seen_other_blocked || !seen_segv_blocked ||
        seen_code != SEGV_ACCERR || !seen_addr_ok || !seen_ctx)
        return 10;
    if (!mask_clean() || closed_page[5] != 9)
        return 11;
    return child_tracked_write(2, 2) ? 12 : 0;
}

static int previous_plain_with_nodefer(void)
{
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGUSR2);
    closed_page = map_pages(1, PROT_NONE);
    if (!closed_page || install(SIGSEGV, NULL, plain_handler, SA_NODEFER, &mask, NULL) || child_mirror() ||
        child_tracked_write(1, 1))
        return 3;
    closed_page[5] = 9;
    if (seen_calls != 1 || seen_sig != SIGSEGV || !seen_usr_blocked || seen_other_blocked || seen_segv_blocked)
        return 10;
    if (!mask_clean() || closed_page[5] != 9)
        return 11;
    return child_tracked_write(2, 2) ? 12 : 0;
}

/* The handler installed before the library gets a foreign fault as the
 * kernel would give it: its arguments (SA_SIGINFO or plain), its sa_mask
 * blocked while it runs (and nothing else: not what the library's own
 * handler blocks), SIGSEGV blocked too unless SA_NODEFER, and the mask
 * restored after it returns. */
TEST(signal_chain_previous_handler_runs_with_its_mask_and_arguments)
{
    use_mprotect();
    check_exited_0(in_child(previous_with_siginfo_and_mask));
    check_exited_0(in_child(previous_plain_with_nodefer));
}

static int previous_on_the_stack_it_asked_for(int onstack)
{
    stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0};
    closed_page = map_pages(1, PROT_NONE);
    if (!ss.ss_sp || !closed_page || sigaltstack(&ss, NULL) ||
        install(SIGSEGV, info_handler, NULL, onstack, NULL, NULL) || child_mirror() || child_tracked_write(1, 1))
        return 3;
    closed_page[5] = 9;
    if (seen_calls != 1)
        return 10;
    if (!seen_on_altstack != !onstack)
        return 11; /* ran on the alternate stack although it did not ask for it, or the other way round */
    return child_tracked_write(2, 2) ? 12 : 0;
}

static int previous_without_onstack(void)
{
    return previous_on_the_stack_it_asked_for(0);
}

static int previous_with_onstack(void)
{
    return previous_on_the_stack_it_asked_for(SA_ONSTACK);
}

/* SA_ONSTACK is the previous handler's choice: on a thread with an
 * alternate stack, a handler installed without it runs on the thread's
 * stack, as it would without the library (the library's handler used to
 * run, and call it, on the alternate stack whatever it asked for). */
TEST(signal_chain_previous_handler_runs_on_the_alternate_stack_only_if_it_asked)
{
    use_mprotect();
    check_exited_0(in_child(previous_without_onstack));
    check_exited_0(in_child(previous_with_onstack));
}

static int pipe_fds[2];
static _Atomic int read_result = -2, read_errno, reader_tid;

static void *blocking_read(void *arg)
{
    (void)arg;
    atomic_store(&reader_tid, (int)gettid());
    char c;
    ssize_t r = read(pipe_fds[0], &c, 1);
    atomic_store(&read_errno, errno);
    atomic_store(&read_result, (int)r);
    return NULL;
}

/* Waits (up to 10 s) until the thread whose id *tid will hold sleeps in
 * the kernel (state S in /proc). */
static bool wait_until_sleeping(_Atomic int *tid)
{
    for (int i = 0; i < 10000; i++, usleep(1000)) {
        char path[64], line[256];
        if (!atomic_load(tid))
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", atomic_load(tid));
        FILE *f = fopen(path, "r");
        if (!f)
            return false;
        char *got = fgets(line, sizeof line, f);
        fclose(f);
        const char *state = got ? strrchr(line, ')') : NULL;
        if (state && state[1] == ' ' && state[2] == 'S') {
            usleep(20000);
            return true;
        }
    }
    return false;
}

static void counting_plain(int sig)
{
    (void)sig;
    seen_calls++;
}

static int previous_without_restart(void)
{
    if (pipe(pipe_fds) || install(SIGSEGV, NULL, counting_plain, 0, NULL, NULL) || child_mirror() ||
        child_tracked_write(1, 1))
        return 3;
    pthread_t reader;
    if (pthread_create(&reader, NULL, blocking_read, NULL))
        return 3;
    if (!wait_until_sleeping(&reader_tid)) /* the reader is in read(2) */
        return 3;
    pthread_kill(reader, SIGSEGV);
    usleep(300000);
    if (write(pipe_fds[1], "x", 1) != 1) /* a restarted read returns this byte */
        return 3;
    pthread_join(reader, NULL);
    if (seen_calls != 1)
        return 10;
    if (atomic_load(&read_result) != -1 || atomic_load(&read_errno) != EINTR)
        return 11; /* restarted: the library's SA_RESTART, not the program's choice */
    return child_tracked_write(2, 2) ? 12 : 0;
}

/* SA_RESTART too: a SIGSEGV sent to a thread blocked in read(2) interrupts
 * the call (EINTR) when the program's handler was installed without it. */
TEST(signal_chain_previous_handler_without_sa_restart_interrupts_a_blocking_read)
{
    use_mprotect();
    check_exited_0(in_child(previous_without_restart));
}

/* ---- stack overflow, siglongjmp ---- */

static sigjmp_buf overflow_jump;
static volatile sig_atomic_t overflow_handled;
static volatile int depth_limit = 1 << 30;

static void overflow_handler(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)info;
    (void)ctx;
    stack_t ss;
    if (sigaltstack(NULL, &ss) != 0 || !(ss.ss_flags & SS_ONSTACK))
        _exit(13); /* not on the alternate stack: could not have run at all */
    overflow_handled++;
    siglongjmp(overflow_jump, 1);
}

static int __attribute__((noinline)) recurse(int depth)
{
    volatile char frame[512];
    frame[0] = (char)depth;
    if (depth > depth_limit)
        return frame[0];
    return recurse(depth + 1) + frame[0];
}

static void *overflowing_thread(void *arg)
{
    (void)arg;
    stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0}, old;
    if (!ss.ss_sp || sigaltstack(&ss, &old))
        return (void *)1;
    if (sigsetjmp(overflow_jump, 1) == 0)
        recurse(0);
    sigaltstack(&old, NULL); /* the thread's own again (AddressSanitizer unmaps it at the thread's end) */
    free(ss.ss_sp);
    return (void *)(uintptr_t)(overflow_handled == 1 ? 0 : 2);
}

static int overflow_with_onstack_handler(void)
{
    if (install(SIGSEGV, overflow_handler, NULL, SA_ONSTACK, NULL, NULL) || child_mirror() ||
        child_tracked_write(1, 1))
        return 3;
    pthread_attr_t attr;
    pthread_t t;
    void *rc = (void *)1;
    if (pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, 256 << 10) ||
        pthread_create(&t, &attr, overflowing_thread, NULL) || pthread_join(t, &rc))
        return 3;
    if (rc)
        return 10 + (int)(uintptr_t)rc;
    return child_tracked_write(2, 2) ? 12 : 0;
}

/* A stack overflow on a thread with an alternate stack reaches the
 * program's SA_ONSTACK handler (installed before the library) on that
 * stack, and it may siglongjmp out; tracking goes on. */
TEST(signal_chain_stack_overflow_reaches_an_onstack_handler_installed_before)
{
    use_mprotect();
    check_exited_0(in_child(overflow_with_onstack_handler));
}

static sigjmp_buf escape;

static void escaping_handler(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    if ((uintptr_t)info->si_addr - (uintptr_t)closed_page >= pg())
        _exit(13);
    seen_calls++;
    siglongjmp(escape, 1);
}

static int siglongjmp_out_of_previous(void)
{
    sigset_t mask, before, after;
    sigemptyset(&mask);
    sigaddset(&mask, SIGUSR2);
    closed_page = map_pages(1, PROT_NONE);
    if (!closed_page || install(SIGSEGV, escaping_handler, NULL, 0, &mask, NULL) || child_mirror())
        return 3;
    pthread_sigmask(SIG_SETMASK, NULL, &before);
    for (int i = 0; i < 200; i++) {
        if (sigsetjmp(escape, 1) == 0) {
            closed_page[3] = 1;
            return 10; /* the write went through */
        }
        pthread_sigmask(SIG_SETMASK, NULL, &after);
        if (sigismember(&after, SIGSEGV) || sigismember(&after, SIGUSR2))
            return 11;
        if (i % 20 == 0 && child_tracked_write((size_t)(i / 20) % CHILD_PAGES, (unsigned char)i))
            return 12;
    }
    return seen_calls == 200 ? 0 : 14;
}

/* The previous handler leaves by siglongjmp, again and again: the mask
 * comes back, it is called each time, and tracked writes go on. */
TEST(signal_chain_siglongjmp_out_of_the_previous_handler_keeps_tracking)
{
    use_mprotect();
    check_exited_0(in_child(siglongjmp_out_of_previous));
}

static sigjmp_buf     abandon;
static unsigned char *held_page;
static _Atomic int    abandoned;

static void jumping_usr1(int sig)
{
    (void)sig;
    atomic_store(&abandoned, 1);
    siglongjmp(abandon, 1);
}

static void *write_then_jump(void *arg)
{
    (void)arg;
    if (sigsetjmp(abandon, 1) == 0)
        held_page[9] = 0x21; /* faults; the library's handler holds 200 ms (test knob) */
    return NULL;
}

static int siglongjmp_over_the_librarys_handler(void)
{
    setenv("MAPPING_TRACK_TEST_OPEN_DELAY_US", "200000", 1); /* read when the handler is installed */
    if (child_mirror() || install(SIGUSR1, NULL, jumping_usr1, 0, NULL, NULL))
        return 3;
    held_page = (unsigned char *)mapping_mirror_cpu(child_m) + 2 * pg();
    int fd[2];
    if (pipe(fd) || write(fd[1], "x", 1) != 1)
        return 3;
    pthread_t w;
    if (pthread_create(&w, NULL, write_then_jump, NULL))
        return 3;
    /* The page is writable once the handler has opened it (read(2): EFAULT before). */
    while (read(fd[0], held_page + 1, 1) != 1)
        if (errno != EFAULT)
            return 3;
    pthread_kill(w, SIGUSR1); /* arrives while the library's handler is between opening and recording */
    pthread_join(w, NULL);
    alarm(5);
    if (mapping_mirror_sync_to_gpu(NULL, child_m)) /* waited forever for the abandoned handler */
        return 10;
    mapping_mirror_destroy(child_m); /* so did this */
    return atomic_load(&abandoned) ? 0 : 11;
}

/* A program's signal handler that leaves by siglongjmp, for a signal that
 * comes while the library's handler is running on that thread: the
 * library's handler is not abandoned halfway (it kept a count that the
 * next sync and the mirror's end waited on forever); the signal waits
 * until it returns. */
TEST(signal_chain_siglongjmp_from_a_signal_arriving_in_the_librarys_handler_hangs_nothing)
{
    not_under_tsan();
    use_mprotect();
    check_exited_0(in_child(siglongjmp_over_the_librarys_handler));
}

/* ---- handlers that change the chain ---- */

static struct sigaction before_remover, before_top;
static volatile sig_atomic_t recovered, remover_calls, top_calls;

static void recovering(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    if ((uintptr_t)info->si_addr - (uintptr_t)closed_page >= pg())
        _exit(13); /* a fault that is not its own: a tracked write came here */
    recovered++;
    mprotect((void *)closed_page, pg(), PROT_READ | PROT_WRITE);
}

/* As LLVM's handler does: puts back the handler from before its own and
 * returns, so that the fault comes again to that one. */
static void remover(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)info;
    (void)ctx;
    remover_calls++;
    sigaction(SIGSEGV, &before_remover, NULL);
}

/* A crash reporter installed after the library, which chains down. */
static void top_reporter(int sig, siginfo_t *info, void *ctx)
{
    top_calls++;
    call_saved(&before_top, sig, info, ctx);
}

static int remover_under_a_top_handler(void)
{
    closed_page = map_pages(1, PROT_NONE);
    if (!closed_page || install(SIGSEGV, recovering, NULL, 0, NULL, NULL) ||
        install(SIGSEGV, remover, NULL, SA_NODEFER, NULL, &before_remover) || child_mirror() ||
        child_tracked_write(1, 1) || install(SIGSEGV, top_reporter, NULL, 0, NULL, &before_top))
        return 3;
    closed_page[5] = 9; /* top -> library -> remover (takes itself out) ... -> recovering */
    if (remover_calls != 1 || recovered != 1 || closed_page[5] != 9)
        return 10;
    if (child_tracked_write(4, 4)) /* went to `recovering` (exit 13) when the top handler had been taken out */
        return 11;
    struct sigaction now;
    if (sigaction(SIGSEGV, NULL, &now) || !(now.sa_flags & SA_SIGINFO) || now.sa_sigaction != top_reporter)
        return 12;
    mprotect((void *)closed_page, pg(), PROT_NONE);
    closed_page[6] = 8; /* top -> library -> recovering */
    if (recovered != 2 || remover_calls != 1)
        return 14;
    return child_tracked_write(5, 5) ? 15 : 0;
}

/* The handler before the library takes itself out when called (restoring
 * the one before it), while a handler installed after the library (which
 * chains to it) is on top: the top handler stays installed, the library
 * passes foreign faults to the restored handler from then on, and tracked
 * writes go on (the library only put itself back when it was on top: the
 * top handler and the library were both left out, and the next tracked
 * write went to the restored handler). */
TEST(signal_chain_keeps_the_top_handler_when_the_previous_one_takes_itself_out)
{
    use_mprotect();
    check_exited_0(in_child(remover_under_a_top_handler));
}

static void not_chaining(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    uintptr_t cpu = (uintptr_t)mapping_mirror_cpu(child_m);
    _exit((uintptr_t)info->si_addr - cpu < CHILD_PAGES * pg() ? 42 : 43);
}

static int handler_after_the_library_that_does_not_chain(void)
{
    if (child_mirror() || child_tracked_write(1, 1) || install(SIGSEGV, not_chaining, NULL, 0, NULL, NULL))
        return 3;
    ((volatile unsigned char *)mapping_mirror_cpu(child_m))[2 * pg()] = 1;
    return 5;
}

/* The documented rule: a SIGSEGV handler installed after the library's
 * that does not chain to it gets the library's faults, a tracked write
 * included (nothing can tell it from one that chains). */
TEST(signal_chain_handler_installed_after_the_library_without_chaining_gets_tracked_faults)
{
    use_mprotect();
    int status = in_child(handler_after_the_library_that_does_not_chain);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42);
}

/* ---- errno, other signals' handlers, blocked SIGSEGV ---- */

static volatile sig_atomic_t errno_ok;

static void errno_clobbering_check(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)info;
    (void)ctx;
    errno_ok = errno == 4242;
    mprotect((void *)closed_page, pg(), PROT_READ | PROT_WRITE);
}

static int errno_across_faults(void)
{
    closed_page = map_pages(1, PROT_NONE);
    if (!closed_page || install(SIGSEGV, errno_clobbering_check, NULL, 0, NULL, NULL) || child_mirror())
        return 3;
    volatile unsigned char *cpu = mapping_mirror_cpu(child_m);
    errno = 4242;
    atomic_signal_fence(memory_order_seq_cst);
    cpu[3 * pg()] = 1; /* the library's fault */
    atomic_signal_fence(memory_order_seq_cst);
    if (errno != 4242)
        return 10;
    closed_page[1] = 1; /* a foreign one, passed on */
    atomic_signal_fence(memory_order_seq_cst);
    if (errno != 4242 || !errno_ok)
        return 11;
    return 0;
}

/* errno is the program's across a tracked fault and on the way to the
 * handler a foreign fault is passed to. */
TEST(tracked_mprotect_faults_preserve_errno)
{
    not_under_tsan();
    use_mprotect();
    check_exited_0(in_child(errno_across_faults));
}

static unsigned char *usr_cpu;
static _Atomic unsigned usr_seq, usr_done;
static volatile sig_atomic_t usr_errno_bad;

static void writing_usr1(int sig)
{
    (void)sig;
    int e = errno;
    unsigned k = atomic_load(&usr_seq);
    size_t p = k % CHILD_PAGES;
    ((volatile unsigned char *)usr_cpu)[p * pg() + k % 64] = (unsigned char)(k | 1); /* a tracked fault in a handler */
    if (errno != e)
        usr_errno_bad = 1;
    atomic_store(&usr_done, k);
}

static _Atomic int usr_stop;

static void *signalled_thread(void *arg)
{
    (void)arg;
    stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0}, old;
    bool alt = ss.ss_sp && sigaltstack(&ss, &old) == 0; /* and on an alternate stack */
    while (!atomic_load(&usr_stop))
        usleep(100);
    if (alt)
        sigaltstack(&old, NULL); /* the thread's own again (AddressSanitizer unmaps it at the thread's end) */
    free(ss.ss_sp);
    return NULL;
}

/* Another signal's handler (SIGUSR1, on an alternate stack) writes the
 * tracked array: each write is carried by the next sync. */
TEST(tracked_mprotect_writes_from_another_signals_handler_are_carried)
{
    not_under_tsan();
    use_mprotect();
    mapping_device *dev = test_device();
    size_t n = CHILD_PAGES * pg();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    usr_cpu = mapping_mirror_cpu(m);
    CHECK(install(SIGUSR1, NULL, writing_usr1, SA_RESTART | SA_ONSTACK, NULL, NULL) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, signalled_thread, NULL) == 0);
    unsigned char *got = malloc(n);
    CHECK(got != NULL);
    for (unsigned k = 1; k <= 300; k++) {
        atomic_store(&usr_seq, k);
        CHECK(pthread_kill(t, SIGUSR1) == 0);
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (atomic_load(&usr_done) != k) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            CHECK(now.tv_sec - t0.tv_sec < 10);
        }
        if (k % 7 == 0 || k == 300) {
            CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
            CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), got, n));
            CHECK_BYTES(got, usr_cpu, n);
        }
    }
    atomic_store(&usr_stop, 1);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(!usr_errno_bad);
    free(got);
    mapping_mirror_destroy(m);
}

static int write_with_sigsegv_blocked(void)
{
    default_segv();
    if (child_mirror())
        return 3;
    sigset_t segv;
    sigemptyset(&segv);
    sigaddset(&segv, SIGSEGV);
    pthread_sigmask(SIG_BLOCK, &segv, NULL);
    ((volatile unsigned char *)mapping_mirror_cpu(child_m))[2 * pg()] = 1;
    return 5;
}

static void write_in_masked_handler(int sig)
{
    (void)sig;
    ((volatile unsigned char *)mapping_mirror_cpu(child_m))[2 * pg()] = 1;
}

static int write_in_a_handler_that_blocks_sigsegv(void)
{
    sigset_t all;
    sigfillset(&all);
    default_segv();
    if (child_mirror() || install(SIGUSR1, NULL, write_in_masked_handler, 0, &all, NULL))
        return 3;
    raise(SIGUSR1);
    return 5;
}

/* The documented limit of mprotect tracking: a thread that blocks SIGSEGV
 * (pthread_sigmask, or a handler whose sa_mask holds it) and writes a
 * tracked array is killed by the kernel with SIGSEGV (a synchronous
 * SIGSEGV cannot be blocked); no hang, no lost process-wide state. */
TEST(tracked_mprotect_write_with_sigsegv_blocked_is_killed_as_documented)
{
    use_mprotect();
    check_killed_by(in_child(write_with_sigsegv_blocked), SIGSEGV);
    check_killed_by(in_child(write_in_a_handler_that_blocks_sigsegv), SIGSEGV);
}

/* ---- system calls writing the array ---- */

/* docs/mirrors.md: with mprotect a system call cannot write a protected
 * page: read(2) into one fails with EFAULT; one that starts on a page
 * already written returns a short count (the bytes up to the protected
 * page); after a mark, the call writes and the sync carries it. */
TEST(tracked_mprotect_system_call_into_the_array_fails_or_stops_short_until_marked)
{
    use_mprotect();
    mapping_device *dev = test_device();
    size_t n = 8 * pg();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *cpu = mapping_mirror_cpu(m), *got = malloc(n), data[256];
    CHECK(got != NULL);
    memset(data, 0x5a, sizeof data);
    FILE *f = tmpfile();
    CHECK(f && fwrite(data, 1, sizeof data, f) == sizeof data && fflush(f) == 0);
    int fd = fileno(f);
    errno = 0;
    CHECK(pread(fd, cpu + 2 * pg() + 8, 100, 0) == -1 && errno == EFAULT);
    cpu[3 * pg()] = 1; /* page 3 written: writable until the next sync */
    CHECK(pread(fd, cpu + 4 * pg() - 10, 100, 0) == 10);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 4 * pg() - 10, 100));
    CHECK(pread(fd, cpu + 4 * pg() - 10, 100, 0) == 100);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), got, n));
    CHECK_BYTES(got, cpu, n);
    CHECK(got[4 * pg() - 10] == 0x5a && got[4 * pg() + 89] == 0x5a && got[3 * pg()] == 1);
    fclose(f);
    free(got);
    mapping_mirror_destroy(m);
}

/* ---- threads ---- */

enum { SAME_PAGE_THREADS = 8, SAME_PAGE_ROUNDS = 300 };
static pthread_barrier_t round_start, round_end;
static unsigned char *same_cpu;

static void *same_page_writer(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg;
    for (unsigned r = 0; r < SAME_PAGE_ROUNDS; r++) {
        pthread_barrier_wait(&round_start);
        size_t p = r % CHILD_PAGES;
        ((volatile unsigned char *)same_cpu)[p * pg() + t * 16 + r % 16] = (unsigned char)(r + t + 1);
        pthread_barrier_wait(&round_end);
    }
    return NULL;
}

/* Many threads fault on one page at the same moment, round after round,
 * with a sync between rounds: every write reaches the device. */
TEST(tracked_mprotect_threads_faulting_on_one_page_at_once_lose_no_write)
{
    use_mprotect();
    mapping_device *dev = test_device();
    size_t n = CHILD_PAGES * pg();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    same_cpu = mapping_mirror_cpu(m);
    CHECK(pthread_barrier_init(&round_start, NULL, SAME_PAGE_THREADS + 1) == 0);
    CHECK(pthread_barrier_init(&round_end, NULL, SAME_PAGE_THREADS + 1) == 0);
    pthread_t t[SAME_PAGE_THREADS];
    for (unsigned i = 0; i < SAME_PAGE_THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, same_page_writer, (void *)(uintptr_t)i) == 0);
    unsigned char *got = malloc(n);
    CHECK(got != NULL);
    for (unsigned r = 0; r < SAME_PAGE_ROUNDS; r++) {
        pthread_barrier_wait(&round_start);
        pthread_barrier_wait(&round_end);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
        if (r % 16 == 15 || r + 1 == SAME_PAGE_ROUNDS) {
            CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), got, n));
            CHECK_BYTES(got, same_cpu, n);
        }
    }
    for (unsigned i = 0; i < SAME_PAGE_THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    pthread_barrier_destroy(&round_start);
    pthread_barrier_destroy(&round_end);
    free(got);
    mapping_mirror_destroy(m);
}

/* A write fault held on its way to the library's handler: a handler
 * installed after the library (as the program may) waits before chaining
 * down, as a thread preempted between its fault and the library's handler
 * would. Meanwhile the test ends the mirror the fault was for. */
static struct sigaction below_holder;
static _Atomic int hold_state; /* 0 off, 1 armed, 2 holding a fault, 3 let it go */
static uintptr_t hold_lo, hold_hi;
static unsigned char *foreign_lo;
static size_t foreign_bytes;
static volatile sig_atomic_t foreign_faults;

static void holding_handler(int sig, siginfo_t *info, void *ctx)
{
    uintptr_t a = (uintptr_t)info->si_addr;
    int armed = 1;
    if (a >= hold_lo && a < hold_hi && atomic_compare_exchange_strong(&hold_state, &armed, 2)) {
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (atomic_load(&hold_state) != 3) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec > 20)
                _exit(17);
        }
    }
    call_saved(&below_holder, sig, info, ctx);
}

/* Installed before the library: a fault the library passes on as foreign
 * lands here, is counted, and the memory made writable. */
static void count_foreign(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    uintptr_t a = (uintptr_t)info->si_addr;
    if (a - (uintptr_t)foreign_lo >= foreign_bytes)
        abort();
    foreign_faults++;
    mprotect((void *)(a & ~(uintptr_t)(pg() - 1)), pg(), PROT_READ | PROT_WRITE);
}

static volatile unsigned char *held_write_at;

static void *held_writer(void *arg)
{
    (void)arg;
    *held_write_at = 0x6d;
    return NULL;
}

static void wait_for_hold(void)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&hold_state) != 2) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        CHECK(now.tv_sec - t0.tv_sec < 10);
    }
}

enum { LATE_OTHERS = 300 };

/* A write faults on a tracked array; before the library's handler runs,
 * the mirror ends and many other tracked mirrors begin and end. The late
 * fault is the library's (the page is writable now): it is retried, never
 * passed on as a foreign fault (the library remembered the last 16 ended
 * regions only: with more ended since, the fault went to the program's
 * handler, or killed a program without one). */
TEST(tracked_mprotect_late_fault_after_many_mirrors_ended_is_retried)
{
    use_mprotect();
    size_t n = 4 * pg();
    unsigned char *array = map_pages(4, PROT_READ | PROT_WRITE), *others = map_pages(2 * LATE_OTHERS, PROT_READ | PROT_WRITE);
    CHECK(array && others);
    foreign_lo = array;
    foreign_bytes = n;
    CHECK(install(SIGSEGV, count_foreign, NULL, 0, NULL, NULL) == 0);
    mapping_device *dev = test_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, array, n, MAPPING_MIRROR_TRACK_WRITES, &m)); /* installs the library's handler */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(install(SIGSEGV, holding_handler, NULL, SA_NODEFER, NULL, &below_holder) == 0);
    hold_lo = (uintptr_t)array;
    hold_hi = hold_lo + n;
    held_write_at = array + 2 * pg() + 3;
    atomic_store(&hold_state, 1);
    pthread_t w;
    CHECK(pthread_create(&w, NULL, held_writer, NULL) == 0);
    wait_for_hold();
    mapping_mirror_destroy(m); /* the page is writable now */
    for (int i = 0; i < LATE_OTHERS; i++) {
        mapping_mirror *o;
        CHECK_OK(mapping_mirror_wrap(dev, others + 2 * (size_t)i * pg(), pg(), MAPPING_MIRROR_TRACK_WRITES, &o));
        mapping_mirror_destroy(o);
    }
    atomic_store(&hold_state, 3);
    CHECK(pthread_join(w, NULL) == 0);
    CHECK(foreign_faults == 0);
    CHECK(array[2 * pg() + 3] == 0x6d);
    CHECK(sigaction(SIGSEGV, &below_holder, NULL) == 0);
    munmap(others, 2 * LATE_OTHERS * pg());
    munmap(array, n);
}

/* The same late fault when the array is wrapped again before the handler
 * runs (the new mirror takes the ended one's slot): the write counts in
 * the new mirror, and its next sync carries it. */
TEST(tracked_mprotect_late_fault_on_an_array_wrapped_again_counts_in_the_new_mirror)
{
    use_mprotect();
    size_t n = 4 * pg();
    unsigned char *array = map_pages(4, PROT_READ | PROT_WRITE);
    CHECK(array != NULL);
    foreign_lo = array;
    foreign_bytes = n;
    CHECK(install(SIGSEGV, count_foreign, NULL, 0, NULL, NULL) == 0);
    mapping_device *dev = test_device();
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, array, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(install(SIGSEGV, holding_handler, NULL, SA_NODEFER, NULL, &below_holder) == 0);
    hold_lo = (uintptr_t)array;
    hold_hi = hold_lo + n;
    held_write_at = array + pg() + 3;
    atomic_store(&hold_state, 1);
    pthread_t w;
    CHECK(pthread_create(&w, NULL, held_writer, NULL) == 0);
    wait_for_hold();
    mapping_mirror_destroy(m);
    CHECK_OK(mapping_mirror_wrap(dev, array, n, MAPPING_MIRROR_TRACK_WRITES, &m));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    atomic_store(&hold_state, 3);
    CHECK(pthread_join(w, NULL) == 0);
    CHECK(foreign_faults == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 1);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char got = 0;
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + pg() + 3, &got, 1));
    CHECK(got == 0x6d);
    mapping_mirror_destroy(m);
    CHECK(sigaction(SIGSEGV, &below_holder, NULL) == 0);
    munmap(array, n);
}

/* ---- the race checker's late faults ---- */

static _Atomic int gate_open;

static void wait_gate(void *user)
{
    (void)user;
    while (!atomic_load(&gate_open))
        usleep(500);
}

/* MAPPING_CHECK=races: a write faults on the source of an async upload
 * (a race), and the copy completes, lifting the protection, before the
 * checker's handler runs. The late fault must not be passed on as a
 * foreign fault (it went to the program's handler, or killed the process
 * with a plain SIGSEGV instead of a report): it is retried. */
TEST(race_check_late_fault_after_the_copy_completed_is_not_passed_on)
{
    if (strcmp(test_backend(), "host") != 0)
        test_skip("signal handling does not depend on the back end: run on host");
    setenv("MAPPING_CHECK", "races", 1);
    size_t n = 8 * pg();
    unsigned char *host = map_pages(8, PROT_READ | PROT_WRITE);
    CHECK(host != NULL);
    memset(host, 1, n);
    foreign_lo = host;
    foreign_bytes = n;
    CHECK(install(SIGSEGV, count_foreign, NULL, 0, NULL, NULL) == 0);
    mapping_device *dev = test_device();
    mapping_stream *s;
    mapping_buffer *buf;
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_allocate_gpu(dev, n, &buf));
    CHECK_OK(mapping_sync_to_gpu_range(s, host, buf, 0, n)); /* installs the checker's handler */
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(install(SIGSEGV, holding_handler, NULL, SA_NODEFER, NULL, &below_holder) == 0);
    CHECK_OK(mapping_launch_host(s, wait_gate, NULL));
    CHECK_OK(mapping_sync_to_gpu_range(s, host, buf, 0, n)); /* the source is read-only until it is done */
    hold_lo = (uintptr_t)host;
    hold_hi = hold_lo + n;
    held_write_at = host + 3 * pg() + 5;
    atomic_store(&hold_state, 1);
    pthread_t w;
    CHECK(pthread_create(&w, NULL, held_writer, NULL) == 0);
    wait_for_hold();
    atomic_store(&gate_open, 1);
    CHECK_OK(mapping_stream_synchronize(s)); /* the guard is gone */
    atomic_store(&hold_state, 3);
    CHECK(pthread_join(w, NULL) == 0);
    CHECK(foreign_faults == 0);
    CHECK(host[3 * pg() + 5] == 0x6d);
    CHECK(sigaction(SIGSEGV, &below_holder, NULL) == 0);
    mapping_free_gpu(buf);
    mapping_stream_destroy(s);
    munmap(host, n);
}

/* ---- the library's own writes from a thread that blocks SIGSEGV ---- */

/* In a child whose main thread blocks SIGSEGV before it opens the device
 * (so every thread the library makes is made by it): a tracked mirror's
 * device side changes, and syncs to the CPU copy into the protected
 * pages, blocking (on this thread) and on a stream (on the stream's
 * thread), 8 MiB each so that copy helper threads share the copy. The
 * library's own writes must not fault there: the kernel would kill the
 * process. 0, or 3..6 naming the step that failed. */
static int library_writes_with_sigsegv_blocked(void)
{
    sigset_t segv;
    sigemptyset(&segv);
    sigaddset(&segv, SIGSEGV);
    pthread_sigmask(SIG_BLOCK, &segv, NULL);
    setenv("MAPPING_COPY_THREADS", "2", 1);
    size_t bytes = (size_t)8 << 20;
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    mapping_mirror *m;
    mapping_stream *s;
    unsigned char *fresh = malloc(bytes);
    if (!fresh || mapping_open(&desc, &dev) || mapping_stream_create(dev, &s) ||
        mapping_mirror_create(dev, bytes, MAPPING_MIRROR_TRACK_WRITES, &m) || mapping_mirror_sync_to_gpu(NULL, m))
        return 3;
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (int round = 0; round < 2; round++) {
        memset(fresh, 0x40 + round, bytes);
        if (mapping_sync_to_gpu_range(NULL, fresh, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), bytes) ||
            mapping_mirror_mark_gpu_modified(m, 0, bytes))
            return 4;
        if (round == 0 ? mapping_mirror_sync_to_cpu(NULL, m)
                       : mapping_mirror_sync_to_cpu(s, m) || mapping_stream_synchronize(s))
            return 5;
        if (memcmp(cpu, fresh, bytes) != 0)
            return 6;
    }
    /* The library's writes are not the program's: nothing to send back. */
    if (mapping_mirror_stale_bytes(m, MAPPING_GPU) != 0)
        return 7;
    return 0;
}


TEST(tracked_mprotect_library_writes_on_threads_made_by_a_thread_blocking_sigsegv_do_not_kill)
{
    use_mprotect();
    check_exited_0(in_child(library_writes_with_sigsegv_blocked));
}
