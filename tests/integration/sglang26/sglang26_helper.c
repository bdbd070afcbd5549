/* The C side of tests/python/test_sglang26_prefill.py and
 * test_sglang26_decode.py: Python peers written from
 * PROTOCOL-SGLANG-2026.md talk to one kvbridge rank driven here over stdin.
 *
 *   sglang26_helper prefill [draft=N]
 * A bootstrap server, one prefill rank whose KV and aux buffers hold a known
 * pattern, and decode-side registered memory the Python 2026 decode names as
 * its own (draft=N: N draft-model layers appended after the target's on both,
 * params draft_layers). Prints "boot ADDR", "session SID", "kv P0,..", "aux P",
 * "item_len N", "page N", "ready". Then per line
 *   send ROOM SRC_AUX DST_AUX N PREFIX MODE D0 .. D(N-PREFIX-1)
 * creates the room's sender for a request of N pages whose first PREFIX the
 * decode holds; MODE "all": the sender is given all N pages (kvbridge skips
 * the prefix), "suffix": only the N-PREFIX suffix pages (as SGLang's prefill
 * scheduler does). It prints
 *   status ROOM <final sender poll> <reason>
 *   kvbad ROOM <wrong KV bytes at D..: request page PREFIX+j expected at Dj>
 *   auxbad ROOM <wrong bytes of aux item DST_AUX>
 * and
 *   dirty ROOM D0 ..  -> "dirty ROOM <non-zero decode KV bytes at D..>"
 *
 *   sglang26_helper decode | decode-mla [boot=ADDR] [draft=N]
 * A bootstrap server (where the Python prefill ranks register; boot=ADDR:
 * theirs instead, e.g. the TokenSpeed-shaped one of
 * test_tokenspeed_decode.py) and one
 * decode rank (MHA, or MLA; draft=N: N draft-model layers appended, params
 * draft_layers) speaking the dialect of KVBRIDGE_SGLANG_DIALECT. Prints
 * "boot ADDR", "ctl HOST:PORT", "session SID", "kv ..", "aux P",
 * "item_len N", "buf_len N" (bytes of each KV buffer), "ready". Then per line
 *   recv ROOM DST_AUX PREFIX_TOKENS N D0 .. D(N-1)   -> "recv ROOM <poll>"
 *   poll ROOM SECONDS  -> "poll ROOM <poll> <pages_safe> <reason>" (waits
 *                         until terminal or SECONDS)
 *   abort ROOM         -> "aborted ROOM"
 *   check ROOM FIRST D0 .. D(N-1) -> "check ROOM <KV bytes at D.. differing
 *                         from kvbh_pat of request pages FIRST..>"
 *   token ROOM         -> "token ROOM <known 0/1> <token> <candidates,...>"
 *                         (kvb_receiver_first_token: TokenSpeed prefills)
 * Exits on stdin EOF. */
#include "harness/kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G KVBH_CHILD_GEOM
#define MAX_RECV 64

static uint64_t verify_shifted(const kvbh_rank_t *d, uint64_t room, const int32_t *dst, int m,
                               int first)
{
    uint64_t bad = 0;
    for (int b = 0; b < d->n_kv; b++)
        for (int j = 0; j < m; j++) {
            const uint8_t *p = d->kv[b] + (uint64_t)dst[j] * d->item_len;
            for (uint64_t k = 0; k < d->item_len; k++)
                bad += p[k] != kvbh_pat(room, b, (uint64_t)(first + j), k);
        }
    return bad;
}

static void prefill_send(kvbh_rank_t *p, kvbh_rank_t *d, const char *addr, char *line)
{
    unsigned long long room;
    int src_aux, dst_aux, n, prefix, off = 0, k;
    char mode[16];
    int32_t src[512], dst[512];
    char why[512] = "";
    kvb_sender_h s;
    if (sscanf(line, "send %llu %d %d %d %d %15s%n", &room, &src_aux, &dst_aux, &n, &prefix, mode,
               &off) != 6 ||
        n < 1 || n > 512 || prefix < 0 || prefix >= n || src_aux < 0 || src_aux >= KVBH_AUX_ITEMS ||
        dst_aux < 0 || dst_aux >= KVBH_AUX_ITEMS)
        return;
    int m = n - prefix, suffix = strcmp(mode, "suffix") == 0;
    for (int i = 0; i < m; i++)
        if (sscanf(line + off, "%d%n", &dst[i], &k) != 1)
            return;
        else
            off += k;
    for (int i = 0; i < n; i++)
        src[i] = 10 + i;
    /* Pattern page i at src[i]; the suffix mode hands only the suffix's
     * source pages, whose patterns are then pages 0.. of what it sends. */
    int first = suffix ? 0 : prefix, count = suffix ? m : n;
    kvbh_fill(p, room, src + (suffix ? prefix : 0), count, src_aux);
    kvb_poll_t st = KVB_POLL_FAILED;
    if (kvb_sender_create(p->mgr, addr, room, &s) == KVB_OK) {
        if (kvbh_wait_sender_ready(s, 10) == 0) {
            const int32_t *sp = src + (suffix ? prefix : 0);
            kvb_sender_init(s, (uint64_t)count, src_aux);
            kvb_sender_send(s, sp, (size_t)(count / 2));
            kvb_sender_send(s, sp + count / 2, (size_t)(count - count / 2));
        }
        st = kvbh_wait_sender(s, 10);
        if (st == KVB_POLL_FAILED)
            kvb_sender_failure(s, why, sizeof(why));
        kvb_sender_destroy(s);
    }
    uint64_t auxbad = 0;
    for (uint64_t j = 0; j < KVBH_AUX_ITEM; j++)
        auxbad += d->aux[(uint64_t)dst_aux * KVBH_AUX_ITEM + j] != kvbh_pat(room, 100, 0, j);
    printf("status %llu %d %s\nkvbad %llu %llu\nauxbad %llu %llu\n", room, (int)st, why, room,
           (unsigned long long)verify_shifted(d, room, dst, m, first), room,
           (unsigned long long)auxbad);
    fflush(stdout);
}

static void prefill_dirty(const kvbh_rank_t *d, char *line)
{
    unsigned long long room;
    int off = 0, k, dst;
    uint64_t n = 0;
    if (sscanf(line, "dirty %llu%n", &room, &off) != 1)
        return;
    for (int j = 0; sscanf(line + off, "%d%n", &dst, &k) == 1 && j < 512; j++, off += k)
        for (int b = 0; dst >= 0 && (uint64_t)dst < KVBH_CHILD_GEOM.pool_pages && b < d->n_kv; b++)
            for (uint64_t x = 0; x < d->item_len; x++)
                n += d->kv[b][(uint64_t)dst * d->item_len + x] != 0;
    printf("dirty %llu %llu\n", room, (unsigned long long)n);
    fflush(stdout);
}

static int run_prefill(int draft)
{
    kvbh_knobs_t kn = {.draft = draft};
    kvbh_boot_t boot;
    kvb_engine_params_t ep = {0};
    kvb_engine_h deng;
    kvbh_rank_t p, d;
    char line[8192];
    if (kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    if (kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, boot.addr, KVBH_MEM_MALLOC, &kn) != 0)
        return 4;
    uint8_t *arena = malloc(kvbh_arena_len_draft(&G, NULL, draft));
    if (arena == NULL || kvb_engine_create(&ep, &deng) != KVB_OK)
        return 5;
    kvbh_layout_draft(&d, &G, NULL, arena, 1, draft);
    for (int i = 0; i < d.n_kv; i++)
        if (kvb_engine_register(deng, d.kv[i], d.buf_len, KVB_MEM_HOST) != KVB_OK)
            return 6;
    if (kvb_engine_register(deng, d.aux, KVBH_AUX_ITEM * KVBH_AUX_ITEMS, KVB_MEM_HOST) != KVB_OK)
        return 6;
    printf("boot %s\nsession %s\nkv ", boot.addr, kvb_engine_session_id(deng));
    for (int i = 0; i < d.n_kv; i++)
        printf("%s%llu", i ? "," : "", (unsigned long long)(uintptr_t)d.kv[i]);
    printf("\naux %llu\nitem_len %llu\npage %d\nready\n", (unsigned long long)(uintptr_t)d.aux,
           (unsigned long long)d.item_len, G.page);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (strncmp(line, "dirty ", 6) == 0)
            prefill_dirty(&d, line);
        else
            prefill_send(&p, &d, boot.addr, line);
    kvbh_rank_stop(&p);
    kvb_engine_destroy(deng);
    free(arena);
    kvbh_boot_stop(&boot);
    return 0;
}

typedef struct recv_slot {
    uint64_t room;
    kvb_receiver_h rc;
} recv_slot_t;

static kvb_receiver_h find(recv_slot_t *r, int n, uint64_t room)
{
    for (int i = 0; i < n; i++)
        if (r[i].rc != NULL && r[i].room == room)
            return r[i].rc;
    return NULL;
}

static void decode_recv(kvbh_rank_t *d, const char *addr, recv_slot_t *r, int *nr, char *line)
{
    unsigned long long room, prefix;
    int aux, n, off = 0, k;
    int32_t dst[512];
    if (sscanf(line, "recv %llu %d %llu %d%n", &room, &aux, &prefix, &n, &off) != 4 || n < 0 ||
        n > 512 || *nr >= MAX_RECV)
        return;
    for (int i = 0; i < n; i++)
        if (sscanf(line + off, "%d%n", &dst[i], &k) != 1)
            return;
        else
            off += k;
    kvb_receiver_h rc;
    if (kvb_receiver_create(d->mgr, addr, room, -1, &rc) != KVB_OK)
        return;
    kvb_receiver_init_t ex = {.field_mask = KVB_RECV_INIT_PREFIX, .prefix_tokens = prefix};
    kvb_receiver_init(rc, dst, (size_t)n, aux, prefix > 0 ? &ex : NULL);
    r[*nr].room = room;
    r[(*nr)++].rc = rc;
    printf("recv %llu %d\n", room, (int)kvb_receiver_poll(rc));
}

static void decode_poll(recv_slot_t *r, int nr, char *line)
{
    unsigned long long room;
    double secs;
    char why[512] = "";
    if (sscanf(line, "poll %llu %lf", &room, &secs) != 2)
        return;
    kvb_receiver_h rc = find(r, nr, room);
    if (rc == NULL)
        return;
    kvb_poll_t st = kvbh_wait_receiver(rc, secs);
    if (st == KVB_POLL_FAILED)
        kvb_receiver_failure(rc, why, sizeof(why));
    printf("poll %llu %d %d %s\n", room, (int)st, kvb_receiver_pages_safe(rc), why);
}

static void decode_check(const kvbh_rank_t *d, char *line)
{
    unsigned long long room;
    int first, off = 0, k, dst;
    uint64_t bad = 0;
    if (sscanf(line, "check %llu %d%n", &room, &first, &off) != 2)
        return;
    for (int j = 0; sscanf(line + off, "%d%n", &dst, &k) == 1 && j < 512; j++, off += k)
        for (int b = 0; b < d->n_kv; b++)
            for (uint64_t x = 0; x < d->item_len; x++)
                bad += d->kv[b][(uint64_t)dst * d->item_len + x] !=
                       kvbh_pat(room, b, (uint64_t)(first + j), x);
    printf("check %llu %llu\n", room, (unsigned long long)bad);
}

static int run_decode(const kvbh_geom_t *g, const char *ext, int draft)
{
    kvbh_knobs_t kn = {.draft = draft};
    kvbh_boot_t boot = {0};
    kvbh_rank_t d;
    char line[8192];
    recv_slot_t r[MAX_RECV];
    int nr = 0;
    if (ext != NULL)
        snprintf(boot.addr, sizeof(boot.addr), "%s", ext);
    else if (kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    if (kvbh_rank_start(&d, g, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, &kn) != 0)
        return 4;
    printf("boot %s\nctl %s\nsession %s\nkv ", boot.addr, kvb_manager_endpoint(d.mgr),
           kvb_engine_session_id(d.eng));
    for (int i = 0; i < d.n_kv; i++)
        printf("%s%llu", i ? "," : "", (unsigned long long)(uintptr_t)d.kv[i]);
    printf("\naux %llu\nitem_len %llu\nbuf_len %llu\npage %d\nready\n",
           (unsigned long long)(uintptr_t)d.aux, (unsigned long long)d.item_len,
           (unsigned long long)d.buf_len, g->page);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long room;
        if (strncmp(line, "recv ", 5) == 0)
            decode_recv(&d, boot.addr, r, &nr, line);
        else if (strncmp(line, "poll ", 5) == 0)
            decode_poll(r, nr, line);
        else if (sscanf(line, "abort %llu", &room) == 1 && find(r, nr, room) != NULL) {
            kvb_receiver_abort(find(r, nr, room));
            printf("aborted %llu\n", room);
        } else if (strncmp(line, "check ", 6) == 0) {
            decode_check(&d, line);
        } else if (sscanf(line, "token %llu", &room) == 1 && find(r, nr, room) != NULL) {
            int64_t tok = -1;
            int32_t c[8];
            size_t n = 0;
            int known = kvb_receiver_first_token(find(r, nr, room), &tok, c, 8, &n);
            printf("token %llu %d %lld ", room, known, (long long)tok);
            for (size_t i = 0; i < n && i < 8; i++)
                printf("%s%d", i ? "," : "", (int)c[i]);
            printf("\n");
        }
        fflush(stdout);
    }
    for (int i = 0; i < nr; i++)
        kvb_receiver_destroy(r[i].rc);
    kvbh_rank_stop(&d);
    kvbh_boot_stop(&boot);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "prefill") == 0)
        return run_prefill(0);
    if (argc == 3 && strcmp(argv[1], "prefill") == 0 && strncmp(argv[2], "draft=", 6) == 0)
        return run_prefill(atoi(argv[2] + 6));
    const char *ext = NULL;
    int draft = 0, bad = argc < 2;
    for (int i = 2; i < argc; i++)
        if (strncmp(argv[i], "boot=", 5) == 0)
            ext = argv[i] + 5;
        else if (strncmp(argv[i], "draft=", 6) == 0)
            draft = atoi(argv[i] + 6);
        else
            bad = 1;
    if (!bad && strcmp(argv[1], "decode") == 0)
        return run_decode(&G, ext, draft);
    if (!bad && strcmp(argv[1], "decode-mla") == 0) {
        kvbh_geom_t mla = G;
        mla.mla = 1; /* one latent buffer per layer */
        return run_decode(&mla, ext, draft);
    }
    fprintf(stderr, "usage: sglang26_helper prefill [draft=N] | decode|decode-mla [boot=ADDR] "
                    "[draft=N]\n");
    return 2;
}
