#include "fault_util.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double fnow(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void fsleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static uint64_t item_len_of(const fgeom_t *g)
{
    return (uint64_t)g->page * (uint64_t)g->heads * (uint64_t)g->head_bytes;
}

size_t farena_len(const fgeom_t *g)
{
    uint64_t buf = item_len_of(g) * g->pool_pages;
    return FR_CANARY + (size_t)(2 * g->layers) * (buf + FR_CANARY) + FR_AUX_ITEM * FR_AUX_ITEMS +
           FR_CANARY;
}

void flayout(frank_t *r, const fgeom_t *g, uint8_t *arena, int fill)
{
    r->g = *g;
    r->arena = arena;
    r->arena_len = farena_len(g);
    r->n_kv = 2 * g->layers;
    r->item_len = item_len_of(g);
    r->buf_len = r->item_len * g->pool_pages;
    size_t off = FR_CANARY;
    if (fill)
        memset(arena, FR_CANARY_BYTE, r->arena_len);
    for (int i = 0; i < r->n_kv; i++) {
        r->kv[i] = arena + off;
        if (fill)
            memset(r->kv[i], 0, r->buf_len);
        off += r->buf_len + FR_CANARY;
    }
    r->aux = arena + off;
    if (fill)
        memset(r->aux, 0, FR_AUX_ITEM * FR_AUX_ITEMS);
}

int frank_start(frank_t *r, const fgeom_t *g, kvb_mode_t mode, const char *boot, int memfd,
                const fknobs_t *k)
{
    kvb_engine_params_t ep = {0};
    kvb_manager_params_t mp = {0};
    kvb_kv_args_t a = {0};
    uint64_t ptrs[FR_MAX_KV], lens[FR_MAX_KV];
    size_t len = farena_len(g);
    uint8_t *arena;
    memset(r, 0, sizeof(*r));
    if (memfd >= 0) {
        arena = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (arena == MAP_FAILED)
            return -1;
        r->mapped = 1;
    } else if (k != NULL && k->shared_pool) {
        void *v = NULL;
        if (kvb_mem_alloc(len, &v) != KVB_OK)
            return -1;
        arena = v;
        r->mapped = 2;
    } else {
        arena = malloc(len);
        if (arena == NULL)
            return -1;
    }
    flayout(r, g, arena, 1);
    for (int i = 0; i < r->n_kv; i++) {
        ptrs[i] = (uint64_t)(uintptr_t)r->kv[i];
        lens[i] = r->buf_len;
    }
    uint64_t aux_ptr = (uint64_t)(uintptr_t)r->aux, aux_len = FR_AUX_ITEM * FR_AUX_ITEMS,
             aux_item = FR_AUX_ITEM;
    a.kv_data_ptrs = ptrs;
    a.kv_data_lens = lens;
    a.num_kv = (uint32_t)r->n_kv;
    a.kv_item_len = r->item_len;
    a.aux_data_ptrs = &aux_ptr;
    a.aux_data_lens = &aux_len;
    a.aux_item_lens = &aux_item;
    a.num_aux = 1;
    a.page_size = (uint32_t)g->page;
    a.kv_head_num = (uint32_t)g->heads;
    a.engine_rank = 0;
    a.num_layers_total = (uint32_t)g->layers;
    if (kvb_engine_create(&ep, &r->eng) != KVB_OK) {
        fprintf(stderr, "engine create failed\n");
        return -1;
    }
    mp.field_mask = KVB_MANAGER_PARAM_THREADS;
    if (boot != NULL && mode == KVB_MODE_PREFILL)
        mp.field_mask |= KVB_MANAGER_PARAM_BOOTSTRAP_ADDR;
    if (k != NULL && k->hb_interval > 0) {
        mp.field_mask |= KVB_MANAGER_PARAM_HEARTBEAT;
        mp.heartbeat_interval_s = k->hb_interval;
        mp.heartbeat_max_failures = k->hb_misses;
    }
    if (k != NULL && k->boot_timeout > 0) {
        mp.field_mask |= KVB_MANAGER_PARAM_BOOTSTRAP_TIMEOUT;
        mp.bootstrap_timeout_s = k->boot_timeout;
    }
    if (k != NULL && k->wait_timeout > 0) {
        mp.field_mask |= KVB_MANAGER_PARAM_WAITING_TIMEOUT;
        mp.waiting_timeout_s = k->wait_timeout;
    }
    mp.mode = mode;
    mp.kv_args = &a;
    mp.engine = r->eng;
    mp.attn_tp_size = mp.attn_dp_size = mp.pp_size = mp.system_dp_size = 1;
    mp.bootstrap_addr = boot;
    mp.transfer_threads = 2;
    mp.transfer_queues = 2;
    if (kvb_manager_create(&mp, &r->mgr) != KVB_OK) {
        fprintf(stderr, "manager create: %s\n", kvb_manager_last_error(NULL));
        return -1;
    }
    return 0;
}

void frank_stop(frank_t *r)
{
    if (r->mgr != NULL)
        kvb_manager_destroy(r->mgr);
    if (r->eng != NULL)
        kvb_engine_destroy(r->eng);
    if (r->mapped == 2)
        kvb_mem_free(r->arena);
    else if (r->mapped)
        munmap(r->arena, r->arena_len);
    else
        free(r->arena);
    memset(r, 0, sizeof(*r));
}

static bool canary_range(const uint8_t *p, size_t n, const char *who, const char *where)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != FR_CANARY_BYTE) {
            fprintf(stderr, "%s: canary %s broken at +%zu (0x%02x)\n", who, where, i, p[i]);
            return false;
        }
    return true;
}

bool fcanaries_ok(const frank_t *r, const char *who)
{
    bool ok = canary_range(r->arena, FR_CANARY, who, "before buffer 0");
    for (int i = 0; i < r->n_kv; i++)
        ok &= canary_range(r->kv[i] + r->buf_len, FR_CANARY, who, "after a KV buffer");
    ok &= canary_range(r->aux + FR_AUX_ITEM * FR_AUX_ITEMS, FR_CANARY, who, "after aux");
    return ok;
}

uint8_t fpat(uint64_t room, int buf, uint64_t page, uint64_t k)
{
    uint64_t x = room * 0x9e3779b97f4a7c15ull ^ (uint64_t)buf << 48 ^ page << 24 ^ (k >> 3);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint8_t)(x >> (8 * (k & 7)));
}

static void fill_item(uint8_t *p, uint64_t len, uint64_t room, int buf, uint64_t page)
{
    for (uint64_t k = 0; k < len; k++)
        p[k] = fpat(room, buf, page, k);
}

void ffill(frank_t *r, uint64_t room, const int32_t *src, int n, int aux_index)
{
    for (int b = 0; b < r->n_kv; b++)
        for (int i = 0; i < n; i++)
            fill_item(r->kv[b] + (uint64_t)src[i] * r->item_len, r->item_len, room, b, (uint64_t)i);
    fill_item(r->aux + (uint64_t)aux_index * FR_AUX_ITEM, FR_AUX_ITEM, room, 100, 0);
}

uint64_t fverify(const frank_t *r, uint64_t room, const int32_t *dst, int n, int aux_index)
{
    uint64_t bad = 0;
    for (int b = 0; b < r->n_kv; b++)
        for (int i = 0; i < n; i++) {
            const uint8_t *p = r->kv[b] + (uint64_t)dst[i] * r->item_len;
            for (uint64_t k = 0; k < r->item_len; k++)
                bad += p[k] != fpat(room, b, (uint64_t)i, k);
        }
    for (uint64_t k = 0; k < FR_AUX_ITEM; k++)
        bad += r->aux[(uint64_t)aux_index * FR_AUX_ITEM + k] != fpat(room, 100, 0, k);
    return bad;
}

kvb_poll_t fwait_receiver(kvb_receiver_h rc, double timeout_s)
{
    double end = fnow() + timeout_s;
    kvb_poll_t p;
    while ((p = kvb_receiver_poll(rc)) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED && fnow() < end)
        fsleep(0.001);
    return p;
}

kvb_poll_t fwait_sender(kvb_sender_h s, double timeout_s)
{
    double end = fnow() + timeout_s;
    kvb_poll_t p;
    while ((p = kvb_sender_poll(s)) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED && fnow() < end)
        fsleep(0.001);
    return p;
}

int fwait_sender_ready(kvb_sender_h s, double timeout_s)
{
    double end = fnow() + timeout_s;
    while (fnow() < end) {
        kvb_poll_t p = kvb_sender_poll(s);
        if (p == KVB_POLL_FAILED)
            return -1;
        if (p >= KVB_POLL_WAITING_FOR_INPUT)
            return 0;
        fsleep(0.0005);
    }
    return -1;
}

int frun_room(frank_t *p, frank_t *d, const char *boot, uint64_t room, int n, int32_t src0,
              int32_t dst0, int aux)
{
    int32_t src[256], dst[256];
    kvb_receiver_h rc = NULL;
    kvb_sender_h s = NULL;
    char why[512] = "";
    int rv = -1;
    if (n > 256)
        return -1;
    for (int i = 0; i < n; i++) {
        src[i] = src0 + i;
        dst[i] = dst0 + (n - 1 - i); /* reversed: no accidental identity */
    }
    if (kvb_receiver_create(d->mgr, boot, room, -1, &rc) != KVB_OK)
        goto out;
    kvb_receiver_init(rc, dst, (size_t)n, aux, NULL);
    ffill(p, room, src, n, aux);
    if (kvb_sender_create(p->mgr, boot, room, &s) != KVB_OK || fwait_sender_ready(s, 10) != 0) {
        fprintf(stderr, "room %llu: sender not ready\n", (unsigned long long)room);
        goto out;
    }
    kvb_sender_init(s, (uint64_t)n, aux);
    kvb_sender_send(s, src, (size_t)(n / 2));
    kvb_sender_send(s, src + n / 2, (size_t)(n - n / 2));
    kvb_poll_t pr = fwait_receiver(rc, 10), ps = fwait_sender(s, 10);
    if (pr != KVB_POLL_SUCCESS || ps != KVB_POLL_SUCCESS) {
        if (pr == KVB_POLL_FAILED)
            kvb_receiver_failure(rc, why, sizeof(why));
        fprintf(stderr, "room %llu: receiver %s sender %s (%s)\n", (unsigned long long)room,
                kvb_poll_string(pr), kvb_poll_string(ps), why);
        goto out;
    }
    uint64_t bad = fverify(d, room, dst, n, aux);
    if (bad != 0) {
        fprintf(stderr, "room %llu: %llu wrong bytes\n", (unsigned long long)room,
                (unsigned long long)bad);
        goto out;
    }
    rv = 0;
out:
    kvb_sender_destroy(s);
    kvb_receiver_destroy(rc);
    return rv;
}

int fchild_spawn(fchild_t *c, const char *self, char *const argv_tail[])
{
    int in[2], out[2];
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)self;
    for (int i = 0; argv_tail[i] != NULL && n < 31; i++)
        argv[n++] = argv_tail[i];
    argv[n] = NULL;
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        return -1;
    c->pid = fork();
    if (c->pid < 0)
        return -1;
    if (c->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execv(self, argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->to = in[1];
    c->from = out[0];
    return 0;
}

int fchild_line(fchild_t *c, char *buf, size_t cap, double timeout_s)
{
    size_t n = 0;
    double end = fnow() + timeout_s;
    while (n + 1 < cap) {
        struct pollfd pf = {c->from, POLLIN, 0};
        int ms = (int)((end - fnow()) * 1000);
        if (ms <= 0 || poll(&pf, 1, ms) <= 0)
            return -1;
        if (read(c->from, buf + n, 1) != 1)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return 0;
}

void fchild_kill(fchild_t *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
        c->pid = 0;
        close(c->to);
        close(c->from);
    }
}

void fchild_close(fchild_t *c)
{
    if (c->pid > 0) {
        close(c->to); /* EOF on its stdin: it exits */
        double end = fnow() + 10;
        while (waitpid(c->pid, NULL, WNOHANG) == 0 && fnow() < end)
            fsleep(0.01);
        if (waitpid(c->pid, NULL, WNOHANG) == 0) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, NULL, 0);
        }
        c->pid = 0;
        close(c->from);
    }
}
