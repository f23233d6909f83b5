/*
 * Status recording, the bottom of the library: every public function that
 * fails goes through mapping__fail() so that mapping_last_error() and the log
 * callback see it. Back ends record driver failures with
 * mapping__fail_driver(). Knows status codes (mapping.h) and nothing else,
 * so every layer, back ends included, may use it. Also home of
 * mapping_version() and the status names.
 */
#ifndef MAPPING_OS_STATUS_H
#define MAPPING_OS_STATUS_H

#include <stdbool.h>
#include "mapping.h"

#if defined(__GNUC__)
#define MAPPING_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MAPPING_PRINTF(a, b)
#endif

/* Records status and message for this thread, logs it, returns status. */
mapping_status mapping__fail(mapping_status status, const char *fmt, ...) MAPPING_PRINTF(2, 3);
/* For back ends: a driver call failed with a raw code. */
mapping_status mapping__fail_driver(mapping_status status, const char *backend, const char *call, long long code,
                                    const char *code_name);
/* mapping_status_name, for the layers that may not call the public one. */
const char *mapping__status_name(mapping_status status);
/* The calling thread's last recorded message (as mapping_last_error_message). */
const char *mapping__last_message(void);
/* How many failures this thread has recorded: tells whether a callback
 * (a pipeline step) recorded its own error. */
unsigned long long mapping__error_count(void);
/* Recovering from a failure inside a call that then succeeds: the thread's
 * error as it was before the attempt, so that the call records nothing.
 * mark() is cheap (the message is copied only when an error was already
 * recorded); forget() puts the error back if anything was recorded since. */
typedef struct mapping_error_mark {
    mapping_status     status;
    unsigned long long count;
    char               message[512];
} mapping_error_mark;
void mapping__error_mark(mapping_error_mark *mark);
void mapping__error_forget(const mapping_error_mark *mark);
/* Through the user's log callback, if any. */
void mapping__log(int level, const char *fmt, ...) MAPPING_PRINTF(2, 3);
/* Whether a log callback is installed (skip building a message otherwise). */
bool mapping__log_enabled(void);

#endif
