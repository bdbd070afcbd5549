/* `kvbridge bench`: what the driver reads about its children from /proc
 * (--resource-report, --scale). */
#include "bench_common.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long bench_proc_rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f != NULL && kib < 0 && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld", &kib) != 1)
            kib = -1;
    if (f != NULL)
        fclose(f);
    return kib;
}

long bench_proc_fds(pid_t pid)
{
    char path[64];
    long n = 0;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n - (pid == getpid()); /* not the fd of this listing */
}

double bench_proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    unsigned long ut = 0, st = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f != NULL)
        fclose(f);
    buf[n] = '\0';
    /* fields after the command name, which may hold spaces: "pid (comm) S ..." */
    const char *p = strrchr(buf, ')');
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}
