/* src/os/json.h: the JSON string writer of the library and the CLI. */
#include "harness.h"
#include "os/json.h"

static void check_string(const char *s, const char *expected)
{
    char out[256];
    size_t n = mapping_json_string(out, sizeof out, s);
    if (n != strlen(expected) || strcmp(out, expected) != 0)
        test_fail(__FILE__, __LINE__, "json of \"%s\": got %s (%zu), expected %s", s, out, n, expected);
    CHECK(mapping_json_string(NULL, 0, s) == n); /* measures */

    /* The FILE writer writes the same bytes. */
    FILE *f = tmpfile();
    CHECK(f != NULL);
    mapping_json_fputs(s, f);
    long len = ftell(f);
    CHECK(len == (long)n);
    rewind(f);
    char back[256] = {0};
    CHECK(fread(back, 1, sizeof back - 1, f) == n);
    CHECK(strcmp(back, expected) == 0);
    fclose(f);
}

UNIT_TEST(json_string_escapes_quotes_backslashes_and_control_characters)
{
    check_string("", "\"\"");
    check_string("plain device 0", "\"plain device 0\"");
    check_string("say \"hi\"", "\"say \\\"hi\\\"\"");
    check_string("C:\\gpu\\", "\"C:\\\\gpu\\\\\"");
    check_string("tab\there\nnew\x01\x1f", "\"tab\\u0009here\\u000anew\\u0001\\u001f\"");
    check_string("\x7f del stays", "\"\x7f del stays\"");
    check_string("caf\xc3\xa9 \xe2\x82\xac", "\"caf\xc3\xa9 \xe2\x82\xac\""); /* UTF-8 as is */
}

UNIT_TEST(json_string_cuts_like_snprintf)
{
    const char *s = "a\"b";                  /* "a\"b" : 6 bytes */
    char out[8];
    memset(out, 'x', sizeof out);
    CHECK(mapping_json_string(out, 1, s) == 6);
    CHECK(out[0] == '\0' && out[1] == 'x');
    memset(out, 'x', sizeof out);
    CHECK(mapping_json_string(out, 4, s) == 6); /* "a\ and a NUL */
    CHECK(strcmp(out, "\"a\\") == 0 && out[4] == 'x');
    memset(out, 'x', sizeof out);
    CHECK(mapping_json_string(out, 7, s) == 6); /* exactly fits */
    CHECK(strcmp(out, "\"a\\\"b\"") == 0);
    memset(out, 'x', sizeof out);
    CHECK(mapping_json_string(out, 0, s) == 6); /* writes nothing */
    CHECK(out[0] == 'x');
}

UNIT_TEST(json_string_writes_each_byte_of_invalid_utf8_as_replacement_character)
{
    /* Well-formed sequences of every length stay, at the edges of the ranges. */
    check_string("\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xef\xbf\xbf \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf",
                 "\"\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xef\xbf\xbf \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf\"");
    check_string("Latin-1 caf\xe9", "\"Latin-1 caf\\ufffd\"");                     /* a lone lead byte */
    check_string("\x80\xbf", "\"\\ufffd\\ufffd\"");                                 /* stray continuations */
    check_string("\xc3", "\"\\ufffd\"");                                            /* cut at the end */
    check_string("\xe2\x82", "\"\\ufffd\\ufffd\"");                                 /* cut, then a stray */
    check_string("\xc0\xaf \xc1\xbf", "\"\\ufffd\\ufffd \\ufffd\\ufffd\"");         /* overlong '/' */
    check_string("\xe0\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\"");                      /* overlong, 3 bytes */
    check_string("\xf0\x80\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");           /* overlong, 4 bytes */
    check_string("\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");                      /* a surrogate */
    check_string("\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");           /* past U+10FFFF */
    check_string("\xf5\xff\xfe", "\"\\ufffd\\ufffd\\ufffd\"");
    check_string("\xc3\"", "\"\\ufffd\\\"\"");                                      /* the quote still escaped */
    check_string("\xe2\x82\x0a", "\"\\ufffd\\ufffd\\u000a\"");
}
