/* Shareable memory of the direct lane: kvb_mem_alloc / kvb_mem_free, the
 * registry behind kvb__shm_lookup, and the writer-side checks of
 * kvb__shm_map_peer (device, inode, size, seals, trailer nonce). */
#include "engine/shmem.h"
#include "kvb_test.h"

#include <kvbridge/engine.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEN 10000 /* not a page multiple: the registry must keep the exact length */

static void test_alloc_and_lookup(void)
{
    void *p, *q;
    kvb__shm_ref_t ref;
    CHECK_EQ(kvb_mem_alloc(LEN, &p), KVB_OK);
    CHECK(p != NULL);
    CHECK_EQ((uintptr_t)p % 4096, 0);
    const uint8_t *b = p;
    for (size_t i = 0; i < LEN; i++)
        CHECK_EQ(b[i], 0);
    memset(p, 0x5c, LEN); /* writable all along */
    CHECK_EQ(kvb_mem_alloc(0, &q), KVB_ERR_INVALID);
    CHECK_EQ(kvb_mem_alloc(4096, NULL), KVB_ERR_INVALID);

    uint64_t base = (uint64_t)(uintptr_t)p;
    CHECK(kvb__shm_lookup(base, LEN, &ref));
    CHECK(ref.file_off == 0);
    CHECK(ref.file_size == 12288 + KVB_SHM_TRAILER); /* payload page-rounded + trailer */
    CHECK(ref.fd >= 0);
    CHECK(kvb__shm_lookup(base + 100, 50, &ref));
    CHECK(ref.file_off == 100);
    CHECK(kvb__shm_lookup(base + 4096, 4096, &ref));
    CHECK(ref.file_off == 4096);
    CHECK(kvb__shm_lookup(base + LEN - 1, 1, &ref));
    CHECK(ref.file_off == LEN - 1);
    /* crossing the end of the allocation (even inside its last page) */
    CHECK(!kvb__shm_lookup(base + LEN - 1, 2, &ref));
    CHECK(!kvb__shm_lookup(base, LEN + 1, &ref));
    CHECK(!kvb__shm_lookup(base + 8192, 8192, &ref));
    CHECK(!kvb__shm_lookup(base + LEN, 1, &ref));
    CHECK(!kvb__shm_lookup(base - 1, 2, &ref));
    CHECK(!kvb__shm_lookup(base + 1, UINT64_MAX, &ref));
    CHECK(!kvb__shm_lookup(UINT64_MAX - 10, 5, &ref));

    /* two allocations: each range maps to its own file */
    kvb__shm_ref_t r1, r2;
    CHECK_EQ(kvb_mem_alloc(4096, &q), KVB_OK);
    CHECK(kvb__shm_lookup(base, 1, &r1));
    CHECK(kvb__shm_lookup((uint64_t)(uintptr_t)q, 4096, &r2));
    CHECK(r1.ino != r2.ino && r1.fd != r2.fd);
    CHECK(memcmp(r1.nonce, r2.nonce, KVB_SHM_NONCE_LEN) != 0);
    CHECK(r2.file_size == 8192);

    /* free: unknown pointers refused, the registry forgets freed ranges */
    int on_heap;
    CHECK_EQ(kvb_mem_free(&on_heap), KVB_ERR_NOT_FOUND);
    CHECK_EQ(kvb_mem_free((uint8_t *)p + 4096), KVB_ERR_NOT_FOUND); /* inside, not the start */
    CHECK_EQ(kvb_mem_free(NULL), KVB_OK);
    CHECK_EQ(kvb_mem_free(q), KVB_OK);
    CHECK_EQ(kvb_mem_free(q), KVB_ERR_NOT_FOUND); /* twice */
    CHECK(!kvb__shm_lookup((uint64_t)(uintptr_t)q, 1, &ref));
    CHECK(kvb__shm_lookup(base, LEN, &ref)); /* the other one stays */
    CHECK_EQ(kvb_mem_free(p), KVB_OK);
    CHECK(!kvb__shm_lookup(base, 1, &ref));
    TEST_PASS("kvb_mem_alloc: page-aligned, zeroed; lookup inside only; free");
}

static uint8_t *map_why(int32_t pid, const kvb__shm_ref_t *ref, bool writable, char *why, size_t wl)
{
    why[0] = '\0';
    uint8_t *m = kvb__shm_map_peer(pid, ref, writable, true, why, wl);
    if (m == NULL)
        CHECK(why[0] != '\0');
    return m;
}

static void test_map_peer(void)
{
    void *p;
    kvb__shm_ref_t ref, bad;
    char why[256];
    CHECK_EQ(kvb_mem_alloc(3 * 4096, &p), KVB_OK);
    uint8_t *base = p;
    CHECK(kvb__shm_lookup((uint64_t)(uintptr_t)base + 4096, 4096, &ref));
    CHECK(ref.file_off == 4096);

    uint8_t *m = map_why(getpid(), &ref, true, why, sizeof(why));
    if (m == NULL) {
        fprintf(stderr, "map_peer: %s\n", why);
        exit(1);
    }
    CHECK(m != base); /* a second mapping of the same file */
    m[ref.file_off + 5] = 0xa5;
    m[ref.file_off + 4095] = 0x5a;
    CHECK_EQ(base[4096 + 5], 0xa5);
    CHECK_EQ(base[4096 + 4095], 0x5a);
    base[0] = 0x11; /* and the other way */
    CHECK_EQ(m[0], 0x11);
    CHECK(memcmp(m + ref.file_size - KVB_SHM_TRAILER, "KVBSHM01", 8) == 0);
    munmap(m, ref.file_size);
    m = map_why(getpid(), &ref, false, why, sizeof(why)); /* read-only view works too */
    CHECK(m != NULL && m[4096 + 5] == 0xa5);
    munmap(m, ref.file_size);

    bad = ref;
    bad.nonce[KVB_SHM_NONCE_LEN - 1] ^= 1;
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "nonce");
    bad = ref;
    bad.ino++;
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "inode");
    bad = ref;
    bad.dev++;
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    bad = ref;
    bad.file_size += 4096; /* bigger than the file */
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "size");
    bad = ref;
    bad.file_size -= 4096; /* smaller: trailer would be read in the payload */
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    bad = ref;
    bad.file_size = 3 * 4096 + 100; /* not a page multiple */
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    bad = ref;
    bad.file_size = KVB_SHM_MAX_FILE + 4096;
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);

    /* a wrong fd: another open file (same checks fail), a closed number,
     * a negative one */
    int other = open("/dev/null", O_RDWR | O_CLOEXEC);
    CHECK(other >= 0);
    bad = ref;
    bad.fd = other;
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "not the one advertised");
    close(other);
    bad.fd = other; /* now closed */
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "open");
    bad.fd = -1;
    CHECK(map_why(getpid(), &bad, true, why, sizeof(why)) == NULL);

    CHECK(map_why(0, &ref, true, why, sizeof(why)) == NULL);
    CHECK(map_why(-5, &ref, true, why, sizeof(why)) == NULL);
    /* a process that does not exist (pid_max is at most 2^22) */
    CHECK(map_why(0x7ffffff0, &ref, true, why, sizeof(why)) == NULL);

    /* sealed: the owner's own descriptor cannot shrink the file */
    errno = 0;
    CHECK(ftruncate(ref.fd, 4096) == -1);
    CHECK_EQ(errno, EPERM);
    struct stat sb;
    CHECK(fstat(ref.fd, &sb) == 0 && (uint64_t)sb.st_size == ref.file_size);
    CHECK(fcntl(ref.fd, F_ADD_SEALS, F_SEAL_WRITE) == -1); /* F_SEAL_SEAL too */
    m = map_why(getpid(), &ref, true, why, sizeof(why));   /* still the advertised file */
    CHECK(m != NULL);
    munmap(m, ref.file_size);

    CHECK_EQ(kvb_mem_free(p), KVB_OK);
    TEST_PASS("map_peer: verified mapping shares bytes; wrong nonce/inode/size/fd/pid refused");
}

/* A file that looks right (device, inode, size, trailer, nonce) but can be
 * shrunk under a writer is refused; sealed the same way, it is accepted. */
static void test_unsealed_refused(void)
{
    char why[256];
    kvb__shm_ref_t ref = {0};
    struct stat sb;
    int fd = memfd_create("kvb-test-unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, 8192) == 0);
    CHECK(fstat(fd, &sb) == 0);
    for (int i = 0; i < KVB_SHM_NONCE_LEN; i++)
        ref.nonce[i] = (uint8_t)(0xc0 + i);
    uint8_t trailer[8 + KVB_SHM_NONCE_LEN];
    memcpy(trailer, "KVBSHM01", 8);
    memcpy(trailer + 8, ref.nonce, KVB_SHM_NONCE_LEN);
    CHECK(pwrite(fd, trailer, sizeof(trailer), 4096) == (ssize_t)sizeof(trailer));
    ref.fd = fd;
    ref.file_off = 0;
    ref.file_size = 8192;
    ref.dev = (uint64_t)sb.st_dev;
    ref.ino = (uint64_t)sb.st_ino;

    CHECK(map_why(getpid(), &ref, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "sealed");
    CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0); /* shrink only: still open to change */
    CHECK(map_why(getpid(), &ref, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "sealed");
    CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) == 0);
    uint8_t *m = map_why(getpid(), &ref, true, why, sizeof(why));
    if (m == NULL) {
        fprintf(stderr, "sealed look-alike refused: %s\n", why);
        exit(1);
    }
    munmap(m, 8192);

    /* sealed, but the trailer's magic is wrong */
    int fd2 = memfd_create("kvb-test-magic", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHECK(fd2 >= 0 && ftruncate(fd2, 8192) == 0 && fstat(fd2, &sb) == 0);
    trailer[0] = 'X';
    CHECK(pwrite(fd2, trailer, sizeof(trailer), 4096) == (ssize_t)sizeof(trailer));
    CHECK(fcntl(fd2, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) == 0);
    ref.fd = fd2;
    ref.dev = (uint64_t)sb.st_dev;
    ref.ino = (uint64_t)sb.st_ino;
    CHECK(map_why(getpid(), &ref, true, why, sizeof(why)) == NULL);
    CHECK_STR_CONTAINS(why, "trailer");
    close(fd);
    close(fd2);
    TEST_PASS("look-alike memfd: refused unsealed or with a wrong trailer");
}

int main(void)
{
    test_alloc_and_lookup();
    test_map_peer();
    test_unsealed_refused();
    TEST_PASS("shmem");
    return 0;
}
