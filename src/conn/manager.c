/* KV manager: parameters and knobs, buffer registration, the control socket
 * and its thread, shared helpers of the prefill and decode sides. */
#include "conn/conn_int.h"
#include "dialect/dialect.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_FRAMES (9 + KVB__FRAMES_MAX_EXT)

static __thread char g_create_err[KVB_ERRMSG_MAX];

static kvb_status_t create_error(kvb_status_t st, const char *fmt, const char *a)
{
    snprintf(g_create_err, sizeof(g_create_err), fmt, a);
    KVB_LOGE("manager: %s", g_create_err);
    return st;
}

static void knobs(kvb_manager_params_t *out, const kvb_manager_params_t *in)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t def_threads = (int64_t)(0.75 * (double)cpus) / 8;
    def_threads = def_threads < 4 ? 4 : def_threads > 12 ? 12 : def_threads;
#define ENV(n) "KVBRIDGE_" n, "SGLANG_DISAGGREGATION_" n
    out->bootstrap_timeout_s = kvb__env_double(ENV("BOOTSTRAP_TIMEOUT"), 300, 0.001, 1e9);
    out->waiting_timeout_s = kvb__env_double(ENV("WAITING_TIMEOUT"), 300, 0.001, 1e9);
    out->heartbeat_interval_s = kvb__env_double(ENV("HEARTBEAT_INTERVAL"), 5.0, 0.0, 1e9);
    out->heartbeat_max_failures = (int)kvb__env_int(ENV("HEARTBEAT_MAX_FAILURE"), 2, 0, 1000000);
    out->transfer_threads = (int)kvb__env_int(ENV("THREAD_POOL_SIZE"), def_threads, 1, 1024);
    out->transfer_queues = (int)kvb__env_int(ENV("QUEUE_SIZE"), 4, 1, 1024);
#undef ENV
    out->room_ttl_s = kvb__env_double("KVBRIDGE_ROOM_TTL", NULL, 600, 0.001, 1e9);
    out->bootstrap_refresh_s = kvb__env_double("KVBRIDGE_BOOTSTRAP_REFRESH", NULL, 5.0, 0.0, 1e9);
    if (in->field_mask & KVB_MANAGER_PARAM_BOOTSTRAP_TIMEOUT)
        out->bootstrap_timeout_s = in->bootstrap_timeout_s;
    if (in->field_mask & KVB_MANAGER_PARAM_WAITING_TIMEOUT)
        out->waiting_timeout_s = in->waiting_timeout_s;
    if (in->field_mask & KVB_MANAGER_PARAM_HEARTBEAT) {
        out->heartbeat_interval_s = in->heartbeat_interval_s;
        out->heartbeat_max_failures = in->heartbeat_max_failures;
    }
    if (in->field_mask & KVB_MANAGER_PARAM_THREADS) {
        out->transfer_threads = in->transfer_threads;
        out->transfer_queues = in->transfer_queues;
    }
    if (in->field_mask & KVB_MANAGER_PARAM_ROOM_TTL)
        out->room_ttl_s = in->room_ttl_s;
    if (in->field_mask & KVB_MANAGER_PARAM_BOOTSTRAP_REFRESH)
        out->bootstrap_refresh_s = in->bootstrap_refresh_s < 0 ? 0 : in->bootstrap_refresh_s;
    out->sglang_dialect =
        (in->field_mask & KVB_MANAGER_PARAM_SGLANG_DIALECT) ? in->sglang_dialect : 0;
    out->draft_layers = (in->field_mask & KVB_MANAGER_PARAM_DRAFT_LAYERS) ? in->draft_layers : 0;
    out->integrity =
        (in->field_mask & KVB_MANAGER_PARAM_INTEGRITY) ? in->integrity : kvb__integ_env();
    out->sglang_kv_checksum_aux =
        (in->field_mask & KVB_MANAGER_PARAM_SGLANG_KV_CHECKSUM) ? in->sglang_kv_checksum_aux : -1;
    /* The seeds' floors: interval at least 2 s, at least one miss. The test
     * hook KVBRIDGE_HEARTBEAT_FLOOR lowers the floor (never in production). */
    double floor = kvb__env_double("KVBRIDGE_HEARTBEAT_FLOOR", NULL, 2.0, 0.05, 2.0);
    if (out->heartbeat_interval_s < floor)
        out->heartbeat_interval_s = floor;
    if (out->heartbeat_max_failures < 1)
        out->heartbeat_max_failures = 1;
    if (out->transfer_queues < 1)
        out->transfer_queues = 1;
    if (out->transfer_threads < out->transfer_queues)
        out->transfer_threads = out->transfer_queues;
}

/* draft_layers: the draft model's layers end the KV list and leave at least
 * one target layer; a PP prefill would hold them only on its last stage,
 * which the pairing does not model. */
static kvb_status_t check_draft(const kvb_manager_params_t *p)
{
    if (!(p->field_mask & KVB_MANAGER_PARAM_DRAFT_LAYERS) || p->draft_layers == 0)
        return KVB_OK;
    uint64_t per = p->is_mla ? 1 : 2, need = per * ((uint64_t)p->draft_layers + 1);
    char why[160];
    if (p->kv_args->num_kv < need)
        snprintf(why, sizeof(why),
                 "draft_layers=%u needs at least %llu KV buffers (the draft's and one target "
                 "layer's), kv_args has %u",
                 p->draft_layers, (unsigned long long)need, p->kv_args->num_kv);
    else if (p->pp_size != 1)
        snprintf(why, sizeof(why), "draft_layers needs pp_size 1 (pp_size=%d)", p->pp_size);
    else
        return KVB_OK;
    return create_error(KVB_ERR_INVALID, "%s", why);
}

static kvb_status_t check_params(const kvb_manager_params_t *p)
{
    const kvb_kv_args_t *a = p->kv_args;
    if (p->mode != KVB_MODE_PREFILL && p->mode != KVB_MODE_DECODE)
        return create_error(KVB_ERR_INVALID, "mode must be prefill or decode%s", "");
    if (a == NULL || p->engine == NULL)
        return create_error(KVB_ERR_INVALID, "kv_args and engine are required%s", "");
    if (a->num_kv == 0 || a->kv_data_ptrs == NULL || a->kv_data_lens == NULL ||
        a->kv_item_len == 0 || a->page_size == 0)
        return create_error(KVB_ERR_INVALID,
                            "kv_args: kv_data_ptrs/lens, kv_item_len and page_size are "
                            "required%s",
                            "");
    if ((a->num_aux > 0 && (!a->aux_data_ptrs || !a->aux_data_lens || !a->aux_item_lens)) ||
        (a->num_state > 0 && (!a->state_data_ptrs || !a->state_data_lens || !a->state_item_lens)))
        return create_error(KVB_ERR_INVALID, "kv_args: aux/state arrays missing%s", "");
    for (uint32_t i = 0; i < a->num_state; i++)
        if (a->state_item_lens[i] == 0 || a->state_data_lens[i] < a->state_item_lens[i])
            return create_error(KVB_ERR_INVALID,
                                "kv_args: a state buffer has item length 0 or one longer than "
                                "the buffer%s",
                                "");
    if (p->attn_tp_size < 1 || p->attn_tp_rank < 0 || p->attn_tp_rank >= p->attn_tp_size ||
        p->attn_dp_size < 1 || p->attn_dp_rank < 0 || p->attn_dp_rank >= p->attn_dp_size ||
        p->pp_size < 1 || p->pp_rank < 0 || p->pp_rank >= p->pp_size || p->system_dp_size < 1 ||
        p->system_dp_rank < 0 || p->system_dp_rank >= p->system_dp_size)
        return create_error(KVB_ERR_INVALID, "parallel info out of range%s", "");
    if (!p->is_mla && (a->num_kv % 2 != 0 || a->kv_head_num == 0 ||
                       a->kv_item_len % ((uint64_t)a->page_size * a->kv_head_num) != 0))
        return create_error(KVB_ERR_INVALID,
                            "kv_args: MHA needs K and V buffers (even num_kv) and kv_item_len "
                            "a multiple of page_size x kv_head_num%s",
                            "");
    if (a->kv_order != KVB_PLAN_ORDER_NHD && a->kv_order != KVB_PLAN_ORDER_HND)
        return create_error(KVB_ERR_INVALID, "kv_args: kv_order is not 0 (NHD) or 1 (HND)%s", "");
    if (p->mode == KVB_MODE_PREFILL &&
        (!(p->field_mask & KVB_MANAGER_PARAM_BOOTSTRAP_ADDR) || p->bootstrap_addr == NULL))
        return create_error(KVB_ERR_INVALID, "a prefill manager needs bootstrap_addr%s", "");
    if (p->mode == KVB_MODE_DECODE && p->pp_size != 1)
        return create_error(KVB_ERR_INVALID, "decode PP must be 1 (decode holds all layers)%s", "");
    if ((p->field_mask & KVB_MANAGER_PARAM_SGLANG_DIALECT) && p->sglang_dialect != 0 &&
        p->sglang_dialect != KVB_BOOTSTRAP_DIALECT_2025 &&
        p->sglang_dialect != KVB_BOOTSTRAP_DIALECT_2026)
        return create_error(KVB_ERR_INVALID, "sglang_dialect is not 0, 2025 or 2026%s", "");
    return check_draft(p);
}

/* The KV cache dtype name (param, else KVBRIDGE_KV_CACHE_DTYPE) into
 * m->kv_dtype: 1..KVB_BOOTSTRAP_WORD_MAX of [A-Za-z0-9_.:+-], the bootstrap
 * server's word rule; NULL or "" leaves it unknown. */
static kvb_status_t set_kv_dtype(struct kvb_manager *m, const kvb_manager_params_t *p)
{
    const char *v = (p->field_mask & KVB_MANAGER_PARAM_KV_CACHE_DTYPE)
                        ? p->kv_cache_dtype
                        : getenv("KVBRIDGE_KV_CACHE_DTYPE");
    if (v == NULL || v[0] == '\0')
        return KVB_OK;
    size_t n = strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-");
    if (v[n] != '\0' || n > KVB_BOOTSTRAP_WORD_MAX)
        return create_error(KVB_ERR_INVALID,
                            "kv_cache_dtype \"%s\" is not 1..64 of [A-Za-z0-9_.:+-]",
                            n > KVB_BOOTSTRAP_WORD_MAX ? "(too long)" : v);
    memcpy(m->kv_dtype, v, n + 1);
    return KVB_OK;
}

/* A TokenSpeed contract the framework gave (params cachepd_contract), kept
 * as text and checked by the dialects (kvb__dialect_check_manager) once the
 * KV args are copied; bounded as a peer's contract is. */
static kvb_status_t set_cachepd_contract(struct kvb_manager *m, const kvb_manager_params_t *p)
{
    const char *v =
        (p->field_mask & KVB_MANAGER_PARAM_CACHEPD_CONTRACT) ? p->cachepd_contract : NULL;
    if (v == NULL || v[0] == '\0')
        return KVB_OK;
    size_t n = strnlen(v, KVB_MANAGER_CONTRACT_MAX + 1);
    if (n > KVB_MANAGER_CONTRACT_MAX)
        return create_error(KVB_ERR_INVALID, "cachepd_contract is longer than 256 KiB%s", "");
    if ((m->cachepd_contract = strdup(v)) == NULL)
        return create_error(KVB_ERR_NOMEM, "out of memory%s", "");
    return KVB_OK;
}

static uint64_t *dup_u64(const uint64_t *a, size_t n)
{
    uint64_t *c = malloc((n ? n : 1) * sizeof(*c));
    if (c != NULL && n > 0)
        memcpy(c, a, n * sizeof(*c));
    return c;
}

static kvb_status_t copy_args(struct kvb_manager *m, const kvb_kv_args_t *a)
{
    m->args = *a;
    m->kv_ptrs = dup_u64(a->kv_data_ptrs, a->num_kv);
    m->kv_lens = dup_u64(a->kv_data_lens, a->num_kv);
    m->aux_ptrs = dup_u64(a->aux_data_ptrs, a->num_aux);
    m->aux_lens = dup_u64(a->aux_data_lens, a->num_aux);
    m->aux_items = dup_u64(a->aux_item_lens, a->num_aux);
    m->state_ptrs = dup_u64(a->state_data_ptrs, a->num_state);
    m->state_lens = dup_u64(a->state_data_lens, a->num_state);
    m->state_items = dup_u64(a->state_item_lens, a->num_state);
    m->args.kv_data_ptrs = m->kv_ptrs;
    m->args.kv_data_lens = m->kv_lens;
    m->args.aux_data_ptrs = m->aux_ptrs;
    m->args.aux_data_lens = m->aux_lens;
    m->args.aux_item_lens = m->aux_items;
    m->args.state_data_ptrs = m->state_ptrs;
    m->args.state_data_lens = m->state_lens;
    m->args.state_item_lens = m->state_items;
    m->state_geom = calloc(a->num_state ? a->num_state : 1, sizeof(*m->state_geom));
    if (!m->kv_ptrs || !m->kv_lens || !m->aux_ptrs || !m->aux_lens || !m->aux_items ||
        !m->state_ptrs || !m->state_lens || !m->state_items || !m->state_geom)
        return KVB_ERR_NOMEM;
    for (uint32_t i = 0; i < a->num_state; i++) /* one row per item, sharded by TP rank */
        m->state_geom[i] = (kvb_plan_geom_t){.item_len = a->state_item_lens[i],
                                             .axis = KVB_PLAN_AXIS_STATE_CHANNEL};
    if (m->args.num_layers_total == 0) {
        uint32_t local = kvb__target_layers(m);
        m->args.num_layers_total = m->mode == KVB_MODE_DECODE ? local : local * m->p.pp_size;
    }
    return KVB_OK;
}

static kvb_status_t register_buffers(struct kvb_manager *m)
{
    size_t n = m->args.num_kv + m->args.num_aux + m->args.num_state, k = 0;
    kvb_mem_region_t *r = calloc(n, sizeof(*r));
    kvb_status_t st;
    if (r == NULL)
        return KVB_ERR_NOMEM;
    /* AUTO: buffers in CUDA device memory (PyTorch tensors) are found by the
     * engine and moved by the driver; host memory as before (also without a
     * driver). */
    for (uint32_t i = 0; i < m->args.num_kv; i++)
        r[k++] = (kvb_mem_region_t){(void *)(uintptr_t)m->kv_ptrs[i], m->kv_lens[i], KVB_MEM_AUTO};
    for (uint32_t i = 0; i < m->args.num_aux; i++)
        r[k++] =
            (kvb_mem_region_t){(void *)(uintptr_t)m->aux_ptrs[i], m->aux_lens[i], KVB_MEM_AUTO};
    for (uint32_t i = 0; i < m->args.num_state; i++)
        r[k++] =
            (kvb_mem_region_t){(void *)(uintptr_t)m->state_ptrs[i], m->state_lens[i], KVB_MEM_AUTO};
    st = kvb_engine_register_batch(m->engine, r, n);
    free(r);
    if (st != KVB_OK)
        return create_error(st, "registering the KV buffers with the engine: %s",
                            kvb_engine_last_error(m->engine));
    return KVB_OK;
}

static void unregister_buffers(struct kvb_manager *m)
{
    for (uint32_t i = 0; i < m->args.num_kv; i++)
        kvb_engine_unregister(m->engine, (void *)(uintptr_t)m->kv_ptrs[i]);
    for (uint32_t i = 0; i < m->args.num_aux; i++)
        kvb_engine_unregister(m->engine, (void *)(uintptr_t)m->aux_ptrs[i]);
    for (uint32_t i = 0; i < m->args.num_state; i++)
        kvb_engine_unregister(m->engine, (void *)(uintptr_t)m->state_ptrs[i]);
}

/* A message with more frames than any message has still names its room in
 * frame 0 when that is a decimal room id: fail that room too. */
static void too_many_frames(zmq_msg_t *first, kvb__frames_err_t *e)
{
    const char *d = zmq_msg_data(first);
    size_t len = zmq_msg_size(first);
    uint64_t room = 0;
    bool ok = len > 0 && len <= 20;
    for (size_t i = 0; ok && i < len; i++) {
        ok = d[i] >= '0' && d[i] <= '9' && room <= (UINT64_MAX - (uint64_t)(d[i] - '0')) / 10;
        room = room * 10 + (uint64_t)(d[i] - '0');
    }
    e->has_room = ok;
    e->room = ok ? room : 0;
    snprintf(e->reason, sizeof(e->reason), "more than %d frames", MAX_FRAMES);
}

static void *control_main(void *arg)
{
    struct kvb_manager *m = arg;
    zmq_msg_t msgs[MAX_FRAMES];
    kvb__frame_t f[MAX_FRAMES];
    double last_sweep = kvb__now_s();
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        int n = kvb__zrecv(m->pull, msgs, MAX_FRAMES, 100);
        if (n > 0)
            __atomic_add_fetch(&m->ctl_received, 1, __ATOMIC_RELAXED);
        if (n > MAX_FRAMES) {
            kvb__frames_err_t e;
            too_many_frames(&msgs[0], &e);
            for (int i = 0; i < MAX_FRAMES; i++)
                zmq_msg_close(&msgs[i]);
            kvb__conn_bad_message(m, "unknown", &e);
        } else if (n > 0) {
            for (int i = 0; i < n; i++)
                f[i] = (kvb__frame_t){zmq_msg_data(&msgs[i]), zmq_msg_size(&msgs[i])};
            kvb__zpeer_id(&msgs[0], m->rx_peer_id, sizeof(m->rx_peer_id));
            if (m->mode == KVB_MODE_PREFILL)
                kvb__prefill_on_message(m, f, (size_t)n);
            else
                kvb__decode_on_message(m, f, (size_t)n);
            for (int i = 0; i < n; i++)
                zmq_msg_close(&msgs[i]);
        }
        double now = kvb__now_s();
        if (now - last_sweep > 1.0) {
            pthread_mutex_lock(&m->mu);
            kvb__rooms_sweep(m, now);
            pthread_mutex_unlock(&m->mu);
            last_sweep = now;
        }
    }
    return NULL;
}

static void manager_free(struct kvb_manager *m)
{
    if (m->ev_on)
        close(m->ev_fd);
    kvb__outputs_free(m); /* first tokens (either mode) */
    kvb__prefill_boot_free(m);
    kvb__endpoints_free(m);
    if (m->pull != NULL)
        zmq_close(m->pull);
    kvb__zcache_free(&m->zc);
    kvb__zcurve_free(&m->curve); /* closes the ZAP socket: before the context ends */
    if (m->zctx != NULL)
        zmq_ctx_term(m->zctx);
    free(m->bootstrap_token);
    free(m->cachepd_contract);
    kvb__rooms_free(m);
    free(m->kv_ptrs);
    free(m->kv_lens);
    free(m->aux_ptrs);
    free(m->aux_lens);
    free(m->aux_items);
    free(m->state_ptrs);
    free(m->state_lens);
    free(m->state_items);
    free(m->state_geom);
    free(m->bootstrap_addr);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->room_cv);
    pthread_rwlock_destroy(&m->reg_mu);
    kvb__err_destroy(&m->err);
    free(m);
}

static kvb_status_t manager_init(struct kvb_manager *m, const kvb_manager_params_t *p)
{
    kvb_status_t st;
    /* Only the fields before the optional ones are read unconditionally; the
     * rest only when field_mask names them, so a caller built against an
     * older, shorter kvb_manager_params_t (or a binding that stops early) is
     * never read past its end. */
    memcpy(&m->p, p, offsetof(kvb_manager_params_t, bootstrap_timeout_s));
    knobs(&m->p, p);
    m->mode = p->mode;
    m->engine = p->engine;
    kvb__err_init(&m->err);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->room_cv, NULL);
    pthread_rwlock_init(&m->reg_mu, NULL);
    m->n_buckets = 64;
    m->buckets = calloc(m->n_buckets, sizeof(*m->buckets));
    snprintf(m->host, sizeof(m->host), "%s",
             (p->field_mask & KVB_MANAGER_PARAM_HOST) && p->host ? p->host : "127.0.0.1");
    if (p->field_mask & KVB_MANAGER_PARAM_BOOTSTRAP_ADDR && p->bootstrap_addr != NULL)
        m->bootstrap_addr = strdup(p->bootstrap_addr);
    m->prefill_rank = p->attn_tp_rank * p->pp_size + p->pp_rank;
    m->is_last_stage = p->pp_rank == p->pp_size - 1;
    if (m->buckets == NULL || (st = copy_args(m, p->kv_args)) != KVB_OK)
        return create_error(KVB_ERR_NOMEM, "out of memory%s", "");
    if (p->field_mask & KVB_MANAGER_PARAM_BOOTSTRAP_TOKEN && p->bootstrap_token != NULL &&
        (m->bootstrap_token = strdup(p->bootstrap_token)) == NULL)
        return create_error(KVB_ERR_NOMEM, "out of memory%s", "");
    if ((st = set_kv_dtype(m, p)) != KVB_OK || (st = set_cachepd_contract(m, p)) != KVB_OK)
        return st;
    char why[512] = "";
    if ((st = kvb__dialect_check_manager(m, why, sizeof(why))) != KVB_OK)
        return create_error(st, "%s", why);
    bool curve = p->field_mask & KVB_MANAGER_PARAM_CURVE;
    st = kvb__zcurve_init(&m->curve, curve ? p->curve_secret_key : NULL,
                          curve ? p->curve_client_secret_key : NULL,
                          curve ? p->curve_allowed_clients : NULL, why, sizeof(why));
    if (st != KVB_OK)
        return create_error(st, "CURVE keys: %s", why);
    m->zctx = zmq_ctx_new();
    if (m->zctx == NULL)
        return create_error(KVB_ERR_IO, "zmq_ctx_new failed%s", "");
    kvb__zcache_init(&m->zc, m->zctx);
    m->zc.curve = &m->curve;
    if (m->curve.on && (st = kvb__zap_start(&m->curve, m->zctx)) != KVB_OK)
        return create_error(st, "cannot start the CURVE authentication handler%s", "");
    st = kvb__zbind_pull(m->zctx, m->host, &m->curve, &m->pull, &m->port);
    if (st != KVB_OK)
        return create_error(st, "cannot bind the control socket on %s", m->host);
    if (strchr(m->host, ':') != NULL)
        snprintf(m->endpoint, sizeof(m->endpoint), "[%s]:%u", m->host, m->port);
    else
        snprintf(m->endpoint, sizeof(m->endpoint), "%s:%u", m->host, m->port);
    return register_buffers(m);
}

kvb_status_t kvb_manager_create(const kvb_manager_params_t *params, kvb_manager_h *manager_p)
{
    kvb_status_t st;
    struct kvb_manager *m;
    g_create_err[0] = '\0';
    if (params == NULL || manager_p == NULL)
        return create_error(KVB_ERR_INVALID, "params and manager_p are required%s", "");
    if ((st = check_params(params)) != KVB_OK)
        return st;
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVB_ERR_NOMEM;
    st = manager_init(m, params);
    if (st != KVB_OK) {
        if (m->engine != NULL && st != KVB_ERR_OVERLAP)
            unregister_buffers(m);
        manager_free(m);
        return st;
    }
    if (m->mode == KVB_MODE_PREFILL) /* a decode can fence us if it declares us lost */
        kvb_engine_set_writer_tag(m->engine, kvb__endpoint_tag(m->host, m->port));
    st = m->mode == KVB_MODE_PREFILL ? kvb__prefill_start(m) : kvb__decode_start(m);
    if (st == KVB_OK && m->mode == KVB_MODE_PREFILL)
        st = kvb__prefill_refresh_start(m);
    if (st == KVB_OK && pthread_create(&m->ctl_thr, NULL, control_main, m) != 0)
        st = create_error(KVB_ERR_IO, "cannot start the control thread%s", "");
    if (st != KVB_OK) {
        /* Keep the reason for kvb_manager_last_error(NULL) (m->err dies here). */
        if (g_create_err[0] == '\0')
            snprintf(g_create_err, sizeof(g_create_err), "%s", kvb__err_get(&m->err));
        __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
        if (m->mode == KVB_MODE_PREFILL)
            kvb__prefill_refresh_stop(m), kvb__prefill_stop(m), kvb__prefill_free(m);
        else
            kvb__decode_stop(m), kvb__decode_free(m);
        unregister_buffers(m);
        manager_free(m);
        return st;
    }
    /* the rank label: this rank's position, as statuses name it (tp * pp_size + pp) */
    kvb__metrics_role_rank((int)m->mode, (int64_t)m->p.attn_tp_rank * m->p.pp_size + m->p.pp_rank);
    kvb__metrics_serve();
    KVB_LOGI("manager %s: %s rank tp %d/%d pp %d/%d up", m->endpoint,
             m->mode == KVB_MODE_PREFILL ? "prefill" : "decode", m->p.attn_tp_rank,
             m->p.attn_tp_size, m->p.pp_rank, m->p.pp_size);
    *manager_p = m;
    return KVB_OK;
}

void kvb_manager_destroy(kvb_manager_h m)
{
    if (m == NULL)
        return;
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    pthread_join(m->ctl_thr, NULL);
    if (m->mode == KVB_MODE_PREFILL) {
        kvb__prefill_refresh_stop(m);
        kvb__prefill_stop(m);
        kvb__prefill_free(m);
    } else {
        kvb__decode_stop(m);
        kvb__decode_free(m);
    }
    unregister_buffers(m);
    manager_free(m);
}

const char *kvb_manager_last_error(kvb_manager_h m)
{
    return m == NULL ? g_create_err : kvb__err_get(&m->err);
}

const char *kvb_manager_endpoint(kvb_manager_h m)
{
    return m->endpoint;
}

void kvb_manager_stats(kvb_manager_h m, kvb_manager_stats_t *s)
{
    pthread_mutex_lock(&m->mu);
    s->bad_messages = m->bad_messages;
    s->rooms = m->n_rooms;
    s->transfers_failed = m->transfers_failed;
    pthread_mutex_unlock(&m->mu);
    pthread_rwlock_rdlock(&m->reg_mu);
    s->registrations = m->n_regs;
    s->registrations_evicted = m->regs_evicted;
    s->registrations_refused = m->regs_refused;
    pthread_rwlock_unlock(&m->reg_mu);
}

kvb_status_t kvb_manager_event_fd(kvb_manager_h m, int *fd_p)
{
    if (m == NULL || fd_p == NULL)
        return KVB_ERR_INVALID;
    kvb_status_t st = KVB_OK;
    pthread_mutex_lock(&m->mu);
    if (!m->ev_on) {
        m->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        m->ev_on = m->ev_fd >= 0;
        if (!m->ev_on)
            st = kvb__err_set(&m->err, KVB_ERR_IO, "eventfd: %s", strerror(errno));
    }
    *fd_p = m->ev_on ? m->ev_fd : -1;
    pthread_mutex_unlock(&m->mu);
    return st;
}

static uint64_t relaxed(const uint64_t *v)
{
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

void kvb_manager_traffic(kvb_manager_h m, kvb_manager_traffic_t *t)
{
    uint64_t f = t->field_mask;
    if (f & KVB_MANAGER_TRAFFIC_CONTROL) {
        kvb__zcache_traffic(&m->zc, &t->control_sent, &t->control_send_failed);
        t->control_received = relaxed(&m->ctl_received);
    }
    if (f & KVB_MANAGER_TRAFFIC_BOOTSTRAP) {
        t->bootstrap_requests = relaxed(&m->boot_requests);
        t->bootstrap_failed = relaxed(&m->boot_failed);
    }
    if (f & KVB_MANAGER_TRAFFIC_HEARTBEAT) {
        t->heartbeat_requests = relaxed(&m->hb_requests);
        t->heartbeat_failed = relaxed(&m->hb_failed);
    }
    if (f & KVB_MANAGER_TRAFFIC_INTEGRITY) {
        t->integrity_sent = relaxed(&m->integ_sent);
        t->integrity_checked = relaxed(&m->integ_checked);
        t->integrity_mismatches = relaxed(&m->integ_mismatches);
        t->integrity_unchecked = relaxed(&m->integ_unchecked);
    }
}

void kvb_manager_limits(kvb_manager_h m, kvb_manager_limits_t *s)
{
    uint64_t f = s->field_mask;
    pthread_rwlock_rdlock(&m->reg_mu);
    if (f & KVB_MANAGER_LIMITS_REG_IDENTITY)
        s->registrations_impostor = m->regs_impostor;
    if (f & KVB_MANAGER_LIMITS_REG_BYTES) {
        s->registration_bytes = m->reg_bytes;
        s->registrations_too_big = m->regs_too_big;
    }
    pthread_rwlock_unlock(&m->reg_mu);
    pthread_mutex_lock(&m->mu);
    if (f & KVB_MANAGER_LIMITS_WIRE_ROOMS) {
        s->wire_rooms = m->wire_rooms;
        s->wire_room_bytes = m->wire_room_bytes;
        s->wire_rooms_refused = m->wire_rooms_refused;
        s->wire_rooms_evicted = m->wire_rooms_evicted;
    }
    pthread_mutex_unlock(&m->mu);
    if (f & KVB_MANAGER_LIMITS_PUSH)
        kvb__zcache_stats(&m->zc, &s->push_sockets, &s->push_sockets_evicted);
}
