/*-------------------------------------------------------------------------
 *
 * node.c
 *	  The felix node worker.  After a start it opens every shard of the
 *	  streams in felix.database, which runs each shard's recovery (torn
 *	  tails cut, indexes rebuilt, damage reported) before clients arrive,
 *	  and then applies retention every felix.retention_check_interval.
 *	  Once after a shard opens it reads every record its files held then,
 *	  checking each as a value of the stream's types (check_contents): a
 *	  file changed outside felix is reported, never crashes a reader.
 *	  Shards of other databases are opened lazily by their first user.
 *
 *	  Every felix.heartbeat_interval, and as it exits, it makes each
 *	  replicated shard's high-water mark durable (shard_persist_hwm): a
 *	  replica restarted after that serves at once what it knew to be
 *	  acknowledged, and never cuts it.
 *
 *	  Every five heartbeat intervals it probes one peer, in turn: connects
 *	  as this node's role and asks who answers (probe_one_peer).  The
 *	  heartbeat reports what it found, so a node its peers cannot log in
 *	  to is shown unreachable, with the reason, in every felix_nodes.
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

#include "access/table.h"
#include "access/xact.h"
#include "am/am.h"
#include "executor/tuptable.h"
#include "core/catalog.h"
#include "catalog/namespace.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "control/nodes.h"
#include "felix.h"
#include "base/isolate.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "base/privilege.h"
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

/*
 * Retention is maintenance of the stream's table: it runs as the table's
 * owner in a security-restricted operation, as VACUUM does (privilege.c).
 */
/*
 * Check, once after the shard opened, every record its segment files held
 * then as a value of the stream's types: the cursor checks each record of
 * shard_unchecked's range as it reads it (tableam.c), so reading them all
 * through it is the check; each pass goes as far as readers can see.  A record that fails raises its error,
 * names it, and leaves the shard unchecked: readers go on checking, and
 * get the same error there, never a crash.
 */
static void
check_contents(const FelixStream *stream, int shard, FelixShard *s)
{
	uint64		lo;
	uint64		hi;
	uint64		start;
	uint64		visible;
	Relation	rel;
	FelixCursor *c;
	TupleTableSlot *slot;

	shard_unchecked(s, &lo, &hi);
	if (lo >= hi)
		return;
	/* records above the mark are not readable yet: they are checked later */
	shard_visible(s, &start, &visible);
	visible = Min(visible, hi);
	if (lo >= visible)
		return;
	rel = table_open(stream->relid, AccessShareLock);
	c = felix_cursor_begin(stream);
	felix_cursor_set_local(c);
	felix_cursor_set_range(c, shard, shard + 1, lo, visible);
	slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsVirtual);
	while (felix_cursor_next(c, slot))
		CHECK_FOR_INTERRUPTS();
	ExecDropSingleTupleTableSlot(slot);
	felix_cursor_end(c);
	table_close(rel, AccessShareLock);
	shard_set_checked(s, hi, visible);
}

static void
tend_shard_guts(void *arg)
{
	TendArgs   *t = arg;
	FelixContext cxt;
	FelixShard *s;

	felix_context_begin(&cxt, felix_relation_owner(t->stream->relid));
	s = felix_stream_shard(t->stream, t->shard);
	shard_trim(s);
	check_contents(t->stream, t->shard, s);
	felix_context_end(&cxt);
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
	ListCell   *lc;
	char		installed[NAMEDATALEN];

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "felix: opening shards and applying retention");

	if (felix_extension_version(installed, sizeof(installed)))
	{
		foreach(lc, felix_stream_list())
		{
			FelixStream *stream = lfirst(lc);

			CHECK_FOR_INTERRUPTS();
			LockRelationOid(stream->relid, AccessShareLock);
			if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(stream->relid)))
				continue;		/* dropped meanwhile */
			for (int sh = 0; sh < stream->shards; sh++)
				tend_shard(stream, sh);
		}
	}

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* Make one shard's mark durable; a failure is logged and returns false. */
static bool
persist_mark(FelixShard *s)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool ok = true;

	PG_TRY();
	{
		shard_persist_hwm(s);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		edata->elevel = LOG;
		ThrowErrorData(edata);
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	return ok;
}

/*
 * Make every moved high-water mark durable.  A mark moves only with a
 * change the slots count (shard_changes): when the count is the one seen
 * before the last pass, and that pass made every mark it found durable,
 * there is nothing to look at -- an idle node's pass then costs nothing,
 * however many shards it holds.
 */
static void
persist_marks(void)
{
	static uint64 done_at = PG_UINT64_MAX;
	uint64		changes = shard_changes();
	bool		all = true;

	if (changes == done_at)
		return;
	for (int i = 0; i < shard_count_slots(); i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (!persist_mark(shard_slot(i)))
			all = false;
	}
	/* a mark that failed is tried again at the next pass */
	done_at = all ? changes : PG_UINT64_MAX;
}

/*
 * A peer that took this node's connection is probed again after this many
 * heartbeat intervals, one that did not at its next turn.  Each probe is
 * a new session on the peer -- a process started and its catalogs read --
 * so probing every healthy peer every second was, on an idle cluster,
 * about a third of what each server spent.  A password changed on a
 * healthy peer shows within this many intervals (10 s by default).
 */
#define PROBE_HEALTHY_INTERVALS 50

/* Note a probe's outcome; say so in the log when it changed. */
static void
probed(const char *name, bool ok, const char *why)
{
	int64		due_ns = felix_monotonic_ns() +
		(int64) (ok ? PROBE_HEALTHY_INTERVALS : 0) * felix_heartbeat_interval * 1000000;

	if (!felix_node_probed(name, ok, why, due_ns))
		return;
	if (ok)
		ereport(LOG,
				(errmsg("felix: node \"%s\" takes this node's connections", name)));
	else
		ereport(LOG,
				(errmsg("felix: this node cannot log in to node \"%s\": %s", name, why),
				 errdetail("felix_nodes shows node \"%s\" unreachable until it can.", name),
				 errhint("%s", felix_conn_hint(why))));
}

/*
 * Probe the next peer that is due (round robin, one per
 * felix.heartbeat_interval times five): connect to it as this node's
 * role, ask who answers, and note the outcome for the heartbeat to
 * report.  A peer whose role or password is wrong is then shown
 * unreachable, with libpq's reason, on every node -- not alive.
 */
static void
probe_one_peer(MemoryContext cxt)
{
	char		name[NAMEDATALEN];
	char		conninfo[FELIX_NODE_CONNINFO_LEN];
	PGconn	   *conn;
	PGresult   *res;
	MemoryContext old = MemoryContextSwitchTo(cxt);
	int			timeout = Max(felix_heartbeat_interval, 500);

	if (felix_nodes_next_probe(name, conninfo, sizeof(conninfo), felix_monotonic_ns()))
	{
		conn = felix_conn_open(felix_peer_conninfo(conninfo), psprintf("node \"%s\"", name),
							   "felix probe", timeout, DEBUG1);
		if (conn == NULL)
			probed(name, false, felix_conn_last_error());
		else
		{
			res = felix_conn_exec(conn, "felix.node_identity",
								  "SELECT name FROM felix.node_identity()", 0, NULL,
								  timeout, DEBUG1);
			if (res == NULL)
				probed(name, false, felix_conn_last_error());
			else if (PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), name) != 0)
				probed(name, false,
					   psprintf("its address reaches node \"%s\" instead",
								PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "?"));
			else
				probed(name, true, NULL);
			PQclear(res);
			felix_conn_close(conn);
		}
	}
	MemoryContextSwitchTo(old);
	MemoryContextReset(cxt);
}

static void
node_worker_exit(int code, Datum arg)
{
	/* a clean stop leaves every mark durable; nothing may raise here */
	PG_TRY();
	{
		persist_marks();
	}
	PG_CATCH();
	{
		FlushErrorState();
	}
	PG_END_TRY();
}

void
felix_node_worker_main(Datum arg)
{
	int64		next_retention_ns = 0;
	int64		next_probe_ns = 0;
	MemoryContext probe_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	felix_worker_pin_search_path();
	elog(LOG, "felix node worker started in database \"%s\"", felix_database);
	before_shmem_exit(node_worker_exit, (Datum) 0);
	probe_cxt = AllocSetContextCreate(TopMemoryContext, "felix node: probes",
									  ALLOCSET_DEFAULT_SIZES);

	for (;;)
	{
		int64		now_ns;
		long		wait_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			next_retention_ns = 0;	/* on the new schedule from now */
		}

		now_ns = felix_monotonic_ns();
		if (now_ns >= next_retention_ns)
		{
			tend_all();
			next_retention_ns = now_ns + (int64) felix_retention_interval * 1000000;
		}
		persist_marks();
		if (felix_monotonic_ns() >= next_probe_ns)
		{
			probe_one_peer(probe_cxt);
			next_probe_ns = felix_monotonic_ns() + (int64) 5 * felix_heartbeat_interval * 1000000;
		}

		wait_ms = Min((long) felix_heartbeat_interval,
					  (long) ((next_retention_ns - felix_monotonic_ns()) / 1000000));
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Max(wait_ms, 1),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
