/* kvb_mem_export / kvb_mem_import / kvb_mem_unimport (issue 25: Mooncake
 * 0.3.14's SharedSegment on kvb_mem_alloc): another process maps the same
 * memory read-write from the blob (bytes seen both ways); a forged or stale
 * blob maps nothing (bad magic, reserved bytes, pid, size, nonce, a freed
 * owner's descriptor); the owner freeing its allocation leaves importers'
 * mappings intact. */
#include "kvb_test.h"

#include <kvbridge/engine.h>

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (3u << 20)

/* A child that imports blob, checks the owner's pattern, writes its own and
 * says so over the pipe; exit status 0 when all held. */
static pid_t child_import(const uint8_t *blob, int out)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid > 0)
        return pid;
    void *p;
    size_t n;
    int bad = kvb_mem_import(blob, &p, &n) != KVB_OK || n < LEN;
    const uint8_t *b = p;
    for (size_t i = 0; !bad && i < LEN; i += 4093)
        bad = b[i] != (uint8_t)(i * 7);
    if (!bad)
        memset(p, 0xc3, LEN / 2);
    char c = bad ? 'n' : 'y';
    bad |= write(out, &c, 1) != 1;
    _exit(bad);
}

static void test_shared_between_processes(void)
{
    uint8_t *p, blob[KVB_MEM_EXPORT_LEN];
    int fds[2];
    CHECK_EQ(kvb_mem_alloc(LEN, (void **)&p), KVB_OK);
    for (size_t i = 0; i < LEN; i += 4093)
        p[i] = (uint8_t)(i * 7);
    CHECK_EQ(kvb_mem_export(p, blob), KVB_OK);
    CHECK_EQ(kvb_mem_export(p + 4096, blob), KVB_ERR_NOT_FOUND); /* not a start */
    CHECK_EQ(pipe(fds), 0);
    pid_t pid = child_import(blob, fds[1]);
    char c = 0;
    CHECK_EQ(read(fds[0], &c, 1), 1);
    int ws;
    CHECK_EQ(waitpid(pid, &ws, 0), pid);
    CHECK(c == 'y' && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(p[0] == 0xc3 && p[LEN / 2 - 1] == 0xc3 && p[LEN / 2] == 0); /* the child's bytes */

    /* In this process too, at another address; the owner frees: still mapped. */
    void *q;
    size_t n;
    CHECK_EQ(kvb_mem_import(blob, &q, &n), KVB_OK);
    CHECK(q != p && n == LEN && ((uint8_t *)q)[0] == 0xc3);
    CHECK_EQ(kvb_mem_free(p), KVB_OK);
    memset(q, 0x11, LEN);
    CHECK_EQ(kvb_mem_unimport(q), KVB_OK);
    CHECK_EQ(kvb_mem_unimport(q), KVB_ERR_NOT_FOUND);
    /* the freed owner's descriptor is closed: the blob is stale */
    CHECK_EQ(kvb_mem_import(blob, &q, &n), KVB_ERR_NOT_FOUND);
    close(fds[0]);
    close(fds[1]);
    TEST_PASS("an allocation shared with another process, both ways; kept after the owner frees");
}

static void test_forged_blobs(void)
{
    uint8_t *p, blob[KVB_MEM_EXPORT_LEN], f[KVB_MEM_EXPORT_LEN];
    void *q;
    size_t n;
    CHECK_EQ(kvb_mem_alloc(LEN, (void **)&p), KVB_OK);
    CHECK_EQ(kvb_mem_export(p, blob), KVB_OK);
    struct {
        size_t off;
        uint8_t xor ;
        kvb_status_t want;
    } cases[] = {
        {0, 1, KVB_ERR_INVALID},       /* magic */
        {41, 1, KVB_ERR_INVALID},      /* reserved bytes */
        {11, 0x80, KVB_ERR_INVALID},   /* pid above INT32_MAX */
        {17, 0x10, KVB_ERR_NOT_FOUND}, /* size: not the file's */
        {25, 1, KVB_ERR_NOT_FOUND},    /* device */
        {60, 1, KVB_ERR_NOT_FOUND},    /* nonce */
        {23, 0xff, KVB_ERR_NOT_FOUND}, /* absurd size (over the cap) */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(f, blob, sizeof(f));
        f[cases[i].off] ^= cases[i].xor ;
        CHECK_EQ(kvb_mem_import(f, &q, &n), cases[i].want);
    }
    memcpy(f, blob, sizeof(f));
    memset(f + 8, 0, 4); /* pid 0 */
    CHECK_EQ(kvb_mem_import(f, &q, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_mem_import(NULL, &q, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_mem_import(blob, NULL, &n), KVB_ERR_INVALID);
    CHECK_EQ(kvb_mem_export(NULL, blob), KVB_ERR_INVALID);
    uint8_t local[4096];
    CHECK_EQ(kvb_mem_export(local, f), KVB_ERR_NOT_FOUND); /* not kvb_mem_alloc memory */
    CHECK_EQ(kvb_mem_free(p), KVB_OK);
    TEST_PASS("forged or stale blobs map nothing");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_shared_between_processes();
    test_forged_blobs();
    return 0;
}
