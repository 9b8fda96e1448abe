/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  Node-wide counters behind felix_metrics: an array of atomics in shared
 *	  memory, bumped from every subsystem without a lock.
 *
 * Locking rule: none; each counter is a pg_atomic_uint64.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "felix.h"
#include "base/metrics.h"
#include "port/atomics.h"
#include "storage/shmem.h"

const char *const felix_counter_names[FELIX_NUM_COUNTERS] = {
	[FELIX_CTR_RECORDS_PUBLISHED] = "records_published",
	[FELIX_CTR_BATCHES_APPENDED] = "batches_appended",
	[FELIX_CTR_BYTES_APPENDED] = "bytes_appended",
	[FELIX_CTR_FSYNCS] = "fsyncs",
	[FELIX_CTR_FLUSH_WAITS] = "flush_waits",
	[FELIX_CTR_SEGMENTS_ROLLED] = "segments_rolled",
	[FELIX_CTR_SEGMENTS_TRIMMED] = "segments_trimmed",
	[FELIX_CTR_TORN_TAILS_REPAIRED] = "torn_tails_repaired",
	[FELIX_CTR_CORRUPTIONS_DETECTED] = "corruptions_detected",
	[FELIX_CTR_INDEX_REBUILDS] = "index_rebuilds",
	[FELIX_CTR_SHARDS_RECOVERED] = "shards_recovered",
	[FELIX_CTR_LEASE_EXPIRIES] = "lease_expiries",
	[FELIX_CTR_PROMOTIONS] = "promotions",
	[FELIX_CTR_QUORUM_TIMEOUTS] = "quorum_timeouts",
	[FELIX_CTR_HEARTBEATS_SENT] = "heartbeats_sent",
	[FELIX_CTR_HEARTBEATS_FAILED] = "heartbeats_failed",
	[FELIX_CTR_BYTES_SHIPPED] = "bytes_shipped",
	[FELIX_CTR_BATCHES_REPLICATED] = "batches_replicated",
	[FELIX_CTR_REPLICA_REPORTS] = "replica_reports",
	[FELIX_CTR_REPORT_REQUESTS] = "report_requests",
	[FELIX_CTR_MARKS_ON_STANDING_REPORT] = "marks_on_standing_report",
	[FELIX_CTR_STEP_DOWNS] = "step_downs",
	[FELIX_CTR_COPIES_BOOTSTRAPPED] = "copies_bootstrapped",
	[FELIX_CTR_COPIES_REBUILT] = "copies_rebuilt",
	[FELIX_CTR_REBUILDS_STARTED] = "rebuilds_started",
	[FELIX_CTR_REBUILDS_COMPLETED] = "rebuilds_completed",
	[FELIX_CTR_REBUILDS_REFUSED] = "rebuilds_refused",
	[FELIX_CTR_REBUILD_BYTES] = "rebuild_bytes_shipped",
	[FELIX_CTR_CATCHUP_BYTES] = "catchup_bytes_shipped",
	[FELIX_CTR_PLANNED_MOVES] = "planned_moves",
	[FELIX_CTR_STORE_REQUESTS] = "store_requests",
	[FELIX_CTR_STORE_FAILURES] = "store_failures",
	[FELIX_CTR_STORE_REQUEST_US] = "store_request_us",
	[FELIX_CTR_STORE_BYTES_READ] = "store_bytes_read",
	[FELIX_CTR_STORE_BYTES_WRITTEN] = "store_bytes_written",
	[FELIX_CTR_STORE_WHOLE_READS] = "store_whole_reads",
	[FELIX_CTR_PUBLISHES_FORWARDED] = "publishes_forwarded",
	[FELIX_CTR_DUTY_WALKS] = "duty_walks",
};

static pg_atomic_uint64 *felix_counters = NULL;

Size
metrics_shmem_size(void)
{
	return MAXALIGN(sizeof(pg_atomic_uint64) * FELIX_NUM_COUNTERS);
}

void
metrics_shmem_init(void)
{
	bool		found;

	felix_counters = ShmemInitStruct("felix metrics", metrics_shmem_size(), &found);
	if (!found)
		for (int i = 0; i < FELIX_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&felix_counters[i], 0);
}

void
felix_count(FelixCounter c, int64 n)
{
	/* Outside a preloaded server (no shared memory) there is nothing to count. */
	if (felix_counters != NULL)
		pg_atomic_fetch_add_u64(&felix_counters[c], (uint64) n);
}

uint64
felix_counter_value(FelixCounter c)
{
	return felix_counters ? pg_atomic_read_u64(&felix_counters[c]) : 0;
}
