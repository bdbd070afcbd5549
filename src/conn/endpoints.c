/* Prefill side: the dialect each decode control endpoint speaks, for the
 * statuses sent to it. An endpoint that never said is answered in the
 * default dialect (kvb__dialect_default: SGLang's 3-frame status, the same
 * in both SGLang dialects); one that did is remembered here (FIFO of
 * KVB__ENDPOINTS), and the endpoint of every registration held counts too
 * (those outlast a flood of forged messages that would push a real decode
 * out of the FIFO). A dialect's decode may die on another dialect's
 * status (TokenSpeed's control thread does), so this decides what is sent.
 * Made on first use: the SGLang-only paths pay nothing. Any thread. */
#include "dialect/dialect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVB__ENDPOINTS 1024 /* endpoints remembered (FIFO) */

struct kvb__endpoints {
    pthread_mutex_t mu; /* first: kvb__lazy_table initialises it */
    struct {
        char ip[KVB_IP_MAX];
        uint16_t port;
        const struct kvb__dialect *dialect;
    } ep[KVB__ENDPOINTS];
    size_t n_ep, next_ep;
};

static struct kvb__endpoints *endpoints_get(struct kvb_manager *m, bool create)
{
    return kvb__lazy_table((void **)&m->endpoints, sizeof(struct kvb__endpoints), create);
}

void kvb__endpoints_free(struct kvb_manager *m)
{
    struct kvb__endpoints *t = m->endpoints;
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t);
    m->endpoints = NULL;
}

void kvb__endpoint_note(struct kvb_manager *m, const char *ip, size_t ip_len, uint16_t port,
                        const struct kvb__dialect *dialect)
{
    struct kvb__endpoints *t = endpoints_get(m, true);
    char host[KVB_IP_MAX];
    if (t == NULL)
        return;
    ip_len = ip_len < sizeof(host) ? ip_len : sizeof(host) - 1;
    memcpy(host, ip, ip_len);
    host[ip_len] = '\0';
    pthread_mutex_lock(&t->mu);
    bool known = false;
    for (size_t i = 0; i < t->n_ep && !known; i++)
        known =
            t->ep[i].port == port && t->ep[i].dialect == dialect && strcmp(t->ep[i].ip, host) == 0;
    if (!known) {
        size_t k = t->n_ep < KVB__ENDPOINTS ? t->n_ep++ : t->next_ep++ % KVB__ENDPOINTS;
        snprintf(t->ep[k].ip, sizeof(t->ep[k].ip), "%s", host);
        t->ep[k].port = port;
        t->ep[k].dialect = dialect;
    }
    pthread_mutex_unlock(&t->mu);
}

const struct kvb__dialect *kvb__endpoint_dialect(struct kvb_manager *m, const char *ip,
                                                 uint16_t port)
{
    struct kvb__endpoints *t = endpoints_get(m, false);
    const struct kvb__dialect *d = NULL;
    if (t == NULL)
        return NULL; /* no endpoint ever said: the default dialect */
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n_ep && d == NULL; i++)
        if (t->ep[i].port == port && strcmp(t->ep[i].ip, ip) == 0)
            d = t->ep[i].dialect;
    pthread_mutex_unlock(&t->mu);
    pthread_rwlock_rdlock(&m->reg_mu);
    for (const kvb__reg_t *g = m->regs; g != NULL && d == NULL; g = g->next)
        if (g->dialect != NULL && g->dialect->t.own_status && g->port == port &&
            strcmp(g->ip, ip) == 0)
            d = g->dialect;
    pthread_rwlock_unlock(&m->reg_mu);
    return d;
}
