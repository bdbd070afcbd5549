/* The CUDA IPC lane's own declarations (cuda_ipc.c, vmm.c, fdsrv.c). */
#ifndef KVB_ENGINE_LANE_CUDA_IPC_H
#define KVB_ENGINE_LANE_CUDA_IPC_H

#include "engine/engine_int.h"

typedef struct kvb__cuda_ipc_conn kvb__cuda_ipc_conn_t;

/* vmm.c: VMM allocations on the same-host lane. Target, at
 * registration of [.., end) whose first byte lies in the mapping [base,
 * +size) on dev: export the VMM allocations mapped back to back from base
 * up to end as file descriptors into cs (vmm, vmm_n, vmm_fds, vmm_sizes,
 * vmm_size). 1 exported; 0 not VMM memory (or a driver without VMM) and end
 * within the mapping; -1 VMM but an export refused (why; writers stage it);
 * -2 the region cannot be registered (why: past its allocation, mixed
 * cuMemAlloc and VMM memory, too many allocations). */
int kvb__cuda_vmm_export(int dev, uint64_t base, uint64_t size, uint64_t end, kvb__cuda_seg_t *cs,
                         char *why, size_t wl);
void kvb__cuda_vmm_unexport(kvb__cuda_seg_t *cs);
/* Writer: a peer's VMM allocations mapped here back to back (size 0: none). */
typedef struct kvb__cuda_vmm_map {
    kvb_CUdeviceptr va; /* the reservation, size bytes */
    uint64_t size;
    bool reserved;
    uint32_t parts, n; /* allocations; mapped so far */
    uint64_t *sizes;   /* each one's size */
} kvb__cuda_vmm_map_t;
/* Writer: fetch listener pid's descriptors of entry e's parts (rep's parts
 * table), import and map them on dev; the segment (seg_len bytes at
 * e->alloc_off) must lie inside. false: nothing mapped (why). */
bool kvb__cuda_vmm_import(int dev, uint32_t pid, const kvb__hs_reply_t *rep,
                          const kvb__hs_cuda_t *e, uint64_t seg_len, kvb__cuda_vmm_map_t *m,
                          char *why, size_t wl);
void kvb__cuda_vmm_unmap(kvb__cuda_vmm_map_t *m);
/* fdsrv.c: the target's VMM descriptors passed to same-host writers
 * over an abstract Unix socket (SCM_RIGHTS), without ptrace rights. */
#define KVB_FDSRV_MAX_FDS 64 /* descriptors per request */
typedef struct kvb__fdsrv kvb__fdsrv_t;
/* seg_mu held (registration of a VMM region): start the server once
 * (KVBRIDGE_CUDA_FD_SOCKET=0: never). */
void kvb__fdsrv_ensure(kvb_engine_h eng);
/* seg_mu held (a reply naming VMM parts): the socket's name and a fresh
 * ticket for it; false (both zeroed) without a server. */
bool kvb__fdsrv_ticket(kvb_engine_h eng, uint8_t name[KVB_HS_FDSOCK_LEN],
                       uint8_t ticket[KVB_HS_TICKET_LEN]);
/* Engine destroy, before the segments go: stop the server. */
void kvb__fdsrv_stop(kvb_engine_h eng);
/* Writer: connect to the target's socket (-1: why), then fetch n (<=
 * KVB_FDSRV_MAX_FDS) of its descriptors under ticket into out (each ours to
 * close); false: none received (why). */
int kvb__fdsrv_connect(const uint8_t name[KVB_HS_FDSOCK_LEN], char *why, size_t wl);
bool kvb__fdsrv_fetch(int c, const uint8_t ticket[KVB_HS_TICKET_LEN], const uint32_t *fdn,
                      uint32_t n, int *out, char *why, size_t wl);

#endif
