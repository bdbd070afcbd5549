/* Huge pages for kvb_mem_alloc files (the direct lane's destination pools).
 *
 * Why: a writer on this host maps a peer's pool once per connection and the
 * first write to each page through that new mapping takes a page fault; with
 * 2 MiB pages there are 512 times fewer (and 512 times fewer page-table
 * entries per writer and peer). What the host offers decides:
 * - hugetlb: pages the operator reserved (vm.nr_hugepages); used when enough
 *   2 MiB pages are free for the whole file;
 * - shmem THP: /sys/kernel/mm/transparent_hugepage/shmem_enabled set to
 *   always, within_size or advise (we ask with MADV_HUGEPAGE);
 * - otherwise 4 KiB pages.
 * KVBRIDGE_HUGEPAGES=auto (default) | off | hugetlb | thp overrides the
 * choice (a forced kind the host cannot give falls back to 4 KiB pages). */
#include "engine/shmem.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long read_long(const char *path)
{
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f != NULL) {
        if (fgets(buf, sizeof(buf), f) != NULL)
            v = strtol(buf, NULL, 10);
        fclose(f);
    }
    return v;
}

/* Free, unreserved 2 MiB hugetlb pages. */
static long tlb_free(void)
{
    const char *d = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
    char p[128];
    snprintf(p, sizeof(p), "%sfree_hugepages", d);
    long fr = read_long(p);
    snprintf(p, sizeof(p), "%sresv_hugepages", d);
    long rs = read_long(p);
    return fr > 0 ? fr - (rs > 0 ? rs : 0) : 0;
}

/* shmem THP allowed for a MADV_HUGEPAGE mapping: "[always]", "[within_size]"
 * or "[advise]" selected. */
static bool thp_shmem(void)
{
    char buf[160] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f == NULL)
        return false;
    bool ok = fgets(buf, sizeof(buf), f) != NULL &&
              (strstr(buf, "[always]") || strstr(buf, "[within_size]") || strstr(buf, "[advise]"));
    fclose(f);
    return ok;
}

kvb__huge_t kvb__huge_choose(size_t length)
{
    const char *v = kvb__env_get("KVBRIDGE_HUGEPAGES", NULL);
    size_t pages = (length + KVB_SHM_TRAILER + KVB_HUGE_PAGE - 1) / KVB_HUGE_PAGE;
    v = v != NULL ? v : "auto";
    bool tlb = strcmp(v, "auto") == 0 || strcmp(v, "hugetlb") == 0;
    bool thp = strcmp(v, "auto") == 0 || strcmp(v, "thp") == 0;
    if (!tlb && !thp && strcmp(v, "off") != 0) {
        KVB_LOGW("KVBRIDGE_HUGEPAGES=%s is not auto, off, hugetlb or thp: using auto", v);
        tlb = thp = true;
    }
    if (tlb && tlb_free() >= (long)pages)
        return KVB_HUGE_TLB;
    if (thp && thp_shmem())
        return KVB_HUGE_THP;
    return KVB_HUGE_NONE;
}

const char *kvb__huge_name(kvb__huge_t h)
{
    return h == KVB_HUGE_TLB   ? "hugetlb 2 MiB pages"
           : h == KVB_HUGE_THP ? "shmem transparent huge pages (MADV_HUGEPAGE)"
                               : "4 KiB pages";
}
