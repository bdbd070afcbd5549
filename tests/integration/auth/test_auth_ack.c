/* Message-lane acks are bound to the transfer's connection and to a message
 * awaiting its ack (review 2.2): a second target the writer talks to cannot
 * complete (or fail) another target's transfer with a forged ack, nor can
 * the right target with the wrong message id. Both targets here are bare
 * UCX workers behind a minimal handshake listener, so the test decides when
 * and what they acknowledge. */
#include "core/core.h"
#include "engine/lane/msg/amwire.h"
#include "engine/engine_int.h"
#include "engine/handshake.h"
#include "kvb_test.h"

#include <arpa/inet.h>
#include <kvbridge/engine.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define LEN 4096

typedef struct fake {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_address_t *addr;
    size_t alen;
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
    uint8_t buf[LEN];
    int lfd, ctl_fd;
    char sid[64];
    pthread_t thr;
    pthread_mutex_t mu;
    int stop;
    bool auto_ack;
    /* the last write received (mu) */
    int got;
    ucp_ep_h reply_ep;
    uint64_t xid, mid;
    /* an ack the main thread asks for (mu): sent by the fake's thread */
    int ack_pending;
    uint64_t ack_xid, ack_mid;
    int acks_sent;
} fake_t;

static void send_ack(fake_t *f, ucp_ep_h ep, uint64_t xid, uint64_t mid)
{
    uint8_t h[AM_ACK_FIXED] = {0};
    uint32_t magic = AM_MAGIC_ACK;
    memcpy(h, &magic, 4); /* status 0 = KVB_OK, no reason */
    kvb__am_put_u64(h + 8, xid);
    kvb__am_put_u64(h + 16, mid);
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    void *r = ucp_am_send_nbx(ep, KVB_AM_ACK, h, sizeof(h), NULL, 0, &p);
    if (UCS_PTR_IS_PTR(r)) {
        for (int i = 0; i < 1000000 && ucp_request_check_status(r) == UCS_INPROGRESS; i++)
            ucp_worker_progress(f->w);
        ucp_request_free(r);
    }
}

static ucs_status_t on_write(void *arg, const void *header, size_t hlen, void *data, size_t length,
                             const ucp_am_recv_param_t *param)
{
    fake_t *f = arg;
    const uint8_t *h = header;
    (void)data;
    (void)length;
    if (hlen < AM_HDR_FIXED || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
        return UCS_OK;
    pthread_mutex_lock(&f->mu);
    f->got++;
    f->reply_ep = param->reply_ep;
    f->xid = kvb__am_u64(h + 8);
    f->mid = kvb__am_u64(h + 16);
    if (f->auto_ack) {
        f->ack_pending = 1;
        f->ack_xid = f->xid;
        f->ack_mid = f->mid;
    }
    pthread_mutex_unlock(&f->mu);
    return UCS_OK; /* the bytes are dropped: only acks matter here */
}

/* The handshake, no secret: the request, then a plain reply naming our
 * worker and buffer. The connection stays open (liveness). */
static void serve(fake_t *f)
{
    uint8_t *req, *rep;
    size_t req_len, rep_len;
    char why[256];
    uint64_t dl = kvb__now_ns() + 3000000000ull;
    kvb__hs_seg_t seg = {(uint64_t)(uintptr_t)f->buf, LEN, f->rkey, (uint32_t)f->rkey_len};
    kvb__hs_reply_t r = {.epoch = 7,
                         .generation = 1,
                         .host = (const uint8_t *)"fake-host",
                         .host_len = 9,
                         .waddr = (const uint8_t *)f->addr,
                         .waddr_len = (uint32_t)f->alen,
                         .nseg = 1,
                         .segs = &seg};
    f->ctl_fd = accept(f->lfd, NULL, NULL);
    CHECK(f->ctl_fd >= 0);
    CHECK_EQ(kvb__sock_read_msg(f->ctl_fd, NULL, 4096, dl, &req, &req_len, why, sizeof(why)),
             KVB_OK);
    CHECK_EQ(kvb__hs_reply_encode(&r, &rep, &rep_len), KVB_OK);
    CHECK_EQ(kvb__sock_write_all(f->ctl_fd, rep, rep_len, dl), KVB_OK);
    free(req);
    free(rep);
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {f->lfd, POLLIN, 0};
        if (f->ctl_fd < 0 && poll(&p, 1, 0) > 0)
            serve(f);
        while (ucp_worker_progress(f->w) != 0)
            ;
        pthread_mutex_lock(&f->mu);
        bool ack = f->ack_pending;
        uint64_t xid = f->ack_xid, mid = f->ack_mid;
        ucp_ep_h ep = f->reply_ep;
        f->ack_pending = 0;
        pthread_mutex_unlock(&f->mu);
        if (ack) {
            send_ack(f, ep, xid, mid);
            __atomic_add_fetch(&f->acks_sent, 1, __ATOMIC_RELEASE);
        }
        usleep(200);
    }
    return NULL;
}

static void fake_start(fake_t *f)
{
    ucp_config_t *cfg;
    ucp_params_t p = {0};
    ucp_worker_params_t wp = {0};
    ucp_mem_map_params_t mp = {0};
    ucp_am_handler_param_t hp = {0};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    f->ctl_fd = -1;
    CHECK(ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
    ucp_config_modify(cfg, "TLS", "tcp");
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    CHECK(ucp_init(&p, cfg, &f->ctx) == UCS_OK);
    ucp_config_release(cfg);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    CHECK(ucp_worker_create(f->ctx, &wp, &f->w) == UCS_OK);
    CHECK(ucp_worker_get_address(f->w, &f->addr, &f->alen) == UCS_OK);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = f->buf;
    mp.length = LEN;
    CHECK(ucp_mem_map(f->ctx, &mp, &f->memh) == UCS_OK);
    CHECK(ucp_rkey_pack(f->ctx, f->memh, &f->rkey, &f->rkey_len) == UCS_OK);
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = KVB_AM_WRITE;
    hp.cb = on_write;
    hp.arg = f;
    CHECK(ucp_worker_set_am_recv_handler(f->w, &hp) == UCS_OK);
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(f->lfd >= 0 && bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
          listen(f->lfd, 4) == 0 && getsockname(f->lfd, (struct sockaddr *)&a, &al) == 0);
    snprintf(f->sid, sizeof(f->sid), "127.0.0.1:%u", ntohs(a.sin_port));
    CHECK_EQ(pthread_create(&f->thr, NULL, fake_main, f), 0);
}

static void fake_stop(fake_t *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->thr, NULL);
    if (f->ctl_fd >= 0)
        close(f->ctl_fd);
    close(f->lfd);
    ucp_rkey_buffer_release(f->rkey);
    ucp_mem_unmap(f->ctx, f->memh);
    ucp_worker_release_address(f->w, f->addr);
    ucp_worker_destroy(f->w);
    ucp_cleanup(f->ctx);
    pthread_mutex_destroy(&f->mu);
}

static int fake_got(fake_t *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->got;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* Ask f to send an ack on the endpoint of the last write it received. */
static void fake_ack(fake_t *f, uint64_t xid, uint64_t mid)
{
    int before = __atomic_load_n(&f->acks_sent, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&f->mu);
    f->ack_pending = 1;
    f->ack_xid = xid;
    f->ack_mid = mid;
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < 300 && __atomic_load_n(&f->acks_sent, __ATOMIC_ACQUIRE) == before; i++)
        usleep(10000);
    CHECK(__atomic_load_n(&f->acks_sent, __ATOMIC_ACQUIRE) > before);
}

/* Still in progress after 300 ms (the writer has long processed the ack). */
static void still_pending(kvb_xfer_h x)
{
    CHECK_EQ(kvb_xfer_wait(x, 0.3), KVB_ERR_TIMEOUT);
    CHECK_EQ(kvb_xfer_test(x), KVB_ERR_INPROGRESS);
}

int main(void)
{
    kvb_engine_params_t p = {0};
    kvb_engine_h w;
    fake_t t1, t2;
    static uint8_t src[LEN];
    kvb_xfer_h x;
    unsetenv("KVBRIDGE_ENGINE_SECRET");
    p.field_mask = KVB_ENGINE_PARAM_TRANSPORT | KVB_ENGINE_PARAM_CONNECT_TIMEOUT;
    p.transport = KVB_TRANSPORT_TCP;
    p.connect_timeout_s = 3;
    CHECK_EQ(kvb_engine_create(&p, &w), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_HOST), KVB_OK);
    fake_start(&t1);
    fake_start(&t2);

    /* t2 acknowledges its own writes: the writer has a connection to it */
    pthread_mutex_lock(&t2.mu);
    t2.auto_ack = true;
    pthread_mutex_unlock(&t2.mu);
    kvb_block_t b2 = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)t2.buf, LEN};
    CHECK_EQ(kvb_engine_write(w, t2.sid, &b2, 1, 5), KVB_OK);
    TEST_PASS("a target's own ack completes its transfer");

    /* a write to t1 that t1 does not acknowledge yet */
    kvb_block_t b1 = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)t1.buf, LEN};
    CHECK_EQ(kvb_engine_write_async(w, t1.sid, &b1, 1, &x), KVB_OK);
    for (int i = 0; i < 300 && fake_got(&t1) == 0; i++)
        usleep(10000);
    pthread_mutex_lock(&t1.mu);
    CHECK_EQ(t1.got, 1);
    uint64_t xid = t1.xid, mid = t1.mid;
    pthread_mutex_unlock(&t1.mu);

    /* t2 forges t1's ack, exact ids and all: ignored */
    fake_ack(&t2, xid, mid);
    still_pending(x);
    TEST_PASS("a forged ack from another target does not complete the transfer");

    /* t1 itself, but for a message it was not sent: ignored */
    fake_ack(&t1, xid, mid + 1);
    still_pending(x);
    TEST_PASS("an ack for no outstanding message does not complete the transfer");

    fake_ack(&t1, xid, mid);
    CHECK_EQ(kvb_xfer_wait(x, 5), KVB_OK);
    kvb_xfer_free(x);
    TEST_PASS("the right ack from the right target completes it");

    kvb_engine_destroy(w);
    fake_stop(&t1);
    fake_stop(&t2);
    return 0;
}
