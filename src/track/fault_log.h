/*
 * The fault log: where this process took its page faults, so that a uffd
 * scan (write_track_uffd.c) can visit only the pages that may have become
 * writable instead of walking a region's whole page table (~40 us per GiB
 * against ~1 us for a page).
 *
 * A perf software event (PERF_COUNT_SW_PAGE_FAULTS_MIN, user mode, one
 * sample with the address per fault) on one thread, the logging thread (the
 * first one that drains), writes into a ring the library reads at each
 * drain. An interval between two drains is trusted only when the log
 * provably saw every fault the process took in it: its sample count equals
 * the growth of getrusage(RUSAGE_SELF)'s minor + major fault count, both
 * read on the logging thread between two equal reads of the ring's head (so
 * no fault of its own slipped between them). Every fault that makes a page
 * writable is counted there; one the log misses (another thread's, the
 * kernel's for the process in read(2) or get_user_pages, a major fault, a
 * sample lost to a full ring or to throttling) makes the counts differ and
 * the interval a gap. A region whose last scan is older than the last gap
 * (or than the oldest page the log keeps) walks its whole range.
 *
 * The event costs ~0.5 us per fault while it is on; a drain turns it off
 * when the faults of the last interval cost more to log than the region's
 * whole scan, and on again when they cost less. $MAPPING_TRACK_SCAN other
 * than "faulted" (the default), a refused perf_event_open (e.g.
 * kernel.perf_event_paranoid > 2), a forked child: no log, every scan walks.
 * Thread-safe (one lock).
 */
#ifndef MAPPING_FAULT_LOG_H
#define MAPPING_FAULT_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A point in the log: the drain it was taken at, and the log's length then. */
typedef struct mapping_track_fault_pos {
    uint64_t drain, length;
} mapping_track_fault_pos;

/* Whether the process could log faults (a trial event, opened and closed;
 * the calling thread does not become the logging thread): false with *why
 * set when not. */
bool mapping_track_fault_log_probe(const char **why);
/* Whether the process logs faults (opens the event on the first call of
 * any function here): false with *why set when not. */
bool mapping_track_fault_log_available(const char **why);

/* Drains the ring and returns the point now, for a region whose scan
 * starts after this call: the next query from that point finds the faults
 * taken after it. */
void mapping_track_fault_log_mark(mapping_track_fault_pos *now);

/* Drains the ring; when every fault since `since` is in the log and at most
 * `cap` distinct pages of [lo, hi) (page-aligned) were faulted on, writes
 * them sorted to pages[] and returns how many (0: none). Else -1: walk the
 * whole range. Either way *now is the point to store for the next query,
 * taken before the caller's scan. `scan_ns`: what a walk of the range costs
 * (0: not known), to decide whether logging the next interval pays.
 * *faults: a fault stamp read at the drain, for the clean-sync shortcut
 * (UINT64_MAX if unknown): the process's minor + major fault count
 * (getrusage, counted at a fault's end), plus, when *every_thread, the
 * faults every thread began (fault_count.h). Equal stamps: no fault ended
 * in between, and with *every_thread none began either (so none is in
 * flight in another thread). Without *every_thread the log is trusted only
 * as far as the caller knows no other thread can fault (the log itself
 * then also needs the entries: an interval is complete only when they
 * grew by its sample count too). */
long mapping_track_fault_log_pages(const mapping_track_fault_pos *since, uintptr_t lo, uintptr_t hi, uintptr_t *pages,
                                size_t cap, uint64_t scan_ns, mapping_track_fault_pos *now, uint64_t *faults,
                                bool *every_thread);

/* $MAPPING_TRACK_SCAN, read at each call: how a uffd collect finds the
 * written pages. faulted (default, also when unset or empty): the fault log
 * names them when it can (fault_log.h); changed: no fault log, only the
 * skip of a collect after no fault; always: a walk at every collect. */
typedef enum mapping_track_scan_kind {
    MAPPING_TRACK_SCAN_FAULTED,
    MAPPING_TRACK_SCAN_CHANGED,
    MAPPING_TRACK_SCAN_ALWAYS,
    MAPPING_TRACK_SCAN_BAD, /* another value */
} mapping_track_scan_kind;
mapping_track_scan_kind mapping_track_scan_mode(void);

#endif
