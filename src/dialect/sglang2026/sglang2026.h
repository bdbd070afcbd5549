/* SGLang's 2026 dialect (sglang2026.c). */
#ifndef KVB_DIALECT_SGLANG2026_H
#define KVB_DIALECT_SGLANG2026_H

#include "dialect/dialect.h"
#include "dialect/sglang2026/frames.h"

extern const kvb__dialect_t kvb__dialect_sglang2026;

#endif
