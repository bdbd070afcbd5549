/* Raw control messages as any peer could send them (tests only). */
#ifndef KVB_TEST_CAPS_WIRE_H
#define KVB_TEST_CAPS_WIRE_H

#include <kvbridge/kvbridge.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/frames.h"

typedef struct caps_push {
    void *zctx, *sock;
} caps_push_t;

/* A PUSH socket to manager m's control endpoint; curve_server_pub and
 * client keys NULL: plain TCP. */
void caps_push_open(caps_push_t *p, kvb_manager_h m, const char *server_pub, const char *client_pub,
                    const char *client_sec);
void caps_push_send(caps_push_t *p, const kvb__frames_buf_t *b);
void caps_push_close(caps_push_t *p);

/* A registration for session sid with n kv pointers (all ptr0 + i * step). */
void caps_reg_frames(kvb__frames_buf_t *b, const char *sid, const char *ip, uint16_t port,
                     uint64_t ptr0, uint64_t step, size_t n, uint64_t aux_ptr);
/* A transfer info for room with n pages (0, 1, ...). */
void caps_xfer_frames(kvb__frames_buf_t *b, uint64_t room, const char *sid, const char *ip,
                      uint16_t port, size_t n);

#endif
