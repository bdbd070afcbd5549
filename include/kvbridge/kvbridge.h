/* kvbridge umbrella header: include this one to get the whole public API. */
#ifndef KVBRIDGE_H
#define KVBRIDGE_H
#include <kvbridge/common.h>
#include <kvbridge/bootstrap.h>
#include <kvbridge/engine.h>
#include <kvbridge/plan.h>
#include <kvbridge/conn.h>
#include <kvbridge/metrics.h>
#endif
