/* Shareable host memory for the direct lane. kvb_mem_alloc backs an
 * allocation with a sealed memfd (it can grow but never shrink, so a peer's
 * mapping never faults). A file ends in one trailer page: "KVBSHM01" and a
 * random 16-byte nonce. A writer on the same host opens the owner's file
 * through /proc/<pid>/fd/<fd> and maps it only when device, inode, size,
 * seals and nonce all match what the handshake advertised; otherwise it
 * keeps to the UCX lanes. */
#ifndef KVB_ENGINE_SHMEM_H
#define KVB_ENGINE_SHMEM_H

#include <kvbridge/common.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVB_SHM_TRAILER 4096u
#define KVB_SHM_NONCE_LEN 16
#define KVB_SHM_MAX_FILE (1ull << 50)

/* Where a registered range lives in its owner's shared file. */
typedef struct kvb__shm_ref {
    int32_t fd;         /* the owner's descriptor */
    uint64_t file_off;  /* offset of the range's first byte in the file */
    uint64_t file_size; /* whole file, trailer included */
    uint64_t dev, ino;
    uint8_t nonce[KVB_SHM_NONCE_LEN];
} kvb__shm_ref_t;

/* Create a sealed shared file of payload bytes (page-rounded) plus trailer
 * and map it. *base_p is the payload; *ref_p describes it (file_off 0). */
kvb_status_t kvb__shm_create(size_t payload, uint8_t **base_p, kvb__shm_ref_t *ref_p);

/* Page size of a kvb_mem_alloc file (hugepage.c, KVBRIDGE_HUGEPAGES). */
typedef enum kvb__huge {
    KVB_HUGE_NONE = 0, /* 4 KiB pages */
    KVB_HUGE_TLB,      /* hugetlbfs memfd: reserved 2 MiB pages */
    KVB_HUGE_THP       /* shmem with MADV_HUGEPAGE (transparent huge pages) */
} kvb__huge_t;
#define KVB_HUGE_PAGE ((size_t)2 << 20)
/* What this host offers for a file of length bytes, by KVBRIDGE_HUGEPAGES
 * (auto: reserved hugetlb pages when enough are free, else shmem THP when
 * shmem_enabled allows it, else none; off; hugetlb; thp). */
kvb__huge_t kvb__huge_choose(size_t length);
const char *kvb__huge_name(kvb__huge_t h);
/* kvb__shm_create with that page size (a hugetlb file is rounded up to whole
 * huge pages, the trailer in the last 4 KiB). */
kvb_status_t kvb__shm_create_ex(size_t payload, kvb__huge_t huge, uint8_t **base_p,
                                kvb__shm_ref_t *ref_p);
void kvb__shm_destroy(uint8_t *base, const kvb__shm_ref_t *ref);

/* The kvb_mem_alloc allocation starting exactly at base: *ref_p (file_off
 * 0). */
bool kvb__shm_find_base(const void *base, kvb__shm_ref_t *ref_p);

/* Is [addr, addr+len) inside one kvb_mem_alloc allocation? Then *ref_p
 * names it, with file_off set to the range's offset. */
bool kvb__shm_lookup(uint64_t addr, uint64_t len, kvb__shm_ref_t *ref_p);

/* Writer side: open pid's file, verify it against ref and map it whole
 * (read-write, or read-only); populate: prefault it (MAP_POPULATE), which
 * allocates every page of a sparse file, so only for sizes the caller
 * bounded. Returns the mapping (length ref->file_size) or NULL with a
 * one-line reason in why. */
uint8_t *kvb__shm_map_peer(int32_t pid, const kvb__shm_ref_t *ref, bool writable, bool populate,
                           char *why, size_t wl);

#endif
