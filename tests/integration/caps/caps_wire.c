#include "caps_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "caps_util.h"
#include "kvb_test.h"

void caps_push_open(caps_push_t *p, kvb_manager_h m, const char *server_pub, const char *client_pub,
                    const char *client_sec)
{
    char ip[64], ep[128];
    uint16_t port;
    int zero = 0, hwm = 100000;
    caps_endpoint(m, ip, sizeof(ip), &port);
    p->zctx = zmq_ctx_new();
    p->sock = zmq_socket(p->zctx, ZMQ_PUSH);
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (server_pub != NULL) {
        CHECK_EQ(zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, server_pub, 40), 0);
        CHECK_EQ(zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, client_pub, 40), 0);
        CHECK_EQ(zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, client_sec, 40), 0);
    }
    snprintf(ep, sizeof(ep), "tcp://%s:%u", ip, port);
    CHECK_EQ(zmq_connect(p->sock, ep), 0);
}

void caps_push_send(caps_push_t *p, const kvb__frames_buf_t *b)
{
    for (size_t i = 0; i < b->n; i++) {
        kvb__frame_t f = kvb__frames_buf_get(b, i);
        CHECK(zmq_send(p->sock, f.data, f.len, i + 1 < b->n ? ZMQ_SNDMORE : 0) >= 0);
    }
}

void caps_push_close(caps_push_t *p)
{
    usleep(100000); /* linger 0: let queued messages leave */
    zmq_close(p->sock);
    zmq_ctx_term(p->zctx);
}

void caps_reg_frames(kvb__frames_buf_t *b, const char *sid, const char *ip, uint16_t port,
                     uint64_t ptr0, uint64_t step, size_t n, uint64_t aux_ptr)
{
    kvb__reg_msg_t r = {0};
    uint64_t *ptrs = malloc(n * sizeof(*ptrs));
    CHECK(ptrs != NULL);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = ptr0 + i * step;
    r.ip = ip;
    r.ip_len = strlen(ip);
    r.port = port;
    r.session_id = sid;
    r.session_id_len = strlen(sid);
    r.kv_ptrs = kvb__u64_view_of(ptrs, n);
    r.aux_ptrs = kvb__u64_view_of(&aux_ptr, 1);
    r.dst_tp_rank = 0;
    r.dst_attn_tp_size = 1;
    r.dst_kv_item_len = CAPS_ITEM;
    kvb__frames_buf_reset(b);
    CHECK_EQ(kvb__frames_encode_registration(&r, NULL, b), KVB_OK);
    free(ptrs);
}

void caps_xfer_frames(kvb__frames_buf_t *b, uint64_t room, const char *sid, const char *ip,
                      uint16_t port, size_t n)
{
    kvb__xfer_msg_t x = {0};
    int32_t *pages = calloc(n ? n : 1, sizeof(*pages));
    CHECK(pages != NULL);
    for (size_t i = 0; i < n; i++)
        pages[i] = (int32_t)(i % CAPS_POOL);
    x.room = room;
    x.ip = ip;
    x.ip_len = strlen(ip);
    x.port = port;
    x.session_id = sid;
    x.session_id_len = strlen(sid);
    x.pages = kvb__i32_view_of(pages, n);
    x.aux_index = 0;
    x.required_dst_info_num = 1;
    kvb__frames_buf_reset(b);
    CHECK_EQ(kvb__frames_encode_transfer(&x, NULL, b), KVB_OK);
    free(pages);
}
