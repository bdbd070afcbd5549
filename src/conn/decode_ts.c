/* Decode side, TokenSpeed's dialect (seed 004, PROTOCOL-TOKENSPEED.md 10,
 * "kvbridge decode <-> TokenSpeed prefill"): a decode whose bootstrap server
 * answered in TokenSpeed's shape (kvb__addr_t.dialect = KVB__DIALECT_TS)
 * sends its ranks the 8-frame KV-args and 12-frame transfer infos (int64
 * pages past the prefix, no plan: equal TP only, checked in decode.c) and
 * reads their 5-frame statuses. Nothing else goes to a TokenSpeed prefill:
 * its control thread dies on anything else (there is no abort message). */
#include "conn/conn_int.h"
#include "proto/frames_ts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvb_status_t send(struct kvb_manager *m, const char *ip, uint16_t port, kvb__frames_buf_t *b,
                         kvb_status_t st, const kvb__frames_err_t *e)
{
    if (st != KVB_OK)
        KVB_LOGW("manager %s: TokenSpeed message to %s:%u not encodable: %s", m->endpoint, ip, port,
                 e->reason);
    else
        st = kvb__zsend(&m->zc, ip, port, b);
    kvb__frames_buf_free(b);
    return st;
}

kvb_status_t kvb__ts_send_registration(struct kvb_manager *m, const char *ip, uint16_t port)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e = {0};
    const char *sid = kvb_engine_session_id(m->engine);
    kvb__regts_msg_t r = {m->host,
                          strlen(m->host),
                          m->port,
                          sid,
                          strlen(sid),
                          kvb__u64_view_of(m->kv_ptrs, m->args.num_kv),
                          kvb__u64_view_of(m->state_ptrs, m->args.num_state),
                          0};
    kvb__frames_buf_init(&b);
    return send(m, ip, port, &b, kvb__frames_encode_registration_ts(&r, &e, &b), &e);
}

kvb_status_t kvb__ts_send_transfer(struct kvb_manager *m, const kvb__src_t *s, uint64_t room,
                                   const int32_t *idx, size_t n, int64_t aux,
                                   const kvb_receiver_init_t *ex)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e = {0};
    const char *sid = kvb_engine_session_id(m->engine);
    uint64_t prefix = ex != NULL && (ex->field_mask & KVB_RECV_INIT_PREFIX) ? ex->prefix_tokens : 0;
    uint64_t skip = prefix / (m->args.page_size ? m->args.page_size : 1);
    size_t np = s->dummy || skip >= n ? 0 : n - skip;
    size_t ns = !s->dummy && ex != NULL && (ex->field_mask & KVB_RECV_INIT_STATE) &&
                        ex->state_indices != NULL
                    ? ex->num_state_indices
                    : 0;
    int64_t *wide = malloc((np + ns + 1) * sizeof(int64_t)); /* int64 on this wire */
    if (wide == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < np; i++)
        wide[i] = idx[skip + i];
    for (size_t i = 0; i < ns; i++)
        wide[np + i] = ex->state_indices[i];
    kvb__xferts_msg_t x = {0};
    x.room = room;
    x.ip = m->host;
    x.ip_len = strlen(m->host);
    x.port = m->port;
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.is_dummy = s->dummy;
    x.pages = (kvb__i64_view_t){(const uint8_t *)wide, np};
    x.aux_index = aux;
    x.required_dst_info_num = (int32_t)s->required_dst_info_num;
    x.prefix_len = (int64_t)prefix;
    x.state_idx = (kvb__i64_view_t){(const uint8_t *)(wide + np), ns};
    kvb__frames_buf_init(&b);
    kvb_status_t st = send(m, s->ip, s->port, &b, kvb__frames_encode_transfer_ts(&x, &e, &b), &e);
    free(wide);
    return st;
}

/* A 5-frame status from a TokenSpeed prefill, handed on as the 3-frame
 * status kvbridge's decode reads: 5 (Success) as 4, 0 (Failed) as 0; the
 * WaitingForInput and the other progress values change nothing here. */
bool kvb__ts_decode_message(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__statusts_msg_t s;
    kvb__frames_err_t e;
    if (n != KVB__STATUSTS_FRAMES || f[0].len == 0 || f[0].data[0] < '0' || f[0].data[0] > '9')
        return false;
    if (kvb__frames_decode_status_ts(f, n, &e, &s) != KVB_OK) {
        kvb__conn_bad_message(m, KVB__MSG_STATUS, &e);
        return true;
    }
    if (s.status != KVB__TS_SUCCESS && s.status != KVB__TS_FAILED)
        return true;
    char room[24], rank[16];
    int rl = snprintf(room, sizeof(room), "%llu", (unsigned long long)s.room);
    int kl = snprintf(rank, sizeof(rank), "%d", (int)s.sender);
    const char *value = s.status == KVB__TS_SUCCESS ? "4" : "0";
    kvb__frame_t g[3] = {{(const uint8_t *)room, (size_t)rl},
                         {(const uint8_t *)value, 1},
                         {(const uint8_t *)rank, (size_t)kl}};
    kvb__decode_on_message(m, g, 3);
    return true;
}
