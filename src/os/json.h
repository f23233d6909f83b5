/*
 * JSON strings: the one writer that the library (mapping_device_stats_json)
 * and the command-line tool (mapping info --json, mapping bench --json) use.
 * Header-only, static inline: the tool links the shared library, whose
 * internal symbols are hidden, so it cannot call a library function.
 *
 * Escaping: '"' and '\' get a backslash, bytes below 0x20 become \u00xx
 * (lower-case hex), and every other byte (UTF-8 included) is written as is.
 */
#ifndef MAPPING_OS_JSON_H
#define MAPPING_OS_JSON_H

#include <stddef.h>
#include <stdio.h>

/* The JSON text of one byte of a string into out, NUL-terminated; returns
 * its length (1, 2 or 6). */
static inline size_t mapping_json_escape_byte(unsigned char c, char out[7])
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    if (c == '"' || c == '\\') {
        out[n++] = '\\';
        out[n++] = (char)c;
    } else if (c < 0x20) {
        out[n++] = '\\';
        out[n++] = 'u';
        out[n++] = '0';
        out[n++] = '0';
        out[n++] = hex[c >> 4];
        out[n++] = hex[c & 15];
    } else {
        out[n++] = (char)c;
    }
    out[n] = '\0';
    return n;
}

/* Appends the len bytes at src to buf at *n, snprintf-style: bytes past
 * size - 1 are counted in *n but not written; buf stays NUL-terminated. */
static inline void mapping_json_put(char *buf, size_t size, size_t *n, const char *src, size_t len)
{
    size_t room = size > 0 ? size - 1 : 0; /* bytes before the NUL */
    for (size_t i = 0; i < len; i++, (*n)++)
        if (*n < room) {
            buf[*n]     = src[i];
            buf[*n + 1] = '\0';
        }
}

/* Writes s as a JSON string, quotes included, into buf the way snprintf
 * does: at most size - 1 bytes and a NUL when size > 0 (buf may be NULL when
 * size is 0). Returns the length of the whole JSON string, without the NUL. */
static inline size_t mapping_json_string(char *buf, size_t size, const char *s)
{
    char   esc[7];
    size_t n = 0;
    if (size > 0)
        buf[0] = '\0';
    mapping_json_put(buf, size, &n, "\"", 1);
    for (; *s; s++)
        mapping_json_put(buf, size, &n, esc, mapping_json_escape_byte((unsigned char)*s, esc));
    mapping_json_put(buf, size, &n, "\"", 1);
    return n;
}

/* Writes s as a JSON string, quotes included, to f. */
static inline void mapping_json_fputs(const char *s, FILE *f)
{
    char esc[7];
    putc('"', f);
    for (; *s; s++) {
        mapping_json_escape_byte((unsigned char)*s, esc);
        fputs(esc, f);
    }
    putc('"', f);
}

#endif
