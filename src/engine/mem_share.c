/* kvb_mem_export / kvb_mem_import / kvb_mem_unimport: one kvb_mem_alloc
 * allocation mapped by several processes of a host (Mooncake 0.3.14's
 * SharedSegment), on the direct lane's file checks (shmem.c). The blob is
 * input from another process: every field is checked, and the file is
 * mapped only when it is the one the blob names (device, inode, size,
 * seals, nonce). */
#include "engine/shmem.h"
#include "core/core.h"

#include <kvbridge/engine.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char BLOB_MAGIC[8] = "KVBMEX01";

/* Blob layout, little-endian: magic, pid u32, fd i32, file_size u64,
 * dev u64, ino u64, 8 reserved zero bytes, nonce. */
enum {
    B_PID = 8,
    B_FD = 12,
    B_SIZE = 16,
    B_DEV = 24,
    B_INO = 32,
    B_RSVD = 40,
    B_NONCE = 48,
    B_END = B_NONCE + KVB_SHM_NONCE_LEN
};
_Static_assert(B_END == KVB_MEM_EXPORT_LEN, "blob layout");

typedef struct import {
    uint8_t *base;
    size_t map_len; /* whole file, trailer included */
    struct import *next;
} import_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static import_t *g_imports;

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

kvb_status_t kvb_mem_export(const void *addr, uint8_t blob[KVB_MEM_EXPORT_LEN])
{
    kvb__shm_ref_t ref;
    if (addr == NULL || blob == NULL)
        return KVB_ERR_INVALID;
    if (!kvb__shm_find_base(addr, &ref))
        return KVB_ERR_NOT_FOUND;
    memset(blob, 0, KVB_MEM_EXPORT_LEN);
    memcpy(blob, BLOB_MAGIC, sizeof(BLOB_MAGIC));
    put_le(blob + B_PID, (uint64_t)getpid(), 4);
    put_le(blob + B_FD, (uint64_t)(uint32_t)ref.fd, 4);
    put_le(blob + B_SIZE, ref.file_size, 8);
    put_le(blob + B_DEV, ref.dev, 8);
    put_le(blob + B_INO, ref.ino, 8);
    memcpy(blob + B_NONCE, ref.nonce, KVB_SHM_NONCE_LEN);
    return KVB_OK;
}

/* The blob's fields, checked for shape (the file itself is checked when
 * mapped). */
static bool blob_read(const uint8_t *blob, int32_t *pid_p, kvb__shm_ref_t *ref)
{
    static const uint8_t zero[B_NONCE - B_RSVD];
    if (memcmp(blob, BLOB_MAGIC, sizeof(BLOB_MAGIC)) != 0 ||
        memcmp(blob + B_RSVD, zero, sizeof(zero)) != 0)
        return false;
    uint64_t pid = get_le(blob + B_PID, 4), fd = get_le(blob + B_FD, 4);
    memset(ref, 0, sizeof(*ref));
    ref->fd = (int32_t)fd;
    ref->file_size = get_le(blob + B_SIZE, 8);
    ref->dev = get_le(blob + B_DEV, 8);
    ref->ino = get_le(blob + B_INO, 8);
    memcpy(ref->nonce, blob + B_NONCE, KVB_SHM_NONCE_LEN);
    *pid_p = (int32_t)pid;
    return pid > 0 && pid <= INT32_MAX && fd <= INT32_MAX;
}

kvb_status_t kvb_mem_import(const uint8_t blob[KVB_MEM_EXPORT_LEN], void **addr_p, size_t *length_p)
{
    kvb__shm_ref_t ref;
    int32_t pid;
    char why[256];
    if (blob == NULL || addr_p == NULL || length_p == NULL || !blob_read(blob, &pid, &ref))
        return KVB_ERR_INVALID;
    import_t *im = calloc(1, sizeof(*im));
    if (im == NULL)
        return KVB_ERR_NOMEM;
    /* Sizes are checked there (at least data + trailer, page multiple, capped). */
    im->base = kvb__shm_map_peer(pid, &ref, true, false, why, sizeof(why));
    if (im->base == NULL) {
        KVB_LOGW("kvb_mem_import: %s", why);
        free(im);
        return KVB_ERR_NOT_FOUND;
    }
    im->map_len = ref.file_size;
    pthread_mutex_lock(&g_mu);
    im->next = g_imports;
    g_imports = im;
    pthread_mutex_unlock(&g_mu);
    *addr_p = im->base;
    *length_p = ref.file_size - KVB_SHM_TRAILER;
    return KVB_OK;
}

kvb_status_t kvb_mem_unimport(void *addr)
{
    import_t **pp, *im = NULL;
    pthread_mutex_lock(&g_mu);
    for (pp = &g_imports; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->base == addr) {
            im = *pp;
            *pp = im->next;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    if (im == NULL)
        return KVB_ERR_NOT_FOUND;
    munmap(im->base, im->map_len);
    free(im);
    return KVB_OK;
}
