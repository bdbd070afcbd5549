/* Shareable host memory (kvb_mem_alloc) and the same-host peer mapping the
 * direct lane writes through. See shmem.h for the file layout and checks. */
#include "engine/shmem.h"
#include "core/core.h"
#include "engine/handshake.h"

#include <kvbridge/engine.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static const char TRAILER_MAGIC[8] = "KVBSHM01";
#define SHM_SEALS (F_SEAL_SHRINK | F_SEAL_SEAL)

typedef struct alloc {
    uint8_t *base;
    size_t payload;
    kvb__shm_ref_t ref;
    struct alloc *next;
} alloc_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static alloc_t *g_allocs;

static size_t page_round(size_t n)
{
    size_t pg = KVB_SHM_TRAILER;
    return (n + pg - 1) / pg * pg;
}

kvb_status_t kvb__shm_create(size_t payload, uint8_t **base_p, kvb__shm_ref_t *ref_p)
{
    return kvb__shm_create_ex(payload, KVB_HUGE_NONE, base_p, ref_p);
}

kvb_status_t kvb__shm_create_ex(size_t payload, kvb__huge_t huge, uint8_t **base_p,
                                kvb__shm_ref_t *ref_p)
{
    kvb__shm_ref_t ref = {0};
    struct stat sb;
    if (payload == 0 || payload > KVB_SHM_MAX_FILE - KVB_SHM_TRAILER)
        return KVB_ERR_INVALID;
    /* hugetlb files are whole huge pages: the trailer ends the last one */
    size_t unit = huge == KVB_HUGE_TLB ? KVB_HUGE_PAGE : KVB_SHM_TRAILER;
    ref.file_size = (page_round(payload) + KVB_SHM_TRAILER + unit - 1) / unit * unit;
    payload = ref.file_size - KVB_SHM_TRAILER;
    if (getrandom(ref.nonce, sizeof(ref.nonce), 0) != (ssize_t)sizeof(ref.nonce))
        return KVB_ERR_IO;
    int fd = memfd_create("kvbridge-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING |
                                             (huge == KVB_HUGE_TLB ? MFD_HUGETLB : 0));
    if (fd < 0)
        return errno == ENOMEM ? KVB_ERR_NOMEM : KVB_ERR_IO;
    if (ftruncate(fd, (off_t)ref.file_size) != 0 || fcntl(fd, F_ADD_SEALS, SHM_SEALS) != 0 ||
        fstat(fd, &sb) != 0) {
        close(fd);
        return KVB_ERR_NOMEM;
    }
    uint8_t *base = mmap(NULL, ref.file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        return KVB_ERR_NOMEM;
    }
    if (huge == KVB_HUGE_THP) /* before the owner's first touch allocates the pages */
        madvise(base, ref.file_size, MADV_HUGEPAGE);
    memcpy(base + payload, TRAILER_MAGIC, sizeof(TRAILER_MAGIC));
    memcpy(base + payload + sizeof(TRAILER_MAGIC), ref.nonce, sizeof(ref.nonce));
    ref.fd = fd;
    ref.dev = (uint64_t)sb.st_dev;
    ref.ino = (uint64_t)sb.st_ino;
    *base_p = base;
    *ref_p = ref;
    return KVB_OK;
}

void kvb__shm_destroy(uint8_t *base, const kvb__shm_ref_t *ref)
{
    munmap(base, ref->file_size);
    close(ref->fd);
}

bool kvb__shm_find_base(const void *base, kvb__shm_ref_t *ref_p)
{
    bool found = false;
    pthread_mutex_lock(&g_mu);
    for (alloc_t *a = g_allocs; a != NULL && !found; a = a->next)
        if (a->base == base) {
            *ref_p = a->ref;
            found = true;
        }
    pthread_mutex_unlock(&g_mu);
    return found;
}

bool kvb__shm_lookup(uint64_t addr, uint64_t len, kvb__shm_ref_t *ref_p)
{
    bool found = false;
    pthread_mutex_lock(&g_mu);
    for (alloc_t *a = g_allocs; a != NULL && !found; a = a->next) {
        uint64_t b = (uint64_t)(uintptr_t)a->base;
        if (addr >= b && len <= a->payload && addr - b <= a->payload - len) {
            *ref_p = a->ref;
            ref_p->file_off = addr - b;
            found = true;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}

static bool check_file(int fd, const kvb__shm_ref_t *ref, char *why, size_t wl)
{
    struct stat sb;
    int seals;
    if (fstat(fd, &sb) != 0) {
        snprintf(why, wl, "fstat: %s", strerror(errno));
        return false;
    }
    if ((uint64_t)sb.st_dev != ref->dev || (uint64_t)sb.st_ino != ref->ino ||
        (uint64_t)sb.st_size != ref->file_size) {
        snprintf(why, wl, "file is not the one advertised (device, inode or size differ)");
        return false;
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & SHM_SEALS) != SHM_SEALS) {
        snprintf(why, wl, "file is not sealed against shrinking");
        return false;
    }
    return true;
}

uint8_t *kvb__shm_map_peer(int32_t pid, const kvb__shm_ref_t *ref, bool writable, bool populate,
                           char *why, size_t wl)
{
    char path[64];
    if (pid <= 0 || ref->fd < 0 || ref->file_size < 2 * KVB_SHM_TRAILER ||
        ref->file_size > KVB_SHM_MAX_FILE || ref->file_size % KVB_SHM_TRAILER != 0) {
        snprintf(why, wl, "advertised file (pid %d, fd %d, %llu bytes) is invalid", (int)pid,
                 (int)ref->fd, (unsigned long long)ref->file_size);
        return NULL;
    }
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)ref->fd);
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, wl, "open %s: %s", path, strerror(errno));
        return NULL;
    }
    uint8_t *m = NULL;
    if (check_file(fd, ref, why, wl)) {
        int prot = PROT_READ | (writable ? PROT_WRITE : 0);
        m = mmap(NULL, ref->file_size, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
        if (m == MAP_FAILED) {
            snprintf(why, wl, "mmap %s: %s", path, strerror(errno));
            m = NULL;
        } else {
            madvise(m, ref->file_size, MADV_HUGEPAGE); /* a THP file: map it in 2 MiB */
        }
    }
    close(fd);
    if (m != NULL) {
        const uint8_t *t = m + ref->file_size - KVB_SHM_TRAILER;
        if (memcmp(t, TRAILER_MAGIC, sizeof(TRAILER_MAGIC)) != 0 ||
            !kvb__ct_equal(t + sizeof(TRAILER_MAGIC), ref->nonce, KVB_SHM_NONCE_LEN)) {
            snprintf(why, wl, "file trailer does not carry the advertised nonce");
            munmap(m, ref->file_size);
            m = NULL;
        }
    }
    return m;
}

/* ---- public allocator ---- */

kvb_status_t kvb_mem_alloc(size_t length, void **addr_p)
{
    alloc_t *a;
    kvb_status_t st;
    if (length == 0 || addr_p == NULL)
        return KVB_ERR_INVALID;
    a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVB_ERR_NOMEM;
    kvb__huge_t huge = kvb__huge_choose(length);
    st = kvb__shm_create_ex(length, huge, &a->base, &a->ref);
    if (st != KVB_OK && huge != KVB_HUGE_NONE) /* e.g. the reserved pages ran out */
        st = kvb__shm_create_ex(length, huge = KVB_HUGE_NONE, &a->base, &a->ref);
    KVB_LOGI("kvb_mem_alloc(%zu): %s", length, kvb__huge_name(huge));
    if (st != KVB_OK) {
        KVB_LOGE("kvb_mem_alloc(%zu): %s (%s)", length, kvb_status_string(st), strerror(errno));
        free(a);
        return st;
    }
    a->payload = length;
    pthread_mutex_lock(&g_mu);
    a->next = g_allocs;
    g_allocs = a;
    pthread_mutex_unlock(&g_mu);
    *addr_p = a->base;
    return KVB_OK;
}

kvb_status_t kvb_mem_free(void *addr)
{
    alloc_t **pp, *a = NULL;
    if (addr == NULL)
        return KVB_OK;
    pthread_mutex_lock(&g_mu);
    for (pp = &g_allocs; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->base == addr) {
            a = *pp;
            *pp = a->next;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    if (a == NULL)
        return KVB_ERR_NOT_FOUND;
    kvb__shm_destroy(a->base, &a->ref);
    free(a);
    return KVB_OK;
}
