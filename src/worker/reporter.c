/*-------------------------------------------------------------------------
 *
 * reporter.c
 *	  The report worker ("felix report"), started only with the etcd
 *	  control-plane store.  With the embedded store the ship worker sends
 *	  felix.cp_report without waiting (a pipelined libpq request); with
 *	  etcd the report rule runs in a felix process and takes a read and a
 *	  transaction -- a Raft commit -- so it runs here, and the ship worker
 *	  goes on shipping meanwhile.
 *
 *	  The protocol: the ship worker, with no request pending, writes the
 *	  JSON into the slot, bumps req_seq and sets this worker's latch; this
 *	  worker runs felix_cp_report, writes the outcome, sets done_seq and
 *	  wakes the ship worker.  A request the ship worker gave up on (it took
 *	  longer than its timeout) finishes all the same; its outcome is for an
 *	  old number and is not taken for a newer request's.  The ship worker
 *	  counts a report as landed only from the outcome of its own request,
 *	  and treats one that timed out as possibly committed, as it does a
 *	  libpq request (replication/report.c).
 *
 * Locking rule: the slot's spinlock guards the numbers, the outcome and
 * the latch pointer; the JSON buffer belongs to whichever side the
 * numbers say (writer while req_seq == done_seq, reader otherwise).
 * Sleeps on its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/cpcall.h"
#include "felix.h"
#include "isolate.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "privilege.h"
#include "replication/state.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "worker/reporter.h"

PGDLLEXPORT void felix_reporter_main(Datum arg);

/* Room per shard slot for its rows (followers x one JSON object each). */
#define REPORT_BYTES_PER_SHARD	(8 * 320)

typedef struct ReporterShared
{
	slock_t		mutex;
	Latch	   *latch;			/* the reporter's, while it runs */
	uint64		req_seq;		/* last request handed over */
	uint64		done_seq;		/* last request finished */
	int64		token;
	int			accepted;		/* of done_seq: rows written, -1 failed */
	char		error[256];
	Size		cap;
	Size		len;
	char		json[FLEXIBLE_ARRAY_MEMBER];
} ReporterShared;

static ReporterShared *rep = NULL;

static Size
json_capacity(void)
{
	return (Size) felix_max_shards * REPORT_BYTES_PER_SHARD + 16;
}

Size
felix_reporter_shmem_size(void)
{
	return MAXALIGN(offsetof(ReporterShared, json) + json_capacity());
}

void
felix_reporter_shmem_init(void)
{
	bool		found;

	rep = ShmemInitStruct("felix reporter", felix_reporter_shmem_size(), &found);
	if (!found)
	{
		memset(rep, 0, offsetof(ReporterShared, json));
		SpinLockInit(&rep->mutex);
		rep->cap = json_capacity();
	}
}

uint64
felix_reporter_submit(const char *json, int64 token)
{
	Size		len = strlen(json);
	Latch	   *latch;
	uint64		seq = 0;

	if (rep == NULL || len + 1 > rep->cap)
		return 0;
	SpinLockAcquire(&rep->mutex);
	latch = rep->latch;
	if (latch != NULL && rep->req_seq == rep->done_seq)
	{
		/* nothing pending: the buffer is ours to write */
		SpinLockRelease(&rep->mutex);
		memcpy(rep->json, json, len + 1);
		SpinLockAcquire(&rep->mutex);
		rep->len = len;
		rep->token = token;
		seq = ++rep->req_seq;
	}
	SpinLockRelease(&rep->mutex);
	if (seq != 0)
		SetLatch(latch);
	return seq;
}

bool
felix_reporter_busy(void)
{
	bool		busy;

	SpinLockAcquire(&rep->mutex);
	busy = rep->latch != NULL && rep->req_seq != rep->done_seq;
	SpinLockRelease(&rep->mutex);
	return busy;
}

bool
felix_reporter_outcome(uint64 seq, int *accepted, char *error, Size errlen)
{
	bool		done;

	SpinLockAcquire(&rep->mutex);
	done = rep->done_seq >= seq;
	if (done)
	{
		*accepted = rep->done_seq == seq ? rep->accepted : -1;
		strlcpy(error, rep->done_seq == seq ? rep->error : "superseded", errlen);
	}
	SpinLockRelease(&rep->mutex);
	return done;
}

static void
reporter_exit(int code, Datum arg)
{
	SpinLockAcquire(&rep->mutex);
	rep->latch = NULL;
	/* a request it will not finish: let the ship worker see it failed */
	if (rep->req_seq != rep->done_seq)
	{
		rep->done_seq = rep->req_seq;
		rep->accepted = -1;
		strlcpy(rep->error, "the report worker exited", sizeof(rep->error));
	}
	SpinLockRelease(&rep->mutex);
}

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

	SpinLockAcquire(&rep->mutex);
	rep->latch = MyLatch;
	/* whatever was pending belonged to an earlier reporter: it failed */
	rep->done_seq = rep->req_seq;
	SpinLockRelease(&rep->mutex);
	before_shmem_exit(reporter_exit, (Datum) 0);

	for (;;)
	{
		uint64		seq;
		int64		token = 0;
		bool		pending;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		SpinLockAcquire(&rep->mutex);
		seq = rep->req_seq;
		pending = seq != rep->done_seq;
		if (pending)
			token = rep->token;
		SpinLockRelease(&rep->mutex);

		if (pending)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);
			char	   *json = pnstrdup(rep->json, rep->len);
			int			accepted;

			pgstat_report_activity(STATE_RUNNING, "felix: replica report");
			accepted = felix_cp_report(json, token, DEBUG1);
			pgstat_report_activity(STATE_IDLE, NULL);
			SpinLockAcquire(&rep->mutex);
			rep->accepted = accepted;
			strlcpy(rep->error, accepted < 0 ? felix_cp_last_error() : "", sizeof(rep->error));
			rep->done_seq = seq;
			SpinLockRelease(&rep->mutex);
			MemoryContextSwitchTo(old);
			MemoryContextReset(cxt);
			repl_wake_shipper();
			continue;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, -1, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
