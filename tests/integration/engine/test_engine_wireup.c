/* A writer process that exits right after its call returned must not take
 * the target down (issue 33: Mooncake's initiator test, send_probe from a
 * fresh process). UCX 1.13.1 aborts a process whose reply to a wire-up
 * request cannot be sent because the asking process is gone ("got REP
 * message" assertion); before the engine waited for the wire-up inside the
 * handshake, a zero-length write, a write refused for its bounds or a
 * kvb_engine_peer_regions look-up returned with that reply pending, and the
 * writer's exit killed the target here. Each child below is a fresh process
 * (this program re-executed) that does one such call against this
 * process's TCP engine and _exits at once, without destroying its engine;
 * this process must survive every one and still take a write. */
#include "kvb_test_engine.h"

#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define LEN 4096u

/* Child: one call of kind against sid, then _exit (status: 0 when the call
 * answered as expected). */
static int child(const char *kind, const char *sid, const char *addr_s)
{
    kvb_engine_h w = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    uint64_t dst = strtoull(addr_s, NULL, 0);
    static uint8_t src[LEN];
    CHECK_EQ(kvb_engine_register(w, src, LEN, KVB_MEM_HOST), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, dst, 0};
    kvb_status_t st, want = KVB_OK;
    if (strcmp(kind, "probe") == 0) {
        st = kvb_engine_write(w, sid, &b, 1, 5);
    } else if (strcmp(kind, "bounds") == 0) {
        b.dst = dst + LEN; /* past the target's region */
        b.len = 16;
        st = kvb_engine_write(w, sid, &b, 1, 5);
        want = KVB_ERR_BOUNDS;
    } else if (strcmp(kind, "regions") == 0) {
        size_t n = 0;
        st = kvb_engine_peer_regions(w, sid, 5, NULL, NULL, 0, &n);
        if (st == KVB_OK && n != 1)
            st = KVB_ERR_INVALID;
    } else {
        memset(src, 0x5a, LEN);
        b.len = LEN;
        st = kvb_engine_write(w, sid, &b, 1, 5);
    }
    _exit(st == want ? 0 : 1);
}

static void run_child(const char *self, const char *kind, const char *sid, const char *addr)
{
    char *argv[] = {(char *)self, (char *)kind, (char *)sid, (char *)addr, NULL};
    pid_t pid;
    int status = 0;
    CHECK_EQ(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv)
{
    if (argc == 4)
        return child(argv[1], argv[2], argv[3]);
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_TCP, 0);
    static uint8_t dst[LEN];
    CHECK_EQ(kvb_engine_register(t, dst, LEN, KVB_MEM_HOST), KVB_OK);
    char addr[32];
    snprintf(addr, sizeof(addr), "%#llx", (unsigned long long)(uintptr_t)dst);
    const char *sid = kvb_engine_session_id(t);
    const char *kinds[] = {"probe", "bounds", "regions"};
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 3; k++) {
            run_child(argv[0], kinds[k], sid, addr);
            usleep(100000); /* the target's reply to a gone writer fails meanwhile */
        }
    CHECK(kvb_test_all(dst, LEN, 0));
    run_child(argv[0], "write", sid, addr);
    CHECK(kvb_test_all(dst, LEN, 0x5a));
    kvb_engine_destroy(t);
    TEST_PASS("writers exiting right after a probe, a refused write or a table look-up: "
              "the target lives and takes the next write");
    return 0;
}
