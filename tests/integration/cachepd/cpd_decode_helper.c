/* The C side of scripts/interop-cachepd.sh's decode direction (TokenSpeed
 * 0.1.1's own prefill -> kvbridge's C decode): TP kvbridge decode ranks of
 * one model, driven over stdin by tests/interop/cachepd_kvbridge_decode.py.
 *
 *   cpd_decode_helper TP mha|mla|hybrid [contract=FILE] [boot=ADDR]
 * Without boot=, a kvbridge bootstrap server of its own, where the
 * TokenSpeed prefill registers. Models as cpd_helper's (mha: 4 layers, 8 KV
 * heads of 64 bfloat16; mla: 3 layers, a 576-wide bfloat16 latent; page 16;
 * hybrid: K and V of one full-attention layer, 2 KV heads of 32 bfloat16,
 * page 128, and six state buffers, conv and ssm of layers 0..2, items of
 * (128/TP) x 3 x 2 and (4/TP) x 16 x 16 x 4 bytes, KVBH_STATE_ITEMS slots;
 * FILE's text, a TokenSpeed contract of the model, is params
 * cachepd_contract), POOL pages per KV buffer, every byte of which holds
 * noise first: byte k of page p of buffer b is kvbh_pat(NOISE, b, p, k), of
 * slot s of state buffer j kvbh_pat(NOISE, 32 + j, s, k). Heartbeats every
 * 0.5 s, the prefill lost after 2 misses; KVBRIDGE_ABORT_ACK_TIMEOUT from the
 * environment. Prints "boot ADDR", "ready", then answers per line:
 *   recv ROOM PREFIX PROMPT ID... [state SLOT]  every rank: a receiver for
 *       ROOM on the TokenSpeed block ids ID (kvbridge pages ID - 1; prefix
 *       and prompt in tokens), hybrid: and state slot SLOT (TokenSpeed block
 *       SLOT + 1 of every state group) -> "init ROOM RANK <poll>"
 *   landed ROOM ID SECONDS  until a byte of block ID's page (rank 0, buffer
 *       0) is no longer noise -> "landed ROOM <seconds>" or "landed ROOM none"
 *   wait ROOM SECONDS  every rank -> "done ROOM RANK <poll> <seconds> <token>
 *       <ncands> <c0> <c1> <cached or -> <logprob or -> <reason>"
 *   dump DIR  every rank's KV buffers, pool pages, buffer after buffer, then
 *       its state buffers, every slot, to DIR/r<RANK>.bin -> "dumped
 *       canaries-intact" (every rank's canary gaps after each buffer, see
 *       kvbh_canaries_ok) or "dumped canaries-broken"
 * Exits on EOF. */
#include "harness/kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TP 4
#define MAX_ROOMS 64
#define POOL 100
#define NOISE 0xC0FFEEu
#define N_STATE 6 /* hybrid */

static kvbh_geom_t G;
static kvbh_rank_t D[MAX_TP];
static int TP;
static const char *BOOT;
static uint64_t STATE_ITEM[N_STATE];

typedef struct room {
    uint64_t id;
    kvb_receiver_h rc[MAX_TP];
} room_t;

static room_t ROOMS[MAX_ROOMS];
static int NROOMS;

static room_t *room_of(uint64_t id)
{
    for (int i = 0; i < NROOMS; i++)
        if (ROOMS[i].id == id)
            return &ROOMS[i];
    return NULL;
}

static void noise(kvbh_rank_t *r)
{
    for (int b = 0; b < r->n_kv; b++)
        for (uint64_t p = 0; p < POOL; p++)
            for (uint64_t k = 0; k < r->item_len; k++)
                r->kv[b][p * r->item_len + k] = kvbh_pat(NOISE, b, p, k);
    for (int j = 0; j < r->n_state; j++)
        for (uint64_t s = 0; s < KVBH_STATE_ITEMS; s++)
            for (uint64_t k = 0; k < r->state_item[j]; k++)
                r->state[j][s * r->state_item[j] + k] = kvbh_pat(NOISE, 32 + j, s, k);
}

static void recv_cmd(char *args)
{
    unsigned long long id, prefix, prompt;
    int used = 0, n = 0, slot = -1;
    int32_t pages[256];
    char *p;
    if (sscanf(args, "%llu %llu %llu%n", &id, &prefix, &prompt, &used) != 3 || NROOMS == MAX_ROOMS)
        return;
    p = args + used;
    for (char *end; n < 256; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        pages[n++] = (int32_t)v - 1; /* TokenSpeed's block 0 is its null page */
    }
    if (sscanf(p, " state %d", &slot) == 1 && (slot < 0 || slot >= KVBH_STATE_ITEMS))
        return;
    room_t *rm = &ROOMS[NROOMS++];
    rm->id = id;
    int32_t st_slot = (int32_t)slot;
    kvb_receiver_init_t ex = {.field_mask = KVB_RECV_INIT_PREFIX | KVB_RECV_INIT_PROMPT,
                              .prefix_tokens = prefix,
                              .prompt_tokens = prompt};
    if (slot >= 0) {
        ex.field_mask |= KVB_RECV_INIT_STATE;
        ex.state_indices = &st_slot;
        ex.num_state_indices = 1;
    }
    for (int t = 0; t < TP; t++) {
        kvb_poll_t st = KVB_POLL_FAILED;
        if (kvb_receiver_create(D[t].mgr, BOOT, id, -1, &rm->rc[t]) == KVB_OK) {
            kvb_receiver_init(rm->rc[t], pages, (size_t)n, 0, &ex);
            st = kvb_receiver_poll(rm->rc[t]);
        }
        printf("init %llu %d %d\n", id, t, (int)st);
    }
}

static void landed_cmd(const char *args)
{
    unsigned long long id;
    long blk;
    double secs, t0 = kvbh_now();
    if (sscanf(args, "%llu %ld %lf", &id, &blk, &secs) != 3 || blk < 1 || blk > POOL)
        return;
    const volatile uint8_t *p = D[0].kv[0] + (uint64_t)(blk - 1) * D[0].item_len;
    while (kvbh_now() - t0 < secs) {
        for (uint64_t k = 0; k < D[0].item_len; k++)
            if (p[k] != kvbh_pat(NOISE, 0, (uint64_t)(blk - 1), k)) {
                printf("landed %llu %.3f\n", id, kvbh_now() - t0);
                return;
            }
        kvbh_sleep(0.001);
    }
    printf("landed %llu none\n", id);
}

static void wait_cmd(const char *args)
{
    unsigned long long id;
    double secs, t0 = kvbh_now();
    room_t *rm;
    if (sscanf(args, "%llu %lf", &id, &secs) != 2 || (rm = room_of(id)) == NULL)
        return;
    for (int t = 0; t < TP; t++) {
        kvb_poll_t st = kvbh_wait_receiver(rm->rc[t], secs - (kvbh_now() - t0));
        double el = kvbh_now() - t0;
        int64_t tok = -1;
        int32_t c[2] = {-1, -1};
        size_t nc = 0;
        uint64_t cached = 0;
        double lp = 0;
        char why[512] = "", cs[32] = "-", ls[32] = "-";
        kvb_receiver_first_token(rm->rc[t], &tok, c, 2, &nc);
        if (kvb_receiver_cached_tokens(rm->rc[t], &cached))
            snprintf(cs, sizeof(cs), "%llu", (unsigned long long)cached);
        if (kvb_receiver_first_logprob(rm->rc[t], &lp))
            snprintf(ls, sizeof(ls), "%.17g", lp);
        if (st == KVB_POLL_FAILED)
            kvb_receiver_failure(rm->rc[t], why, sizeof(why));
        printf("done %llu %d %d %.3f %lld %zu %d %d %s %s %s\n", id, t, (int)st, el, (long long)tok,
               nc, (int)c[0], (int)c[1], cs, ls, why);
    }
}

static void dump_cmd(const char *args)
{
    char dir[400], path[512];
    bool intact = true;
    if (sscanf(args, "%399s", dir) != 1)
        return;
    for (int t = 0; t < TP; t++) {
        snprintf(path, sizeof(path), "%s/r%d.bin", dir, t);
        FILE *f = fopen(path, "wb");
        for (int b = 0; f != NULL && b < D[t].n_kv; b++)
            fwrite(D[t].kv[b], D[t].item_len, POOL, f);
        for (int j = 0; f != NULL && j < D[t].n_state; j++)
            fwrite(D[t].state[j], D[t].state_item[j], KVBH_STATE_ITEMS, f);
        if (f != NULL)
            fclose(f);
        intact &= kvbh_canaries_ok(&D[t], "cpd_decode_helper");
    }
    printf("dumped %s\n", intact ? "canaries-intact" : "canaries-broken");
}

int main(int argc, char **argv)
{
    kvbh_boot_t boot;
    kvbh_knobs_t k = {.hb_interval = 0.5, .hb_misses = 2};
    char line[4096], *contract = NULL;
    if (argc < 3 || (TP = atoi(argv[1])) < 1 || TP > MAX_TP) {
        fprintf(stderr, "usage: cpd_decode_helper TP mha|mla|hybrid [contract=FILE] [boot=ADDR]\n");
        return 2;
    }
    bool mla = strcmp(argv[2], "mla") == 0;
    G = mla ? (kvbh_geom_t){3, 1, 1152, 16, POOL, 1, 0} : (kvbh_geom_t){4, 8, 128, 16, POOL, 0, 0};
    if (strcmp(argv[2], "hybrid") == 0) {
        for (int j = 0; j < N_STATE; j++)
            STATE_ITEM[j] = (uint64_t)(j % 2 == 0 ? 128 / TP * 3 * 2 : 4 / TP * 16 * 16 * 4);
        G = (kvbh_geom_t){1, 2, 64, 128, POOL, 0, 0};
        k.n_state = N_STATE;
        k.state_items = STATE_ITEM;
    }
    memset(&boot, 0, sizeof(boot));
    for (int i = 3; i < argc; i++)
        if (strncmp(argv[i], "boot=", 5) == 0)
            snprintf(boot.addr, sizeof(boot.addr), "%s", argv[i] + 5);
        else if (strncmp(argv[i], "contract=", 9) == 0 &&
                 (k.cachepd_contract = contract = kvbh_read_file(argv[i] + 9)) == NULL)
            return 2;
    if (boot.addr[0] == '\0' && kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    BOOT = boot.addr;
    for (int i = 0; i < TP; i++) {
        kvbh_place_t pl = {i, TP, 0, 1, 0, 1};
        if (kvbh_rank_start_at(&D[i], &G, &pl, KVB_MODE_DECODE, NULL, KVBH_MEM_MALLOC, &k) !=
            KVB_OK)
            return 4;
        noise(&D[i]);
    }
    printf("boot %s\nready\n", boot.addr);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (strncmp(line, "recv ", 5) == 0)
            recv_cmd(line + 5);
        else if (strncmp(line, "landed ", 7) == 0)
            landed_cmd(line + 7);
        else if (strncmp(line, "wait ", 5) == 0)
            wait_cmd(line + 5);
        else if (strncmp(line, "dump ", 5) == 0)
            dump_cmd(line + 5);
        fflush(stdout);
    }
    for (int i = 0; i < NROOMS; i++)
        for (int t = 0; t < TP; t++)
            kvb_receiver_destroy(ROOMS[i].rc[t]);
    for (int i = 0; i < TP; i++)
        kvbh_rank_stop(&D[i]);
    kvbh_boot_stop(&boot);
    free(contract);
    return 0;
}
