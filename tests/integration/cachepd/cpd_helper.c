/* The C side of scripts/interop-cachepd.sh (TokenSpeed 0.1.1's own decode
 * connector against kvbridge's C prefill): a kvbridge bootstrap server (or
 * none: boot=ADDR, a TokenSpeed server the ranks register with) and TP
 * kvbridge prefill ranks of one model, driven over stdin.
 *
 *   cpd_helper TP mha|mla|hybrid [contract=FILE] [boot=ADDR]
 * mha: 4 layers, 8 KV heads of 64 bfloat16, page 16; mla: 3 layers, a
 * 576-wide bfloat16 latent, page 16 (tests/interop/cachepd_kvbridge_prefill.py
 * builds the same models with TokenSpeed's own code). hybrid: the CachePD
 * golden's hybrid model (tests/interop/tokenspeed011_common.py HybridModel),
 * page 128: KV buffers K and V of its one full-attention layer (2 KV heads of
 * 32 bfloat16), six state buffers layer.0.conv, layer.0.ssm, .. layer.2.ssm
 * (conv [128/TP, 3] bfloat16, ssm [4/TP, 16, 16] float32, one field payload
 * per item); the manager is given FILE's text, a TokenSpeed contract of the
 * model, as params cachepd_contract. Prints "boot ADDR", "ready". Then per
 * line
 *   send ROOM PAGES TOKEN CACHED [SLOT]
 * each rank: a sender for the room (first token TOKEN, candidates TOKEN+1,
 * TOKEN+2, cached tokens CACHED, logprob -0.5), its request pages 0..PAGES-1
 * at its pages 40-2p filled with the room's pattern (below), sent in two
 * chunks once the decode's requests came, the state slot SLOT (hybrid)
 * filled and set before the last chunk; answers per rank
 *   status ROOM RANK <final sender poll> <reason>
 * Byte o of a page of KV buffer b (K of the layers in order, then V; MLA:
 * the latents) holds, for the whole model's token-major page, kvbh_pat(ROOM,
 * b, request page, o); each rank holds its heads' slice of it. Byte o of
 * the whole model's payload of state field j (buffer order, row-major in its
 * global shape) is kvbh_pat(ROOM, 32 + j, 0, o); each rank holds its rows
 * (TokenSpeed's split, PROTOCOL-TOKENSPEED-CACHEPD.md 7.3: every part of
 * axis 0 split evenly by TP, the rank's slices of the parts side by side).
 * Exits on EOF. */
#include "harness/kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TP 4
#define MAX_PAGES 64
#define N_STATE 6 /* hybrid: conv and ssm of layers 0..2 */

static kvbh_geom_t G;
static kvbh_rank_t P[MAX_TP];
static int TP;

/* A state field's global geometry: rows on the partition axis 0, bytes per
 * row, the parts of the axis. */
typedef struct sfield {
    int rows, width, nparts, parts[3];
} sfield_t;

static const sfield_t CONV = {128, 3 * 2, 3, {32, 32, 64}}, SSM = {4, 16 * 16 * 4, 1, {4}};
static uint64_t STATE_ITEM[N_STATE];

static const sfield_t *sfield(int j)
{
    return j % 2 == 0 ? &CONV : &SSM;
}

/* The global row of local row i of TP rank tp. */
static int global_row(const sfield_t *f, int i, int tp)
{
    for (int p = 0, off = 0, loff = 0; p < f->nparts; p++) {
        int e = f->parts[p] / TP;
        if (i < loff + e)
            return off + tp * e + (i - loff);
        off += f->parts[p];
        loff += e;
    }
    return -1;
}

static void fill_state(kvbh_rank_t *r, uint64_t room, int32_t slot)
{
    for (int j = 0; j < r->n_state; j++) {
        const sfield_t *f = sfield(j);
        uint8_t *item = r->state[j] + (uint64_t)slot * r->state_item[j];
        for (int i = 0; i < f->rows / TP; i++)
            for (int x = 0; x < f->width; x++)
                item[i * f->width + x] =
                    kvbh_pat(room, 32 + j, 0, (uint64_t)global_row(f, i, r->tp) * f->width + x);
    }
}

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

static void run_rank(int i, const char *addr, uint64_t room, int n, long token, long cached,
                     int32_t slot)
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
    if (slot >= 0)
        fill_state(&P[i], room, slot);
    if (kvb_sender_create(P[i].mgr, addr, room, &s) == KVB_OK) {
        kvb_sender_set_first_token(s, token, cands, 2);
        kvb_sender_set_cached_tokens(s, (uint64_t)cached);
        kvb_sender_set_first_logprob(s, -0.5);
        if (kvbh_wait_sender_ready(s, 30) == 0) {
            kvb_sender_init(s, (uint64_t)n, 0);
            kvb_sender_send(s, src, (size_t)(n / 2));
            if (slot >= 0)
                kvb_sender_set_state_indices(s, &slot, 1);
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
    char *contract = NULL;
    kvbh_knobs_t k = {0};
    if (argc < 3 || (TP = atoi(argv[1])) < 1 || TP > MAX_TP) {
        fprintf(stderr, "usage: cpd_helper TP mha|mla|hybrid [contract=FILE] [boot=ADDR]\n");
        return 2;
    }
    bool mla = strcmp(argv[2], "mla") == 0;
    G = mla ? (kvbh_geom_t){3, 1, 1152, 16, 96, 1, 0} : (kvbh_geom_t){4, 8, 128, 16, 96, 0, 0};
    if (strcmp(argv[2], "hybrid") == 0) {
        for (int j = 0; j < N_STATE; j++)
            STATE_ITEM[j] = (uint64_t)(sfield(j)->rows / TP * sfield(j)->width);
        G = (kvbh_geom_t){1, 2, 64, 128, 96, 0, 0};
        k.n_state = N_STATE;
        k.state_items = STATE_ITEM;
    }
    for (int i = 3; i < argc; i++)
        if (strncmp(argv[i], "boot=", 5) == 0)
            ext = argv[i] + 5;
        else if (strncmp(argv[i], "contract=", 9) == 0 &&
                 (k.cachepd_contract = contract = kvbh_read_file(argv[i] + 9)) == NULL)
            return 2;
    memset(&boot, 0, sizeof(boot));
    if (ext != NULL)
        snprintf(boot.addr, sizeof(boot.addr), "%s", ext);
    else if (kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    for (int i = 0; i < TP; i++) {
        kvbh_place_t pl = {i, TP, 0, 1, 0, 1};
        if (kvbh_rank_start_at(&P[i], &G, &pl, KVB_MODE_PREFILL, boot.addr, KVBH_MEM_MALLOC, &k) !=
            KVB_OK)
            return 4;
    }
    printf("boot %s\nready\n", boot.addr);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long room;
        int n, slot = -1;
        long token, cached;
        int got = sscanf(line, "send %llu %d %ld %ld %d", &room, &n, &token, &cached, &slot);
        if (got < 4 || n < 1 || n > MAX_PAGES || slot >= KVBH_STATE_ITEMS ||
            (slot >= 0) != (P[0].n_state > 0))
            continue;
        for (int i = 0; i < TP; i++)
            run_rank(i, boot.addr, room, n, token, cached, (int32_t)slot);
        fflush(stdout);
    }
    for (int i = 0; i < TP; i++)
        kvbh_rank_stop(&P[i]);
    kvbh_boot_stop(&boot);
    free(contract);
    return 0;
}
