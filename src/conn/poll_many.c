/* kvb_sender_poll_many / kvb_receiver_poll_many: many rooms' statuses for
 * one lock round trip per manager instead of one per room (review §3: a
 * rank with 10k rooms in flight polled each under the manager-wide mutex,
 * and from Python each poll also paid a ctypes call). Same answers and side
 * effects as polling each handle in turn with kvb_*_poll.
 * Which rooms to poll at all: kvb_manager_changed (rooms.c). */
#include "conn/conn_int.h"

#include <kvbridge/conn.h>

static bool args_ok(const void *const *h, size_t count, const void *out)
{
    if (count > 0 && (h == NULL || out == NULL))
        return false;
    for (size_t i = 0; i < count; i++)
        if (h[i] == NULL)
            return false;
    return true;
}

kvb_status_t kvb_sender_poll_many(kvb_sender_h const *s, size_t count, kvb_poll_t *polls_p)
{
    if (!args_ok((const void *const *)s, count, polls_p))
        return KVB_ERR_INVALID;
    /* Handles of one manager that come one after another share a lock. */
    for (size_t i = 0, j; i < count; i = j) {
        struct kvb_manager *m = s[i]->mgr;
        pthread_mutex_lock(&m->mu);
        for (j = i; j < count && s[j]->mgr == m; j++)
            polls_p[j] = s[j]->concluded ? (kvb_poll_t)(s[j]->concluded - 1)
                                         : (kvb_poll_t)kvb__sender_status(m, s[j]);
        pthread_mutex_unlock(&m->mu);
        for (size_t k = i; k < j; k++) /* outside the lock: it may notify the decode */
            if (!s[k]->concluded)
                polls_p[k] = kvb__sender_conclude(s[k], (int)polls_p[k]);
    }
    return KVB_OK;
}

kvb_status_t kvb_receiver_poll_many(kvb_receiver_h const *rc, size_t count, kvb_poll_t *polls_p)
{
    if (!args_ok((const void *const *)rc, count, polls_p))
        return KVB_ERR_INVALID;
    for (size_t i = 0, j; i < count; i = j) {
        struct kvb_manager *m = rc[i]->mgr;
        pthread_mutex_lock(&m->mu);
        for (j = i; j < count && rc[j]->mgr == m; j++)
            polls_p[j] = rc[j]->concluded ? (kvb_poll_t)(rc[j]->concluded - 1)
                                          : (kvb_poll_t)kvb__receiver_status(m, rc[j]);
        pthread_mutex_unlock(&m->mu);
        for (size_t k = i; k < j; k++) {
            if (rc[k]->concluded)
                continue;
            /* A failed room is terminal only once its writer fence closes:
             * kvb_receiver_poll opens it and says (rare: poll it alone). */
            if (polls_p[k] == KVB_POLL_FAILED)
                polls_p[k] = kvb_receiver_poll(rc[k]);
            else if (polls_p[k] == KVB_POLL_SUCCESS)
                rc[k]->concluded = KVB_POLL_SUCCESS + 1;
        }
    }
    return KVB_OK;
}
