/* What any engine thread may ask of the progress thread, below the lanes
 * and the core that drives them: queue a command (kvb__engine_submit), hold
 * and drop a connection (its last reference retires it through a command),
 * list the UCX requests it owns resources for (kvb__op_track), and have it
 * kill a connection (kvb__conn_kill: lanes may, session.c does it). */
#include "engine/engine_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvb_status_t kvb__engine_submit(kvb_engine_h eng, kvb__cmd_t *cmd, bool wait)
{
    uint64_t one = 1;
    cmd->next = NULL;
    cmd->done = 0;
    pthread_mutex_lock(&eng->cmd_mu);
    if (__atomic_load_n(&eng->stop, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&eng->cmd_mu);
        return KVB_ERR_CANCELED;
    }
    if (eng->cmd_tail)
        eng->cmd_tail->next = cmd;
    else
        eng->cmd_head = cmd;
    eng->cmd_tail = cmd;
    if (write(eng->evfd, &one, sizeof(one)) < 0)
        KVB_LOGD("eventfd write: %s", strerror(errno));
    while (wait && !cmd->done)
        pthread_cond_wait(&eng->cmd_cv, &eng->cmd_mu);
    pthread_mutex_unlock(&eng->cmd_mu);
    return KVB_OK;
}

void kvb__op_track(kvb_engine_h eng, kvb__op_t *op)
{
    op->next = eng->ops.next;
    op->prev = &eng->ops;
    eng->ops.next->prev = op;
    eng->ops.next = op;
}

void kvb__op_untrack(kvb_engine_h eng, kvb__op_t *op)
{
    (void)eng;
    if (op->next == NULL)
        return;
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->next = op->prev = NULL;
}

void kvb__conn_get(kvb__conn_t *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void kvb__conn_put(kvb__conn_t *c)
{
    kvb_engine_h eng;
    if (c == NULL || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    /* Last reference: its UCX objects belong to the progress thread. */
    eng = c->eng_backref;
    if (eng == NULL) { /* orphaned by kvb_engine_destroy: nothing left but it */
        free(c);
        return;
    }
    kvb__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return;
    cmd->kind = CMD_RETIRE;
    cmd->conn = c;
    if (kvb__engine_submit(eng, cmd, false) != KVB_OK)
        free(cmd); /* engine stopping: it releases every conn itself */
}

void kvb__conn_kill(kvb_engine_h eng, kvb__conn_t *c, const char *why)
{
    kvb__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return;
    kvb__conn_get(c);
    cmd->kind = CMD_KILL;
    cmd->conn = c;
    snprintf(cmd->why, sizeof(cmd->why), "%s", why);
    if (kvb__engine_submit(eng, cmd, false) != KVB_OK) {
        free(cmd);
        kvb__conn_put(c);
    }
}
