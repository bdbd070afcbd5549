#include "caps_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvb_test.h"

int caps_boot_start(caps_pair_t *p)
{
    kvb_bootstrap_server_params_t bp = {0};
    bp.field_mask = KVB_BOOTSTRAP_SERVER_PARAM_PORT;
    if (kvb_bootstrap_server_start(&bp, &p->boot) != KVB_OK)
        return -1;
    snprintf(p->boot_addr, sizeof(p->boot_addr), "%s", kvb_bootstrap_server_address(p->boot));
    return 0;
}

int caps_rank_start(caps_pair_t *p, caps_rank_t *r, kvb_mode_t mode, const caps_curve_t *cv)
{
    kvb_manager_params_t mp = {0};
    kvb_kv_args_t a = {0};
    uint64_t ptrs[CAPS_LAYERS], lens[CAPS_LAYERS];
    uint64_t aux_ptr, aux_len = sizeof(r->aux), aux_item = sizeof(r->aux);
    memset(r, 0, sizeof(*r));
    r->mem = malloc(CAPS_TOTAL);
    if (r->mem == NULL)
        return -1;
    memset(r->mem, CAPS_FILL, CAPS_TOTAL);
    for (int i = 0; i < CAPS_LAYERS; i++) {
        ptrs[i] = (uint64_t)(uintptr_t)(r->mem + CAPS_OFF(i));
        lens[i] = CAPS_LEN(i);
    }
    aux_ptr = (uint64_t)(uintptr_t)r->aux;
    a.kv_data_ptrs = ptrs;
    a.kv_data_lens = lens;
    a.num_kv = CAPS_LAYERS;
    a.kv_item_len = CAPS_ITEM;
    a.aux_data_ptrs = &aux_ptr;
    a.aux_data_lens = &aux_len;
    a.aux_item_lens = &aux_item;
    a.num_aux = 1;
    a.page_size = CAPS_PAGE;
    a.kv_head_num = 1;
    a.num_layers_total = CAPS_LAYERS;
    if (kvb_engine_create(NULL, &r->eng) != KVB_OK)
        return -1;
    mp.field_mask = KVB_MANAGER_PARAM_BOOTSTRAP_ADDR | KVB_MANAGER_PARAM_THREADS;
    mp.mode = mode;
    mp.kv_args = &a;
    mp.engine = r->eng;
    mp.attn_tp_size = mp.attn_dp_size = mp.pp_size = mp.system_dp_size = 1;
    mp.is_mla = 1;
    mp.bootstrap_addr = p->boot_addr;
    mp.transfer_threads = 2;
    mp.transfer_queues = 2;
    if (cv != NULL && cv->sk != NULL) {
        mp.field_mask |= KVB_MANAGER_PARAM_CURVE;
        mp.curve_secret_key = cv->sk;
        mp.curve_client_secret_key = cv->client_sk;
        mp.curve_allowed_clients = cv->allowed;
    }
    if (kvb_manager_create(&mp, &r->mgr) != KVB_OK) {
        fprintf(stderr, "manager create: %s\n", kvb_manager_last_error(NULL));
        return -1;
    }
    return 0;
}

void caps_rank_stop(caps_rank_t *r)
{
    if (r->mgr != NULL)
        kvb_manager_destroy(r->mgr);
    if (r->eng != NULL)
        kvb_engine_destroy(r->eng);
    free(r->mem);
    memset(r, 0, sizeof(*r));
}

int caps_pair_start(caps_pair_t *p, const caps_curve_t *cv)
{
    memset(p, 0, sizeof(*p));
    if (caps_boot_start(p) != 0 || caps_rank_start(p, &p->pre, KVB_MODE_PREFILL, cv) != 0 ||
        caps_rank_start(p, &p->dec, KVB_MODE_DECODE, cv) != 0)
        return -1;
    return 0;
}

void caps_pair_stop(caps_pair_t *p)
{
    caps_rank_stop(&p->dec);
    caps_rank_stop(&p->pre);
    kvb_bootstrap_server_stop(p->boot);
}

static uint8_t pat(uint64_t room, int layer, int page, int b)
{
    uint64_t x =
        room * 0x9e3779b97f4a7c15ull ^ (uint64_t)layer << 40 ^ (uint64_t)page << 20 ^ (uint64_t)b;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint8_t)x;
}

void caps_fill_prefill(caps_rank_t *r, uint64_t room, const int32_t *src, int n)
{
    for (int l = 0; l < CAPS_LAYERS; l++)
        for (int i = 0; i < n; i++)
            for (int b = 0; b < CAPS_ITEM; b++)
                r->mem[CAPS_OFF(l) + (size_t)src[i] * CAPS_ITEM + (size_t)b] = pat(room, l, i, b);
}

uint64_t caps_verify(const caps_rank_t *r, uint64_t room, const int32_t *dst, int n)
{
    uint64_t bad = 0;
    for (int l = 0; l < CAPS_LAYERS; l++)
        for (int i = 0; i < n; i++)
            for (int b = 0; b < CAPS_ITEM; b++)
                bad += r->mem[CAPS_OFF(l) + (size_t)dst[i] * CAPS_ITEM + (size_t)b] !=
                       pat(room, l, i, b);
    return bad;
}

uint64_t caps_changed(const caps_rank_t *r, uint64_t off, uint64_t len)
{
    uint64_t n = 0;
    for (uint64_t i = off; i < off + len; i++)
        n += r->mem[i] != CAPS_FILL;
    return n;
}

kvb_poll_t caps_wait_recv(kvb_receiver_h rc, double timeout_s)
{
    double end = kvb_test_now_s() + timeout_s;
    kvb_poll_t st = kvb_receiver_poll(rc);
    while (st != KVB_POLL_SUCCESS && st != KVB_POLL_FAILED && kvb_test_now_s() < end) {
        usleep(2000);
        st = kvb_receiver_poll(rc);
    }
    return st;
}

kvb_poll_t caps_wait_send(kvb_sender_h s, double timeout_s)
{
    double end = kvb_test_now_s() + timeout_s;
    kvb_poll_t st = kvb_sender_poll(s);
    while (st != KVB_POLL_SUCCESS && st != KVB_POLL_FAILED && kvb_test_now_s() < end) {
        usleep(2000);
        st = kvb_sender_poll(s);
    }
    return st;
}

static kvb_poll_t wait_sender_ready(kvb_sender_h s, double timeout_s)
{
    double end = kvb_test_now_s() + timeout_s;
    kvb_poll_t st = kvb_sender_poll(s);
    while (st == KVB_POLL_BOOTSTRAPPING && kvb_test_now_s() < end) {
        usleep(2000);
        st = kvb_sender_poll(s);
    }
    return st;
}

int caps_room(caps_pair_t *p, uint64_t room, const int32_t *src, const int32_t *dst, int n,
              double timeout_s)
{
    kvb_sender_h s = NULL;
    kvb_receiver_h rc = NULL;
    int rv = -1;
    char why[256] = "";
    caps_fill_prefill(&p->pre, room, src, n);
    if (kvb_sender_create(p->pre.mgr, p->boot_addr, room, &s) != KVB_OK ||
        kvb_receiver_create(p->dec.mgr, p->boot_addr, room, -1, &rc) != KVB_OK)
        goto out;
    if (kvb_sender_init(s, (uint64_t)n, 0) != KVB_OK ||
        kvb_receiver_init(rc, dst, (size_t)n, 0, NULL) != KVB_OK)
        goto out;
    if (wait_sender_ready(s, timeout_s) != KVB_POLL_WAITING_FOR_INPUT)
        goto out;
    if (kvb_sender_send(s, src, (size_t)n) != KVB_OK)
        goto out;
    kvb_poll_t ss = caps_wait_send(s, timeout_s), rs = caps_wait_recv(rc, timeout_s);
    if (ss == KVB_POLL_SUCCESS && rs == KVB_POLL_SUCCESS && caps_verify(&p->dec, room, dst, n) == 0)
        rv = 0;
    else
        kvb_receiver_failure(rc, why, sizeof(why));
out:
    if (rv != 0)
        fprintf(stderr, "room %llu did not verify: %s\n", (unsigned long long)room, why);
    if (s != NULL)
        kvb_sender_destroy(s);
    if (rc != NULL)
        kvb_receiver_destroy(rc);
    return rv;
}

void caps_endpoint(kvb_manager_h m, char *ip, size_t len, uint16_t *port_p)
{
    const char *ep = kvb_manager_endpoint(m), *colon = strrchr(ep, ':');
    snprintf(ip, len, "%.*s", (int)(colon - ep), ep);
    *port_p = (uint16_t)atoi(colon + 1);
}
