/* kvbridge CLI entry point: dispatches to one subcommand per tools/ file.
 * Subcommands are weak references so each lives in its own file. */
#include <kvbridge/common.h>

#include <stdio.h>
#include <string.h>

#include "tools.h"

#define WEAK __attribute__((weak))
int kvb_cmd_engine_bench(int argc, char **argv) WEAK;
int kvb_cmd_engine_target(int argc, char **argv) WEAK;
int kvb_cmd_plan(int argc, char **argv) WEAK;
int kvb_cmd_plan_bench(int argc, char **argv) WEAK;
int kvb_cmd_bootstrap(int argc, char **argv) WEAK;
int kvb_cmd_bench(int argc, char **argv) WEAK;

struct command {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
};

static const struct command g_commands[] = {
    {"engine-bench", kvb_cmd_engine_bench, "transfer-engine throughput vs memcpy / raw TCP"},
    {"engine-target", kvb_cmd_engine_target, "(internal) target process of engine-bench"},
    {"plan", kvb_cmd_plan, "print the transfer plan of a prefill/decode layout pair"},
    {"plan-bench", kvb_cmd_plan_bench, "planner speed vs memcpy"},
    {"bootstrap", kvb_cmd_bootstrap, "run a standalone bootstrap server"},
    {"bench", kvb_cmd_bench, "verified prefill/decode transfer benchmark"},
};
#define NCOMMANDS (sizeof(g_commands) / sizeof(g_commands[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: kvbridge <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (g_commands[i].fn != NULL)
            fprintf(out, "  %-14s %s\n", g_commands[i].name, g_commands[i].help);
    fprintf(out, "\n  --help         this text\n  --version      print the version\n"
                 "\nRun 'kvbridge <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kvbridge %s\n", kvb_version());
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (g_commands[i].fn != NULL && strcmp(argv[1], g_commands[i].name) == 0)
            return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvbridge: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
