/* Microbenchmark behind bench/results/bench.md ("a one-copy pull of our
 * own"): a child process holds a source pool; the parent copies 512 MiB of
 * BLOCK-byte runs at random slots from it into its own pool with
 * process_vm_readv (up to 1024 iovecs per call), and memcpy's the same
 * pattern between two local pools. Two repetitions each (the first is cold).
 *   gcc -O2 -Wall bench/micro/cma_pull.c -o /tmp/cma_pull
 *   /tmp/cma_pull 32768 0     # block bytes, 1 = madvise(MADV_HUGEPAGE)
 * Not built by CMake: a measurement aid, not part of kvbridge. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define POOL ((size_t)4 << 30)
#define TOTAL ((size_t)512 << 20)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *pool(int huge)
{
    char *p = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    if (huge)
        madvise(p, POOL, MADV_HUGEPAGE);
    memset(p, 1, POOL);
    return p;
}

static double cma(pid_t pid, char *dst, char *src, const size_t *so, const size_t *dof, size_t nb,
                  size_t blk)
{
    struct iovec l[1024], r[1024];
    double t = now();
    for (size_t i = 0; i < nb;) {
        int k = 0;
        for (; k < 1024 && i < nb; k++, i++) {
            l[k] = (struct iovec){dst + dof[i], blk};
            r[k] = (struct iovec){src + so[i], blk};
        }
        if (process_vm_readv(pid, l, (unsigned long)k, r, (unsigned long)k, 0) !=
            (ssize_t)((size_t)k * blk)) {
            perror("process_vm_readv");
            exit(1);
        }
    }
    return (double)TOTAL / (now() - t) / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: %s BLOCK_BYTES HUGE(0|1)\n", argv[0]);
        return 2;
    }
    size_t blk = (size_t)atol(argv[1]), nb = TOTAL / blk;
    int huge = atoi(argv[2]), p[2];
    char *src;
    if (pipe(p) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        char *s = pool(huge);
        if (write(p[1], &s, sizeof(s)) != sizeof(s))
            _exit(1);
        pause();
        _exit(0);
    }
    if (read(p[0], &src, sizeof(src)) != sizeof(src))
        return 1;
    char *dst = pool(huge), *lsrc = pool(huge);
    size_t *so = malloc(nb * sizeof(*so)), *dof = malloc(nb * sizeof(*dof));
    srand(1);
    for (size_t i = 0; i < nb; i++) {
        so[i] = (size_t)rand() % (POOL / blk) * blk;
        dof[i] = (size_t)rand() % (POOL / blk) * blk;
    }
    for (int rep = 0; rep < 2; rep++) {
        double c = cma(pid, dst, src, so, dof, nb, blk), t = now();
        for (size_t i = 0; i < nb; i++)
            memcpy(dst + dof[i], lsrc + so[i], blk);
        printf("block %zu huge %d: process_vm_readv %.2f GB/s, memcpy same pattern %.2f GB/s\n",
               blk, huge, c, (double)TOTAL / (now() - t) / 1e9);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}
