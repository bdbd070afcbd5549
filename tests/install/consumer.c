/* A framework's first contact with an installed kvbridge: built by
 * test_install.sh against the installed headers and library only (through
 * pkg-config and through find_package), never against the source tree.
 * Prints the version and a status string, then creates and destroys an
 * engine on an ephemeral loopback port. argv[1] = the expected version. */
#include <kvbridge/kvbridge.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s EXPECTED_VERSION\n", argv[0]);
        return 2;
    }
    if (strcmp(kvb_version(), argv[1]) != 0 || strcmp(KVB_VERSION_STRING, argv[1]) != 0) {
        fprintf(stderr, "version: library %s, header %s, expected %s\n", kvb_version(),
                KVB_VERSION_STRING, argv[1]);
        return 1;
    }
    kvb_engine_params_t p = {.field_mask = KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_PORT,
                             .host = "127.0.0.1",
                             .port = 0};
    kvb_engine_h e = NULL;
    kvb_status_t st = kvb_engine_create(&p, &e);
    if (st != KVB_OK || e == NULL) {
        fprintf(stderr, "kvb_engine_create: %s\n", kvb_status_string(st));
        return 1;
    }
    const char *sid = kvb_engine_session_id(e);
    int ok = sid != NULL && strncmp(sid, "127.0.0.1:", 10) == 0;
    printf("consumer: kvbridge %s, %s, engine %s\n", kvb_version(),
           kvb_status_string(KVB_ERR_TIMEOUT), sid ? sid : "(null)");
    kvb_engine_destroy(e);
    return ok ? 0 : 1;
}
