/* A cluster of ranks in this process (the harness's kvbh_cluster_t): a
 * bootstrap server, prefill ranks [dp][tp][pp] and decode ranks [tp], each
 * its own engine and manager, and whole rooms run across them with every
 * byte verified against a pattern keyed by global layer and head. */
#include "kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvbh_rank_t *kvbh_cluster_prefill(kvbh_cluster_t *c, int dp, int tp, int pp)
{
    return &c->pre[(dp * c->ptp + tp) * c->ppp + pp];
}

kvb_status_t kvbh_cluster_rank(kvbh_cluster_t *c, kvbh_rank_t *r, const kvbh_place_t *p,
                               kvb_mode_t mode, const kvbh_knobs_t *k)
{
    return kvbh_rank_start_at(r, &c->g, p, mode, c->boot_addr, c->mem, k);
}

kvb_status_t kvbh_cluster_start(kvbh_cluster_t *c, const kvbh_cluster_cfg_t *cfg)
{
    kvb_status_t st = KVB_OK;
    memset(c, 0, sizeof(*c));
    c->g = cfg->g;
    c->ptp = cfg->ptp;
    c->ppp = cfg->ppp;
    c->pdp = cfg->pdp;
    c->dtp = cfg->dtp;
    c->mem = cfg->shared ? KVBH_MEM_SHARED : KVBH_MEM_MALLOC;
    if (kvbh_boot_start(&c->boot, 0, cfg->server_token) != 0)
        return KVB_ERR_IO;
    snprintf(c->boot_addr, sizeof(c->boot_addr), "%s", c->boot.addr);
    c->pre = calloc((size_t)(c->ptp * c->ppp * c->pdp), sizeof(kvbh_rank_t));
    c->dec = calloc((size_t)c->dtp, sizeof(kvbh_rank_t));
    for (int d = 0; d < c->pdp && st == KVB_OK; d++)
        for (int t = 0; t < c->ptp && st == KVB_OK; t++)
            for (int p = 0; p < c->ppp && st == KVB_OK; p++) {
                kvbh_place_t pl = {t, c->ptp, p, c->ppp, d, c->pdp};
                st = kvbh_cluster_rank(c, kvbh_cluster_prefill(c, d, t, p), &pl, KVB_MODE_PREFILL,
                                       &cfg->pre);
            }
    for (int t = 0; t < c->dtp && st == KVB_OK; t++) {
        kvbh_place_t pl = {t, c->dtp, 0, 1, 0, 1};
        st = kvbh_cluster_rank(c, &c->dec[t], &pl, KVB_MODE_DECODE, &cfg->dec);
    }
    return st;
}

void kvbh_cluster_stop(kvbh_cluster_t *c)
{
    for (int t = 0; t < c->dtp; t++)
        kvbh_rank_stop(&c->dec[t]);
    for (int i = 0; i < c->ptp * c->ppp * c->pdp; i++)
        kvbh_rank_stop(&c->pre[i]);
    free(c->pre);
    free(c->dec);
    kvbh_boot_stop(&c->boot);
}

/* Pattern byte of (room, global layer, kind 0=K/latent 1=V, token, global
 * head, byte in head). */
static uint8_t pattern(uint64_t room, int layer, int kind, uint64_t token, int head, int b)
{
    uint64_t x = room * 0x9e3779b97f4a7c15ull ^ (uint64_t)layer << 40 ^ (uint64_t)kind << 56 ^
                 token << 20 ^ (uint64_t)head << 8 ^ (uint64_t)b;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint8_t)x;
}

/* Local layer ll of r: its target layers, then (ll >= n_layers) the draft
 * model's, whose buffers follow every target buffer: K target, V target,
 * K draft, V draft (params draft_layers). */
static uint8_t *cell(const kvbh_cluster_t *c, const kvbh_rank_t *r, int kind, int ll, int32_t page,
                     int s, int lh)
{
    int kinds = c->g.mla ? 1 : 2, d = ll - r->n_layers;
    int buf = d < 0 ? kind * r->n_layers + ll : kinds * r->n_layers + kind * r->draft + d;
    return r->kv[buf] + (uint64_t)page * r->item_len +
           (uint64_t)s * (uint64_t)(r->local_heads * c->g.head_bytes) +
           (uint64_t)lh * (uint64_t)c->g.head_bytes;
}

/* Global id of local layer ll of r: draft layers are told apart from the
 * target's (1000 + draft layer). */
static int layer_id(const kvbh_rank_t *r, int ll)
{
    return ll < r->n_layers ? r->first_layer + ll : 1000 + ll - r->n_layers;
}

static void fill_prefill(const kvbh_cluster_t *c, kvbh_rank_t *r, uint64_t room, const int32_t *src,
                         int n, int aux_index)
{
    int kinds = c->g.mla ? 1 : 2;
    for (int k = 0; k < kinds; k++)
        for (int ll = 0; ll < r->n_layers + r->draft; ll++)
            for (int i = 0; i < n; i++)
                for (int s = 0; s < c->g.page; s++)
                    for (int lh = 0; lh < r->local_heads; lh++) {
                        uint8_t *p = cell(c, r, k, ll, src[i], s, lh);
                        for (int b = 0; b < c->g.head_bytes; b++)
                            p[b] = pattern(room, layer_id(r, ll), k, (uint64_t)(i * c->g.page + s),
                                           r->first_head + lh, b);
                    }
    for (int b = 0; b < KVBH_AUX_ITEM; b++)
        r->aux[aux_index * KVBH_AUX_ITEM + b] = pattern(room, 255, 2, 0, 0, b);
}

/* State item of state slot k of room on a prefill rank: pattern keyed by
 * (room, buffer, k, TP rank): state pairs rank by rank. */
static void fill_state(const kvbh_cluster_t *c, kvbh_rank_t *r, uint64_t room, int k, int32_t slot)
{
    for (int i = 0; i < KVBH_STATE_BUFS; i++)
        for (int b = 0; b < c->g.state_bytes; b++)
            r->state[i][(size_t)slot * (size_t)c->g.state_bytes + (size_t)b] =
                pattern(room, 200 + i, 3 + k, 0, r->tp, b);
}

static uint64_t verify_state(const kvbh_cluster_t *c, const kvbh_rank_t *r, uint64_t room, int k,
                             int32_t slot)
{
    uint64_t bad = 0;
    for (int i = 0; i < KVBH_STATE_BUFS; i++)
        for (int b = 0; b < c->g.state_bytes; b++)
            bad += r->state[i][(size_t)slot * (size_t)c->g.state_bytes + (size_t)b] !=
                   pattern(room, 200 + i, 3 + k, 0, r->tp, b);
    return bad;
}

static uint64_t verify_decode(const kvbh_cluster_t *c, const kvbh_rank_t *r, uint64_t room,
                              const int32_t *dst, int n, int skip, const uint8_t *mask,
                              int aux_index)
{
    uint64_t bad = 0;
    int kinds = c->g.mla ? 1 : 2;
    for (int k = 0; k < kinds; k++)
        for (int ll = 0; ll < r->n_layers + r->draft; ll++)
            for (int i = 0; i < n; i++) {
                if (i < skip || (mask != NULL && !mask[i])) {
                    /* pages the decode already held must not be written */
                    const uint8_t *p = cell(c, r, k, ll, dst[i], 0, 0);
                    for (uint64_t b = 0; b < r->item_len; b++)
                        bad += p[b] != 0;
                    continue;
                }
                for (int s = 0; s < c->g.page; s++)
                    for (int lh = 0; lh < r->local_heads; lh++) {
                        const uint8_t *p = cell(c, r, k, ll, dst[i], s, lh);
                        for (int b = 0; b < c->g.head_bytes; b++)
                            bad += p[b] != pattern(room, layer_id(r, ll), k,
                                                   (uint64_t)(i * c->g.page + s),
                                                   r->first_head + lh, b);
                    }
            }
    for (int b = 0; aux_index >= 0 && b < KVBH_AUX_ITEM; b++)
        bad += r->aux[aux_index * KVBH_AUX_ITEM + b] != pattern(room, 255, 2, 0, 0, b);
    return bad;
}

/* The first KV byte of the room on decode rank r that is not its pattern:
 * its buffer index and page; false when every byte is right. */
static bool first_wrong(const kvbh_cluster_t *c, const kvbh_rank_t *r, uint64_t room,
                        const int32_t *dst, int n, int skip, int *buf_p, int32_t *page_p)
{
    int kinds = c->g.mla ? 1 : 2;
    for (int k = 0; k < kinds; k++)
        for (int ll = 0; ll < r->n_layers; ll++)
            for (int i = skip; i < n; i++)
                for (int s = 0; s < c->g.page; s++)
                    for (int lh = 0; lh < r->local_heads; lh++) {
                        const uint8_t *p = cell(c, r, k, ll, dst[i], s, lh);
                        for (int b = 0; b < c->g.head_bytes; b++)
                            if (p[b] != pattern(room, layer_id(r, ll), k,
                                                (uint64_t)(i * c->g.page + s), r->first_head + lh,
                                                b)) {
                                *buf_p = k * r->n_layers + ll;
                                *page_p = dst[i];
                                return true;
                            }
                    }
    return false;
}

/* expect_integrity_fail: decode rank r's room failed its check, naming the
 * buffer and page of the wrong byte that landed. 0 or 1 (a failure). */
static int integrity_failed(const kvbh_cluster_t *c, const kvbh_rank_t *r, uint64_t room,
                            const int32_t *dst, int n, int skip, kvb_poll_t p, const char *why)
{
    int buf = -1;
    int32_t page = -1;
    char want[96];
    bool wrong = first_wrong(c, r, room, dst, n, skip, &buf, &page);
    snprintf(want, sizeof(want), "KV integrity check failed: buffer %d page %d ", buf, (int)page);
    fprintf(stderr, "room %llu: %s; first wrong byte in buffer %d page %d; reason: %s\n",
            (unsigned long long)room, kvb_poll_string(p), buf, (int)page, why);
    return p != KVB_POLL_FAILED || !wrong || strstr(why, want) == NULL;
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

static int start_room(kvbh_cluster_t *c, room_state_t *rs, const kvbh_room_opts_t *o)
{
    kvb_receiver_init_t ex = {0};
    if (o->prefix_pages > 0) {
        ex.field_mask |= KVB_RECV_INIT_PREFIX;
        ex.prefix_tokens = (uint64_t)(o->prefix_pages * c->g.page);
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
            kvbh_rank_t *r = kvbh_cluster_prefill(c, rs->dp, t, p);
            kvb_sender_h *s = &rs->snd[t * c->ppp + p];
            fill_prefill(c, r, rs->id, rs->src, rs->n, rs->aux);
            for (int k = 0; k < o->state; k++)
                fill_state(c, r, rs->id, k, rs->sst[k]);
            if (kvb_sender_create(r->mgr, c->boot_addr, rs->id, s) != KVB_OK)
                return -1;
        }
    return 0;
}

static int drive_room(kvbh_cluster_t *c, room_state_t *rs, const kvbh_room_opts_t *o)
{
    double deadline = kvbh_now() + 20;
    for (int i = 0; i < c->ptp * c->ppp; i++) {
        if (kvbh_wait_sender_ready(rs->snd[i], deadline - kvbh_now()) != 0) {
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

static int finish_room(kvbh_cluster_t *c, room_state_t *rs, const kvbh_room_opts_t *o)
{
    double deadline = kvbh_now() + 20;
    int fails = 0;
    for (int t = 0; t < c->dtp; t++) {
        kvb_poll_t p = kvbh_wait_receiver(rs->rcv[t], deadline - kvbh_now());
        if (o->expect_integrity_fail) {
            char why[512] = "";
            kvb_receiver_failure(rs->rcv[t], why, sizeof(why));
            fails +=
                integrity_failed(c, &c->dec[t], rs->id, rs->dst, rs->n, o->prefix_pages, p, why);
            continue;
        }
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
                                     rs->mask, c->no_aux ? -1 : rs->aux);
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
        kvb_poll_t p = kvbh_wait_sender(rs->snd[i], deadline - kvbh_now());
        char why[512] = "";
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

int kvbh_run_rooms(kvbh_cluster_t *c, int n, uint64_t first_room, const kvbh_room_opts_t *o)
{
    int32_t *free_dst = malloc(c->g.pool_pages * sizeof(int32_t));
    int32_t *free_src = malloc(c->g.pool_pages * sizeof(int32_t));
    room_state_t *rs = calloc((size_t)n, sizeof(*rs));
    int fails = 0, used = 0;
    for (uint64_t i = 0; i < c->g.pool_pages; i++)
        free_dst[i] = free_src[i] = (int32_t)i;
    shuffle(free_dst, (int)c->g.pool_pages);
    shuffle(free_src, (int)c->g.pool_pages);
    for (int j = 0; j < n; j++) {
        room_state_t *r = &rs[j];
        r->id = first_room + (uint64_t)j;
        r->n = 5 + rand() % 16;
        if (used + r->n > (int)c->g.pool_pages)
            r->n = 1;
        r->src = free_src + used;
        r->dst = free_dst + used;
        used += r->n;
        r->aux = j % KVBH_AUX_ITEMS;
        for (int k = 0; k < 4; k++) { /* distinct slots per room on both sides */
            r->sst[k] = (int32_t)((j * 4 + k) % KVBH_STATE_ITEMS);
            r->dst_st[k] = (int32_t)((j * 4 + k + 17) % KVBH_STATE_ITEMS);
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
