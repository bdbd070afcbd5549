/* The notification wire format (src/engine/notif.h, kvb__notif_parse), case
 * by case: the shapes a kvbridge sender makes are accepted with their
 * fields; every rule's violation is refused with nothing written. The
 * fuzzer (tests/fuzz/fuzz_notif.c) checks the invariants on random input. */
#include "engine/notif.h"
#include "kvb_test.h"

#include <stdio.h>
#include <string.h>

static size_t hdr(uint8_t *h, uint32_t magic, uint32_t flags, uint32_t nl, uint32_t ml)
{
    memcpy(h, &magic, 4);
    memcpy(h + 4, &flags, 4);
    memcpy(h + 8, &nl, 4);
    memcpy(h + 12, &ml, 4);
    for (int i = 0; i < 16; i++)
        h[16 + i] = (uint8_t)(0xA0 + i);
    return (flags & KVB_NOTIF_FLAG_TOKEN) ? 32 : 16;
}

static bool parse(const uint8_t *h, size_t hlen, size_t length, uint32_t *nl, uint32_t *ml,
                  const uint8_t **tok)
{
    *nl = *ml = 7777;
    *tok = (const uint8_t *)"x";
    return kvb__notif_parse(h, hlen, length, nl, ml, tok);
}

/* Refused, and nothing written. */
static void refused(const uint8_t *h, size_t hlen, size_t length, const char *what)
{
    uint32_t nl, ml;
    const uint8_t *tok;
    if (parse(h, hlen, length, &nl, &ml, &tok)) {
        fprintf(stderr, "accepted: %s\n", what);
        CHECK(false);
    }
    CHECK(nl == 7777 && ml == 7777 && strcmp((const char *)tok, "x") == 0);
}

int main(void)
{
    uint8_t h[64];
    uint32_t nl, ml;
    const uint8_t *tok;
    size_t hl = hdr(h, KVB_NOTIF_MAGIC, 0, 6, 10);
    CHECK(parse(h, hl, 16, &nl, &ml, &tok) && nl == 6 && ml == 10 && tok == NULL);
    hl = hdr(h, KVB_NOTIF_MAGIC, KVB_NOTIF_FLAG_TOKEN, 6, 10);
    CHECK(parse(h, hl, 16, &nl, &ml, &tok) && tok == h + 16 && tok[15] == 0xAF);
    hl = hdr(h, KVB_NOTIF_MAGIC, 0, 1, 0); /* empty message */
    CHECK(parse(h, hl, 1, &nl, &ml, &tok) && nl == 1 && ml == 0);
    hl = hdr(h, KVB_NOTIF_MAGIC, 0, KVB_NOTIF_NAME_MAX, KVB_NOTIF_MAX_LEN);
    CHECK(parse(h, hl, KVB_NOTIF_NAME_MAX + KVB_NOTIF_MAX_LEN, &nl, &ml, &tok));
    TEST_PASS("accepted shapes");

    hl = hdr(h, KVB_NOTIF_MAGIC, 0, 6, 10);
    refused(h, hl, 15, "data one byte short");
    refused(h, hl, 17, "data one byte long");
    refused(h, 15, 16, "header one byte short");
    refused(h, 32, 16, "a token-sized header without the flag");
    refused(h, 0, 0, "nothing");
    hl = hdr(h, KVB_NOTIF_MAGIC, KVB_NOTIF_FLAG_TOKEN, 6, 10);
    refused(h, 16, 16, "the token flag without a token");
    hl = hdr(h, KVB_NOTIF_MAGIC ^ 1, 0, 6, 10);
    refused(h, hl, 16, "bad magic");
    hl = hdr(h, KVB_NOTIF_MAGIC, 2, 6, 10);
    refused(h, hl, 16, "unknown flag");
    hl = hdr(h, KVB_NOTIF_MAGIC, 0, 0, 10);
    refused(h, hl, 10, "empty name");
    hl = hdr(h, KVB_NOTIF_MAGIC, 0, KVB_NOTIF_NAME_MAX + 1, 0);
    refused(h, hl, KVB_NOTIF_NAME_MAX + 1, "name too long");
    hl = hdr(h, KVB_NOTIF_MAGIC, 0, 1, KVB_NOTIF_MAX_LEN + 1);
    refused(h, hl, KVB_NOTIF_MAX_LEN + 2, "message too long");
    hl = hdr(h, KVB_NOTIF_MAGIC, 0, 0xffffffffu, 0xffffffffu);
    refused(h, hl, (size_t)0xffffffffu * 2, "lengths that overflow 32 bits");
    TEST_PASS("refused shapes, nothing written");
    return 0;
}
