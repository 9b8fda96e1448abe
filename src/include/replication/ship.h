/*-------------------------------------------------------------------------
 *
 * ship.h
 *	  The ship worker ("felix ship"): for every shard led here with
 *	  replication_factor > 1 it ships bounded runs of whole batches from
 *	  each follower's cursor to the leader's written end, over one
 *	  pipelined, non-blocking libpq connection per peer node, and hands
 *	  the answers to the quorum report (report.h).
 *
 *	  Also the small non-blocking connection driver the worker uses for
 *	  its peers and for the control plane: connect with a deadline and a
 *	  backoff between attempts, all inside the worker's one wait loop.
 *
 * Locking rule: everything here is the worker's own memory; shared state
 * is reached only through shard.h and state.h under their rules.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_SHIP_H
#define FELIX_REPLICATION_SHIP_H

#include "postgres.h"

#include "control/client.h"
#include "felix.h"
#include "libpq-fe.h"

/* Register the worker (from _PG_init). */
extern void felix_ship_worker_register(void);

PGDLLEXPORT void felix_ship_worker_main(Datum arg);

/*
 * When the shipment in flight to follower fidx of the shard in `slot` (at
 * `generation`) left, 0 if none is; *carries says whether it carries every
 * record below `end` (if not, the rest leaves as soon as it is answered).
 */
extern int64 ship_in_flight_since(int slot, const FelixShardKey *key,
								  uint64 generation, int fidx, uint64 end,
								  bool *carries);

#endif							/* FELIX_REPLICATION_SHIP_H */
