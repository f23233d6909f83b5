#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "os/status.h"

static _Thread_local mapping_status last_status = MAPPING_OK;
static _Thread_local char last_message[512];
static _Thread_local unsigned long long error_count; /* failures recorded on this thread */

static mapping_log_fn log_fn;
static void *log_user;

#define MAPPING_STR_(x) #x
#define MAPPING_STR(x) MAPPING_STR_(x)

const char *mapping_version(void)
{
    return MAPPING_STR(MAPPING_VERSION_MAJOR) "." MAPPING_STR(MAPPING_VERSION_MINOR) "." MAPPING_STR(
        MAPPING_VERSION_PATCH);
}

const char *mapping_status_string(mapping_status status)
{
    switch (status) {
#define MAPPING_STATUS_MESSAGE_(name, value, message) \
    case MAPPING_##name:                              \
        return message;
        MAPPING_STATUS_LIST(MAPPING_STATUS_MESSAGE_)
#undef MAPPING_STATUS_MESSAGE_
    }
    return "unknown status";
}

const char *mapping_status_name(mapping_status status)
{
    switch (status) {
#define MAPPING_STATUS_NAME_(name, value, message) \
    case MAPPING_##name:                           \
        return #name;
        MAPPING_STATUS_LIST(MAPPING_STATUS_NAME_)
#undef MAPPING_STATUS_NAME_
    }
    return "UNKNOWN";
}

const char *mapping__status_name(mapping_status status)
{
    return mapping_status_name(status);
}

mapping_status mapping_last_error(void)
{
    return last_status;
}

const char *mapping__last_message(void)
{
    return last_message;
}

const char *mapping_last_error_message(void)
{
    return last_message;
}

void mapping_clear_last_error(void)
{
    last_status = MAPPING_OK;
    last_message[0] = '\0';
}

void mapping_set_log(mapping_log_fn fn, void *user)
{
    log_fn = fn;
    log_user = user;
}

/* Calls the user's callback with the thread's last error saved and restored
 * around it (a callback that calls the library must not change what the
 * caller will read), and never re-entered on one thread (a callback whose
 * own calls fail is not called again from inside itself). */
static _Thread_local int in_log;

static void call_log(int level, const char *message)
{
    mapping_log_fn fn = log_fn;
    if (!fn || in_log)
        return;
    mapping_status saved_status = last_status;
    char saved_message[sizeof last_message];
    memcpy(saved_message, last_message, sizeof saved_message);
    in_log = 1;
    fn(level, message, log_user);
    in_log = 0;
    last_status = saved_status;
    memcpy(last_message, saved_message, sizeof last_message);
}

void mapping__log(int level, const char *fmt, ...)
{
    if (!log_fn || in_log)
        return;
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    call_log(level, message);
}

unsigned long long mapping__error_count(void)
{
    return error_count;
}

mapping_status mapping__fail(mapping_status status, const char *fmt, ...)
{
    error_count++;
    last_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    if (log_fn && !in_log) {
        char message[sizeof last_message];
        memcpy(message, last_message, sizeof message);
        call_log(0, message);
    }
    return status;
}

mapping_status mapping__fail_driver(mapping_status status, const char *backend, const char *call, long long code,
                                    const char *code_name)
{
    return mapping__fail(status, "%s: %s failed: %s (%lld)", backend, call, code_name ? code_name : "?", code);
}

bool mapping__log_enabled(void)
{
    return log_fn != NULL;
}

void mapping__error_mark(mapping_error_mark *mark)
{
    mark->status = last_status;
    mark->count = error_count;
    if (last_status != MAPPING_OK)
        memcpy(mark->message, last_message, sizeof mark->message);
}

void mapping__error_forget(const mapping_error_mark *mark)
{
    if (error_count == mark->count)
        return;
    last_status = mark->status;
    error_count = mark->count;
    if (mark->status != MAPPING_OK)
        memcpy(last_message, mark->message, sizeof last_message);
    else
        last_message[0] = '\0';
}
