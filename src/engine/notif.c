/* Notifications (notif.h): a transfer's notification leaves only after the
 * transfer succeeded (complete.c defers its publish to here), so the bytes
 * are in the peer's memory (write) or in ours (read) when the peer reads
 * it; the receiver validates every byte of it and queues it under caps. */
#include "engine/engine_int.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvb__notif_entry {
    kvb__notif_entry_t *next;
    size_t name_len, len;
    char data[]; /* name, NUL, message, NUL: kvb_notif_t points in here */
};

bool kvb__notif_parse(const uint8_t *h, size_t hlen, size_t length, uint32_t *name_len_p,
                      uint32_t *msg_len_p, const uint8_t **token_p)
{
    uint32_t magic, flags, nl, ml;
    if (hlen < KVB_NOTIF_HDR)
        return false;
    memcpy(&magic, h, 4);
    memcpy(&flags, h + 4, 4);
    memcpy(&nl, h + 8, 4);
    memcpy(&ml, h + 12, 4);
    size_t want_h = KVB_NOTIF_HDR + ((flags & KVB_NOTIF_FLAG_TOKEN) ? KVB_HS_TOKEN_LEN : 0);
    if (magic != KVB_NOTIF_MAGIC || (flags & ~KVB_NOTIF_FLAG_TOKEN) != 0 || hlen != want_h ||
        nl == 0 || nl > KVB_NOTIF_NAME_MAX || ml > KVB_NOTIF_MAX_LEN || length != (size_t)nl + ml)
        return false;
    *name_len_p = nl;
    *msg_len_p = ml;
    *token_p = (flags & KVB_NOTIF_FLAG_TOKEN) ? h + KVB_NOTIF_HDR : NULL;
    return true;
}

void kvb__notifq_init(kvb__notifq_t *q)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->mu, NULL);
    q->max_n = (size_t)kvb__env_int("KVBRIDGE_NOTIF_QUEUE_MAX", NULL, 65536, 1, 100000000);
    q->max_bytes = (size_t)kvb__env_int("KVBRIDGE_NOTIF_QUEUE_BYTES", NULL, 64ll << 20, 1024,
                                        (int64_t)1 << 40);
}

void kvb__notifq_free(kvb__notifq_t *q)
{
    while (q->head != NULL) {
        kvb__notif_entry_t *e = q->head;
        q->head = e->next;
        free(e);
    }
    pthread_mutex_destroy(&q->mu);
}

/* One refusal, logged at powers of two (a hostile peer floods no log). */
static void refuse(kvb_engine_h eng, const char *why)
{
    pthread_mutex_lock(&eng->notifs.mu);
    uint64_t n = ++eng->notifs.refused;
    pthread_mutex_unlock(&eng->notifs.mu);
    if ((n & (n - 1)) == 0)
        KVB_LOGW("engine %s: refused a notification: %s (%llu so far)", eng->sid, why,
                 (unsigned long long)n);
}

static void enqueue(kvb_engine_h eng, const uint8_t *data, uint32_t nl, uint32_t ml)
{
    kvb__notifq_t *q = &eng->notifs;
    size_t cost = (size_t)nl + ml;
    kvb__notif_entry_t *e = malloc(sizeof(*e) + cost + 2);
    pthread_mutex_lock(&q->mu);
    if (e == NULL || q->n >= q->max_n || cost > q->max_bytes - q->bytes) {
        uint64_t n = ++q->dropped;
        size_t held = q->n;
        pthread_mutex_unlock(&q->mu);
        free(e);
        if ((n & (n - 1)) == 0)
            KVB_LOGW("engine %s: dropped a notification: queue full (%zu held, %llu dropped)",
                     eng->sid, held, (unsigned long long)n);
        return;
    }
    e->next = NULL;
    e->name_len = nl;
    e->len = ml;
    memcpy(e->data, data, nl);
    e->data[nl] = '\0';
    memcpy(e->data + nl + 1, data + nl, ml);
    e->data[nl + 1 + ml] = '\0';
    if (q->tail != NULL)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    q->n++;
    q->bytes += cost;
    pthread_mutex_unlock(&q->mu);
}

/* Progress thread: a notification arrived. Eager data only: a rendezvous
 * one (which our senders never send) is refused unread. */
static ucs_status_t am_notif_cb(void *arg, const void *header, size_t hlen, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    kvb_engine_h eng = arg;
    uint32_t nl, ml;
    const uint8_t *tok;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        refuse(eng, "not sent eager");
        return UCS_OK;
    }
    if (!kvb__notif_parse(header, hlen, length, &nl, &ml, &tok)) {
        refuse(eng, "malformed header or lengths");
        return UCS_OK;
    }
    if (eng->secret != NULL && (tok == NULL || !kvb__am_token_live(eng, tok))) {
        refuse(eng, "engine-secret token missing or wrong");
        return UCS_OK;
    }
    if (memchr(data, '\0', nl) != NULL) {
        refuse(eng, "NUL inside the sender name");
        return UCS_OK;
    }
    enqueue(eng, data, nl, ml);
    return UCS_OK;
}

kvb_status_t kvb__notif_register(kvb_engine_h eng)
{
    ucp_am_handler_param_t p = {0};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.arg = eng;
    p.id = KVB_AM_NOTIF;
    p.cb = am_notif_cb;
    return ucp_worker_set_am_recv_handler(eng->worker, &p) == UCS_OK ? KVB_OK : KVB_ERR_IO;
}

/* ---- sender ---- */

typedef struct notif_op {
    kvb__op_t op; /* first: the send is the op */
    struct kvb_xfer *x;
    uint8_t hdr[KVB_NOTIF_HDR + KVB_HS_TOKEN_LEN];
    uint8_t *buf;         /* name, then message */
    bool starting, ended; /* a send completed from within ucp_am_send_nbx (msg.c) */
    ucs_status_t status;
} notif_op_t;

/* x's end: KVB_OK, or st with the reason (its bytes moved and settled).
 * While the engine is being destroyed the reason names no session: its
 * sessions are freed before the worker, whose destruction ends the sends
 * still pending (their callbacks run inside ucp_worker_destroy), and the
 * listed ones are released after it. */
static void end_xfer(struct kvb_xfer *x, kvb_status_t st, const char *why)
{
    if (st != KVB_OK) {
        bool stopping = __atomic_load_n(&x->eng->stop, __ATOMIC_ACQUIRE);
        pthread_mutex_lock(&x->mu);
        if (stopping)
            snprintf(x->err, sizeof(x->err),
                     "transfer done, notification not sent: engine destroyed");
        else
            snprintf(x->err, sizeof(x->err), "session %s: transfer done, notification not sent: %s",
                     x->conn->sess->sid, why);
        pthread_mutex_unlock(&x->mu);
    }
    kvb__xfer_publish(x, st);
}

static void op_end(notif_op_t *o, kvb_status_t st, const char *why)
{
    kvb__op_untrack(o->x->eng, &o->op);
    end_xfer(o->x, st, why);
    free(o->buf);
    free(o);
}

static void op_release(kvb__op_t *op) /* the worker was destroyed first */
{
    op_end((notif_op_t *)op, KVB_ERR_CANCELED, "engine destroyed");
}

static void op_done(notif_op_t *o, ucs_status_t status)
{
    op_end(o, status == UCS_OK ? KVB_OK : KVB_ERR_PEER,
           status == UCS_OK ? "" : ucs_status_string(status));
}

static void send_cb(void *req, ucs_status_t status, void *user)
{
    notif_op_t *o = user;
    if (o->starting) {
        o->ended = true;
        o->status = status;
    } else {
        op_done(o, status);
    }
    ucp_request_free(req);
}

/* Header and data of x's notification into o (a test hook may break them:
 * kvb__test_hooks.notif_wire_fault). Returns the header's length. */
static size_t build(kvb_engine_h eng, const struct kvb_xfer *x, notif_op_t *o, size_t *len_p)
{
    uint32_t magic = KVB_NOTIF_MAGIC, flags = x->conn->am_auth ? KVB_NOTIF_FLAG_TOKEN : 0;
    uint32_t nl = (uint32_t)strlen(eng->name), ml = (uint32_t)x->notif_len;
    size_t len = (size_t)nl + ml;
    memcpy(o->buf, eng->name, nl);
    memcpy(o->buf + nl, x->notif, ml);
    int fault = KVB__HOOK(notif_wire_fault);
    if (fault == 1)
        len--;
    else if (fault == 2)
        ml = KVB_NOTIF_MAX_LEN + 1;
    else if (fault == 3)
        magic ^= 1;
    else if (fault == 4)
        o->buf[0] = '\0';
    memcpy(o->hdr, &magic, 4);
    memcpy(o->hdr + 4, &flags, 4);
    memcpy(o->hdr + 8, &nl, 4);
    memcpy(o->hdr + 12, &ml, 4);
    if (flags & KVB_NOTIF_FLAG_TOKEN)
        memcpy(o->hdr + KVB_NOTIF_HDR, x->conn->am_token, KVB_HS_TOKEN_LEN);
    *len_p = len;
    return KVB_NOTIF_HDR + ((flags & KVB_NOTIF_FLAG_TOKEN) ? KVB_HS_TOKEN_LEN : 0);
}

void kvb__notif_send(kvb_engine_h eng, struct kvb_xfer *x)
{
    kvb__conn_t *c = x->conn;
    if (__atomic_load_n(&c->dead, __ATOMIC_ACQUIRE) || c->ep == NULL) {
        end_xfer(x, KVB_ERR_PEER, c->why[0] != '\0' ? c->why : "connection lost");
        return;
    }
    notif_op_t *o = calloc(1, sizeof(*o));
    if (o == NULL || (o->buf = malloc(strlen(eng->name) + x->notif_len + 1)) == NULL) {
        free(o);
        end_xfer(x, KVB_ERR_NOMEM, "out of memory");
        return;
    }
    o->x = x;
    o->op.release = op_release;
    size_t len, hlen = build(eng, x, o, &len);
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
    p.cb.send = send_cb;
    p.user_data = o;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    p.datatype = ucp_dt_make_contig(1);
    o->starting = true;
    void *r = ucp_am_send_nbx(c->ep, KVB_AM_NOTIF, o->hdr, hlen, o->buf, len, &p);
    o->starting = false;
    if (o->ended)
        op_done(o, o->status);
    else if (UCS_PTR_IS_ERR(r) || r == NULL)
        op_done(o, UCS_PTR_STATUS(r));
    else
        kvb__op_track(eng, &o->op);
}

/* ---- API ---- */

kvb_status_t kvb_engine_get_notifs(kvb_engine_h eng, kvb_notif_t *notifs, size_t max, size_t *n_p)
{
    if (eng == NULL || n_p == NULL || (notifs == NULL && max > 0))
        return KVB_ERR_INVALID;
    kvb__notifq_t *q = &eng->notifs;
    size_t n = 0;
    pthread_mutex_lock(&q->mu);
    while (n < max && q->head != NULL) {
        kvb__notif_entry_t *e = q->head;
        q->head = e->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->n--;
        q->bytes -= e->name_len + e->len;
        notifs[n++] = (kvb_notif_t){
            .sender = e->data, .msg = (const uint8_t *)e->data + e->name_len + 1, .len = e->len};
    }
    pthread_mutex_unlock(&q->mu);
    if (n == 0 && max > 0)
        kvb__poll_idle(eng);
    *n_p = n;
    return KVB_OK;
}

void kvb_notifs_free(kvb_notif_t *notifs, size_t n)
{
    for (size_t i = 0; notifs != NULL && i < n; i++) {
        if (notifs[i].sender != NULL)
            free(notifs[i].sender - offsetof(kvb__notif_entry_t, data));
        notifs[i] = (kvb_notif_t){0};
    }
}

void kvb__notif_stats(kvb_engine_h eng, kvb_engine_limits_t *l)
{
    pthread_mutex_lock(&eng->notifs.mu);
    l->notifs_queued = eng->notifs.n;
    l->notifs_queued_bytes = eng->notifs.bytes;
    l->notifs_dropped = eng->notifs.dropped;
    l->notifs_refused = eng->notifs.refused;
    pthread_mutex_unlock(&eng->notifs.mu);
}
