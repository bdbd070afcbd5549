/* Fault injection for tests only (engine_int.h, kvb__test_hooks_t): all
 * zero in production. Its own file: the core and every lane read it. */
#include "engine/engine_int.h"

kvb__test_hooks_t kvb__test_hooks;
