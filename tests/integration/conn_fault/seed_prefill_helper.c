/* The C side of tests/python/test_seed_peer.py: a bootstrap server and one
 * kvbridge prefill rank whose KV and aux buffers hold a known pattern, plus a
 * decode-side engine with registered memory the Python seed-001 peer names
 * in its KV-args registration (Python owns no registered memory itself).
 *
 * Prints "boot ADDR", "session SID", "kv P0,P1,..", "aux P", "unreg_aux P",
 * "item_len N", "ready". Then per stdin line
 *   send ROOM SRC_AUX DST_AUX N D0 .. D(N-1)
 * it creates the room's sender, waits until the peer's transfer info made it
 * WaitingForInput, sends the pages in two chunks and prints
 *   auxhex ROOM <expected aux item, hex>
 *   status ROOM <final sender poll value> <reason>
 *   kvbad ROOM <wrong KV bytes on the decode memory at D0..>
 *   auxbad ROOM <wrong bytes of aux item DST_AUX of the decode memory>
 * Exits on stdin EOF. */
#include "harness/kvb_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G KVBH_CHILD_GEOM

int main(void)
{
    kvbh_boot_t boot;
    kvb_engine_params_t ep = {0};
    kvb_engine_h deng;
    kvbh_rank_t p, d;
    char line[8192];
    static uint8_t unreg_aux[KVBH_AUX_ITEM * KVBH_AUX_ITEMS];
    if (kvbh_boot_start(&boot, 0, NULL) != 0)
        return 3;
    const char *addr = boot.addr;
    if (kvbh_rank_start(&p, &G, KVB_MODE_PREFILL, addr, KVBH_MEM_MALLOC, NULL) != 0)
        return 4;
    /* decode-side memory: same layout, registered with its own engine */
    uint8_t *arena = malloc(kvbh_arena_len(&G, NULL));
    if (arena == NULL || kvb_engine_create(&ep, &deng) != KVB_OK)
        return 5;
    kvbh_layout(&d, &G, NULL, arena, 1);
    for (int i = 0; i < d.n_kv; i++)
        if (kvb_engine_register(deng, d.kv[i], d.buf_len, KVB_MEM_HOST) != KVB_OK)
            return 6;
    if (kvb_engine_register(deng, d.aux, KVBH_AUX_ITEM * KVBH_AUX_ITEMS, KVB_MEM_HOST) != KVB_OK)
        return 6;
    printf("boot %s\nsession %s\nkv ", addr, kvb_engine_session_id(deng));
    for (int i = 0; i < d.n_kv; i++)
        printf("%s%llu", i ? "," : "", (unsigned long long)(uintptr_t)d.kv[i]);
    printf("\naux %llu\nunreg_aux %llu\nitem_len %llu\nready\n",
           (unsigned long long)(uintptr_t)d.aux, (unsigned long long)(uintptr_t)unreg_aux,
           (unsigned long long)d.item_len);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
        unsigned long long room;
        int src_aux, dst_aux, n, off = 0, k;
        int32_t src[512], dst[512];
        char why[512] = "";
        kvb_sender_h s;
        if (sscanf(line, "send %llu %d %d %d%n", &room, &src_aux, &dst_aux, &n, &off) != 4 ||
            n < 1 || n > 512 || src_aux < 0 || src_aux >= KVBH_AUX_ITEMS || dst_aux < 0 ||
            dst_aux >= KVBH_AUX_ITEMS)
            continue;
        for (int i = 0; i < n; i++) {
            src[i] = 10 + i;
            if (sscanf(line + off, "%d%n", &dst[i], &k) != 1) {
                n = 0;
                break;
            }
            off += k;
        }
        if (n == 0)
            continue;
        kvbh_fill(&p, room, src, n, src_aux);
        printf("auxhex %llu ", room);
        for (int b = 0; b < KVBH_AUX_ITEM; b++)
            printf("%02x", kvbh_pat(room, 100, 0, (uint64_t)b));
        printf("\n");
        kvb_poll_t st = KVB_POLL_FAILED;
        if (kvb_sender_create(p.mgr, addr, room, &s) == KVB_OK) {
            if (kvbh_wait_sender_ready(s, 10) == 0) {
                kvb_sender_init(s, (uint64_t)n, src_aux);
                kvb_sender_send(s, src, (size_t)(n / 2));
                kvb_sender_send(s, src + n / 2, (size_t)(n - n / 2));
            }
            st = kvbh_wait_sender(s, 10);
            if (st == KVB_POLL_FAILED)
                kvb_sender_failure(s, why, sizeof(why));
            kvb_sender_destroy(s);
        }
        uint64_t auxbad = 0;
        for (uint64_t j = 0; j < KVBH_AUX_ITEM; j++)
            auxbad += d.aux[(uint64_t)dst_aux * KVBH_AUX_ITEM + j] != kvbh_pat(room, 100, 0, j);
        uint64_t kvbad = kvbh_verify(&d, room, dst, n, dst_aux) - auxbad;
        printf("status %llu %d %s\nkvbad %llu %llu\nauxbad %llu %llu\n", room, (int)st, why, room,
               (unsigned long long)kvbad, room, (unsigned long long)auxbad);
        fflush(stdout);
    }
    kvbh_rank_stop(&p);
    kvb_engine_destroy(deng);
    free(arena);
    kvbh_boot_stop(&boot);
    return 0;
}
