/* The room -> dp_rank table behind /register_dp_rank (src/bootstrap/dp_rooms.c)
 * on a synthetic clock: every entry found after growth, the cap (refused
 * without a rebuild per refusal), re-registration at the cap, expiry, and the
 * slot memory bound (at most 4 x max slots). */
#include <stdint.h>
#include <stdlib.h>

#include "bootstrap/dp_rooms.h"
#include "kvb_test.h"

#define MAX 5000
#define SEC 1000000000ull

int main(void)
{
    kvb__dp_rooms_t t;
    kvb__dp_rooms_init(&t, MAX, 1.0);
    uint64_t now = 10 * SEC;
    CHECK_EQ(kvb__dp_rooms_get(&t, 1, now), -1); /* empty */
    /* Rooms spread over the 64-bit range, several DP ranks. */
    for (uint64_t i = 0; i < MAX; i++)
        CHECK_EQ(kvb__dp_rooms_put(&t, i * 0x9e3779b97f4a7c15ull, (int32_t)(i % 7), now), KVB_OK);
    for (uint64_t i = 0; i < MAX; i++)
        CHECK_EQ(kvb__dp_rooms_get(&t, i * 0x9e3779b97f4a7c15ull, now), (int32_t)(i % 7));
    CHECK_EQ(kvb__dp_rooms_live(&t, now), MAX);
    CHECK(t.cap <= 4 * MAX);
    /* At the cap: a new room is refused, a known one is updated. */
    CHECK_EQ(kvb__dp_rooms_put(&t, 12345, 1, now), KVB_ERR_STATE);
    kvb__dp_slot_t *slots = t.slots;
    for (int i = 0; i < 1000; i++) /* a flood costs no rebuild each */
        CHECK_EQ(kvb__dp_rooms_put(&t, 12345 + (uint64_t)i, 1, now), KVB_ERR_STATE);
    CHECK(t.slots == slots);
    CHECK_EQ(kvb__dp_rooms_put(&t, 0, 6, now), KVB_OK);
    CHECK_EQ(kvb__dp_rooms_get(&t, 0, now), 6);
    /* After the TTL everything is gone and new rooms fit again. */
    now += 2 * SEC;
    CHECK_EQ(kvb__dp_rooms_get(&t, 0, now), -1);
    CHECK_EQ(kvb__dp_rooms_live(&t, now), 0);
    CHECK_EQ(kvb__dp_rooms_put(&t, 12345, 3, now), KVB_OK);
    CHECK_EQ(kvb__dp_rooms_get(&t, 12345, now), 3);
    CHECK_EQ(t.used, 1);
    /* Just before the TTL an entry is still there, at the TTL it is not. */
    CHECK_EQ(kvb__dp_rooms_get(&t, 12345, now + SEC - 1), 3);
    CHECK_EQ(kvb__dp_rooms_get(&t, 12345, now + SEC), -1);
    kvb__dp_rooms_destroy(&t);
    TEST_PASS("dp rooms: growth, cap without rebuild floods, update at cap, expiry, memory");
    return 0;
}
