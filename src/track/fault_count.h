/*
 * Page faults counted as they begin, in every thread of the process: what
 * lets a uffd sync with several threads trust "no fault since the last
 * sync" (write_track_uffd.c) without walking its page table.
 *
 * Why getrusage is not enough there: the kernel makes a write-protected
 * page writable inside the fault, then counts the fault (mm_account_fault,
 * at its end). In between, another thread can write the page without a
 * fault of its own and have a sync run, which sees the old count. The perf
 * software event PERF_COUNT_SW_PAGE_FAULTS is counted at the fault's entry
 * (do_user_addr_fault), before the page changes: a write that used the
 * page happens after the count grew.
 *
 * One counting event per thread that exists at the first call (found in
 * /proc/self/task until a pass finds no new one), each inherited by the
 * threads it makes (inherit: reading an event sums its live children), so
 * every later thread is counted too. Kernel-mode faults (copy_to_user in
 * read(2)) count only when perf lets the process see kernel events
 * (CAP_PERFMON, or kernel.perf_event_paranoid <= 1); where it does not,
 * where perf is refused, past MAX_THREADS threads, and in a forked child,
 * the counter is not available and the caller walks when other threads
 * could be faulting. $MAPPING_TRACK_FAULT_ENTRIES=off makes it not
 * available (to test that path).
 */
#ifndef MAPPING_FAULT_COUNT_H
#define MAPPING_FAULT_COUNT_H

#include <stdbool.h>
#include <stdint.h>

/* The number of page faults every thread of the process began, kernel-mode
 * ones included, since the counter was set up (on the first call). False
 * when it is not available here (see above): *out is then untouched. */
bool mapping_track_fault_entries(uint64_t *out);
/* Whether mapping_track_fault_entries counts here (sets it up on the first
 * call); a read can still fail later. */
bool mapping_track_fault_entries_available(void);

#endif
