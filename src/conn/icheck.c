/* The decode's integrity checks on a small pool of workers (conn_int.h,
 * "icheck.c"; docs/integrity.md): the control thread hands over a room
 * whose sources all answered Success; a worker recomputes its digest over
 * the room's pages (decode.c's check, passed in at the start) while the control thread goes
 * on receiving other rooms' statuses. The room stays Transferring until its
 * check ends; abort and expiry work on it meanwhile as before (the check's
 * verdict is dropped for a room that ended). */
#include "conn/conn_int.h"

#include <stdlib.h>

int kvb__icheck_stall_ms;

#define THREADS_DEFAULT 2
#define QUEUE_DEFAULT 64

typedef struct icheck {
    struct icheck *next;
    uint64_t room;
    kvb__integ_t *a;
    kvb__tl_t *tl; /* a reference */
} icheck_t;

struct kvb__icheck_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    icheck_t *head, *tail; /* mu */
    size_t n, cap;         /* mu: waiting, at most */
    int stop;              /* mu */
    pthread_t *thr;
    size_t n_thr;
    kvb__icheck_fn finish; /* the check itself (decode.c's, passed in: no call circle) */
};

static void icheck_drop(icheck_t *c)
{
    kvb__integ_free(c->a);
    free(c->a);
    kvb__tl_put(c->tl);
    free(c);
}

static void *icheck_main(void *arg)
{
    struct kvb_manager *m = arg;
    struct kvb__icheck_pool *p = m->icheck;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->head == NULL)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        icheck_t *c = p->head;
        p->head = c->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->n--;
        pthread_mutex_unlock(&p->mu);
        p->finish(m, c->room, c->a, c->tl); /* frees c->a */
        kvb__tl_put(c->tl);
        free(c);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kvb_status_t kvb__icheck_start(struct kvb_manager *m, kvb__icheck_fn finish)
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
    p->finish = finish;
    p->cap = (size_t)kvb__env_int("KVBRIDGE_INTEGRITY_QUEUE", NULL, QUEUE_DEFAULT, 1, 1 << 16);
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

bool kvb__icheck_submit(struct kvb_manager *m, uint64_t room, kvb__integ_t *a, kvb__tl_t *tl)
{
    struct kvb__icheck_pool *p = m->icheck;
    icheck_t *c;
    if (p == NULL || (c = malloc(sizeof(*c))) == NULL)
        return false;
    *c = (icheck_t){NULL, room, a, tl};
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
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (!ok)
        free(c);
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
        pthread_join(p->thr[i], NULL); /* after the check each is running */
    for (icheck_t *c = p->head, *next; c != NULL; c = next) {
        next = c->next;
        icheck_drop(c);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->thr);
    free(p);
    m->icheck = NULL;
}
