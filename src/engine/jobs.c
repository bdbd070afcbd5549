/* The engine's device-copy worker (engine_int.h "jobs"): one thread,
 * started with the first job, runs CUDA copies that must not block the
 * progress thread (the target's host-to-device copy of a staged message,
 * the writer's device-to-host staging, chunk by chunk). A job runs in
 * steps; after each one that is not the last it goes to the back of the
 * queue, so a long transfer's staging does not hold up a short one.
 * Finished jobs are handed back to the progress thread (the done list,
 * the event fd woken), which answers peers: only it may touch UCX. */
#include "engine/engine_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JOBS_BOUND_DEFAULT 16 /* bounded jobs (the target's copies) queued or running */

void kvb__jobs_init(kvb__jobs_t *q)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->mu, NULL);
    kvb__cond_init_mono(&q->cv); /* blocked_wait: a monotonic time-out */
    q->max_bounded =
        (size_t)kvb__env_int("KVBRIDGE_CUDA_COPY_QUEUE", NULL, JOBS_BOUND_DEFAULT, 1, 1 << 20);
}

static void wake(kvb_engine_h eng)
{
    uint64_t one = 1;
    if (write(eng->evfd, &one, sizeof(one)) < 0)
        KVB_LOGD("eventfd write: %s", strerror(errno));
}

void kvb__jobs_wake(kvb_engine_h eng)
{
    wake(eng);
}

/* Every queued job is blocked: wait for a kick (or 2 ms, bounded, in case
 * one was missed), then try them all again. q->mu held. */
static void blocked_wait(kvb__jobs_t *q)
{
    if (!q->kicked && !q->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 2000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    q->kicked = false;
    q->n_blocked = 0;
}

void kvb__jobs_kick(kvb_engine_h eng)
{
    kvb__jobs_t *q = &eng->jobs;
    pthread_mutex_lock(&q->mu);
    q->kicked = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void *jobs_main(void *arg)
{
    kvb_engine_h eng = arg;
    kvb__jobs_t *q = &eng->jobs;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && q->head == NULL)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop)
            break;
        kvb__job_t *j = q->head;
        q->head = j->next;
        if (q->head == NULL)
            q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        int r = j->run(j);
        pthread_mutex_lock(&q->mu);
        j->next = NULL;
        if (r != KVB__JOB_DONE) { /* to the back: the others get their turn */
            if (q->tail != NULL)
                q->tail->next = j;
            else
                q->head = j;
            q->tail = j;
            q->n_blocked = r == KVB__JOB_BLOCKED ? q->n_blocked + 1 : 0;
            if (q->n_blocked >= q->n_queued)
                blocked_wait(q); /* a whole round blocked */
            continue;
        }
        q->n_queued--;
        q->n_bounded -= j->bounded;
        j->next = q->done;
        q->done = j;
        __atomic_store_n(&q->has_done, 1, __ATOMIC_RELEASE);
        wake(eng);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

bool kvb__jobs_push(kvb_engine_h eng, kvb__job_t *j)
{
    kvb__jobs_t *q = &eng->jobs;
    bool ok = true;
    pthread_mutex_lock(&q->mu);
    if (q->stop || (j->bounded && q->n_bounded >= q->max_bounded))
        ok = false;
    if (ok && !q->started) {
        ok = pthread_create(&q->thr, NULL, jobs_main, eng) == 0;
        q->started = ok;
        if (!ok)
            KVB_LOGW("engine %s: cannot start the device-copy worker: copies run inline", eng->sid);
    }
    if (ok) {
        j->next = NULL;
        if (q->tail != NULL)
            q->tail->next = j;
        else
            q->head = j;
        q->tail = j;
        q->n_bounded += j->bounded;
        q->n_queued++;
        q->n_blocked = 0;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

bool kvb__jobs_progress(kvb_engine_h eng)
{
    kvb__jobs_t *q = &eng->jobs;
    if (!__atomic_load_n(&q->has_done, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&q->mu);
    kvb__job_t *j = q->done;
    q->done = NULL;
    __atomic_store_n(&q->has_done, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&q->mu);
    bool any = j != NULL;
    while (j != NULL) {
        kvb__job_t *next = j->next;
        j->done(eng, j);
        j = next;
    }
    return any;
}

static void drop_list(kvb_engine_h eng, kvb__job_t *j)
{
    while (j != NULL) {
        kvb__job_t *next = j->next;
        j->drop(eng, j);
        j = next;
    }
}

void kvb__jobs_stop(kvb_engine_h eng)
{
    kvb__jobs_t *q = &eng->jobs;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    bool started = q->started;
    pthread_mutex_unlock(&q->mu);
    if (started)
        pthread_join(q->thr, NULL); /* after the step it is running */
    pthread_mutex_lock(&q->mu);
    kvb__job_t *queued = q->head, *done = q->done;
    q->head = q->tail = q->done = NULL;
    q->n_queued = 0;
    __atomic_store_n(&q->has_done, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&q->mu);
    drop_list(eng, queued);
    drop_list(eng, done);
}

void kvb__jobs_free(kvb__jobs_t *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}
