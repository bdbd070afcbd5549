/* A raw message-lane peer, as any process that learnt an engine's worker
 * address can be (the caps tests' attackers): an unauthenticated handshake
 * whose reply is kept, its own UCX context, worker and endpoint, and the
 * message lane's header written by hand. For a child forked before any UCX
 * state exists; nothing here CHECKs (a child reports by exit status). Needs
 * src/ on the include path and kvb_test.h's clock. */
#ifndef KVB_TEST_RAW_PEER_H
#define KVB_TEST_RAW_PEER_H

#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "engine/handshake.h"
#include "engine/lane/msg/amwire.h"
#include "kvb_test.h"

/* Handshake with the engine on 127.0.0.1:port, its reply decoded into *r;
 * the socket (returned) is left open: the listener keeps it. -1 on any
 * failure. */
static inline int kvb_test_raw_hs_reply(uint16_t port, kvb__hs_reply_t *r)
{
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    uint8_t *req, *rep;
    size_t req_len, rep_len;
    char why[256];
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) != 0 ||
        kvb__hs_request_encode("127.0.0.1:9", 0, &req, &req_len) != KVB_OK ||
        write(fd, req, req_len) != (ssize_t)req_len)
        return -1;
    uint64_t deadline = (uint64_t)(kvb_test_now_s() * 1e9) + 5000000000ull;
    if (kvb__sock_read_msg(fd, NULL, 64 << 20, deadline, &rep, &rep_len, why, sizeof(why)) !=
            KVB_OK ||
        kvb__hs_reply_decode(rep, rep_len, r, why, sizeof(why)) != KVB_OK)
        return -1;
    return fd;
}

/* A single-threaded worker with features, the target's acknowledgements to
 * ack_cb, an endpoint to the worker address the reply r named with
 * err_mode. false on any failure. */
static inline bool kvb_test_raw_ucx(const kvb__hs_reply_t *r, uint64_t features,
                                    ucp_err_handling_mode_t err_mode, ucp_am_recv_callback_t ack_cb,
                                    ucp_worker_h *w_p, ucp_ep_h *ep_p)
{
    ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_context_h ctx;
    if (ucp_init(&cp, NULL, &ctx) != UCS_OK || ucp_worker_create(ctx, &wp, w_p) != UCS_OK)
        return false;
    ucp_am_handler_param_t hp = {.field_mask =
                                     UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = KVB_AM_ACK,
                                 .cb = ack_cb};
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = (const ucp_address_t *)r->waddr,
                          .err_mode = err_mode};
    return ucp_worker_set_am_recv_handler(*w_p, &hp) == UCS_OK &&
           ucp_ep_create(*w_p, &ep, ep_p) == UCS_OK;
}

/* A message-lane header of one descriptor (len bytes at addr) into
 * h[AM_HDR_FIXED + AM_DESC]: magic AM_MAGIC_WRITE or AM_MAGIC_READ,
 * transfer id xid, writer tag 0 and sequence seq, epoch 0 (the tag-only
 * fence). */
static inline void kvb_test_raw_am_header(uint8_t *h, uint32_t magic, uint64_t xid, uint32_t seq,
                                          uint64_t addr, uint64_t len)
{
    uint32_t nd = 1;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &nd, 4);
    kvb__am_put_u64(h + 8, xid);
    kvb__am_put_u64(h + 16, seq);
    kvb__am_put_u64(h + 24, len); /* total */
    kvb__am_put_u64(h + 32, 0);
    kvb__am_desc_t d = {.dst = addr, .len = len, .stride = 0, .count = 1};
    kvb__am_put_desc(h, 0, &d);
}

/* The target a raw peer is sent to work against. */
typedef struct kvb_test_raw_target {
    uint16_t port; /* its handshake listener on 127.0.0.1 */
    uint64_t addr; /* the registered memory the peer aims at */
} kvb_test_raw_target_t;

/* Fork the raw peer before any UCX state exists in this process. Child
 * (returns 0, killed when the parent dies): *t is what the parent sent with
 * kvb_test_raw_go, *fd_p the pipe it reports on. Parent (returns the pid):
 * *fd_p the pipe the report comes on; *go_p where kvb_test_raw_go writes. */
static inline pid_t kvb_test_raw_fork(kvb_test_raw_target_t *t, int *go_p, int *fd_p)
{
    int go[2], rep[2];
    CHECK_EQ(pipe(go), 0);
    CHECK_EQ(pipe(rep), 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        close(go[1]);
        close(rep[0]);
        if (read(go[0], t, sizeof(*t)) != (ssize_t)sizeof(*t))
            _exit(2);
        *fd_p = rep[1];
        return 0;
    }
    close(go[0]);
    close(rep[1]);
    *go_p = go[1];
    *fd_p = rep[0];
    return pid;
}

/* Send the forked peer its target: the engine of session id sid, memory
 * at addr. */
static inline void kvb_test_raw_go(int go, const char *sid, const void *addr)
{
    kvb_test_raw_target_t t = {(uint16_t)atoi(strrchr(sid, ':') + 1), (uint64_t)(uintptr_t)addr};
    CHECK_EQ(write(go, &t, sizeof(t)), (ssize_t)sizeof(t));
}

#endif
