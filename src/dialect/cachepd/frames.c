/* CachePD ZeroMQ messages: 8-frame registration, 3-frame pre-allocation
 * request, 7-frame status (cachepd.h; spec 4.2-4.4, 12.4). Checks run in
 * TokenSpeed's order and carry its texts, so a kvbridge peer fails a room
 * for the same reason a TokenSpeed one would, with the offending value
 * added. */
#include "dialect/cachepd/cpd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROOM_MAX ((uint64_t)INT64_MAX)

/* ---------------------------------------------------------------- buffer */

void kvb__cpd_msg_init(kvb__cpd_msg_t *m)
{
    memset(m, 0, sizeof(*m));
}

void kvb__cpd_msg_reset(kvb__cpd_msg_t *m)
{
    m->len = 0;
    m->n = 0;
}

void kvb__cpd_msg_free(kvb__cpd_msg_t *m)
{
    free(m->data);
    memset(m, 0, sizeof(*m));
}

kvb__frame_t kvb__cpd_msg_frame(const kvb__cpd_msg_t *m, size_t i)
{
    size_t start = i ? m->ends[i - 1] : 0;
    kvb__frame_t f = {m->data + start, m->ends[i] - start};
    return f;
}

static bool msg_put(kvb__cpd_msg_t *m, const void *p, size_t n)
{
    if (m->n >= sizeof(m->ends) / sizeof(m->ends[0]))
        return false;
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->len + n)
            cap *= 2;
        uint8_t *d = realloc(m->data, cap);
        if (d == NULL)
            return false;
        m->data = d;
        m->cap = cap;
    }
    if (n)
        memcpy(m->data + m->len, p, n);
    m->len += n;
    m->ends[m->n++] = m->len;
    return true;
}

static bool msg_dec(kvb__cpd_msg_t *m, long long v)
{
    char t[24];
    int k = snprintf(t, sizeof(t), "%lld", v);
    return msg_put(m, t, (size_t)k);
}

/* ---------------------------------------------------------------- registration */

kvb_status_t kvb__cpd_decode_registration_header(const kvb__frame_t *f, size_t n,
                                                 kvb__frames_err_t *err, kvb__cpd_reg_t *msg_p)
{
    uint64_t port;
    char show[256];
    if (n != KVB__CPD_REG_FRAMES || f[0].len != 4 || memcmp(f[0].data, "None", 4) != 0)
        return kvb__cpd_fail(err, false, 0,
                             "CachePD slab registration requires exactly 8 frames (got %zu, "
                             "frame 0 \"%s\")",
                             n, n ? kvb__cpd_show((const char *)f[0].data, f[0].len, show) : "");
    if (!kvb__cpd_ascii(f[1].data, f[1].len, KVB__CPD_MAX_ENDPOINT))
        return kvb__cpd_fail(err, false, 0,
                             "CachePD registration endpoint is invalid (frame 1: %zu bytes, "
                             "ASCII 1..255)",
                             f[1].len);
    if (!kvb__cpd_ascii(f[3].data, f[3].len, KVB__CPD_MAX_SESSION))
        return kvb__cpd_fail(err, false, 0,
                             "CachePD registration session is invalid (frame 3: %zu bytes, "
                             "ASCII 1..512)",
                             f[3].len);
    if (!kvb__cpd_canon_uint(f[2].data, f[2].len, 1, 65535, &port))
        return kvb__cpd_fail(err, false, 0,
                             "CachePD registration port must be canonical unsigned ASCII in "
                             "1..65535 (frame 2 \"%s\")",
                             kvb__cpd_show((const char *)f[2].data, f[2].len, show));
    memset(msg_p, 0, sizeof(*msg_p));
    msg_p->endpoint = (const char *)f[1].data;
    msg_p->endpoint_len = f[1].len;
    msg_p->port = (uint16_t)port;
    msg_p->session_id = (const char *)f[3].data;
    msg_p->session_id_len = f[3].len;
    return KVB_OK;
}

/* Frames 6-7 (decode TP size and rank). */
static kvb_status_t reg_tp(const kvb__frame_t *f, kvb__frames_err_t *err, kvb__cpd_reg_t *m)
{
    uint64_t size, rank;
    char show[256];
    if (!kvb__cpd_canon_uint(f[6].data, f[6].len, 1, KVB__CPD_MAX_TP, &size))
        return kvb__cpd_fail(err, false, 0,
                             "CachePD decode_tp_size must be canonical unsigned ASCII in 1..%u "
                             "(frame 6 \"%s\")",
                             KVB__CPD_MAX_TP,
                             kvb__cpd_show((const char *)f[6].data, f[6].len, show));
    if (!kvb__cpd_canon_uint(f[7].data, f[7].len, 0, size - 1, &rank))
        return kvb__cpd_fail(err, false, 0,
                             "CachePD decode_tp_rank must be canonical unsigned ASCII in 0..%llu "
                             "(frame 7 \"%s\")",
                             (unsigned long long)(size - 1),
                             kvb__cpd_show((const char *)f[7].data, f[7].len, show));
    m->decode_tp_size = (uint32_t)size;
    m->decode_tp_rank = (uint32_t)rank;
    return KVB_OK;
}

kvb_status_t kvb__cpd_decode_registration(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                          kvb__cpd_reg_t *msg_p, kvb__cpd_contract_t *contract_p)
{
    kvb__cpd_reg_t m;
    kvb__cpd_contract_t c;
    KVB__FRAMES_TRY(kvb__cpd_decode_registration_header(f, n, err, &m));
    if (f[4].len != 8)
        return kvb__cpd_fail(err, false, 0,
                             "CachePD slab pointer frame must be exactly 8 bytes (frame 4: %zu)",
                             f[4].len);
    if (contract_p != NULL)
        KVB__FRAMES_TRY(kvb__cpd_contract_parse(f[5].data, f[5].len, err, &c));
    else if (f[5].len == 0 || f[5].len > KVB__CPD_MAX_CONTRACT_BYTES)
        return kvb__cpd_fail(err, false, 0, "CachePD contract: payload must be 1..%u bytes",
                             KVB__CPD_MAX_CONTRACT_BYTES);
    kvb_status_t st = reg_tp(f, err, &m);
    memcpy(&m.slab, f[4].data, 8);
    if (st == KVB_OK && m.slab == 0)
        st = kvb__cpd_fail(err, false, 0, "CachePD slab pointer must be nonzero");
    if (st != KVB_OK) {
        if (contract_p != NULL)
            kvb__cpd_contract_free(&c);
        return st;
    }
    m.contract_json = f[5].data;
    m.contract_len = f[5].len;
    *msg_p = m;
    if (contract_p != NULL)
        *contract_p = c;
    return KVB_OK;
}

bool kvb__cpd_is_registration(const kvb__frame_t *f, size_t n)
{
    return n == KVB__CPD_REG_FRAMES && f[0].len == 4 && memcmp(f[0].data, "None", 4) == 0 &&
           f[4].len == 8 && f[5].len > 0 && f[5].data[0] == '{';
}

kvb_status_t kvb__cpd_encode_registration(const kvb__cpd_reg_t *msg, kvb__frames_err_t *err,
                                          kvb__cpd_msg_t *out)
{
    kvb__frames_err_t e;
    kvb__cpd_reg_t check;
    char port[8], size[8], rank[8];
    snprintf(port, sizeof(port), "%u", msg->port);
    snprintf(size, sizeof(size), "%u", msg->decode_tp_size);
    snprintf(rank, sizeof(rank), "%u", msg->decode_tp_rank);
    kvb__frame_t f[8] = {{(const uint8_t *)"None", 4},
                         {(const uint8_t *)msg->endpoint, msg->endpoint_len},
                         {(const uint8_t *)port, strlen(port)},
                         {(const uint8_t *)msg->session_id, msg->session_id_len},
                         {(const uint8_t *)&msg->slab, 8},
                         {msg->contract_json, msg->contract_len},
                         {(const uint8_t *)size, strlen(size)},
                         {(const uint8_t *)rank, strlen(rank)}};
    kvb__cpd_msg_reset(out);
    if (kvb__cpd_decode_registration(f, 8, err ? err : &e, &check, NULL) != KVB_OK)
        return KVB_ERR_INVALID;
    for (size_t i = 0; i < 8; i++)
        if (!msg_put(out, f[i].data, f[i].len)) {
            kvb__cpd_msg_reset(out);
            return KVB_ERR_NOMEM;
        }
    return KVB_OK;
}

/* ---------------------------------------------------------------- request */

/* Frames 0-1 (TransferInfo.route_header_from_zmq). */
static kvb_status_t req_header(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                               kvb__cpd_req_t *m)
{
    char show[256];
    uint64_t room;
    bool has_room = n >= 1 && kvb__cpd_canon_uint(f[0].data, f[0].len, 0, ROOM_MAX, &room);
    if (n != KVB__CPD_REQ_FRAMES)
        return kvb__cpd_fail(err, has_room, room,
                             "CachePD pre-allocation requires exactly 3 frames (got %zu)", n);
    if (!has_room)
        return kvb__cpd_fail(err, false, 0,
                             "CachePD room must be canonical unsigned ASCII in 0..2^63-1 (frame "
                             "0 \"%s\")",
                             kvb__cpd_show((const char *)f[0].data, f[0].len, show));
    if (!kvb__cpd_ascii(f[1].data, f[1].len, KVB__CPD_MAX_SESSION))
        return kvb__cpd_fail(err, true, room,
                             "CachePD request requires a Decode session (frame 1: %zu bytes, "
                             "ASCII 1..512)",
                             f[1].len);
    m->room = room;
    m->session_id = (const char *)f[1].data;
    m->session_id_len = f[1].len;
    return KVB_OK;
}

kvb_status_t kvb__cpd_decode_request(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                     kvb__cpd_req_t *msg_p, kvb__cpd_manifest_t *manifest_p)
{
    kvb__cpd_req_t m;
    memset(&m, 0, sizeof(m));
    KVB__FRAMES_TRY(req_header(f, n, err, &m));
    m.is_dummy = f[2].len == 0;
    if (!m.is_dummy) {
        kvb_status_t st = KVB_OK;
        if (manifest_p != NULL)
            st = kvb__cpd_manifest_parse(f[2].data, f[2].len, err, manifest_p);
        else if (f[2].len > KVB__CPD_MAX_MANIFEST_BYTES)
            st = kvb__cpd_fail(err, false, 0, "CachePD manifest: payload over %u bytes",
                               KVB__CPD_MAX_MANIFEST_BYTES);
        if (st != KVB_OK) {
            if (err != NULL && st == KVB_ERR_PROTO) {
                err->has_room = true;
                err->room = m.room;
            }
            return st;
        }
        m.manifest_json = f[2].data;
        m.manifest_len = f[2].len;
    }
    *msg_p = m;
    return KVB_OK;
}

bool kvb__cpd_is_request(const kvb__frame_t *f, size_t n)
{
    uint64_t room;
    return n == KVB__CPD_REQ_FRAMES && kvb__cpd_canon_uint(f[0].data, f[0].len, 0, ROOM_MAX, &room);
}

bool kvb__cpd_is_status(const kvb__frame_t *f, size_t n)
{
    uint64_t room;
    return n > KVB__CPD_STATUS_MIN_FRAMES && n <= KVB__CPD_STATUS_FRAMES &&
           kvb__cpd_canon_uint(f[0].data, f[0].len, 0, ROOM_MAX, &room);
}

kvb_status_t kvb__cpd_encode_request(const kvb__cpd_req_t *msg, kvb__frames_err_t *err,
                                     kvb__cpd_msg_t *out)
{
    kvb__frames_err_t e;
    kvb__cpd_req_t check;
    char room[24];
    snprintf(room, sizeof(room), "%llu", (unsigned long long)msg->room);
    kvb__frame_t f[3] = {
        {(const uint8_t *)room, strlen(room)},
        {(const uint8_t *)msg->session_id, msg->session_id_len},
        {msg->is_dummy ? NULL : msg->manifest_json, msg->is_dummy ? 0 : msg->manifest_len}};
    kvb__cpd_msg_reset(out);
    if (!msg->is_dummy && msg->manifest_len == 0) {
        kvb__cpd_fail(err ? err : &e, true, msg->room,
                      "CachePD request: a non-dummy request needs a manifest");
        return KVB_ERR_INVALID;
    }
    if (kvb__cpd_decode_request(f, 3, err ? err : &e, &check, NULL) != KVB_OK)
        return KVB_ERR_INVALID;
    for (size_t i = 0; i < 3; i++)
        if (!msg_put(out, f[i].data, f[i].len)) {
            kvb__cpd_msg_reset(out);
            return KVB_ERR_NOMEM;
        }
    return KVB_OK;
}

/* ---------------------------------------------------------------- status */

static kvb_status_t status_int(const kvb__frame_t *f, size_t i, const char *name, uint64_t max,
                               bool has_room, uint64_t room, kvb__frames_err_t *err,
                               uint64_t *out_p)
{
    char show[256];
    if (!kvb__cpd_canon_uint(f[i].data, f[i].len, 0, max, out_p))
        return kvb__cpd_fail(err, has_room, room,
                             "CachePD status frame %zu (%s) \"%s\" is not a decimal in 0..%llu", i,
                             name, kvb__cpd_show((const char *)f[i].data, f[i].len, show),
                             (unsigned long long)max);
    return KVB_OK;
}

/* Frames 3-6, the optional tail (absent ones keep their defaults). */
static kvb_status_t status_tail(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                kvb__cpd_status_t *m)
{
    uint64_t v;
    if (f[3].len == 2 && memcmp(f[3].data, "-1", 2) == 0)
        m->token = -1;
    else {
        KVB__FRAMES_TRY(status_int(f, 3, "bootstrap token", INT64_MAX, true, m->room, err, &v));
        m->token = (int64_t)v;
    }
    if (f[4].len % 4 != 0)
        return kvb__cpd_fail(err, true, m->room,
                             "CachePD status frame 4 (speculative candidates): %zu bytes, not a "
                             "multiple of 4",
                             f[4].len);
    m->candidates = (kvb__i32_view_t){f[4].data, f[4].len / 4};
    if (n > 5)
        KVB__FRAMES_TRY(
            status_int(f, 5, "cached tokens", INT64_MAX, true, m->room, err, &m->cached_tokens));
    if (n > 6 && f[6].len != 0) {
        if (f[6].len != 8)
            return kvb__cpd_fail(err, true, m->room,
                                 "CachePD status frame 6 (bootstrap logprob): %zu bytes, not 8",
                                 f[6].len);
        uint64_t bits = 0;
        for (int i = 7; i >= 0; i--) /* "<d": little-endian whatever the host */
            bits = bits << 8 | f[6].data[i];
        memcpy(&m->logprob, &bits, 8);
        m->has_logprob = true;
    }
    return KVB_OK;
}

kvb_status_t kvb__cpd_decode_status(const kvb__frame_t *f, size_t n, kvb__frames_err_t *err,
                                    kvb__cpd_status_t *msg_p)
{
    kvb__cpd_status_t m;
    uint64_t v;
    memset(&m, 0, sizeof(m));
    m.token = -1;
    bool has_room = n >= 1 && kvb__cpd_canon_uint(f[0].data, f[0].len, 0, ROOM_MAX, &m.room);
    if (n < KVB__CPD_STATUS_MIN_FRAMES || n > KVB__CPD_STATUS_FRAMES)
        return kvb__cpd_fail(err, has_room, m.room,
                             "CachePD status requires 5 to 7 frames (got %zu)", n);
    KVB__FRAMES_TRY(status_int(f, 0, "room", ROOM_MAX, false, 0, err, &m.room));
    KVB__FRAMES_TRY(status_int(f, 1, "status", KVB__CPD_SUCCESS, true, m.room, err, &v));
    m.status = (int32_t)v;
    KVB__FRAMES_TRY(status_int(f, 2, "sender", 2u * KVB__CPD_MAX_TP * KVB__CPD_MAX_STAGES, true,
                               m.room, err, &v));
    m.sender = (uint32_t)v;
    KVB__FRAMES_TRY(status_tail(f, n, err, &m));
    *msg_p = m;
    return KVB_OK;
}

kvb_status_t kvb__cpd_encode_status(const kvb__cpd_status_t *msg, kvb__frames_err_t *err,
                                    kvb__cpd_msg_t *out)
{
    kvb__frames_err_t e;
    uint8_t lp[8];
    uint64_t bits;
    memcpy(&bits, &msg->logprob, 8);
    for (int i = 0; i < 8; i++)
        lp[i] = (uint8_t)(bits >> (8 * i));
    kvb__cpd_msg_reset(out);
    bool ok = msg_dec(out, (long long)msg->room) && msg_dec(out, msg->status) &&
              msg_dec(out, msg->sender) && msg_dec(out, msg->token) &&
              msg_put(out, msg->candidates.data, msg->candidates.count * 4) &&
              msg_dec(out, (long long)msg->cached_tokens) &&
              msg_put(out, lp, msg->has_logprob ? 8 : 0);
    if (!ok) {
        kvb__cpd_msg_reset(out);
        return KVB_ERR_NOMEM;
    }
    kvb__frame_t f[KVB__CPD_STATUS_FRAMES];
    kvb__cpd_status_t check;
    for (size_t i = 0; i < out->n; i++)
        f[i] = kvb__cpd_msg_frame(out, i);
    if (msg->token < -1 || msg->room > ROOM_MAX || msg->cached_tokens > ROOM_MAX ||
        kvb__cpd_decode_status(f, out->n, err ? err : &e, &check) != KVB_OK) {
        if (msg->token < -1 || msg->room > ROOM_MAX || msg->cached_tokens > ROOM_MAX)
            kvb__cpd_fail(err ? err : &e, false, 0,
                          "CachePD status: room, token or cached tokens out of range");
        kvb__cpd_msg_reset(out);
        return KVB_ERR_INVALID;
    }
    return KVB_OK;
}
