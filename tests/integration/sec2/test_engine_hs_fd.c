/* Review finding 1.4: when a connection's remote keys do not unpack on the
 * put lane, the handshake socket was closed twice (by the progress thread
 * releasing the half-made connection, then by the handshaking caller).
 * Between the two closes another thread may get the same descriptor number,
 * and the second close shuts it. The unusable key is injected through the
 * internal test hook kvb__test_hooks.fail_rkey_unpack (a real one needs a
 * peer whose UCX build packs keys this one cannot read).
 *
 * Detection: close() is wrapped; a close of a descriptor that is not open
 * (EBADF) is what the second close looks like when nothing reused the number
 * meanwhile. A descriptor opened by the test before each attempt (and thus
 * possibly handed the number) must still be open afterwards. */
#include "engine/engine_int.h"
#include "kvb_test.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static int g_ebadf;

int close(int fd)
{
    static int (*real_close)(int);
    if (real_close == NULL)
        real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    int rc = real_close(fd);
    if (rc != 0 && errno == EBADF && fd >= 0)
        __atomic_add_fetch(&g_ebadf, 1, __ATOMIC_RELAXED);
    return rc;
}

int main(void)
{
    kvb_engine_params_t prm = {0};
    kvb_engine_h a = NULL, b = NULL;
    static uint8_t src[4096], dst[4096];
    setenv("KVBRIDGE_LANE", "put", 1);
    prm.field_mask = KVB_ENGINE_PARAM_TRANSPORT;
    prm.transport = KVB_TRANSPORT_TCP;
    CHECK_EQ(kvb_engine_create(&prm, &a), KVB_OK);
    CHECK_EQ(kvb_engine_create(&prm, &b), KVB_OK);
    CHECK_EQ(kvb_engine_register(a, src, sizeof(src), KVB_MEM_HOST), KVB_OK);
    CHECK_EQ(kvb_engine_register(b, dst, sizeof(dst), KVB_MEM_HOST), KVB_OK);
    kvb_block_t blk = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, sizeof(src)};
    KVB__HOOK_SET(fail_rkey_unpack, 1);
    for (int i = 0; i < 5; i++) {
        int keep = open("/dev/null", O_RDONLY);
        CHECK(keep >= 0);
        kvb_status_t st = kvb_engine_write(a, kvb_engine_session_id(b), &blk, 1, 5.0);
        CHECK_EQ(st, KVB_ERR_PEER);
        CHECK_STR_CONTAINS(kvb_engine_last_error(a), "remote key 0 unusable");
        CHECK(fcntl(keep, F_GETFD) >= 0); /* still ours */
        CHECK_EQ(close(keep), 0);
    }
    fprintf(stderr, "closes of descriptors that were not open: %d\n", g_ebadf);
    CHECK_EQ(g_ebadf, 0);
    /* Without the fault the same engines connect and write. */
    KVB__HOOK_SET(fail_rkey_unpack, 0);
    memset(src, 0x5a, sizeof(src));
    CHECK_EQ(kvb_engine_write(a, kvb_engine_session_id(b), &blk, 1, 5.0), KVB_OK);
    CHECK_EQ(dst[4095], 0x5a);
    kvb_engine_destroy(a);
    kvb_engine_destroy(b);
    TEST_PASS("test_engine_hs_fd");
    return 0;
}
