/* Without a usable CUDA driver (argv[1] "missing": KVBRIDGE_CUDA_LIB names
 * no file; "init": the test double's cuInit fails) host memory works as
 * before, AUTO means host, and device memory is refused with the reason. */
#include "kvb_test_engine.h"

#define N (256u << 10)

int main(int argc, char **argv)
{
    bool missing = argc > 1 && strcmp(argv[1], "missing") == 0;
    const char *why = NULL;
    CHECK_EQ(kvb_cuda_available(&why), 0);
    CHECK_STR_CONTAINS(why, missing ? "cannot load" : "cuInit failed");
    fprintf(stderr, "no driver: %s\n", why);

    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 2),
                 w = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    uint8_t *src = malloc(N), *dst = NULL;
    CHECK(src != NULL);
    CHECK_EQ(kvb_mem_alloc(N, (void **)&dst), KVB_OK);
    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)(i * 7);
    CHECK_EQ(kvb_engine_register(t, dst, N, KVB_MEM_CUDA), KVB_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(kvb_engine_last_error(t), "CUDA device memory needs the CUDA driver");
    CHECK_STR_CONTAINS(kvb_engine_last_error(t), "KVBRIDGE_CUDA_LIB");
    fprintf(stderr, "refused: %s\n", kvb_engine_last_error(t));
    kvb_mem_type_t mt;
    int dev;
    CHECK_EQ(kvb_mem_query(src, &mt, &dev), KVB_OK);
    CHECK(mt == KVB_MEM_HOST && dev == -1);
    CHECK_EQ(kvb_engine_register(t, dst, N, KVB_MEM_AUTO), KVB_OK);
    CHECK_EQ(kvb_engine_register(w, src, N, KVB_MEM_AUTO), KVB_OK);
    kvb_block_t b = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, N};
    CHECK_EQ(kvb_engine_write(w, kvb_engine_session_id(t), &b, 1, 10.0), KVB_OK);
    CHECK_EQ(kvb_engine_session_direct(w, kvb_engine_session_id(t)), 1);
    CHECK(memcmp(src, dst, N) == 0);
    TEST_PASS("host memory as before");
    kvb_engine_destroy(w);
    kvb_engine_destroy(t);
    kvb_mem_free(dst);
    free(src);
    return 0;
}
