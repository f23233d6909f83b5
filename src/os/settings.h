/*
 * The environment variables, in one table: every MAPPING_* variable that
 * the library or the `mapping` command reads, with what it accepts. Every
 * open (mapping_open, mapping_open_opencl) checks the whole environment
 * against it first, so a bad value fails there with a message naming the
 * variable and its accepted values, whichever back end is opened and
 * whether or not the value would have been read later. The code that uses
 * a variable still reads it where it needs it; the table's rules are that
 * code's rules (tests/unit/settings.c; scripts/check_docs.py checks the
 * table against docs/environment.md and against the code's getenv calls).
 */
#ifndef MAPPING_OS_SETTINGS_H
#define MAPPING_OS_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include "mapping.h"

typedef enum mapping_setting_kind {
    MAPPING_SETTING_WORDS, /* one of `words` */
    MAPPING_SETTING_LIST,  /* a comma-separated list of `words` (a trailing comma is allowed) */
    MAPPING_SETTING_COUNT, /* decimal digits only (no sign, space or suffix), min to max */
    MAPPING_SETTING_BYTES, /* one of `words`, or decimal digits: a power of two from 4 pages to max */
    MAPPING_SETTING_LINK,  /* BANDWIDTH[,LATENCY]: plain numbers, the rules of mapping_os_link_check */
    MAPPING_SETTING_PATH   /* any text (a path, or one of `words`); the code that uses it says why it cannot */
} mapping_setting_kind;

typedef struct mapping_setting {
    const char          *name;     /* "MAPPING_TRACK" */
    mapping_setting_kind kind;
    const char          *words;    /* comma-separated: "auto,uffd,mprotect,none" (NULL: none) */
    unsigned long long   min, max; /* COUNT: the bounds; BYTES: max */
    const char          *accepted; /* what it accepts, as messages say it */
    const char          *unset;    /* what unset or empty means */
    const char          *doc;      /* one line: what it does */
} mapping_setting;

/* The table, in the order of docs/environment.md. */
const mapping_setting *mapping_os_settings(size_t *count);
/* The row of `name`, or NULL. */
const mapping_setting *mapping_os_setting_find(const char *name);
/* NULL when `value` (not NULL, not empty) is accepted, else why not, in a
 * few words ("not one of the accepted words", "out of range", ...). */
const char *mapping_os_setting_refusal(const mapping_setting *s, const char *value);
/* Every variable of the table that is set and not empty, checked:
 * MAPPING_OK, or MAPPING_ERR_INVALID_ARGUMENT recorded through mapping__fail
 * as "<fn>: NAME=\"value\" is refused (why); accepted: ...; unset or empty:
 * ..." for the first one refused. */
mapping_status mapping__settings_check(const char *fn);

#endif
