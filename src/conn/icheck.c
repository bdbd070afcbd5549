/* The decode's integrity checks on a small pool of workers (conn_int.h,
 * "icheck.c"; docs/integrity.md): the control thread hands over a room
 * whose sources all answered Success; the workers recompute its digest
 * over the room's pages (integrity.h's check in parts: a large room is
 * shared by the idle workers) while the control thread goes on receiving
 * other rooms' statuses; the worker that ends its last part reports it
 * (decode.c's report, passed in). The room stays unfinished until then;
 * abort and expiry work on it meanwhile as before (the report is dropped
 * for a room that ended). */
#include "conn/conn_int.h"

#include <stdlib.h>
#include <unistd.h>

#define THREADS_DEFAULT 2
#define QUEUE_DEFAULT 64
/* KVBRIDGE_INTEGRITY_PART: a room is split in parts of about this much,
 * one per worker at most */
#define PART_DEFAULT (1 << 20)

int kvb__icheck_stall_ms;

typedef struct icheck {
    struct icheck *next;
    uint64_t room;
    kvb__integ_t *a;
    kvb__tl_t *tl; /* a reference */
    kvb__integ_run_t run;
    size_t n_parts, claimed, ended; /* claimed, ended: the pool's mu */
} icheck_t;

struct kvb__icheck_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    icheck_t *head, *tail; /* mu: rooms with parts not yet claimed */
    size_t n, cap;         /* mu: rooms queued, at most */
    uint64_t part_bytes;   /* KVBRIDGE_INTEGRITY_PART */
    int stop;              /* mu */
    pthread_t *thr;
    size_t n_thr;
    kvb__icheck_fn report;
};

void kvb__icheck_test_stall(void)
{
    int ms = __atomic_exchange_n(&kvb__icheck_stall_ms, 0, __ATOMIC_RELAXED);
    if (ms > 0) /* tests only: a slow check (a large room) */
        usleep((useconds_t)ms * 1000);
}

static void icheck_free(icheck_t *c)
{
    kvb__integ_run_free(&c->run);
    kvb__integ_free(c->a);
    free(c->a);
    kvb__tl_put(c->tl);
    free(c);
}

/* The next part to compute (mu held): the head room's; a room whose last
 * part is claimed leaves the queue. NULL when none. */
static icheck_t *claim(struct kvb__icheck_pool *p, size_t *part_p)
{
    icheck_t *c = p->head;
    if (c == NULL)
        return NULL;
    *part_p = c->claimed++;
    if (c->claimed == c->n_parts) {
        p->head = c->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->n--;
    }
    return c;
}

/* c's parts all ended (no lock): the verdict, reported. */
static void conclude(struct kvb_manager *m, icheck_t *c)
{
    char why[320] = "";
    bool good = kvb__integ_run_verdict(c->a, &c->run, why, sizeof(why));
    m->icheck->report(m, c->room, good, why, c->tl);
    icheck_free(c);
}

static void *icheck_main(void *arg)
{
    struct kvb_manager *m = arg;
    struct kvb__icheck_pool *p = m->icheck;
    size_t part = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        icheck_t *c = NULL;
        while (!p->stop && (c = claim(p, &part)) == NULL)
            pthread_cond_wait(&p->cv, &p->mu);
        if (c == NULL)
            break; /* stopping */
        pthread_mutex_unlock(&p->mu);
        if (part == 0)
            kvb__icheck_test_stall();
        kvb__integ_run_part(c->a, &c->run, m->kv_ptrs, m->args.kv_item_len, part, c->n_parts);
        pthread_mutex_lock(&p->mu);
        if (++c->ended == c->n_parts) { /* the others' sums are in: their adds came before */
            pthread_mutex_unlock(&p->mu);
            conclude(m, c);
            pthread_mutex_lock(&p->mu);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kvb_status_t kvb__icheck_start(struct kvb_manager *m, kvb__icheck_fn report)
{
    size_t n = (size_t)kvb__env_int("KVBRIDGE_INTEGRITY_THREADS", NULL, THREADS_DEFAULT, 0, 64);
    struct kvb__icheck_pool *p;
    if (!m->p.integrity || n == 0)
        return KVB_OK;
    if ((p = calloc(1, sizeof(*p))) == NULL || (p->thr = calloc(n, sizeof(*p->thr))) == NULL) {
        free(p);
        return KVB_ERR_NOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->report = report;
    p->cap = (size_t)kvb__env_int("KVBRIDGE_INTEGRITY_QUEUE", NULL, QUEUE_DEFAULT, 1, 1 << 16);
    p->part_bytes =
        (uint64_t)kvb__env_int("KVBRIDGE_INTEGRITY_PART", NULL, PART_DEFAULT, 1, (int64_t)1 << 40);
    m->icheck = p;
    for (size_t i = 0; i < n; i++)
        if (pthread_create(&p->thr[p->n_thr], NULL, icheck_main, m) == 0)
            p->n_thr++;
    if (p->n_thr == 0) {
        kvb__icheck_stop(m);
        return KVB_ERR_IO;
    }
    return KVB_OK;
}

/* Parts for c: one per part_bytes of pages to read, one per worker at most. */
static size_t parts_of(const struct kvb__icheck_pool *p, const icheck_t *c, uint64_t item_len)
{
    uint64_t bytes = (uint64_t)c->run.n_items * item_len, n = bytes / p->part_bytes;
    n = n < p->n_thr ? n : p->n_thr;
    return n > 0 ? (size_t)n : 1;
}

bool kvb__icheck_submit(struct kvb_manager *m, uint64_t room, kvb__integ_t *a, kvb__tl_t *tl)
{
    struct kvb__icheck_pool *p = m->icheck;
    icheck_t *c;
    if (p == NULL || (c = calloc(1, sizeof(*c))) == NULL)
        return false;
    if (kvb__integ_run_init(a, &c->run) != KVB_OK) {
        free(c);
        return false;
    }
    c->room = room;
    c->a = a;
    c->tl = tl;
    c->n_parts = parts_of(p, c, m->args.kv_item_len);
    pthread_mutex_lock(&p->mu);
    bool ok = !p->stop && p->n < p->cap;
    if (ok) {
        if (p->tail != NULL)
            p->tail->next = c;
        else
            p->head = c;
        p->tail = c;
        p->n++;
        kvb__tl_ref(tl);
        pthread_cond_broadcast(&p->cv); /* its parts: every idle worker */
    }
    pthread_mutex_unlock(&p->mu);
    if (!ok) {
        kvb__integ_run_free(&c->run);
        free(c);
    }
    return ok;
}

void kvb__icheck_stop(struct kvb_manager *m)
{
    struct kvb__icheck_pool *p = m->icheck;
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_thr; i++)
        pthread_join(p->thr[i], NULL); /* after the part each is running */
    for (icheck_t *c = p->head, *next; c != NULL; c = next) {
        next = c->next;
        icheck_free(c); /* none of its parts runs now; an unclaimed one never will */
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->thr);
    free(p);
    m->icheck = NULL;
}
