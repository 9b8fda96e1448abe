/*-------------------------------------------------------------------------
 *
 * metrics.h
 *	  Node-wide counters shown by the felix_metrics view.  Each is a
 *	  pg_atomic_uint64 in shared memory: bumped without a lock, read without
 *	  one (a reader may see counters from slightly different instants).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_BASE_METRICS_H
#define FELIX_BASE_METRICS_H

#include "postgres.h"

typedef enum FelixCounter
{
	FELIX_CTR_RECORDS_PUBLISHED,
	FELIX_CTR_BATCHES_APPENDED,
	FELIX_CTR_BYTES_APPENDED,
	FELIX_CTR_FSYNCS,				/* group flushes: one fdatasync each */
	FELIX_CTR_FLUSH_WAITS,			/* publishers that waited on a flush */
	FELIX_CTR_SEGMENTS_ROLLED,
	FELIX_CTR_SEGMENTS_TRIMMED,
	FELIX_CTR_TORN_TAILS_REPAIRED,
	FELIX_CTR_CORRUPTIONS_DETECTED,
	FELIX_CTR_INDEX_REBUILDS,
	FELIX_CTR_SHARDS_RECOVERED,
	FELIX_CTR_LEASE_EXPIRIES,		/* a lease this node held ran out */
	FELIX_CTR_PROMOTIONS,			/* this node took a shard at generation > 1 */
	FELIX_CTR_QUORUM_TIMEOUTS,		/* quorum publishes that gave up waiting */
	FELIX_CTR_HEARTBEATS_SENT,		/* heartbeats sent to the control plane */
	FELIX_CTR_HEARTBEATS_FAILED,	/* heartbeats that got no answer (or no connection) */
	FELIX_CTR_BYTES_SHIPPED,		/* batch bytes sent to followers */
	FELIX_CTR_BATCHES_REPLICATED,	/* batches this node stored as a follower */
	FELIX_CTR_REPLICA_REPORTS,		/* follower rows reported to the control plane */
	FELIX_CTR_REPORT_REQUESTS,		/* felix.cp_report requests that landed */
	FELIX_CTR_MARKS_ON_STANDING_REPORT,	/* quorum marks moved with no new report */
	FELIX_CTR_STEP_DOWNS,			/* leaderships given up on learning of a newer generation */
	FELIX_CTR_COPIES_BOOTSTRAPPED,	/* copies begun at a leader's oldest record (follower) */
	FELIX_CTR_COPIES_REBUILT,		/* copies discarded and begun again (follower) */
	FELIX_CTR_REBUILDS_STARTED,		/* rebuilds of a follower this node began (leader) */
	FELIX_CTR_REBUILDS_COMPLETED,	/* ... that reached the tail */
	FELIX_CTR_REBUILDS_REFUSED,		/* ... that the follower refused or that were abandoned */
	FELIX_CTR_REBUILD_BYTES,		/* batch bytes shipped to followers being rebuilt */
	FELIX_CTR_CATCHUP_BYTES,		/* batch bytes shipped after taking a shard, below
									 * where this leadership began */
	FELIX_CTR_PLANNED_MOVES,		/* leadership transfers and replica moves completed */
	FELIX_CTR_STORE_REQUESTS,		/* reads and transactions sent to the control-plane store */
	FELIX_CTR_STORE_FAILURES,		/* ... that failed or whose outcome is unknown */
	FELIX_CTR_STORE_REQUEST_US,		/* ... their total latency, microseconds */
	FELIX_CTR_STORE_BYTES_READ,		/* key and value bytes the store returned */
	FELIX_CTR_STORE_BYTES_WRITTEN,	/* key and value bytes of the puts sent to it */
	FELIX_CTR_STORE_WHOLE_READS,	/* reads of the whole control-plane state */
	FELIX_CTR_PUBLISHES_FORWARDED,	/* publishes this node forwarded to a shard's leader */
	FELIX_CTR_DUTY_WALKS,			/* duty ticks that looked at every shard (cp_duty.c) */
	FELIX_NUM_COUNTERS
} FelixCounter;

/* Names as shown in felix_metrics, indexed by FelixCounter. */
extern const char *const felix_counter_names[FELIX_NUM_COUNTERS];

extern void felix_count(FelixCounter c, int64 n);
extern uint64 felix_counter_value(FelixCounter c);

extern Size metrics_shmem_size(void);
extern void metrics_shmem_init(void);

#endif							/* FELIX_BASE_METRICS_H */
