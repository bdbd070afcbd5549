/* Notifications (engine.h, "Notifications"): the wire format of one
 * notification, the receiver's capped queue, and the sender's path from a
 * transfer's success to the active message. Below the lanes: the
 * completion (complete.c) hands a succeeded transfer carrying a
 * notification to the progress thread, which sends it here and only then
 * publishes the transfer's end.
 *
 * Wire (sender → receiver, UCX active message KVB_AM_NOTIF), little-endian:
 *   header: u32 magic "KVBN" | u32 flags | u32 name_len | u32 msg_len
 *           | 16-byte token when flags bit 0 (the engine secret's token, as
 *           on the message lane's writes)
 *   data:   name_len bytes of the sender's name, then msg_len bytes,
 *           sent eager (never rendezvous).
 * name_len 1..KVB_NOTIF_NAME_MAX, msg_len 0..KVB_NOTIF_MAX_LEN, the data
 * exactly name_len + msg_len bytes, other flag bits zero. */
#ifndef KVB_ENGINE_NOTIF_H
#define KVB_ENGINE_NOTIF_H

#include <kvbridge/engine.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVB_AM_NOTIF 14             /* the active-message id */
#define KVB_NOTIF_MAGIC 0x4e42564bu /* "KVBN" */
#define KVB_NOTIF_HDR 16            /* fixed header bytes */
#define KVB_NOTIF_FLAG_TOKEN 1u     /* a token follows the fixed header */

typedef struct kvb__notif_entry kvb__notif_entry_t;

/* The receiver's queue (its own mutex: filled on the progress thread,
 * emptied by any thread calling kvb_engine_get_notifs). */
typedef struct kvb__notifq {
    pthread_mutex_t mu;
    kvb__notif_entry_t *head, *tail;
    size_t n, bytes;         /* queued now */
    size_t max_n, max_bytes; /* KVBRIDGE_NOTIF_QUEUE_MAX, _BYTES */
    uint64_t dropped, refused;
} kvb__notifq_t;

/* Check a header of hlen bytes announcing length bytes of data: on success
 * *name_len_p, *msg_len_p and *token_p (NULL: none; else into h) are set;
 * else none is written. Pure (fuzzable). */
bool kvb__notif_parse(const uint8_t *h, size_t hlen, size_t length, uint32_t *name_len_p,
                      uint32_t *msg_len_p, const uint8_t **token_p);

/* Engine create: the queue's caps from the environment; the receive
 * handler on the worker (KVB_ERR_IO). Destroy: every queued entry freed. */
void kvb__notifq_init(kvb__notifq_t *q);
void kvb__notifq_free(kvb__notifq_t *q);
struct kvb_engine;
kvb_status_t kvb__notif_register(struct kvb_engine *eng);

/* Progress thread (CMD_NOTIF): send x's notification over its connection,
 * then publish x's end (KVB_OK once sent; KVB_ERR_PEER when it cannot be;
 * KVB_ERR_CANCELED when the engine stops first). */
struct kvb_xfer;
void kvb__notif_send(struct kvb_engine *eng, struct kvb_xfer *x);

/* kvb_engine_limits' KVB_ENGINE_LIMITS_NOTIFS group. Any thread. */
void kvb__notif_stats(struct kvb_engine *eng, kvb_engine_limits_t *l);

#endif
