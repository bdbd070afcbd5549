/* The cluster harness's core: time, ranks over a canary arena, patterns,
 * bounded waits, bootstrap servers. */
#include "kvb_cluster.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

double kvbh_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void kvbh_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

char *kvbh_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = calloc(1, (size_t)n + 1)) != NULL &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (f != NULL)
        fclose(f);
    if (buf == NULL)
        fprintf(stderr, "cannot read %s\n", path);
    return buf;
}

/* ---- placement and layout ---- */

static const kvbh_place_t SINGLE = {0, 1, 0, 1, 0, 1};

/* Heads of TP rank tp: MLA has one latent "head"; with more TP ranks than
 * heads (GQA) ranks share a head. */
static void heads_of(const kvbh_geom_t *g, int tp, int tp_size, int *local, int *first)
{
    if (g->mla) {
        *local = 1;
        *first = 0;
    } else if (tp_size <= g->heads) {
        *local = g->heads / tp_size;
        *first = tp * *local;
    } else {
        *local = 1;
        *first = tp * g->heads / tp_size;
    }
}

/* k: the state buffers' knobs (n_state, state_items), or NULL. */
static void shape(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p, int draft,
                  const kvbh_knobs_t *k)
{
    if (p == NULL)
        p = &SINGLE;
    r->g = *g;
    r->tp = p->tp;
    r->tp_size = p->tp_size;
    r->pp = p->pp;
    r->pp_size = p->pp_size;
    r->dp = p->dp;
    heads_of(g, p->tp, p->tp_size, &r->local_heads, &r->first_head);
    r->n_layers = g->layers / p->pp_size;
    r->first_layer = p->pp * r->n_layers;
    r->item_len = (uint64_t)g->page * (uint64_t)r->local_heads * (uint64_t)g->head_bytes;
    r->draft = draft;
    r->n_kv = (g->mla ? 1 : 2) * (r->n_layers + draft);
    r->buf_len = r->item_len * g->pool_pages;
    r->n_state = 0;
    if (k != NULL && k->n_state > 0) {
        r->n_state = k->n_state < KVBH_MAX_STATE ? k->n_state : KVBH_MAX_STATE; /* refused */
        for (int i = 0; i < r->n_state; i++)
            r->state_item[i] = k->state_items[i];
    } else if (g->state_bytes > 0) {
        r->n_state = KVBH_STATE_BUFS;
        for (int i = 0; i < r->n_state; i++)
            r->state_item[i] = (uint64_t)g->state_bytes;
    }
}

static size_t state_len(const kvbh_rank_t *r, int i)
{
    return (size_t)KVBH_STATE_ITEMS * (size_t)r->state_item[i];
}

/* Canary bytes after each buffer (a packed arena has one after the last). */
static size_t gap(bool packed)
{
    return packed ? 0 : KVBH_CANARY;
}

static size_t arena_len_of(const kvbh_geom_t *g, const kvbh_place_t *p, bool packed, int draft,
                           const kvbh_knobs_t *k)
{
    kvbh_rank_t r;
    shape(&r, g, p, draft, k);
    size_t len = KVBH_CANARY + (size_t)r.n_kv * ((size_t)r.buf_len + gap(packed)) +
                 KVBH_AUX_ITEM * KVBH_AUX_ITEMS + gap(packed);
    for (int i = 0; i < r.n_state; i++)
        len += state_len(&r, i) + gap(packed);
    return len + (packed ? KVBH_CANARY : 0);
}

size_t kvbh_arena_len(const kvbh_geom_t *g, const kvbh_place_t *p)
{
    return arena_len_of(g, p, false, 0, NULL);
}

size_t kvbh_arena_len_draft(const kvbh_geom_t *g, const kvbh_place_t *p, int draft)
{
    return arena_len_of(g, p, false, draft, NULL);
}

/* Place n bytes at *off (zeroed when fill), a canary gap of gap_len after it. */
static uint8_t *carve(uint8_t *arena, size_t *off, size_t n, int fill, size_t gap_len)
{
    uint8_t *p = arena + *off;
    if (fill)
        memset(p, 0, n);
    *off += n + gap_len;
    return p;
}

static void layout_of(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p, uint8_t *arena,
                      int fill, bool packed, int draft, const kvbh_knobs_t *k)
{
    size_t off = KVBH_CANARY;
    shape(r, g, p, draft, k);
    r->arena = arena;
    r->arena_len = arena_len_of(g, p, packed, draft, k);
    if (fill)
        memset(arena, KVBH_CANARY_BYTE, r->arena_len);
    for (int i = 0; i < r->n_kv; i++)
        r->kv[i] = carve(arena, &off, r->buf_len, fill, gap(packed));
    r->aux = carve(arena, &off, KVBH_AUX_ITEM * KVBH_AUX_ITEMS, fill, gap(packed));
    for (int i = 0; i < r->n_state; i++)
        r->state[i] = carve(arena, &off, state_len(r, i), fill, gap(packed));
}

void kvbh_layout(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p, uint8_t *arena,
                 int fill)
{
    layout_of(r, g, p, arena, fill, false, 0, NULL);
}

void kvbh_layout_draft(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p, uint8_t *arena,
                       int fill, int draft)
{
    layout_of(r, g, p, arena, fill, false, draft, NULL);
}

/* ---- memory ---- */

static uint8_t *arena_get(int mem, size_t len)
{
    void *a = NULL;
    if (mem >= 0) {
        a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
        return a == MAP_FAILED ? NULL : a;
    }
    if (mem == KVBH_MEM_SHARED)
        return kvb_mem_alloc(len, &a) == KVB_OK ? a : NULL;
    return malloc(len); /* KVBH_MEM_MALLOC, KVBH_MEM_PACKED */
}

static void arena_put(int mem, uint8_t *a, size_t len)
{
    if (a == NULL)
        return;
    if (mem >= 0)
        munmap(a, len);
    else if (mem == KVBH_MEM_SHARED)
        kvb_mem_free(a);
    else
        free(a);
}

/* ---- ranks ---- */

typedef struct args_buf {
    uint64_t ptrs[KVBH_MAX_KV], lens[KVBH_MAX_KV];
    uint64_t aux_ptr, aux_len, aux_item;
    uint64_t st_ptr[KVBH_MAX_STATE], st_len[KVBH_MAX_STATE], st_item[KVBH_MAX_STATE];
} args_buf_t;

static void kv_args(const kvbh_rank_t *r, args_buf_t *b, kvb_kv_args_t *a)
{
    memset(a, 0, sizeof(*a));
    for (int i = 0; i < r->n_kv; i++) {
        b->ptrs[i] = (uint64_t)(uintptr_t)r->kv[i];
        b->lens[i] = r->buf_len;
    }
    b->aux_ptr = (uint64_t)(uintptr_t)r->aux;
    b->aux_len = KVBH_AUX_ITEM * KVBH_AUX_ITEMS;
    b->aux_item = KVBH_AUX_ITEM;
    a->kv_data_ptrs = b->ptrs;
    a->kv_data_lens = b->lens;
    a->num_kv = (uint32_t)r->n_kv;
    a->kv_item_len = r->item_len;
    a->aux_data_ptrs = &b->aux_ptr;
    a->aux_data_lens = &b->aux_len;
    a->aux_item_lens = &b->aux_item;
    a->num_aux = 1;
    for (int i = 0; i < r->n_state; i++) {
        b->st_ptr[i] = (uint64_t)(uintptr_t)r->state[i];
        b->st_len[i] = state_len(r, i);
        b->st_item[i] = r->state_item[i];
    }
    if (r->n_state > 0) {
        a->state_data_ptrs = b->st_ptr;
        a->state_data_lens = b->st_len;
        a->state_item_lens = b->st_item;
        a->num_state = (uint32_t)r->n_state;
    }
    a->page_size = (uint32_t)r->g.page;
    a->kv_head_num = (uint32_t)r->local_heads;
    a->engine_rank = r->tp;
    a->prefill_start_layer = (uint32_t)r->first_layer;
    a->num_layers_total = (uint32_t)r->g.layers;
}

static void knobs_apply(kvb_manager_params_t *mp, const kvbh_knobs_t *k)
{
    if (k == NULL)
        return;
    if (k->hb_interval > 0) {
        mp->field_mask |= KVB_MANAGER_PARAM_HEARTBEAT;
        mp->heartbeat_interval_s = k->hb_interval;
        mp->heartbeat_max_failures = k->hb_misses;
    }
    if (k->boot_timeout > 0) {
        mp->field_mask |= KVB_MANAGER_PARAM_BOOTSTRAP_TIMEOUT;
        mp->bootstrap_timeout_s = k->boot_timeout;
    }
    if (k->wait_timeout > 0) {
        mp->field_mask |= KVB_MANAGER_PARAM_WAITING_TIMEOUT;
        mp->waiting_timeout_s = k->wait_timeout;
    }
    if (k->bootstrap_token != NULL) {
        mp->field_mask |= KVB_MANAGER_PARAM_BOOTSTRAP_TOKEN;
        mp->bootstrap_token = k->bootstrap_token;
    }
    if (k->curve_sk != NULL) {
        mp->field_mask |= KVB_MANAGER_PARAM_CURVE;
        mp->curve_secret_key = k->curve_sk;
        mp->curve_client_secret_key = k->curve_client_sk;
        mp->curve_allowed_clients = k->curve_allowed;
    }
    if (k->host != NULL) {
        mp->field_mask |= KVB_MANAGER_PARAM_HOST;
        mp->host = k->host;
    }
    if (k->cachepd_contract != NULL) {
        mp->field_mask |= KVB_MANAGER_PARAM_CACHEPD_CONTRACT;
        mp->cachepd_contract = k->cachepd_contract;
    }
}

static kvb_status_t manager_start(kvbh_rank_t *r, const kvbh_place_t *p, kvb_mode_t mode,
                                  const char *boot, const kvbh_knobs_t *k)
{
    kvb_manager_params_t mp = {0};
    kvb_kv_args_t a;
    args_buf_t b;
    kv_args(r, &b, &a);
    mp.field_mask = KVB_MANAGER_PARAM_THREADS;
    if (boot != NULL)
        mp.field_mask |= KVB_MANAGER_PARAM_BOOTSTRAP_ADDR;
    knobs_apply(&mp, k);
    mp.mode = mode;
    mp.kv_args = &a;
    mp.engine = r->eng;
    mp.attn_tp_size = p->tp_size;
    mp.attn_tp_rank = p->tp;
    mp.attn_dp_size = mode == KVB_MODE_PREFILL ? p->dp_size : 1;
    mp.attn_dp_rank = mode == KVB_MODE_PREFILL ? p->dp : 0;
    mp.pp_size = p->pp_size;
    mp.pp_rank = p->pp;
    mp.system_dp_size = 1;
    mp.is_mla = r->g.mla;
    if (r->draft > 0) {
        mp.field_mask |= KVB_MANAGER_PARAM_DRAFT_LAYERS;
        mp.draft_layers = (uint32_t)r->draft;
    }
    mp.bootstrap_addr = boot;
    mp.transfer_threads = 2;
    mp.transfer_queues = 2;
    kvb_status_t st = kvb_manager_create(&mp, &r->mgr);
    if (st != KVB_OK)
        fprintf(stderr, "manager create: %s\n", kvb_manager_last_error(NULL));
    return st;
}

kvb_status_t kvbh_rank_start_at(kvbh_rank_t *r, const kvbh_geom_t *g, const kvbh_place_t *p,
                                kvb_mode_t mode, const char *boot, int mem, const kvbh_knobs_t *k)
{
    kvb_engine_params_t ep = {0};
    int draft = k != NULL ? k->draft : 0;
    memset(r, 0, sizeof(*r));
    if (k != NULL && k->n_state > KVBH_MAX_STATE) {
        fprintf(stderr, "knobs n_state %d: at most %d state buffers\n", k->n_state, KVBH_MAX_STATE);
        return KVB_ERR_INVALID;
    }
    size_t len = arena_len_of(g, p, mem == KVBH_MEM_PACKED, draft, k);
    uint8_t *arena = arena_get(mem, len);
    kvb_status_t st;
    if (arena == NULL) {
        fprintf(stderr, "rank arena of %zu bytes: no memory\n", len);
        return KVB_ERR_NOMEM;
    }
    layout_of(r, g, p, arena, 1, mem == KVBH_MEM_PACKED, draft, k);
    r->mem = mem;
    st = kvb_engine_create(k != NULL && k->engine != NULL ? k->engine : &ep, &r->eng);
    if (st != KVB_OK)
        fprintf(stderr, "engine create: %s\n", kvb_status_string(st));
    else
        st = manager_start(r, p != NULL ? p : &SINGLE, mode, boot, k);
    if (st != KVB_OK)
        kvbh_rank_stop(r);
    return st;
}

kvb_status_t kvbh_rank_start(kvbh_rank_t *r, const kvbh_geom_t *g, kvb_mode_t mode,
                             const char *boot, int mem, const kvbh_knobs_t *k)
{
    return kvbh_rank_start_at(r, g, NULL, mode, mode == KVB_MODE_PREFILL ? boot : NULL, mem, k);
}

void kvbh_rank_stop(kvbh_rank_t *r)
{
    if (r->mgr != NULL)
        kvb_manager_destroy(r->mgr);
    if (r->eng != NULL)
        kvb_engine_destroy(r->eng);
    arena_put(r->mem, r->arena, r->arena_len);
    memset(r, 0, sizeof(*r));
}

static bool canary_range(const uint8_t *p, size_t n, const char *who, const char *where)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != KVBH_CANARY_BYTE) {
            fprintf(stderr, "%s: canary %s broken at +%zu (0x%02x)\n", who, where, i, p[i]);
            return false;
        }
    return true;
}

bool kvbh_canaries_ok(const kvbh_rank_t *r, const char *who)
{
    bool ok = canary_range(r->arena, KVBH_CANARY, who, "before buffer 0");
    if (r->mem == KVBH_MEM_PACKED)
        return ok & canary_range(r->arena + r->arena_len - KVBH_CANARY, KVBH_CANARY, who,
                                 "after the last buffer");
    for (int i = 0; i < r->n_kv; i++)
        ok &= canary_range(r->kv[i] + r->buf_len, KVBH_CANARY, who, "after a KV buffer");
    ok &= canary_range(r->aux + KVBH_AUX_ITEM * KVBH_AUX_ITEMS, KVBH_CANARY, who, "after aux");
    for (int i = 0; i < r->n_state; i++)
        ok &= canary_range(r->state[i] + state_len(r, i), KVBH_CANARY, who, "after a state buffer");
    return ok;
}

/* ---- patterns ---- */

uint8_t kvbh_pat(uint64_t room, int buf, uint64_t page, uint64_t k)
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
        p[k] = kvbh_pat(room, buf, page, k);
}

void kvbh_fill(kvbh_rank_t *r, uint64_t room, const int32_t *src, int n, int aux_index)
{
    for (int b = 0; b < r->n_kv; b++)
        for (int i = 0; i < n; i++)
            fill_item(r->kv[b] + (uint64_t)src[i] * r->item_len, r->item_len, room, b, (uint64_t)i);
    fill_item(r->aux + (uint64_t)aux_index * KVBH_AUX_ITEM, KVBH_AUX_ITEM, room, 100, 0);
}

uint64_t kvbh_verify_buf(const kvbh_rank_t *r, uint64_t room, int b, const int32_t *dst, int n)
{
    uint64_t bad = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = r->kv[b] + (uint64_t)dst[i] * r->item_len;
        for (uint64_t k = 0; k < r->item_len; k++)
            bad += p[k] != kvbh_pat(room, b, (uint64_t)i, k);
    }
    return bad;
}

uint64_t kvbh_verify(const kvbh_rank_t *r, uint64_t room, const int32_t *dst, int n, int aux_index)
{
    uint64_t bad = 0;
    for (int b = 0; b < r->n_kv; b++)
        bad += kvbh_verify_buf(r, room, b, dst, n);
    for (uint64_t k = 0; aux_index >= 0 && k < KVBH_AUX_ITEM; k++)
        bad += r->aux[(uint64_t)aux_index * KVBH_AUX_ITEM + k] != kvbh_pat(room, 100, 0, k);
    return bad;
}

void kvbh_guard_fill(kvbh_rank_t *r, const int32_t *dst, int n, int aux_index, uint8_t v)
{
    for (int b = 0; b < r->n_kv; b++)
        for (int i = 0; i < n; i++)
            memset(r->kv[b] + (uint64_t)dst[i] * r->item_len, v, r->item_len);
    if (aux_index >= 0)
        memset(r->aux + (uint64_t)aux_index * KVBH_AUX_ITEM, v, KVBH_AUX_ITEM);
}

uint64_t kvbh_guard_bad_buf(const kvbh_rank_t *r, int b, const int32_t *dst, int n, uint8_t v)
{
    uint64_t bad = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = r->kv[b] + (uint64_t)dst[i] * r->item_len;
        for (uint64_t k = 0; k < r->item_len; k++)
            bad += p[k] != v;
    }
    return bad;
}

uint64_t kvbh_guard_bad(const kvbh_rank_t *r, const int32_t *dst, int n, int aux_index, uint8_t v)
{
    uint64_t bad = 0;
    for (int b = 0; b < r->n_kv; b++)
        bad += kvbh_guard_bad_buf(r, b, dst, n, v);
    for (uint64_t k = 0; aux_index >= 0 && k < KVBH_AUX_ITEM; k++)
        bad += r->aux[(uint64_t)aux_index * KVBH_AUX_ITEM + k] != v;
    return bad;
}

static uint64_t room_slot(const kvbh_geom_t *g, uint64_t room)
{
    uint64_t slots = g->pool_pages / KVBH_MAX_PAGES;
    return room % (slots > 0 ? slots : 1) * KVBH_MAX_PAGES;
}

int32_t kvbh_src_page(const kvbh_geom_t *g, uint64_t room, int i)
{
    return (int32_t)((room_slot(g, room) + KVBH_MAX_PAGES - 1 - (uint64_t)i) % g->pool_pages);
}

int32_t kvbh_dst_page(const kvbh_geom_t *g, uint64_t room, int i)
{
    return (int32_t)((room_slot(g, room) + (uint64_t)i) % g->pool_pages);
}

int kvbh_room_aux(uint64_t room)
{
    return (int)(room % KVBH_AUX_ITEMS);
}

void kvbh_room_pages(const kvbh_geom_t *g, uint64_t room, int n, int32_t *src, int32_t *dst)
{
    for (int i = 0; i < n; i++) {
        if (src != NULL)
            src[i] = kvbh_src_page(g, room, i);
        if (dst != NULL)
            dst[i] = kvbh_dst_page(g, room, i);
    }
}

/* ---- bounded waits ---- */

kvb_poll_t kvbh_wait_receiver(kvb_receiver_h rc, double timeout_s)
{
    double end = kvbh_now() + timeout_s;
    kvb_poll_t p;
    while ((p = kvb_receiver_poll(rc)) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED &&
           kvbh_now() < end)
        kvbh_sleep(0.0005);
    return p;
}

kvb_poll_t kvbh_wait_sender(kvb_sender_h s, double timeout_s)
{
    double end = kvbh_now() + timeout_s;
    kvb_poll_t p;
    while ((p = kvb_sender_poll(s)) != KVB_POLL_SUCCESS && p != KVB_POLL_FAILED && kvbh_now() < end)
        kvbh_sleep(0.0005);
    return p;
}

int kvbh_wait_sender_ready(kvb_sender_h s, double timeout_s)
{
    double end = kvbh_now() + timeout_s;
    while (kvbh_now() < end) {
        kvb_poll_t p = kvb_sender_poll(s);
        if (p == KVB_POLL_FAILED)
            return -1;
        if (p >= KVB_POLL_WAITING_FOR_INPUT)
            return 0;
        kvbh_sleep(0.0005);
    }
    return -1;
}

kvb_status_t kvbh_pair_room(kvbh_pair_t *p, uint64_t room, const int32_t *src, const int32_t *dst,
                            int n, kvb_receiver_h *rc_p, kvb_sender_h *s_p)
{
    kvb_status_t st;
    *rc_p = NULL;
    *s_p = NULL;
    kvbh_fill(&p->pre, room, src, n, -1);
    if ((st = kvb_receiver_create(p->dec.mgr, p->boot.addr, room, -1, rc_p)) != KVB_OK ||
        (st = kvb_receiver_init(*rc_p, dst, (size_t)n, 0, NULL)) != KVB_OK ||
        (st = kvb_sender_create(p->pre.mgr, p->boot.addr, room, s_p)) != KVB_OK)
        return st;
    if (kvbh_wait_sender_ready(*s_p, 10) != 0)
        return KVB_ERR_TIMEOUT;
    return kvb_sender_init(*s_p, (uint64_t)n, 0);
}

int kvbh_wait_receivers_fail(kvb_receiver_h *rc, int n, double t0, double timeout_s, int *other_p,
                             double *t_last_p)
{
    int left = n, done[KVBH_MAX_ROOMS] = {0};
    *other_p = 0;
    *t_last_p = 0;
    if (n > KVBH_MAX_ROOMS)
        return n;
    while (left > 0 && kvbh_now() < t0 + timeout_s) {
        for (int j = 0; j < n; j++) {
            kvb_poll_t p = kvb_receiver_poll(rc[j]);
            if (done[j] || p == KVB_POLL_WAITING_FOR_INPUT || p == KVB_POLL_TRANSFERRING)
                continue;
            *other_p += p != KVB_POLL_FAILED;
            done[j] = 1;
            left--;
            *t_last_p = kvbh_now() - t0;
        }
        kvbh_sleep(0.002);
    }
    return left;
}

int kvbh_receivers(kvbh_rank_t *d, const char *boot, uint64_t first, int count, int n,
                   kvb_receiver_h *rc)
{
    for (int j = 0; j < count; j++) {
        uint64_t room = first + (uint64_t)j;
        int32_t dst[KVBH_MAX_PAGES];
        if (n > KVBH_MAX_PAGES)
            return -1;
        kvbh_room_pages(&d->g, room, n, NULL, dst);
        if (kvb_receiver_create(d->mgr, boot, room, -1, &rc[j]) != KVB_OK)
            return -1;
        kvb_receiver_init(rc[j], dst, (size_t)n, kvbh_room_aux(room), NULL);
    }
    return 0;
}

/* Both ends of a room terminal; 0 when both Success (else printed). */
static int room_outcome(kvb_receiver_h rc, kvb_sender_h s, uint64_t room)
{
    char why[512] = "";
    kvb_poll_t pr = kvbh_wait_receiver(rc, 10), ps = kvbh_wait_sender(s, 10);
    if (pr == KVB_POLL_SUCCESS && ps == KVB_POLL_SUCCESS)
        return 0;
    if (pr == KVB_POLL_FAILED)
        kvb_receiver_failure(rc, why, sizeof(why));
    fprintf(stderr, "room %llu: receiver %s sender %s (%s)\n", (unsigned long long)room,
            kvb_poll_string(pr), kvb_poll_string(ps), why);
    return -1;
}

int kvbh_run_room(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot, uint64_t room, int n,
                  int32_t src0, int32_t dst0, int aux)
{
    int32_t src[256], dst[256];
    if (n > 256)
        return -1;
    for (int i = 0; i < n; i++) {
        src[i] = src0 + i;
        dst[i] = dst0 + (n - 1 - i); /* reversed: no accidental identity */
    }
    return kvbh_run_room_pages(p, d, boot, room, src, dst, n, aux);
}

int kvbh_run_room_pages(kvbh_rank_t *p, kvbh_rank_t *d, const char *boot, uint64_t room,
                        const int32_t *src, const int32_t *dst, int n, int aux)
{
    kvb_receiver_h rc = NULL;
    kvb_sender_h s = NULL;
    int rv = -1;
    if (n > 256)
        return -1;
    if (kvb_receiver_create(d->mgr, boot, room, -1, &rc) != KVB_OK)
        goto out;
    kvb_receiver_init(rc, dst, (size_t)n, aux, NULL);
    kvbh_fill(p, room, src, n, aux);
    if (kvb_sender_create(p->mgr, boot, room, &s) != KVB_OK || kvbh_wait_sender_ready(s, 10) != 0) {
        fprintf(stderr, "room %llu: sender not ready\n", (unsigned long long)room);
        goto out;
    }
    kvb_sender_init(s, (uint64_t)n, aux);
    kvb_sender_send(s, src, (size_t)(n / 2));
    kvb_sender_send(s, src + n / 2, (size_t)(n - n / 2));
    if (room_outcome(rc, s, room) != 0)
        goto out;
    uint64_t bad = kvbh_verify(d, room, dst, n, aux);
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

/* ---- bootstrap servers ---- */

int kvbh_boot_start(kvbh_boot_t *b, unsigned port, const char *token)
{
    kvb_bootstrap_server_params_t bp = {0};
    memset(b, 0, sizeof(*b));
    bp.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_PORT;
    bp.port = (uint16_t)port;
    if (token != NULL) {
        bp.field_mask |= KVB_BOOTSTRAP_SERVER_PARAM_TOKEN | KVB_BOOTSTRAP_SERVER_PARAM_AUTH_READS;
        bp.token = token;
        bp.auth_reads = 1;
    }
    if (kvb_bootstrap_server_start(&bp, &b->h) != KVB_OK)
        return -1;
    snprintf(b->addr, sizeof(b->addr), "%s", kvb_bootstrap_server_address(b->h));
    b->port = kvbh_addr_port(b->addr);
    b->token = token;
    return 0;
}

void kvbh_boot_stop(kvbh_boot_t *b)
{
    if (b->h != NULL)
        kvb_bootstrap_server_stop(b->h);
    b->h = NULL;
}

int kvbh_boot_restart(kvbh_boot_t *b)
{
    kvbh_boot_t n;
    kvbh_boot_stop(b);
    for (int tries = 0; tries < 30; tries++) {
        if (kvbh_boot_start(&n, b->port, b->token) == 0) {
            *b = n;
            return 0;
        }
        kvbh_sleep(0.1);
    }
    return -1;
}

unsigned kvbh_addr_port(const char *addr)
{
    const char *c = strrchr(addr, ':');
    return c != NULL ? (unsigned)atoi(c + 1) : 0;
}

/* ---- a pair of ranks ---- */

kvb_status_t kvbh_pair_start(kvbh_pair_t *p, const kvbh_geom_t *g, int mem, const kvbh_knobs_t *pre,
                             const kvbh_knobs_t *dec)
{
    kvb_status_t st;
    memset(p, 0, sizeof(*p));
    if (kvbh_boot_start(&p->boot, 0, NULL) != 0) {
        fprintf(stderr, "bootstrap server did not start\n");
        return KVB_ERR_IO;
    }
    st = kvbh_rank_start(&p->pre, g, KVB_MODE_PREFILL, p->boot.addr, mem, pre);
    if (st == KVB_OK)
        st = kvbh_rank_start(&p->dec, g, KVB_MODE_DECODE, NULL, mem, dec);
    if (st != KVB_OK)
        kvbh_pair_stop(p);
    return st;
}

void kvbh_pair_stop(kvbh_pair_t *p)
{
    kvbh_rank_stop(&p->dec);
    kvbh_rank_stop(&p->pre);
    kvbh_boot_stop(&p->boot);
}
