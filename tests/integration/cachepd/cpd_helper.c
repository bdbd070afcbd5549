/* The C side of scripts/interop-cachepd.sh (TokenSpeed 0.1.1's own decode
 * connector against kvbridge's C prefill): a kvbridge bootstrap server (or
 * none: boot=ADDR, a TokenSpeed server the ranks register with) and TP
 * kvbridge prefill ranks of one model, driven over stdin.
 *
 *   cpd_helper TP mha|mla [boot=ADDR]
 * mha: 4 layers, 8 KV heads of 64 bfloat16, page 16; mla: 3 layers, a
 * 576-wide bfloat16 latent, page 16 (tests/interop/cachepd_ts011.py builds
 * the same models with TokenSpeed's own code). Prints "boot ADDR", "ready".
 * Then per line
 *   send ROOM PAGES TOKEN CACHED
 * each rank: a sender for the room (first token TOKEN, candidates TOKEN+1,
 * TOKEN+2, cached tokens CACHED, logprob -0.5), its request pages 0..PAGES-1
 * at its pages 40-2p filled with the room's pattern (below), sent in two
 * chunks once the decode's requests came; answers per rank
 *   status ROOM RANK <final sender poll> <reason>
 * Byte o of a page of KV buffer b (K of layers 0..L-1, then V; MLA: the
 * latents) holds, for the whole model's token-major page, kvbh_pat(ROOM, b,
 * request page, o); each rank holds its heads' slice of it. Exits on EOF. */
#include "harness/kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TP 4
#define MAX_PAGES 64

static kvbh_geom_t G;
static kvbh_rank_t P[MAX_TP];
static int TP;

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

static void run_rank(int i, const char *addr, uint64_t room, int n, long token, long cached)
{
    int32_t src[MAX_PAGES];
    int32_t cands[2] = {(int32_t)token + 1, (int32_t)token + 2};
    char why[512] = "";
    kvb_sender_h s;
    kvb_poll_t st = KVB_POLL_FAILED;
    for (int p = 0; p < n; p++) {
        src[p] = 40 - 2 * p;
        fill_page(&P[i], room, (uint64_t)p, src[p]);
    }
    if (kvb_sender_create(P[i].mgr, addr, room, &s) == KVB_OK) {
        kvb_sender_set_first_token(s, token, cands, 2);
        kvb_sender_set_cached_tokens(s, (uint64_t)cached);
        kvb_sender_set_first_logprob(s, -0.5);
        if (kvbh_wait_sender_ready(s, 30) == 0) {
            kvb_sender_init(s, (uint64_t)n, 0);
            kvb_sender_send(s, src, (size_t)(n / 2));
            kvb_sender_send(s, src + n / 2, (size_t)(n - n / 2));
        }
        st = kvbh_wait_sender(s, 30);
        if (st == KVB_POLL_FAILED)
            kvb_sender_failure(s, why, sizeof(why));
        kvb_sender_destroy(s);
    }
    printf("status %llu %d %d %s\n", (unsigned long long)room, i, (int)st, why);
}

int main(int argc, char **argv)
{
    kvbh_boot_t boot;
    char line[512];
    const char *ext = NULL;
    if (argc < 3 || (TP = atoi(argv[1])) < 1 || TP > MAX_TP) {
        fprintf(stderr, "usage: cpd_helper TP mha|mla [boot=ADDR]\n");
        return 2;
    }
    bool mla = strcmp(argv[2], "mla") == 0;
    G = mla ? (kvbh_geom_t){3, 1, 1152, 16, 96, 1, 0} : (kvbh_geom_t){4, 8, 128, 16, 96, 0, 0};
    for (int i = 3; i < argc; i++)
        if (strncmp(argv[i], "boot=", 5) == 0)
            ext = argv[i] + 5;
    memset(&boot, 0, sizeof(boot));
    if (ext != NULL)
        snprintf(boot.addr, sizeof(boot.addr), "%s", ext);
    else if (kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    for (int i = 0; i < TP; i++) {
        kvbh_place_t pl = {i, TP, 0, 1, 0, 1};
        if (kvbh_rank_start_at(&P[i], &G, &pl, KVB_MODE_PREFILL, boot.addr, KVBH_MEM_MALLOC,
                               NULL) != KVB_OK)
            return 4;
    }
    printf("boot %s\nready\n", boot.addr);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long room;
        int n;
        long token, cached;
        if (sscanf(line, "send %llu %d %ld %ld", &room, &n, &token, &cached) != 4 || n < 1 ||
            n > MAX_PAGES)
            continue;
        for (int i = 0; i < TP; i++)
            run_rank(i, boot.addr, room, n, token, cached);
        fflush(stdout);
    }
    for (int i = 0; i < TP; i++)
        kvbh_rank_stop(&P[i]);
    kvbh_boot_stop(&boot);
    return 0;
}
