/* An encoded CachePD message onto the connector's ZeroMQ sockets (both
 * sides send through here: prefill.c its statuses, decode.c its
 * registrations and requests). */
#include "dialect/cachepd/adapter.h"
#include "proto/frames_kit.h"

static kvb_status_t kvb__cpd_send_msg(struct kvb_manager *m, const char *ip, uint16_t port,
                                      const kvb__cpd_msg_t *msg)
{
    kvb__frames_buf_t b;
    kvb_status_t st = KVB_OK;
    kvb__frames_buf_init(&b);
    for (size_t i = 0; i < msg->n && st == KVB_OK; i++) {
        kvb__frame_t f = kvb__cpd_msg_frame(msg, i);
        if (!kvb__fk_put(&b, f.data, f.len))
            st = KVB_ERR_NOMEM;
    }
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, &b);
    kvb__frames_buf_free(&b);
    return st;
}

kvb_status_t kvb__cpd_send_encoded(struct kvb_manager *m, const char *ip, uint16_t port,
                                   kvb_status_t st, kvb__cpd_msg_t *msg, const kvb__frames_err_t *e,
                                   const char *what)
{
    if (st == KVB_OK)
        st = kvb__cpd_send_msg(m, ip, port, msg);
    else
        KVB_LOGW("manager %s: CachePD %s to %s:%u not encoded: %s", m->endpoint, what, ip, port,
                 st == KVB_ERR_INVALID ? e->reason : kvb_status_string(st));
    kvb__cpd_msg_free(msg);
    return st;
}
