/* Fuzz the engine handshake decoders (reply, request, notice, session id).
 * Invariant: an accepted reply re-encodes to the identical bytes. */
#include "engine/handshake.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_reply(const uint8_t *data, size_t size)
{
    kvb__hs_reply_t r;
    char why[256];
    uint8_t *buf;
    size_t len;
    if (kvb__hs_reply_decode(data, size, &r, why, sizeof(why)) != KVB_OK)
        return;
    if (kvb__hs_reply_encode(&r, &buf, &len) != KVB_OK || len != size ||
        memcmp(buf, data, size) != 0)
        abort();
    free(buf);
    kvb__hs_reply_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sid;
    uint32_t sl;
    char why[256], host[KVB_HS_MAX_HOST];
    uint16_t port;
    uint64_t g;
    check_reply(data, size);
    kvb__hs_request_decode(data, size, &sid, &sl, why, sizeof(why));
    if (size >= KVB_HS_NOTICE_LEN)
        kvb__hs_notice_decode(data, &g);
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    kvb__sid_parse(s, host, sizeof(host), &port);
    free(s);
    return 0;
}
