/* Fuzz the engine handshake decoders (reply, request, notice, session id,
 * the authentication messages: challenge, proof, denial, sealed reply, and
 * the same-host proof: challenge and answer).
 * Invariant: every accepted message re-encodes to the identical bytes. */
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

static void check_auth(const uint8_t *data, size_t size)
{
    const uint8_t *p, *q;
    char why[256];
    uint8_t chal[KVB_HS_CHALLENGE_LEN], proof[KVB_HS_PROOF_LEN];
    kvb__hs_kind_t kind = kvb__hs_kind(data, size);
    if (kvb__hs_challenge_decode(data, size, &p, why, sizeof(why)) == KVB_OK) {
        kvb__hs_challenge_encode(p, chal);
        if (kind != KVB_HS_MSG_CHALLENGE || size != sizeof(chal) || memcmp(chal, data, size) != 0)
            abort();
    }
    if (kvb__hs_proof_decode(data, size, &p, &q, why, sizeof(why)) == KVB_OK) {
        kvb__hs_proof_encode(p, q, proof);
        if (size != sizeof(proof) || memcmp(proof, data, size) != 0)
            abort();
    }
    if (kvb__hs_deny_decode(data, size, why, sizeof(why)) == KVB_OK &&
        (kind != KVB_HS_MSG_DENY || size != KVB_HS_DENY_LEN))
        abort();
}

static void check_sealed_local(const uint8_t *data, size_t size)
{
    const uint8_t *mac, *rep, *host;
    size_t rep_len, len;
    uint32_t pid, fd, hl;
    char why[256], hs[KVB_HS_MAX_HOST + 1];
    uint8_t *buf, local[KVB_HS_LOCAL_MAX], ok[KVB_HS_LOCALOK_LEN];
    kvb__hs_kind_t kind = kvb__hs_kind(data, size);
    if (kvb__hs_sealed_decode(data, size, &mac, &rep, &rep_len, why, sizeof(why)) == KVB_OK) {
        if (kind != KVB_HS_MSG_SEALED ||
            kvb__hs_sealed_encode(mac, rep, rep_len, &buf, &len) != KVB_OK || len != size ||
            memcmp(buf, data, size) != 0)
            abort();
        free(buf);
        check_reply(rep, rep_len);
    }
    if (kvb__hs_local_decode(data, size, &pid, &fd, &host, &hl, why, sizeof(why)) == KVB_OK) {
        memcpy(hs, host, hl);
        hs[hl] = '\0';
        len = kvb__hs_local_encode(pid, fd, hs, local);
        /* a host with a NUL inside encodes shorter: only NUL-free ones compare */
        if (kind != KVB_HS_MSG_LOCAL ||
            (strlen(hs) == hl && (len != size || memcmp(local, data, size) != 0)))
            abort();
    }
    if (kvb__hs_localok_decode(data, size, &mac, why, sizeof(why)) == KVB_OK) {
        kvb__hs_localok_encode(mac, ok);
        if (size != sizeof(ok) || memcmp(ok, data, size) != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sid;
    uint32_t sl, caps;
    char why[256], host[KVB_HS_MAX_HOST];
    uint16_t port;
    uint64_t g;
    check_reply(data, size);
    check_auth(data, size);
    check_sealed_local(data, size);
    kvb__hs_request_decode(data, size, &sid, &sl, &caps, why, sizeof(why));
    if (size >= KVB_HS_NOTICE_LEN)
        kvb__hs_notice_decode(data, &g);
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    kvb__sid_parse(s, host, sizeof(host), &port);
    free(s);
    return 0;
}
