/* A raw, unauthenticated engine handshake, as any process that can reach a
 * listener can make one (the cap and flood tests). Needs src/ on the include
 * path (engine/handshake.h) and kvb_test.h's clock. */
#ifndef KVB_TEST_RAW_HS_H
#define KVB_TEST_RAW_HS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/handshake.h"
#include "kvb_test.h"

/* Handshake with the engine listening on 127.0.0.1:port (from 127.0.0.2
 * when from_other, else unbound: 127.0.0.1, the genuine writers' own
 * address); the socket is left open (the listener keeps it). -1 when the
 * target closed it without a reply (refused at the cap). */
static inline int kvb_test_raw_handshake(uint16_t port, bool from_other)
{
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    uint8_t *req = NULL, *rep = NULL;
    size_t req_len, rep_len;
    char why[256];
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons(port);
    if (from_other)
        CHECK_EQ(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    CHECK_EQ(connect(fd, (struct sockaddr *)&dst, sizeof(dst)), 0);
    CHECK_EQ(kvb__hs_request_encode("127.0.0.2:9", 0, &req, &req_len), KVB_OK);
    CHECK_EQ(write(fd, req, req_len), (ssize_t)req_len);
    uint64_t deadline = (uint64_t)(kvb_test_now_s() * 1e9) + 5000000000ull;
    kvb_status_t st =
        kvb__sock_read_msg(fd, NULL, 1 << 20, deadline, &rep, &rep_len, why, sizeof(why));
    free(req);
    free(rep);
    if (st != KVB_OK) {
        close(fd);
        return -1;
    }
    return fd;
}

#endif
