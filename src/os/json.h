/*
 * JSON strings: the one writer that the library (mapping_device_stats_json,
 * the trace) and the command-line tool (mapping info --json, mapping bench
 * --json) use. Header-only, static inline: the tool links the shared
 * library, whose internal symbols are hidden, so it cannot call a library
 * function.
 *
 * Escaping: '"' and '\' get a backslash, bytes below 0x20 become \u00xx
 * (lower-case hex), well-formed UTF-8 is written as is, and every byte that
 * does not start a well-formed UTF-8 sequence (a stray continuation byte, a
 * truncated sequence, an overlong form, a surrogate, a code point past
 * U+10FFFF, 0xc0, 0xc1, 0xf5-0xff) becomes \ufffd, one per byte: a device
 * name in Latin-1 or garbage still gives valid JSON.
 */
#ifndef MAPPING_OS_JSON_H
#define MAPPING_OS_JSON_H

#include <stddef.h>
#include <stdio.h>

/* The length of the well-formed UTF-8 sequence at s (2, 3 or 4; s[0] >=
 * 0x80), or 0 when it is not one (RFC 3629; s is NUL-terminated, and a NUL
 * is never a continuation byte, so this never reads past it). */
static inline size_t mapping_json_utf8_length(const unsigned char *s)
{
    unsigned c = s[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0; /* no overlong forms */
        else if (c == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f; /* nothing past U+10FFFF */
    } else
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

/* The JSON text of the character at s (NUL-terminated, *s != 0) into out,
 * NUL-terminated; *used: how many bytes of s it stands for. Returns the
 * text's length (1 to 6). */
static inline size_t mapping_json_escape_at(const char *s, char out[7], size_t *used)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t n = 0;
    *used = 1;
    if (u[0] == '"' || u[0] == '\\') {
        out[n++] = '\\';
        out[n++] = (char)u[0];
    } else if (u[0] < 0x20) {
        out[n++] = '\\';
        out[n++] = 'u';
        out[n++] = '0';
        out[n++] = '0';
        out[n++] = hex[u[0] >> 4];
        out[n++] = hex[u[0] & 15];
    } else if (u[0] < 0x80) {
        out[n++] = (char)u[0];
    } else if ((*used = mapping_json_utf8_length(u)) != 0) {
        for (; n < *used; n++)
            out[n] = s[n];
    } else {
        *used = 1;
        for (const char *r = "\\ufffd"; *r; r++)
            out[n++] = *r;
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
    size_t n = 0, used;
    if (size > 0)
        buf[0] = '\0';
    mapping_json_put(buf, size, &n, "\"", 1);
    for (; *s; s += used)
        mapping_json_put(buf, size, &n, esc, mapping_json_escape_at(s, esc, &used));
    mapping_json_put(buf, size, &n, "\"", 1);
    return n;
}

/* Writes s as a JSON string, quotes included, to f. */
static inline void mapping_json_fputs(const char *s, FILE *f)
{
    char   esc[7];
    size_t used;
    putc('"', f);
    for (; *s; s += used) {
        mapping_json_escape_at(s, esc, &used);
        fputs(esc, f);
    }
    putc('"', f);
}

#endif
