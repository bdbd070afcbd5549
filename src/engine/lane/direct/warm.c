/* Direct lane: warming a peer's newly mapped files in the background.
 *
 * Why: the first write to each 4 KiB page through a new mapping takes a page
 * fault (measured 1.4 us per page here, about 5 us on VMs whose hypervisor
 * builds its tables lazily), so the first requests over a new connection ran
 * at 0.7-3 GB/s while later ones ran at memory speed; and pre-faulting the
 * whole pool on the connecting thread (MAP_POPULATE) held the first write
 * for ~90 ms per GiB. Instead one thread per engine walks each new mapping
 * a chunk at a time: it asks the kernel to fill the page tables
 * (MADV_POPULATE_READ) and then writes each page once (an atomic OR of 0:
 * it never changes a byte, whoever writes the page meanwhile), so the copy
 * threads find the pages ready.
 *
 * Bounds: only pages the owner has already allocated are touched (mincore:
 * a sparse file is never filled in by us, so no page count to cap); CPU is
 * bounded by KVBRIDGE_DIRECT_WARM_CPU, the percentage of one core the thread
 * may use (it sleeps in proportion after each chunk; 0 = no warmer: the
 * mapping is pre-faulted synchronously as before, up to
 * KVBRIDGE_DIRECT_POPULATE_MAX). A job ends early when its connection dies,
 * goes stale or is referenced by nothing but the warmer. */
#include "engine/lane/direct/direct.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define WARM_CHUNK ((uint64_t)8 << 20) /* bytes per step */
#define WARM_PAGE 4096u

typedef struct warm_job {
    kvb__conn_t *c; /* a reference, dropped when the job ends */
    uint8_t *base;
    uint64_t size, done;
    uint64_t t0; /* queued at (ns) */
    struct warm_job *next;
} warm_job_t;

struct kvb__warm {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thr;
    bool started, stop;
    bool populate_ok; /* MADV_POPULATE_READ known to the kernel (Linux 5.14) */
    warm_job_t *head, *tail;
    uint64_t pages; /* pages touched so far (tests, logs) */
};

int kvb__warm_cpu_pct(void)
{
    return (int)kvb__env_int("KVBRIDGE_DIRECT_WARM_CPU", NULL, 50, 0, 100);
}

static bool job_over(const warm_job_t *j)
{
    const kvb__conn_t *c = j->c;
    return j->done >= j->size || __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE) ||
           __atomic_load_n(&c->stale, __ATOMIC_ACQUIRE) ||
           __atomic_load_n(&c->refs, __ATOMIC_ACQUIRE) <= 1;
}

/* Warm the resident pages of [p, p + len): populate each resident run, then
 * write every resident page once. Populating for reading is enough for the
 * page tables (a shared file mapping without dirty tracking gets writable
 * entries on a read fault; measured: 126-144 ms per GiB, then the first
 * write pass runs at memory speed, where MADV_POPULATE_WRITE took 327 ms and
 * one write fault per page 635 ms); the write touch after it costs 60-100 ms
 * per GiB more here and is what hosts that track first writes themselves (a
 * hypervisor's shadow page tables) need. Returns the pages touched. */
static uint64_t warm_range(struct kvb__warm *w, uint8_t *p, uint64_t len, unsigned char *vec)
{
    uint64_t n = len / WARM_PAGE, touched = 0;
    if (mincore(p, len, vec) != 0)
        return 0;
    for (uint64_t i = 0; i < n;) {
        uint64_t k = i;
        while (k < n && (vec[k] & 1))
            k++;
        if (k > i && w->populate_ok &&
            madvise(p + i * WARM_PAGE, (k - i) * WARM_PAGE, MADV_POPULATE_READ) != 0 &&
            errno == EINVAL)
            w->populate_ok = false; /* older kernel: the touch alone faults */
        /* ORs in 0: no byte changes, so it races with nobody's bytes; hidden
         * from TSan, which would pair it with a copy thread's plain loads
         * (a one-sided read copying out of the same page). */
        KVB_TSAN_IGNORE_BEGIN();
        for (uint64_t q = i; q < k; q++)
            __atomic_fetch_or((uint64_t *)(void *)(p + q * WARM_PAGE), 0, __ATOMIC_RELAXED);
        KVB_TSAN_IGNORE_END();
        touched += k - i;
        i = k + 1;
    }
    return touched;
}

static void pause_for(double busy_s, int pct)
{
    double idle = busy_s * (100 - pct) / pct;
    if (idle <= 0)
        return;
    struct timespec ts = {(time_t)idle, (long)((idle - (double)(time_t)idle) * 1e9)};
    nanosleep(&ts, NULL);
}

/* One chunk of the head job (mu not held while it works). */
static void warm_step(kvb_engine_h eng, struct kvb__warm *w, warm_job_t *j, unsigned char *vec)
{
    uint64_t len = j->size - j->done < WARM_CHUNK ? j->size - j->done : WARM_CHUNK;
    uint64_t t0 = kvb__now_ns();
    uint64_t pages = warm_range(w, j->base + j->done, len / WARM_PAGE * WARM_PAGE, vec);
    j->done += len;
    __atomic_add_fetch(&w->pages, pages, __ATOMIC_RELAXED);
    pause_for((double)(kvb__now_ns() - t0) / 1e9, eng->direct->warm_pct);
}

static void *warm_main(void *arg)
{
    kvb_engine_h eng = arg;
    struct kvb__warm *w = eng->direct->warm;
    unsigned char *vec = malloc(WARM_CHUNK / WARM_PAGE);
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        warm_job_t *j = w->head;
        if (j == NULL) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        if (vec != NULL && !job_over(j)) {
            pthread_mutex_unlock(&w->mu);
            warm_step(eng, w, j, vec);
            pthread_mutex_lock(&w->mu);
            if (!job_over(j))
                continue;
        }
        w->head = j->next;
        if (w->head == NULL)
            w->tail = NULL;
        KVB_LOGD("engine %s: session %s: warmed %.1f of %.1f MiB of a peer's file in %.3f s",
                 eng->sid, j->c->sess->sid, (double)j->done / (1 << 20),
                 (double)j->size / (1 << 20), (double)(kvb__now_ns() - j->t0) / 1e9);
        pthread_mutex_unlock(&w->mu);
        kvb__conn_put(j->c);
        free(j);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    free(vec);
    return NULL;
}

void kvb__warm_add(kvb_engine_h eng, kvb__conn_t *c, uint8_t *base, uint64_t size)
{
    struct kvb__warm *w = eng->direct->warm;
    warm_job_t *j = calloc(1, sizeof(*j));
    if (w == NULL || j == NULL) {
        free(j);
        return;
    }
    kvb__conn_get(c);
    *j = (warm_job_t){.c = c, .base = base, .size = size, .t0 = kvb__now_ns()};
    pthread_mutex_lock(&w->mu);
    if (!w->started && !w->stop)
        w->started = pthread_create(&w->thr, NULL, warm_main, eng) == 0;
    if (!w->started) {
        pthread_mutex_unlock(&w->mu);
        kvb__conn_put(c);
        free(j);
        return;
    }
    if (w->tail != NULL)
        w->tail->next = j;
    else
        w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void kvb__warm_init(kvb_engine_h eng)
{
    eng->direct->warm_pct = kvb__warm_cpu_pct();
    struct kvb__warm *w = eng->direct->warm_pct > 0 ? calloc(1, sizeof(*w)) : NULL;
    if (w == NULL)
        return; /* off (or no memory): attach pre-faults synchronously */
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->populate_ok = true;
    eng->direct->warm = w;
}

void kvb__warm_stop(kvb_engine_h eng)
{
    struct kvb__warm *w = eng->direct->warm;
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->started)
        pthread_join(w->thr, NULL);
    for (warm_job_t *j = w->head, *nx; j != NULL; j = nx) {
        nx = j->next;
        kvb__conn_put(j->c);
        free(j);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    eng->direct->warm = NULL;
}

uint64_t kvb__warm_pages(kvb_engine_h eng)
{
    return eng->direct->warm != NULL ? __atomic_load_n(&eng->direct->warm->pages, __ATOMIC_RELAXED)
                                     : 0;
}
