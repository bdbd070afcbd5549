/* Driver for fuzz harnesses when libFuzzer is not used (gcc builds): replays
 * every file of the corpus directories given, then runs a bounded number of
 * seeded mutations of them (bit flips, byte sets, truncations, insertions,
 * splices). Usage: harness [--runs N] [--seed S] DIR... */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct input {
    uint8_t *data;
    size_t size;
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static int load_file(const char *path, struct input *in)
{
    FILE *f = fopen(path, "rb");
    long n;
    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    in->data = malloc((size_t)n + 1);
    in->size = fread(in->data, 1, (size_t)n, f);
    fclose(f);
    return 0;
}

static size_t load_dir(const char *dir, struct input **ins, size_t count)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4096];
    struct stat st;
    if (d == NULL)
        return count;
    while ((e = readdir(d)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        *ins = realloc(*ins, (count + 1) * sizeof(**ins));
        if (load_file(path, &(*ins)[count]) == 0)
            count++;
    }
    closedir(d);
    return count;
}

static size_t mutate(uint8_t *buf, size_t size, size_t cap, const struct input *other)
{
    switch (next_rand() % 6) {
    case 0:
        if (size > 0)
            buf[next_rand() % size] ^= (uint8_t)(1u << (next_rand() % 8));
        return size;
    case 1:
        if (size > 0)
            buf[next_rand() % size] = (uint8_t)next_rand();
        return size;
    case 2:
        return size > 0 ? (size_t)(next_rand() % size) : 0;
    case 3:
        if (size < cap) {
            size_t at = size > 0 ? next_rand() % (size + 1) : 0;
            memmove(buf + at + 1, buf + at, size - at);
            buf[at] = (uint8_t)next_rand();
            return size + 1;
        }
        return size;
    case 4: {
        static const uint8_t specials[] = {0, 0xff, '0', '9', '-', '\n', '"', '{', '}', 0x80};
        if (size > 0)
            buf[next_rand() % size] = specials[next_rand() % sizeof(specials)];
        return size;
    }
    default:
        if (other->size > 0 && size > 0) {
            size_t at = next_rand() % size, n = next_rand() % other->size;
            if (at + n > cap)
                n = cap - at;
            memcpy(buf + at, other->data, n);
            return at + n > size ? at + n : size;
        }
        return size;
    }
}

int main(int argc, char **argv)
{
    long runs = 10000;
    struct input *ins = NULL;
    size_t count = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atol(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            g_rng = strtoull(argv[++i], NULL, 0) | 1;
        else
            count = load_dir(argv[i], &ins, count);
    }
    for (size_t i = 0; i < count; i++)
        LLVMFuzzerTestOneInput(ins[i].data, ins[i].size);
    LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
    static const struct input empty = {NULL, 0};
    enum { CAP = 1 << 16 };
    uint8_t *buf = malloc(CAP);
    for (long r = 0; r < runs; r++) {
        size_t size = 0;
        if (count > 0) {
            const struct input *src = &ins[next_rand() % count];
            size = src->size < CAP ? src->size : CAP;
            memcpy(buf, src->data, size);
        }
        int depth = 1 + (int)(next_rand() % 4);
        for (int k = 0; k < depth; k++)
            size = mutate(buf, size, CAP, count > 0 ? &ins[next_rand() % count] : &empty);
        /* An exact-size heap copy so ASan catches reads past the input. */
        uint8_t *exact = malloc(size ? size : 1);
        memcpy(exact, buf, size);
        LLVMFuzzerTestOneInput(exact, size);
        free(exact);
    }
    printf("fuzz smoke: %zu corpus inputs, %ld mutated runs, no crash\n", count, runs);
    for (size_t i = 0; i < count; i++)
        free(ins[i].data);
    free(ins);
    free(buf);
    return 0;
}
