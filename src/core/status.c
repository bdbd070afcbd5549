#include "core.h"

const char *kvb_status_string(kvb_status_t status)
{
    switch (status) {
    case KVB_OK:
        return "ok";
    case KVB_ERR_INVALID:
        return "invalid argument";
    case KVB_ERR_NOMEM:
        return "out of memory";
    case KVB_ERR_BOUNDS:
        return "out of bounds";
    case KVB_ERR_OVERLAP:
        return "overlapping registration";
    case KVB_ERR_NOT_FOUND:
        return "not found";
    case KVB_ERR_TIMEOUT:
        return "timed out";
    case KVB_ERR_PEER:
        return "peer unreachable or dead";
    case KVB_ERR_PROTO:
        return "protocol error";
    case KVB_ERR_CANCELED:
        return "canceled";
    case KVB_ERR_IO:
        return "I/O error";
    case KVB_ERR_INPROGRESS:
        return "in progress";
    case KVB_ERR_AUTH:
        return "authentication failed";
    case KVB_ERR_STATE:
        return "invalid state";
    case KVB_ERR_UNSUPPORTED:
        return "unsupported";
    case KVB_ERR_FENCED:
        return "writer fenced by the target";
    case KVB_ERR_UNSETTLED:
        return "failed, unsettled: bytes in flight may still be placed";
    case KVB_ERR_BUSY:
        return "peer busy: try again";
    }
    return "unknown status";
}

const char *kvb_version(void)
{
    return KVB_VERSION_STRING;
}
