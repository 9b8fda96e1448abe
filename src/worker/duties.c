/*-------------------------------------------------------------------------
 *
 * duties.c
 *	  The duty worker ("felix duties"): this node's part in the
 *	  control-plane duties, failure detection and promotion
 *	  (control/cp_duty.c), which exactly one node at a time runs.  Every
 *	  felix.heartbeat_interval it ticks them (felix_cp_duty_tick): a node
 *	  that does not hold them reads the duty key alone and takes them over
 *	  when its holder stops refreshing it; the holder reads the state,
 *	  promotes, and names the nodes it granted a generation.  It ticks again
 *	  between intervals when the first lease it watches lapses, so a
 *	  failover waits for no interval, and it wakes the grantees so that each
 *	  claims its generation at once: this node's heartbeat worker through
 *	  its latch, another node over a connection of its own (etcd; the
 *	  embedded control plane notifies them itself).
 *
 *	  A process of its own, so that the holder's ticks -- a read of the
 *	  whole state and a pass over every shard, most of a second at
 *	  thousands of shards under load -- never delay the heartbeats that
 *	  renew this node's own leases (worker/heartbeat.c).  The holder's
 *	  observations live in this process (with etcd) or in the control-plane
 *	  backend serving its session (embedded store); a new process or a new
 *	  session is a holder that knows nothing, which cp_duty.c allows for.
 *
 *	  It ticks only while this node's heartbeats are answered (the store
 *	  view the heartbeat worker keeps), the last one within
 *	  felix.node_expiry: a node the control plane does not hear from takes
 *	  no part, whether its store is unreachable or its heartbeat worker
 *	  hangs; and not at all with
 *	  felix.control_plane_duties off, which stops the refreshes of a holder
 *	  so that another node takes over.
 *
 * Locking rule: none of its own.  Never waits on the network inside a
 * transaction.  Sleeps on its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/isolate.h"
#include "base/privilege.h"
#include "base/wake.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "control/cpcall.h"
#include "control/store_view.h"
#include "felix.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "worker/cp_session.h"
#include "worker/duties.h"

PGDLLEXPORT void felix_duty_worker_main(Datum arg);

#define DUTY_APPNAME		"felix duties"

static WorkerCpSession cp = {.appname = DUTY_APPNAME};

/*
 * Does the control plane hear this node's heartbeats?  The last call
 * succeeded, and within felix.node_expiry: a heartbeat worker that hangs
 * (stopped, stuck) leaves its last success in the view, and a node the
 * control plane has counted dead by now must not go on running its duties.
 * Liveness only; the duty key's rules (cp_duty.c) keep two holders from
 * granting.
 */
static bool
heartbeats_answered(void)
{
	FelixStoreView v;

	felix_store_view(&v);
	return v.ok && v.ok_mono_ns != 0 &&
		felix_monotonic_ns() - v.ok_mono_ns < (int64) felix_node_expiry * 1000000;
}

/*
 * Wake the nodes just given a new generation, so each claims it now rather
 * than at its next beat.  This node's heartbeat worker through its latch;
 * the others over connections of their own, within half an interval in
 * all, so that peers this node cannot reach (a partition) never hold up
 * the next tick: a node not woken claims at its next beat anyway.
 */
static void
wake_grantees(List *grantees)
{
	ListCell   *lc;
	int64		deadline = felix_monotonic_ns() + (int64) felix_heartbeat_interval * 500000;

	foreach(lc, grantees)
	{
		const char *name = strVal(lfirst(lc));
		PGconn	   *conn;
		int			left_ms;

		if (strcmp(name, felix_node_name_resolved()) == 0)
		{
			felix_wake(FELIX_WORKER_HEARTBEAT);
			continue;
		}
		left_ms = (int) ((deadline - felix_monotonic_ns()) / 1000000);
		if (left_ms <= 0)
			continue;
		conn = felix_node_connect(name, DUTY_APPNAME, left_ms);
		left_ms = (int) ((deadline - felix_monotonic_ns()) / 1000000);
		if (left_ms > 0)
			felix_node_wake_heartbeat(conn, left_ms);
		felix_conn_close(conn);
	}
}

/*
 * One tick; returns when to tick again at the latest (monotonic ns): the
 * next interval, or sooner when a lease the holder watches lapses first.
 */
static int64
tick_once(void)
{
	int64		next = felix_monotonic_ns() + (int64) felix_heartbeat_interval * 1000000;
	CpTick		tick;
	int			elevel;

	if (!felix_control_plane_duties || !heartbeats_answered() || !worker_cp_connect(&cp))
		return next;
	pgstat_report_activity(STATE_RUNNING, "felix: control-plane duties");
	elevel = worker_cp_elevel(&cp);
	felix_cp_duty_tick(&cp.session, elevel, &tick);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (tick.promoted > 0)
		ereport(LOG,
				(errmsg("felix control plane: %d promotion%s in this tick",
						tick.promoted, tick.promoted == 1 ? "" : "s")));
	wake_grantees(tick.grantees);
	if (!felix_cp_usable(&cp.session))
		worker_cp_failed(&cp, elevel);
	else if (tick.lapse_in_ms >= 0)
		next = Min(next, felix_monotonic_ns() + (int64) tick.lapse_in_ms * 1000000);
	return next;
}

void
felix_duty_worker_register(void)
{
	felix_register_worker("felix_duty_worker_main", DUTY_APPNAME, 1);
}

void
felix_duty_worker_main(Datum arg)
{
	MemoryContext tick_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	felix_worker_pin_search_path();
	pgstat_report_appname(DUTY_APPNAME);
	tick_cxt = AllocSetContextCreate(TopMemoryContext, "felix duty tick",
									 ALLOCSET_DEFAULT_SIZES);
	cp_snapshot_cache_enable();

	for (;;)
	{
		int64		next;
		int64		now;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		/* the last tick's snapshots went with its memory */
		MemoryContextReset(tick_cxt);
		cp_snapshot_quiesce();
		MemoryContextSwitchTo(tick_cxt);
		next = tick_once();
		MemoryContextSwitchTo(TopMemoryContext);

		now = felix_monotonic_ns();
		if (next > now)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 (long) ((next - now + 999999) / 1000000), PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
	}
}
