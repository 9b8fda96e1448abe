/*-------------------------------------------------------------------------
 *
 * node.c
 *	  The felix node worker.  After a start it opens every shard of the
 *	  streams in felix.database, which runs each shard's recovery (torn
 *	  tails cut, indexes rebuilt, damage reported) before clients arrive,
 *	  and then applies retention every felix.retention_check_interval.
 *	  Shards of other databases are opened lazily by their first user.
 *
 *	  One shard's failure never stops the worker: each shard is handled in
 *	  its own subtransaction, and an error is logged and left for the shard
 *	  to report to its readers (felix_shards shows it).
 *
 * Locking rule: holds AccessShareLock on a stream's table while working
 * on its shards, so the stream cannot be dropped underneath; the shard's
 * own locks are taken inside shard.c.  Sleeps on its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "api/catalog.h"
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "felix.h"
#include "isolate.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/shard.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "worker/node.h"

PGDLLEXPORT void felix_node_worker_main(Datum arg);

void
felix_node_worker_register(void)
{
	felix_register_worker("felix_node_worker_main", "felix node", 10);
}

typedef struct TendArgs
{
	const FelixStream *stream;
	int			shard;
} TendArgs;

static void
tend_shard_guts(void *arg)
{
	TendArgs   *t = arg;

	shard_trim(felix_stream_shard(t->stream, t->shard));
}

/* Open and trim one shard; errors are logged, not raised. */
static void
tend_shard(const FelixStream *stream, int shard)
{
	TendArgs	t = {stream, shard};
	ErrorData  *edata = felix_run_isolated(tend_shard_guts, &t);

	if (edata != NULL)
	{
		edata->elevel = LOG;
		ThrowErrorData(edata);
		FreeErrorData(edata);
	}
}

/* One pass over every stream of the database. */
static void
tend_all(void)
{
	List	   *relids = NIL;
	ListCell   *lc;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "felix: opening shards and applying retention");

	if (OidIsValid(get_extension_oid("felix", true)))
	{
		SPI_connect();
		if (SPI_execute("SELECT relid FROM felix.streams ORDER BY name", true, 0) == SPI_OK_SELECT)
		{
			for (uint64 i = 0; i < SPI_processed; i++)
			{
				bool		isnull;
				Oid			relid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
																   SPI_tuptable->tupdesc, 1, &isnull));
				MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);

				relids = lappend_oid(relids, relid);
				MemoryContextSwitchTo(old);
			}
		}
		SPI_finish();

		foreach(lc, relids)
		{
			Oid			relid = lfirst_oid(lc);
			const FelixStream *stream;
			FelixStream copy;

			CHECK_FOR_INTERRUPTS();
			LockRelationOid(relid, AccessShareLock);
			if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
				continue;		/* dropped meanwhile */
			stream = felix_stream_by_relid(relid);
			if (stream == NULL)
				continue;
			copy = *stream;
			for (int sh = 0; sh < copy.shards; sh++)
				tend_shard(&copy, sh);
		}
	}

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

void
felix_node_worker_main(Datum arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	elog(LOG, "felix node worker started in database \"%s\"", felix_database);

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		tend_all();

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 felix_retention_interval,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
