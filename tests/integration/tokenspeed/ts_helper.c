/* The C side of tests/python/test_tokenspeed_prefill.py (a TokenSpeed decode
 * written from PROTOCOL-TOKENSPEED.md) and scripts/interop-tokenspeed.sh
 * (TokenSpeed's own receiver): a bootstrap server and TP kvbridge prefill
 * ranks of one instance, plus decode-side memory (a TP 1 decode's KV
 * buffers, each registered on its own with a kvbridge engine) that the
 * Python decode names as its own.
 *
 *   ts_helper prefill TP [mla] [draft=N] [boot=ADDR]
 * draft=N: N draft-model layers appended after the target's on every rank
 * and in the decode memory (params draft_layers; spec 8.5). With boot=ADDR the ranks register with
 * that bootstrap server (which then outlives them), else with one of the helper's own. Prints "boot
 * ADDR", "session SID", "kv P0,..", "item_len N" (the decode's), "buf_len N", "page N", "heads N",
 * "head_bytes N", "layers N", "ready". Then per line send ROOM RANKS N PREFIX MODE TOKEN D0 ..
 * D(N-PREFIX-1) RANKS: the prefill TP ranks that send (comma list: the ranks the decode's plan
 * targets), each with a sender for a request of N pages whose first PREFIX the decode holds; MODE
 * "all": the sender has all N pages (kvbridge skips the prefix), "suffix": only the missing ones
 * (as TokenSpeed's prefill). TOKEN >= 0: kvb_sender_set_first_token(TOKEN, [TOKEN+1, TOKEN+2]); -1:
 * the first int32 of the aux item ROOM % 32 is 1000 + ROOM % 1000 (the aux fallback). Answers, per
 * rank, then once: status ROOM RANK <final sender poll> <reason> kvbad ROOM <decode KV bytes at D..
 * differing from request pages PREFIX..> dirty ROOM <non-zero decode bytes at D..> (0: nothing was
 * written) Request page p of KV buffer b holds, at byte o of a TP 1 item, kvbh_pat( ROOM, b, p, o):
 * each prefill rank holds its heads' slice of it (token-major rows), so TP re-slicing is checked
 * byte for byte. Exits on stdin EOF. */
#include "harness/kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TP 4
#define MAX_PAGES 256

static kvbh_geom_t G;
static kvbh_rank_t P[MAX_TP], D;
static int TP, DRAFT;

/* Fill request page p (at source page sp) of every buffer of rank r. */
static void fill_page(kvbh_rank_t *r, uint64_t room, uint64_t p, int32_t sp)
{
    int hb = G.head_bytes, H = G.mla ? 1 : G.heads, Hl = r->local_heads;
    for (int b = 0; b < r->n_kv; b++) {
        uint8_t *item = r->kv[b] + (uint64_t)sp * r->item_len;
        for (int t = 0; t < G.page; t++)
            for (int h = 0; h < Hl; h++)
                for (int k = 0; k < hb; k++) {
                    uint64_t global = ((uint64_t)t * H + (uint64_t)(r->first_head + h)) * hb + k;
                    item[((uint64_t)t * Hl + h) * hb + k] = kvbh_pat(room, b, p, global);
                }
    }
}

static void verify(uint64_t room, const int32_t *dst, int m, int prefix, uint64_t *bad_p,
                   uint64_t *dirty_p)
{
    *bad_p = *dirty_p = 0;
    for (int b = 0; b < D.n_kv; b++)
        for (int j = 0; j < m; j++) {
            const uint8_t *p = D.kv[b] + (uint64_t)dst[j] * D.item_len;
            for (uint64_t k = 0; k < D.item_len; k++) {
                *bad_p += p[k] != kvbh_pat(room, b, (uint64_t)(prefix + j), k);
                *dirty_p += p[k] != 0;
            }
        }
}

static int parse_ranks(const char *s, int *ranks)
{
    int n = 0;
    for (const char *c = s; *c != '\0' && n < MAX_TP; c++)
        if (*c >= '0' && *c < '0' + TP)
            ranks[n++] = *c - '0';
    return n;
}

static void run_rank(kvbh_rank_t *r, const char *addr, uint64_t room, int n, int prefix,
                     bool suffix, long token, char *why, size_t wl, kvb_poll_t *st_p)
{
    int32_t src[MAX_PAGES];
    int first = suffix ? prefix : 0, count = n - first;
    kvb_sender_h s;
    for (int i = 0; i < n; i++) {
        src[i] = 10 + i;
        if (i >= first)
            fill_page(r, room, (uint64_t)i, src[i]);
    }
    int aux = (int)(room % KVBH_AUX_ITEMS);
    int32_t v = (int32_t)(1000 + room % 1000);
    memcpy(r->aux + (uint64_t)aux * KVBH_AUX_ITEM, &v, 4);
    *st_p = KVB_POLL_FAILED;
    if (kvb_sender_create(r->mgr, addr, room, &s) != KVB_OK)
        return;
    if (token >= 0) {
        int32_t cands[2] = {(int32_t)token + 1, (int32_t)token + 2};
        kvb_sender_set_first_token(s, token, cands, 2);
    }
    if (kvbh_wait_sender_ready(s, 10) == 0) {
        kvb_sender_init(s, (uint64_t)count, aux);
        kvb_sender_send(s, src + first, (size_t)(count / 2));
        kvb_sender_send(s, src + first + count / 2, (size_t)(count - count / 2));
    }
    *st_p = kvbh_wait_sender(s, 10);
    if (*st_p == KVB_POLL_FAILED)
        kvb_sender_failure(s, why, wl);
    kvb_sender_destroy(s);
}

static void do_send(const char *addr, char *line)
{
    unsigned long long room;
    int n, prefix, off = 0, k, ranks[MAX_TP];
    long token;
    char rs[32], mode[16];
    int32_t dst[MAX_PAGES];
    if (sscanf(line, "send %llu %31s %d %d %15s %ld%n", &room, rs, &n, &prefix, mode, &token,
               &off) != 6 ||
        n < 1 || n > MAX_PAGES || prefix < 0 || prefix >= n)
        return;
    int m = n - prefix, nr = parse_ranks(rs, ranks);
    for (int i = 0; i < m; i++) {
        if (sscanf(line + off, "%d%n", &dst[i], &k) != 1)
            return;
        off += k;
    }
    for (int i = 0; i < nr; i++) {
        char why[512] = "";
        kvb_poll_t st;
        run_rank(&P[ranks[i]], addr, room, n, prefix, strcmp(mode, "suffix") == 0, token, why,
                 sizeof(why), &st);
        printf("status %llu %d %d %s\n", room, ranks[i], (int)st, why);
    }
    uint64_t bad, dirty;
    verify(room, dst, m, prefix, &bad, &dirty);
    printf("kvbad %llu %llu\ndirty %llu %llu\n", room, (unsigned long long)bad, room,
           (unsigned long long)dirty);
    fflush(stdout);
}

static int start(kvbh_boot_t *boot, const char *ext, kvb_engine_h *deng, uint8_t **arena)
{
    kvb_engine_params_t ep = {0};
    memset(boot, 0, sizeof(*boot));
    if (ext != NULL)
        snprintf(boot->addr, sizeof(boot->addr), "%s", ext);
    else if (kvbh_boot_start(boot, 0, NULL) != 0)
        return 3;
    kvbh_knobs_t k = {.draft = DRAFT};
    for (int i = 0; i < TP; i++) {
        kvbh_place_t pl = {i, TP, 0, 1, 0, 1};
        if (kvbh_rank_start_at(&P[i], &G, &pl, KVB_MODE_PREFILL, boot->addr, KVBH_MEM_MALLOC, &k) !=
            KVB_OK)
            return 4;
    }
    *arena = malloc(kvbh_arena_len_draft(&G, NULL, DRAFT));
    if (*arena == NULL || kvb_engine_create(&ep, deng) != KVB_OK)
        return 5;
    kvbh_layout_draft(&D, &G, NULL, *arena, 1, DRAFT);
    /* One registration per buffer, as TokenSpeed's decode registers them:
     * a write past a buffer's end is then outside every region. */
    for (int i = 0; i < D.n_kv; i++)
        if (kvb_engine_register(*deng, D.kv[i], D.buf_len, KVB_MEM_HOST) != KVB_OK)
            return 6;
    return 0;
}

int main(int argc, char **argv)
{
    kvbh_boot_t boot;
    kvb_engine_h deng;
    uint8_t *arena = NULL;
    char line[8192];
    const char *ext = NULL;
    if (argc < 3 || strcmp(argv[1], "prefill") != 0 || (TP = atoi(argv[2])) < 1 || TP > MAX_TP) {
        fprintf(stderr, "usage: ts_helper prefill TP [mla] [draft=N] [boot=ADDR]\n");
        return 2;
    }
    G = KVBH_CHILD_GEOM;
    for (int i = 3; i < argc; i++) {
        G.mla |= strcmp(argv[i], "mla") == 0;
        if (strncmp(argv[i], "draft=", 6) == 0)
            DRAFT = atoi(argv[i] + 6);
        if (strncmp(argv[i], "boot=", 5) == 0)
            ext = argv[i] + 5;
    }
    int rc = start(&boot, ext, &deng, &arena);
    if (rc != 0)
        return rc;
    printf("boot %s\nsession %s\nkv ", boot.addr, kvb_engine_session_id(deng));
    for (int i = 0; i < D.n_kv; i++)
        printf("%s%llu", i ? "," : "", (unsigned long long)(uintptr_t)D.kv[i]);
    printf("\nitem_len %llu\nbuf_len %llu\npage %d\nheads %d\nhead_bytes %d\nlayers %d\ndraft "
           "%d\nready\n",
           (unsigned long long)D.item_len, (unsigned long long)D.buf_len, G.page,
           G.mla ? 1 : G.heads, G.head_bytes, G.layers, DRAFT);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (strncmp(line, "send ", 5) == 0)
            do_send(boot.addr, line);
    for (int i = 0; i < TP; i++)
        kvbh_rank_stop(&P[i]);
    kvb_engine_destroy(deng);
    free(arena);
    kvbh_boot_stop(&boot);
    return 0;
}
