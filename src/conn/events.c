/* The connector's name tables: KVPoll values, and the timeline events'
 * names (the one string table of KVB_EVENT_MAP, conn.h), which the
 * snapshots' readers and the trace writer use. Calls nothing. */
#include <kvbridge/conn.h>

static const char *const event_names[KVB_EV_COUNT] = {
#define KVB_EVENT_NAME_(id, name, what) name,
    KVB_EVENT_MAP(KVB_EVENT_NAME_)
#undef KVB_EVENT_NAME_
};

const char *kvb_event_name(kvb_event_t ev)
{
    return (unsigned)ev < KVB_EV_COUNT ? event_names[ev] : "unknown";
}

const char *kvb_poll_string(kvb_poll_t poll)
{
    static const char *names[] = {"Failed", "Bootstrapping", "WaitingForInput", "Transferring",
                                  "Success"};
    return (unsigned)poll < 5 ? names[poll] : "Unknown";
}
