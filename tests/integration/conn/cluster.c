#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint8_t pattern(uint64_t room, int layer, int kind, uint64_t token, int head, int b)
{
    uint64_t x = room * 0x9e3779b97f4a7c15ull ^ (uint64_t)layer << 40 ^ (uint64_t)kind << 56 ^
                 token << 20 ^ (uint64_t)head << 8 ^ (uint64_t)b;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint8_t)x;
}

static void heads_of(const model_t *m, int tp, int tp_size, int *local, int *first)
{
    if (m->mla) {
        *local = 1;
        *first = 0;
    } else if (tp_size <= m->heads) {
        *local = m->heads / tp_size;
        *first = tp * *local;
    } else {
        *local = 1;
        *first = tp * m->heads / tp_size;
    }
}

static int rank_start(cluster_t *c, rank_t *r, kvb_mode_t mode)
{
    const model_t *m = &c->m;
    kvb_engine_params_t ep = {0};
    kvb_manager_params_t mp = {0};
    kvb_kv_args_t a = {0};
    heads_of(m, r->tp, r->tp_size, &r->local_heads, &r->first_head);
    r->n_layers = m->layers / r->pp_size;
    r->first_layer = r->pp * r->n_layers;
    r->item_len = (uint64_t)m->page * (uint64_t)r->local_heads * (uint64_t)m->head_bytes;
    r->n_kv = m->mla ? r->n_layers : 2 * r->n_layers;
    r->pool_pages = c->pool_pages;
    r->kv = calloc((size_t)r->n_kv, sizeof(*r->kv));
    uint64_t *ptrs = calloc((size_t)r->n_kv, 8), *lens = calloc((size_t)r->n_kv, 8);
    for (int i = 0; i < r->n_kv; i++) {
        r->kv[i] = calloc(1, r->pool_pages * r->item_len);
        ptrs[i] = (uint64_t)(uintptr_t)r->kv[i];
        lens[i] = r->pool_pages * r->item_len;
    }
    r->aux = calloc(AUX_ITEMS, AUX_ITEM);
    uint64_t aux_ptr = (uint64_t)(uintptr_t)r->aux, aux_len = AUX_ITEMS * AUX_ITEM,
             aux_item = AUX_ITEM;
    a.kv_data_ptrs = ptrs;
    a.kv_data_lens = lens;
    a.num_kv = (uint32_t)r->n_kv;
    a.kv_item_len = r->item_len;
    a.aux_data_ptrs = &aux_ptr;
    a.aux_data_lens = &aux_len;
    a.aux_item_lens = &aux_item;
    a.num_aux = 1;
    uint64_t st_ptr[STATE_BUFS], st_len[STATE_BUFS], st_item[STATE_BUFS];
    for (int i = 0; m->state_bytes > 0 && i < STATE_BUFS; i++) {
        r->state[i] = calloc(STATE_ITEMS, (size_t)m->state_bytes);
        st_ptr[i] = (uint64_t)(uintptr_t)r->state[i];
        st_len[i] = (uint64_t)STATE_ITEMS * (uint64_t)m->state_bytes;
        st_item[i] = (uint64_t)m->state_bytes;
    }
    if (m->state_bytes > 0) {
        a.state_data_ptrs = st_ptr;
        a.state_data_lens = st_len;
        a.state_item_lens = st_item;
        a.num_state = STATE_BUFS;
    }
    a.page_size = (uint32_t)m->page;
    a.kv_head_num = (uint32_t)r->local_heads;
    a.engine_rank = r->tp;
    a.prefill_start_layer = (uint32_t)r->first_layer;
    a.num_layers_total = (uint32_t)m->layers;
    if (kvb_engine_create(&ep, &r->eng) != KVB_OK)
        return -1;
    mp.field_mask = KVB_MANAGER_PARAM_BOOTSTRAP_ADDR | KVB_MANAGER_PARAM_THREADS;
    mp.mode = mode;
    mp.kv_args = &a;
    mp.engine = r->eng;
    mp.attn_tp_size = r->tp_size;
    mp.attn_tp_rank = r->tp;
    mp.attn_dp_size = mode == KVB_MODE_PREFILL ? c->pdp : 1;
    mp.attn_dp_rank = mode == KVB_MODE_PREFILL ? r->dp : 0;
    mp.pp_size = r->pp_size;
    mp.pp_rank = r->pp;
    mp.system_dp_size = 1;
    mp.is_mla = m->mla;
    mp.bootstrap_addr = c->boot_addr;
    mp.transfer_threads = 2;
    mp.transfer_queues = 2;
    kvb_status_t st = kvb_manager_create(&mp, &r->mgr);
    free(ptrs);
    free(lens);
    if (st != KVB_OK) {
        fprintf(stderr, "manager create: %s\n", kvb_manager_last_error(NULL));
        return -1;
    }
    return 0;
}

static void rank_stop(rank_t *r)
{
    kvb_manager_destroy(r->mgr);
    kvb_engine_destroy(r->eng);
    for (int i = 0; i < r->n_kv; i++)
        free(r->kv[i]);
    free(r->kv);
    free(r->aux);
    for (int i = 0; i < STATE_BUFS; i++)
        free(r->state[i]);
}

rank_t *cluster_prefill(cluster_t *c, int dp, int tp, int pp)
{
    return &c->pre[(dp * c->ptp + tp) * c->ppp + pp];
}

int cluster_start(cluster_t *c, const model_t *m, int ptp, int ppp, int pdp, int dtp,
                  uint64_t pool_pages)
{
    kvb_bootstrap_server_params_t bp = {0};
    memset(c, 0, sizeof(*c));
    c->m = *m;
    c->ptp = ptp;
    c->ppp = ppp;
    c->pdp = pdp;
    c->dtp = dtp;
    c->pool_pages = pool_pages;
    bp.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_PORT;
    bp.port = 0;
    if (kvb_bootstrap_server_start(&bp, &c->boot) != KVB_OK)
        return -1;
    snprintf(c->boot_addr, sizeof(c->boot_addr), "%s", kvb_bootstrap_server_address(c->boot));
    c->pre = calloc((size_t)(ptp * ppp * pdp), sizeof(rank_t));
    c->dec = calloc((size_t)dtp, sizeof(rank_t));
    for (int d = 0; d < pdp; d++)
        for (int t = 0; t < ptp; t++)
            for (int p = 0; p < ppp; p++) {
                rank_t *r = cluster_prefill(c, d, t, p);
                *r = (rank_t){.tp = t, .tp_size = ptp, .pp = p, .pp_size = ppp, .dp = d};
                if (rank_start(c, r, KVB_MODE_PREFILL) != 0)
                    return -1;
            }
    for (int t = 0; t < dtp; t++) {
        c->dec[t] = (rank_t){.tp = t, .tp_size = dtp, .pp = 0, .pp_size = 1};
        if (rank_start(c, &c->dec[t], KVB_MODE_DECODE) != 0)
            return -1;
    }
    return 0;
}

void cluster_stop(cluster_t *c)
{
    for (int t = 0; t < c->dtp; t++)
        rank_stop(&c->dec[t]);
    for (int i = 0; i < c->ptp * c->ppp * c->pdp; i++)
        rank_stop(&c->pre[i]);
    free(c->pre);
    free(c->dec);
    kvb_bootstrap_server_stop(c->boot);
}

static uint8_t *cell(const cluster_t *c, const rank_t *r, int kind, int ll, int32_t page, int s,
                     int lh)
{
    int buf = kind * r->n_layers + ll;
    return r->kv[buf] + (uint64_t)page * r->item_len +
           (uint64_t)s * (uint64_t)(r->local_heads * c->m.head_bytes) +
           (uint64_t)lh * (uint64_t)c->m.head_bytes;
}

void fill_prefill(const cluster_t *c, rank_t *r, uint64_t room, const int32_t *src, int n,
                  int aux_index)
{
    int kinds = c->m.mla ? 1 : 2;
    for (int k = 0; k < kinds; k++)
        for (int ll = 0; ll < r->n_layers; ll++)
            for (int i = 0; i < n; i++)
                for (int s = 0; s < c->m.page; s++)
                    for (int lh = 0; lh < r->local_heads; lh++) {
                        uint8_t *p = cell(c, r, k, ll, src[i], s, lh);
                        for (int b = 0; b < c->m.head_bytes; b++)
                            p[b] = pattern(room, r->first_layer + ll, k,
                                           (uint64_t)(i * c->m.page + s), r->first_head + lh, b);
                    }
    for (int b = 0; b < AUX_ITEM; b++)
        r->aux[aux_index * AUX_ITEM + b] = pattern(room, 255, 2, 0, 0, b);
}

/* State item of state slot k of room on a prefill rank: pattern keyed by
 * (room, buffer, k, TP rank): state pairs rank by rank. */
void fill_state(const cluster_t *c, rank_t *r, uint64_t room, int k, int32_t slot)
{
    for (int i = 0; i < STATE_BUFS; i++)
        for (int b = 0; b < c->m.state_bytes; b++)
            r->state[i][(size_t)slot * (size_t)c->m.state_bytes + (size_t)b] =
                pattern(room, 200 + i, 3 + k, 0, r->tp, b);
}

uint64_t verify_state(const cluster_t *c, const rank_t *r, uint64_t room, int k, int32_t slot)
{
    uint64_t bad = 0;
    for (int i = 0; i < STATE_BUFS; i++)
        for (int b = 0; b < c->m.state_bytes; b++)
            bad += r->state[i][(size_t)slot * (size_t)c->m.state_bytes + (size_t)b] !=
                   pattern(room, 200 + i, 3 + k, 0, r->tp, b);
    return bad;
}

uint64_t verify_decode(const cluster_t *c, const rank_t *r, uint64_t room, const int32_t *dst,
                       int n, int skip, const uint8_t *mask, int aux_index)
{
    uint64_t bad = 0;
    int kinds = c->m.mla ? 1 : 2;
    for (int k = 0; k < kinds; k++)
        for (int ll = 0; ll < r->n_layers; ll++)
            for (int i = 0; i < n; i++) {
                if (i < skip || (mask != NULL && !mask[i])) {
                    /* pages the decode already held must not be written */
                    const uint8_t *p = cell(c, r, k, ll, dst[i], 0, 0);
                    for (uint64_t b = 0; b < r->item_len; b++)
                        bad += p[b] != 0;
                    continue;
                }
                for (int s = 0; s < c->m.page; s++)
                    for (int lh = 0; lh < r->local_heads; lh++) {
                        const uint8_t *p = cell(c, r, k, ll, dst[i], s, lh);
                        for (int b = 0; b < c->m.head_bytes; b++)
                            bad += p[b] != pattern(room, ll, k, (uint64_t)(i * c->m.page + s),
                                                   r->first_head + lh, b);
                    }
            }
    for (int b = 0; b < AUX_ITEM; b++)
        bad += r->aux[aux_index * AUX_ITEM + b] != pattern(room, 255, 2, 0, 0, b);
    return bad;
}

typedef struct room_state {
    uint64_t id;
    int n;
    int32_t *src, *dst;
    uint8_t *mask;
    int aux;
    int dp;
    int32_t sst[4], dst_st[4]; /* state slots: prefill, decode */
    kvb_sender_h *snd;
    kvb_receiver_h *rcv;
} room_state_t;

static void shuffle(int32_t *v, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = rand() % (i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static int wait_sender_ready(kvb_sender_h s, double deadline)
{
    while (now_s() < deadline) {
        kvb_poll_t p = kvb_sender_poll(s);
        if (p == KVB_POLL_WAITING_FOR_INPUT || p == KVB_POLL_TRANSFERRING || p == KVB_POLL_SUCCESS)
            return 0;
        if (p == KVB_POLL_FAILED)
            return -1;
        usleep(500);
    }
    return -1;
}

static void send_chunks(kvb_sender_h s, const room_state_t *rs, int chunks)
{
    int cur = 0;
    for (int k = 0; k < chunks && cur < rs->n; k++) {
        int left = rs->n - cur;
        int len = k == chunks - 1 ? left : 1 + rand() % (left > 1 ? left : 1);
        if (len > left)
            len = left;
        if (kvb_sender_send(s, rs->src + cur, (size_t)len) != KVB_OK)
            fprintf(stderr, "send failed\n");
        cur += len;
    }
    if (cur < rs->n)
        kvb_sender_send(s, rs->src + cur, (size_t)(rs->n - cur));
}

static int start_room(cluster_t *c, room_state_t *rs, const room_opts_t *o)
{
    kvb_receiver_init_t ex = {0};
    if (o->prefix_pages > 0) {
        ex.field_mask |= KVB_RECV_INIT_PREFIX;
        ex.prefix_tokens = (uint64_t)(o->prefix_pages * c->m.page);
    }
    if (rs->mask != NULL) {
        ex.field_mask |= KVB_RECV_INIT_MASK;
        ex.page_mask = rs->mask;
    }
    if (o->state > 0) {
        ex.field_mask |= KVB_RECV_INIT_STATE;
        ex.state_indices = rs->dst_st;
        ex.num_state_indices = (size_t)o->state;
    }
    for (int t = 0; t < c->dtp; t++) {
        if (kvb_receiver_create(c->dec[t].mgr, c->boot_addr, rs->id, o->dp_rank, &rs->rcv[t]) !=
            KVB_OK)
            return -1;
        kvb_receiver_init(rs->rcv[t], rs->dst, (size_t)rs->n, rs->aux, &ex);
    }
    for (int t = 0; t < c->ptp; t++)
        for (int p = 0; p < c->ppp; p++) {
            rank_t *r = cluster_prefill(c, rs->dp, t, p);
            kvb_sender_h *s = &rs->snd[t * c->ppp + p];
            fill_prefill(c, r, rs->id, rs->src, rs->n, rs->aux);
            for (int k = 0; k < o->state; k++)
                fill_state(c, r, rs->id, k, rs->sst[k]);
            if (kvb_sender_create(r->mgr, c->boot_addr, rs->id, s) != KVB_OK)
                return -1;
        }
    return 0;
}

static int drive_room(cluster_t *c, room_state_t *rs, const room_opts_t *o)
{
    double deadline = now_s() + 20;
    for (int i = 0; i < c->ptp * c->ppp; i++) {
        if (wait_sender_ready(rs->snd[i], deadline) != 0) {
            char why[256];
            if (o->expect_fail != NULL)
                continue; /* the room may fail before this sender is ready: finish_room
                             checks the reason */
            kvb_sender_failure(rs->snd[i], why, sizeof(why));
            fprintf(stderr, "room %llu: sender %d never ready: %s\n", (unsigned long long)rs->id, i,
                    why);
            return -1;
        }
        kvb_sender_init(rs->snd[i], (uint64_t)rs->n, rs->aux);
        if (o->state > 0 && kvb_sender_set_state_indices(
                                rs->snd[i], rs->sst, (size_t)(o->state + o->extra_state)) != KVB_OK)
            return -1;
        send_chunks(rs->snd[i], rs, o->chunks);
    }
    return 0;
}

static int finish_room(cluster_t *c, room_state_t *rs, const room_opts_t *o)
{
    double deadline = now_s() + 20;
    int fails = 0;
    for (int t = 0; t < c->dtp; t++) {
        kvb_poll_t p;
        while ((p = kvb_receiver_poll(rs->rcv[t])) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED &&
               now_s() < deadline)
            usleep(500);
        if (o->expect_fail != NULL || p != KVB_POLL_SUCCESS) {
            char why[512];
            kvb_receiver_failure(rs->rcv[t], why, sizeof(why));
            if (o->expect_fail == NULL || p != KVB_POLL_FAILED) {
                fprintf(stderr, "room %llu decode %d: %s (%s)%s\n", (unsigned long long)rs->id, t,
                        kvb_poll_string(p), why, o->expect_fail ? "; wanted Failed" : "");
                fails++;
            }
            continue;
        }
        uint64_t bad = verify_decode(c, &c->dec[t], rs->id, rs->dst, rs->n, o->prefix_pages,
                                     rs->mask, rs->aux);
        for (int k = 0; k < o->state; k++)
            bad += verify_state(c, &c->dec[t], rs->id, k, rs->dst_st[k]);
        if (bad != 0) {
            fprintf(stderr, "room %llu decode %d: %llu wrong bytes\n", (unsigned long long)rs->id,
                    t, (unsigned long long)bad);
            fails++;
        }
    }
    /* The decode hears only "Failed" (the seeds' protocol); the reason is
     * the prefill's: with expect_fail, some sender must name it. */
    int named = 0;
    for (int i = 0; i < c->ptp * c->ppp; i++) {
        kvb_poll_t p;
        char why[512] = "";
        while ((p = kvb_sender_poll(rs->snd[i])) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED &&
               now_s() < deadline)
            usleep(500);
        if (p == KVB_POLL_FAILED)
            kvb_sender_failure(rs->snd[i], why, sizeof(why));
        named += o->expect_fail != NULL && strstr(why, o->expect_fail) != NULL;
        if (o->expect_fail == NULL && p != KVB_POLL_SUCCESS) {
            fprintf(stderr, "room %llu sender %d: %s (%s)\n", (unsigned long long)rs->id, i,
                    kvb_poll_string(p), why);
            fails++;
        }
    }
    if (o->expect_fail != NULL && named == 0) {
        fprintf(stderr, "room %llu: no sender failed with \"%s\"\n", (unsigned long long)rs->id,
                o->expect_fail);
        fails++;
    }
    return fails;
}

int run_rooms(cluster_t *c, int n, uint64_t first_room, const room_opts_t *o)
{
    int32_t *free_dst = malloc(c->pool_pages * sizeof(int32_t));
    int32_t *free_src = malloc(c->pool_pages * sizeof(int32_t));
    room_state_t *rs = calloc((size_t)n, sizeof(*rs));
    int fails = 0, used = 0;
    for (uint64_t i = 0; i < c->pool_pages; i++)
        free_dst[i] = free_src[i] = (int32_t)i;
    shuffle(free_dst, (int)c->pool_pages);
    shuffle(free_src, (int)c->pool_pages);
    for (int j = 0; j < n; j++) {
        room_state_t *r = &rs[j];
        r->id = first_room + (uint64_t)j;
        r->n = 5 + rand() % 16;
        if (used + r->n > (int)c->pool_pages)
            r->n = 1;
        r->src = free_src + used;
        r->dst = free_dst + used;
        used += r->n;
        r->aux = j % AUX_ITEMS;
        for (int k = 0; k < 4; k++) { /* distinct slots per room on both sides */
            r->sst[k] = (int32_t)((j * 4 + k) % STATE_ITEMS);
            r->dst_st[k] = (int32_t)((j * 4 + k + 17) % STATE_ITEMS);
        }
        r->dp = o->dp_rank >= 0 ? o->dp_rank : (int)(r->id % (uint64_t)c->pdp);
        if (o->use_mask) {
            r->mask = malloc((size_t)r->n);
            for (int i = 0; i < r->n; i++)
                r->mask[i] = i % 3 != 1;
        }
        r->snd = calloc((size_t)(c->ptp * c->ppp), sizeof(kvb_sender_h));
        r->rcv = calloc((size_t)c->dtp, sizeof(kvb_receiver_h));
        if (start_room(c, r, o) != 0)
            fails++;
    }
    for (int j = 0; j < n; j++)
        if (drive_room(c, &rs[j], o) != 0)
            fails++;
    for (int j = 0; j < n; j++) {
        fails += finish_room(c, &rs[j], o);
        for (int i = 0; i < c->ptp * c->ppp; i++)
            kvb_sender_destroy(rs[j].snd[i]);
        for (int t = 0; t < c->dtp; t++)
            kvb_receiver_destroy(rs[j].rcv[t]);
        free(rs[j].snd);
        free(rs[j].rcv);
        free(rs[j].mask);
    }
    free(rs);
    free(free_dst);
    free(free_src);
    return fails;
}
