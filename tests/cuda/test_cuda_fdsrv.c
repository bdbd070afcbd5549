/* The target's descriptor socket (src/engine/lane/cuda_ipc/fdsrv.c: VMM descriptors passed over
 * an abstract Unix socket with SCM_RIGHTS, no ptrace rights needed), against
 * the driver-API test double, in one process: a request with the ticket a
 * handshake reply carries gets duplicates of the exported descriptors (the
 * same files); a forged ticket, a descriptor the engine does not export
 * (any other of its files), a malformed message and a request after the
 * region is unregistered get nothing; no descriptor is left open here. */
#include "cuda/cuda_test.h"
#include "engine/lane/cuda_ipc/cuda_ipc.h"
#include "kvb_test_engine.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static ino_t ino(int fd)
{
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    return st.st_ino;
}

/* One request on a fresh connection: true and the descriptors, or false. */
static bool fetch(const uint8_t *name, const uint8_t *ticket, const uint32_t *fdn, uint32_t n,
                  int *out, char *why, size_t wl)
{
    int c = kvb__fdsrv_connect(name, why, wl);
    CHECK(c >= 0);
    bool ok = kvb__fdsrv_fetch(c, ticket, fdn, n, out, why, wl);
    close(c);
    fprintf(stderr, "request for %u descriptor(s): %s\n", n, ok ? "granted" : why);
    return ok;
}

int main(void)
{
    kvb_engine_h t = kvb_test_engine(KVB_TRANSPORT_AUTO, 2);
    setenv("KVB_CUDA_TEST_VMM_PART", "2097152", 1);
    uint8_t *va = cuda_test_alloc_vmm(0, 4u << 20);
    CHECK_EQ(kvb_engine_register(t, va, 4u << 20, KVB_MEM_AUTO), KVB_OK);

    uint8_t name[KVB_HS_FDSOCK_LEN], ticket[KVB_HS_TICKET_LEN];
    uint32_t fdn[2];
    pthread_mutex_lock(&t->seg_mu);
    const kvb__cuda_seg_t *cs = NULL;
    for (size_t i = 0; i < t->segs.n && cs == NULL; i++)
        cs = t->segs.v[i].cuda;
    CHECK(cs != NULL && cs->vmm && cs->vmm_n == 2);
    fdn[0] = (uint32_t)cs->vmm_fds[0];
    fdn[1] = (uint32_t)cs->vmm_fds[1];
    CHECK(kvb__fdsrv_ticket(t, name, ticket)); /* as a reply to a local writer mints one */
    pthread_mutex_unlock(&t->seg_mu);
    CHECK(memcmp(name, KVB_HS_FDSOCK_PREFIX, strlen(KVB_HS_FDSOCK_PREFIX)) == 0);

    int n0 = open_fds(), got[2] = {-1, -1};
    char why[300] = "";
    CHECK(fetch(name, ticket, fdn, 2, got, why, sizeof(why)));
    CHECK(ino(got[0]) == ino((int)fdn[0]) && ino(got[1]) == ino((int)fdn[1]));
    CHECK(got[0] != (int)fdn[0] && got[1] != (int)fdn[1]); /* duplicates, ours */
    close(got[0]);
    close(got[1]);
    TEST_PASS("the ticket's request gets the exported descriptors");

    uint8_t forged[KVB_HS_TICKET_LEN];
    memcpy(forged, ticket, sizeof(forged));
    forged[5] ^= 1;
    CHECK(!fetch(name, forged, fdn, 2, got, why, sizeof(why)));
    CHECK_STR_CONTAINS(why, "refused the request");
    uint32_t other[2] = {fdn[0], 0}; /* stdin: not an exported descriptor */
    CHECK(!fetch(name, ticket, other, 2, got, why, sizeof(why)));
    CHECK_STR_CONTAINS(why, "refused the request");
    /* malformed: a short request */
    int c = kvb__fdsrv_connect(name, why, sizeof(why));
    CHECK(c >= 0);
    CHECK(send(c, "KVBFQ001junk", 12, 0) == 12);
    uint8_t ans[16];
    CHECK(recv(c, ans, sizeof(ans), 0) == 16 && memcmp(ans, "KVBFA001", 8) == 0 && ans[8] == 1);
    close(c);
    TEST_PASS("forged ticket, foreign descriptor, malformed request: nothing");

    CHECK_EQ(kvb_engine_unregister(t, va), KVB_OK);
    CHECK(!fetch(name, ticket, fdn, 2, got, why, sizeof(why)));
    TEST_PASS("nothing once the region is unregistered");
    /* every descriptor received or refused is closed; the engine closed its
     * two exports with the region (the server closes its end of the last
     * connection on its own thread: waited for, bounded) */
    for (int i = 0; i < 200 && open_fds() != n0 - 2; i++)
        usleep(5000);
    CHECK_EQ(open_fds(), n0 - 2);
    kvb_engine_destroy(t);
    TEST_PASS("fdsrv");
    return 0;
}
