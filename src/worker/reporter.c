/*-------------------------------------------------------------------------
 *
 * reporter.c
 *	  The report worker ("felix report"), started only with the etcd
 *	  control-plane store: it makes the replica reports the ship worker
 *	  hands over (replication/report_queue.c) to the control plane, one at
 *	  a time, so that shipping never waits for an etcd commit.
 *
 * Locking rule: none of its own (the queue's is in report_queue.c).
 * Sleeps on its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/isolate.h"
#include "base/privilege.h"
#include "control/cpcall.h"
#include "felix.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/report_queue.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "worker/reporter.h"

PGDLLEXPORT void felix_reporter_main(Datum arg);

void
felix_reporter_register(void)
{
	felix_register_worker("felix_reporter_main", "felix report", 1);
}

void
felix_reporter_main(Datum arg)
{
	MemoryContext cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	felix_worker_pin_search_path();
	pgstat_report_appname("felix report");
	cxt = AllocSetContextCreate(TopMemoryContext, "felix report", ALLOCSET_DEFAULT_SIZES);

	report_queue_attach();
	cp_snapshot_cache_enable();

	for (;;)
	{
		uint64		seq;
		int64		token;
		char	   *json;
		MemoryContext old;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		old = MemoryContextSwitchTo(cxt);
		json = report_queue_take(&seq, &token);
		if (json != NULL)
		{
			int			accepted;

			pgstat_report_activity(STATE_RUNNING, "felix: replica report");
			accepted = felix_cp_report(json, token, DEBUG1);
			pgstat_report_activity(STATE_IDLE, NULL);
			report_queue_finish(seq, accepted, accepted < 0 ? felix_cp_last_error() : "");
			MemoryContextSwitchTo(old);
			MemoryContextReset(cxt);
			cp_snapshot_quiesce();
			continue;
		}
		MemoryContextSwitchTo(old);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, -1, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
