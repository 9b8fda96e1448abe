/*-------------------------------------------------------------------------
 *
 * isolate.c
 *	  Running work in its own subtransaction, and registering felix's
 *	  background workers.  A shard that fails to open, a control-plane row
 *	  that cannot be applied, a damaged sample block: each is one unit of
 *	  work whose error must be reported without aborting the rest, which is
 *	  what an internal subtransaction gives (as PL/pgSQL's exception blocks
 *	  do).
 *
 * Locking rule: none of its own; locks taken by the work are released with
 * its subtransaction when it fails.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "base/isolate.h"
#include "postmaster/bgworker.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

ErrorData *
felix_run_isolated(void (*fn) (void *arg), void *arg)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	CurrentResourceOwner = oldowner;
	return edata;
}

void
felix_register_worker(const char *function, const char *name, int restart_seconds)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = restart_seconds;
	strlcpy(worker.bgw_library_name, "felix", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, function, BGW_MAXLEN);
	strlcpy(worker.bgw_name, name, BGW_MAXLEN);
	strlcpy(worker.bgw_type, name, BGW_MAXLEN);
	RegisterBackgroundWorker(&worker);
}
