/* SGLang's 2026 dialect in the connector: the small messages that exist
 * only there (ABORT, ABORT_ACK). The larger ones are built in decode.c and
 * parsed in prefill_ctl.c; the dialect of each source is chosen in
 * decode.c. */
#include "conn/conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvb_status_t send_buf(struct kvb_manager *m, const char *ip, uint16_t port,
                             kvb__frames_buf_t *b, kvb_status_t st)
{
    if (st == KVB_OK)
        st = kvb__zsend(&m->zc, ip, port, b);
    kvb__frames_buf_free(b);
    return st;
}

/* gen: the ABORT's generation (SGLang 0.5.23), echoed as frame 3; NULL:
 * the 3-frame ACK of the spec's dialect. */
kvb_status_t kvb__send_abort_ack(struct kvb_manager *m, const char *ip, uint16_t port,
                                 uint64_t room, int32_t rank, const uint64_t *gen)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__abort_ack_msg_t a = {room, true, rank, gen != NULL, gen != NULL ? *gen : 0};
    kvb__frames_buf_init(&b);
    return send_buf(m, ip, port, &b, kvb__frames_encode_abort_ack(&a, &e, &b));
}

kvb_status_t kvb__send_abort26(struct kvb_manager *m, const char *ip, uint16_t port, uint64_t room,
                               uint64_t gen)
{
    kvb__frames_buf_t b;
    kvb__frames_err_t e;
    kvb__abort_msg_t a = {room, m->host, strlen(m->host), m->port, true, gen};
    kvb__frames_buf_init(&b);
    return send_buf(m, ip, port, &b, kvb__frames_encode_abort(&a, &e, &b));
}

void kvb__conn_unsupported(struct kvb_manager *m, const kvb__frame_t *f, size_t n)
{
    kvb__frames_err_t e = {0};
    snprintf(e.reason, sizeof(e.reason),
             "%.*s (%zu frames): GPU staging is not supported by kvbridge (it never advertises "
             "a staging ring and never stages); ignored",
             (int)(n > 0 && f[0].len < 16 ? f[0].len : 0), n > 0 ? (const char *)f[0].data : "", n);
    kvb__conn_bad_message(m, KVB__MSG_STAGING, &e);
}
