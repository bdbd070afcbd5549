/* Fuzz harness for the notification wire format (src/engine/notif.h,
 * kvb__notif_parse), which the receiver runs on every notification a peer
 * sends.
 *
 * Input: one selector byte, then the header bytes. The data length handed
 * to the parser: selector % 2 == 0, the header's own name + message
 * lengths (so valid headers are reachable), perturbed by selector / 2 - 64
 * when selector >= 128; selector % 2 == 1, the next header bytes' first 8
 * read as u64 (any length).
 *
 * Invariants (abort on violation): a rejected header writes no output; an
 * accepted one has the magic "KVBN", no flag but bit 0, hlen 16 (no token)
 * or 32 (token: then the token pointer is the input at offset 16), a name
 * of 1..KVB_NOTIF_NAME_MAX bytes, a message of at most KVB_NOTIF_MAX_LEN,
 * their sum equal to the data length, and the outputs equal to the header's
 * fields. */
#include "fuzz_assert.h"
#include "engine/notif.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    const uint8_t *h = data + 1;
    size_t hlen = size - 1;
    size_t length = 0;
    if (sel % 2 == 0 && hlen >= KVB_NOTIF_HDR) {
        length = (size_t)u32_at(h + 8) + u32_at(h + 12);
        if (sel >= 128)
            length += (size_t)(sel / 2) - 64;
    } else if (sel % 2 == 1 && hlen >= 8) {
        uint64_t v;
        memcpy(&v, h, 8);
        length = (size_t)v;
    }
    uint32_t nl = 0xdeadbeef, ml = 0xdeadbeef;
    const uint8_t *tok = (const uint8_t *)"sentinel";
    bool ok = kvb__notif_parse(h, hlen, length, &nl, &ml, &tok);
    if (!ok) {
        FUZZ_ASSERT(nl == 0xdeadbeef && ml == 0xdeadbeef);
        FUZZ_ASSERT(strcmp((const char *)tok, "sentinel") == 0);
        return 0;
    }
    uint32_t flags = u32_at(h + 4);
    FUZZ_ASSERT(u32_at(h) == KVB_NOTIF_MAGIC);
    FUZZ_ASSERT((flags & ~KVB_NOTIF_FLAG_TOKEN) == 0);
    FUZZ_ASSERT(hlen == (flags ? KVB_NOTIF_HDR + 16u : KVB_NOTIF_HDR));
    FUZZ_ASSERT(tok == (flags ? h + KVB_NOTIF_HDR : NULL));
    FUZZ_ASSERT(nl == u32_at(h + 8) && ml == u32_at(h + 12));
    FUZZ_ASSERT(nl >= 1 && nl <= KVB_NOTIF_NAME_MAX && ml <= KVB_NOTIF_MAX_LEN);
    FUZZ_ASSERT((size_t)nl + ml == length);
    return 0;
}
