/* The cluster harness's raw ZeroMQ peer: what any peer that reaches a
 * manager's control socket can send (encoded messages or arbitrary frames),
 * for tests of malformed, forged and flooding peers. */
#include "kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "dialect/sglang2025/frames.h"

int kvbh_push_open(kvbh_push_t *p, const char *endpoint, const char *const *keys)
{
    char ep[160];
    int zero = 0, tmo = 5000, hwm = 100000, rc = 0;
    p->zctx = zmq_ctx_new();
    p->sock = p->zctx != NULL ? zmq_socket(p->zctx, ZMQ_PUSH) : NULL;
    if (p->sock == NULL) {
        fprintf(stderr, "raw peer: no PUSH socket (%s)\n", zmq_strerror(zmq_errno()));
        return -1;
    }
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->sock, ZMQ_SNDTIMEO, &tmo, sizeof(tmo));
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (keys != NULL)
        rc = zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, keys[0], 40) |
             zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, keys[1], 40) |
             zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, keys[2], 40);
    snprintf(ep, sizeof(ep), "tcp://%s", endpoint);
    if (rc != 0 || zmq_connect(p->sock, ep) != 0) {
        fprintf(stderr, "raw peer to %s: %s\n", ep, zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

int kvbh_push_frames(kvbh_push_t *p, const void *const *f, const size_t *len, int n)
{
    for (int i = 0; i < n; i++)
        if (zmq_send(p->sock, f[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    return 0;
}

int kvbh_push_send(kvbh_push_t *p, const struct kvb__frames_buf *b)
{
    for (size_t i = 0; i < b->n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(b, i);
        if (zmq_send(p->sock, f.data, f.len, i + 1 < b->n ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    }
    return 0;
}

void kvbh_push_close(kvbh_push_t *p)
{
    kvbh_sleep(0.1);
    if (p->sock != NULL)
        zmq_close(p->sock);
    if (p->zctx != NULL)
        zmq_ctx_term(p->zctx);
    memset(p, 0, sizeof(*p));
}

/* "ip:port" (or "[ip]:port") into ip and port. */
static void split_ep(const char *ep, char *ip, size_t cap, uint16_t *port_p)
{
    const char *colon = strrchr(ep, ':');
    int n = colon != NULL ? (int)(colon - ep) : (int)strlen(ep);
    if (ep[0] == '[' && n >= 2)
        snprintf(ip, cap, "%.*s", n - 2, ep + 1);
    else
        snprintf(ip, cap, "%.*s", n, ep);
    *port_p = colon != NULL ? (uint16_t)atoi(colon + 1) : 0;
}

kvb_status_t kvbh_reg_frames(struct kvb__frames_buf *b, const char *sid, const char *ep,
                             uint64_t ptr0, uint64_t step, size_t n, uint64_t aux_ptr,
                             uint64_t item_len)
{
    kvb__reg_msg_t r = {0};
    char ip[128];
    uint64_t *ptrs = malloc((n ? n : 1) * sizeof(*ptrs));
    if (ptrs == NULL)
        return KVB_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        ptrs[i] = ptr0 + i * step;
    split_ep(ep, ip, sizeof(ip), &r.port);
    r.ip = ip;
    r.ip_len = strlen(ip);
    r.session_id = sid;
    r.session_id_len = strlen(sid);
    r.kv_ptrs = kvb__u64_view_of(ptrs, n);
    r.aux_ptrs = kvb__u64_view_of(&aux_ptr, 1);
    r.dst_tp_rank = 0;
    r.dst_attn_tp_size = 1;
    r.dst_kv_item_len = item_len;
    kvb__frames_buf_reset(b);
    kvb_status_t st = kvb__frames_encode_registration(&r, NULL, b);
    free(ptrs);
    return st;
}

kvb_status_t kvbh_xfer_frames(struct kvb__frames_buf *b, uint64_t room, const char *sid,
                              const char *ep, const int32_t *pages, size_t n, int aux_index)
{
    kvb__xfer_msg_t x = {0};
    char ip[128];
    split_ep(ep, ip, sizeof(ip), &x.port);
    x.room = room;
    x.ip = ip;
    x.ip_len = strlen(ip);
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.pages = kvb__i32_view_of(pages, n);
    x.aux_index = aux_index;
    x.required_dst_info_num = 1;
    kvb__frames_buf_reset(b);
    return kvb__frames_encode_transfer(&x, NULL, b);
}
