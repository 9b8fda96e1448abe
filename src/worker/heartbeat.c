/*-------------------------------------------------------------------------
 *
 * heartbeat.c
 *	  The node agent: background worker "felix heartbeat".  Every
 *	  felix.heartbeat_interval it
 *
 *	  1. reads the monotonic clock (t_send) and makes the heartbeat call
 *		 (control/cpcall.c: felix.cp_heartbeat over the one libpq session
 *		 it keeps with the embedded store, or the rule run right here with
 *		 etcd).  The call registers the node, claims the leases it is due,
 *		 reports what this node's probes found of its peers, and returns
 *		 every assignment of every stream;
 *	  2. hands the returned rows to the node agent (api/agent.c), which
 *		 applies each to its local shard, with the lease anchored at t_send
 *		 -- the instant the heartbeat was sent, before its claim was
 *		 written, so the round trip comes out of this node's lease and
 *		 never out of the duty holder's safety margin.  Costly rows (a
 *		 shard to open, a lead to take) wait for the next beat once an
 *		 interval is spent: a failover that hands this node a thousand
 *		 shards must not keep it from renewing the leases it holds;
 *	  3. (the agent, too) creates the tables of streams the control plane
 *		 lists but this node does not have yet, after the leases of
 *		 existing streams were applied, so a user's long transaction can
 *		 delay a new stream's table but never a lease renewal;
 *	  4. keeps the node directory (control/nodes.c) current: each shard's
 *		 leader and its conninfo from the rows, and the control plane's node
 *		 list, with liveness and who runs the duties, every heartbeat; and
 *		 notes what it saw of the control-plane store for felix_nodes.
 *
 *	  It registers only the address part of felix.node_conninfo and logs in
 *	  as this node's own role (conninfo.c); every query it runs, locally
 *	  or remotely, has search_path pinned to pg_catalog, pg_temp.
 *
 *	  When the control plane cannot be reached the worker logs it (at most
 *	  once every few seconds) and carries on.  It revokes nothing: a lease
 *	  it cannot renew runs out by itself in shard.c, which is the design --
 *	  a revocation could not reach a partitioned node anyway.
 *
 *	  The control-plane duties (failure detection and promotion) are not
 *	  its work: they run in a process of their own (worker/duties.c), so
 *	  that a holder's long tick never delays this node's lease renewals.
 *
 *	  Between beats it sleeps on its latch (felix.heartbeat_now, and the
 *	  duty worker when it granted this node a generation, wake it) and,
 *	  with the embedded store, on its control-plane session, where
 *	  felix.cp_tick notifies the nodes it granted a generation: such a node
 *	  beats at once to claim it, at most once per interval.
 *
 *	  A node joins once CREATE EXTENSION felix has run in felix.database;
 *	  until then the worker waits without contacting the control plane.
 *
 * Locking rule: none of its own (the agent's are in api/agent.c).  Never
 * waits on the network inside a transaction.  Sleeps on its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>

#include "access/xact.h"
#include "api/agent.h"
#include "base/isolate.h"
#include "base/metrics.h"
#include "base/privilege.h"
#include "base/wake.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "control/cpcall.h"
#include "control/halts.h"
#include "control/nodes.h"
#include "control/store.h"
#include "control/store_view.h"
#include "felix.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/lease.h"
#include "storage/incarnation.h"
#include "storage/latch.h"
#include "storage/shard.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "worker/cp_session.h"
#include "worker/heartbeat.h"

PGDLLEXPORT void felix_heartbeat_worker_main(Datum arg);

#define HB_APPNAME			"felix heartbeat"
#define HB_PURPOSE			"the felix control plane"
/* How often a failed check of felix.node_conninfo is tried again. */
#define HB_SELF_CHECK_NS	(INT64CONST(1) * 1000000000)
/* How often a server refused its node name tells the control plane so. */
#define HB_CLASH_NOTE_MS	2000
/* How often the store revision seen is written to the felix data directory. */
#define HB_STORE_SEEN_WRITE_NS	(INT64CONST(1) * 1000000000)
/* The node list and the halted followers are read every this many beats. */
#define HB_LISTS_EVERY	5
/* Log ends that keep moving are given at most every this many beats. */
#define HB_ENDS_EVERY	5

/* The worker's state; all of it is process-local. */
static WorkerCpSession cp = {.appname = HB_APPNAME, .listen = true};
static MemoryContext cycle_cxt = NULL;	/* one beat's, until the next beat */
static int	failed_in_a_row = 0;
static bool waiting_logged = false;
static bool woken_early = false;	/* this interval's beat came early on a wake */

/* ---------------------------------------------------------------------
 * One heartbeat
 * ---------------------------------------------------------------------
 */

/*
 * Is felix installed in felix.database, at the version this library
 * serves?  Until it is (CREATE EXTENSION felix, or ALTER EXTENSION felix
 * UPDATE after the binaries were replaced), the node does not join.
 */
static bool
local_extension_ready(void)
{
	bool		ready;
	char		installed[NAMEDATALEN];

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ready = felix_extension_version(installed, sizeof(installed));
	CommitTransactionCommand();
	MemoryContextSwitchTo(cycle_cxt);

	if (!ready && !waiting_logged)
	{
		if (installed[0] == '\0')
			ereport(LOG,
					(errmsg("felix heartbeat: waiting for CREATE EXTENSION felix in database \"%s\" before joining the cluster",
							felix_database)));
		else
			ereport(LOG,
					(errmsg("felix heartbeat: felix %s is installed in database \"%s\", and this library is %s: waiting for ALTER EXTENSION felix UPDATE before joining the cluster",
							installed, felix_database, FELIX_SQL_VERSION)));
	}
	waiting_logged = !ready;
	return ready;
}

/*
 * Re-read the control plane's node list into the node directory, with
 * each node's liveness and who runs the duties: the felix_nodes view
 * shows it from there.  Every HB_LISTS_EVERY heartbeats (and right after
 * one that followed a failure), so the view is about
 * a second behind the control plane at most; each read costs the store
 * as much as the nodes' records hold.
 */
static void
refresh_directory(void)
{
	static TimestampTz clash_logged = 0;
	FelixNodeInfo *nodes;
	int			n;
	int			elevel = worker_cp_elevel(&cp);

	if (!felix_cp_nodes(&cp.session, &nodes, &n, elevel))
	{
		worker_cp_failed(&cp, elevel);
		return;
	}
	felix_nodes_listed(nodes, n);

	/* another server was refused this node's name: say so here too */
	for (int i = 0; i < n; i++)
	{
		FelixNodeInfo *x = &nodes[i];

		if (!felix_is_this_node(x->name) || x->clash_at <= clash_logged ||
			x->clash_incarnation[0] == '\0')
			continue;
		clash_logged = x->clash_at;
		ereport(WARNING,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("felix heartbeat: another server, at \"%s\", tried to register as node \"%s\"; the control plane refused it",
						x->clash_conninfo, x->name),
				 errdetail("This server, at \"%s\", is felix data directory incarnation %s; the other is incarnation %s.",
						   x->conninfo, x->incarnation, x->clash_incarnation),
				 errhint("Give each server its own felix.node_name; felix_nodes shows the last such attempt.")));
	}
}

/*
 * Does felix.node_conninfo reach this very node (felix_verify_own_conninfo)?
 * A node registers only once it does: a conninfo pasted from another
 * node's would have this node registered at that node's address, and its
 * shipments land there.  Checked at most every HB_SELF_CHECK_NS until it
 * succeeds, with a deadline of one heartbeat interval.
 */
static bool
own_conninfo_ok(void)
{
	static int64 next_check_ns = 0;
	int64		now = felix_monotonic_ns();

	if (felix_conninfo_verified() > 0)
		return true;
	if (now < next_check_ns)
		return false;
	next_check_ns = now + HB_SELF_CHECK_NS;
	return felix_verify_own_conninfo(Max(felix_heartbeat_interval, 100), LOG) > 0;
}

/*
 * Re-read the halted followers the control plane knows of (the reports
 * of the shards' current leaders) into the cache felix_halted shows.
 */
static void
refresh_halts(void)
{
	FelixHaltInfo *halts;
	int			n;
	int			elevel = worker_cp_elevel(&cp);

	if (felix_cp_halted(&cp.session, &halts, &n, elevel))
		felix_halts_listed(halts, n);
	else
		worker_cp_failed(&cp, elevel);
}

static void note_store(bool ok, bool called, int64 beat_no);

static void
refresh_lists(void)
{
	if (cp.open)
		refresh_directory();
	if (cp.open)
		refresh_halts();
}

/*
 * How long a heartbeat may spend on costly assignments: an interval, and
 * at most a quarter of what a lease leaves after epsilon, so the beat
 * that follows (after the call) still renews in time.
 */
static int64
apply_budget_ns(void)
{
	int			ms = Min(felix_heartbeat_interval,
						 (felix_lease_duration - felix_lease_epsilon) / 4);

	return (int64) Max(ms, 1) * 1000000;
}

static void
heartbeat_once(void)
{
	static int64 beats = 0;
	static int64 ends_given_at = 0;	/* the last beat that gave log ends (0: none) */
	static bool rows_came = false;	/* the last answer brought rows */
	static int64 store_seen_written_ns = 0;
	static bool store_seen_failing = false;
	static int64 clash_noted_beat = -1000000;
	const char *me = felix_node_name_resolved();
	/* only where this node is: its credentials never leave it */
	const char *my_conninfo = felix_conninfo_address(felix_node_conninfo_resolved());
	int64		t_send;
	FelixCpShard *shards;
	AgentRow   *rows;
	int			nrows;
	int			napply;
	FelixCpAnswer answer;
	bool		ends_same;
	bool		ends_moved;
	bool		give_ends;
	int			nunable;
	char	  **unable;
	int			nends;
	char	  **ends;
	int			elevel;
	bool		answered_again;

	if (!local_extension_ready())
		return;
	if (!own_conninfo_ok())
	{
		felix_store_view_blocked(felix_conninfo_verified() < 0 ?
					 "felix.node_conninfo reaches another felix node, not this server, so this node does not join "
					 "(the server log names it): set felix.node_conninfo to this server's own address and restart" :
					 psprintf("felix.node_conninfo does not reach this server, so this node does not join yet: %s",
							  felix_conn_last_error()));
		return;
	}
	felix_node_note(me, my_conninfo);
	unable = agent_unable_list(&nunable);
	ends = agent_held_ends(&nends, &ends_moved);

	beats++;
	if (!worker_cp_connect(&cp))
	{
		felix_count(FELIX_CTR_HEARTBEATS_FAILED, 1);
		failed_in_a_row++;
		note_store(false, false, beats);
		return;
	}

	/*
	 * The lease is anchored at t_send, read just before the request leaves
	 * (felix_cp_heartbeat): before the claim is written, so this node stops
	 * no later than the duty holder's wait allows, whatever the round trip
	 * costs.
	 */
	pgstat_report_activity(STATE_RUNNING, "felix: heartbeat");
	agent_rows_asked();
	felix_count(FELIX_CTR_HEARTBEATS_SENT, 1);
	elevel = worker_cp_elevel(&cp);
	ends_same = agent_ends_unchanged(ends, nends);

	/*
	 * Under load every copy's end moves at every beat, and giving them all
	 * (the ends key of every node rewritten five times a second, decoded by
	 * every reader of the state) cost so much that the leases of a loaded
	 * node lapsed.  Ends still moving are given every HB_ENDS_EVERY beats;
	 * a beat in between gives none, which the control plane counts as no
	 * read of them (ends_beat stays, cp_heartbeat.c), so nothing is taken
	 * for fresher than it is.  They are given at once when they stopped
	 * moving (after a leader is lost: the duty holder waits for them), at
	 * the first beat, and after an answer that brought rows (a grant's
	 * first claim compares them).
	 */
	give_ends = !ends_same &&
		(!ends_moved || ends_given_at == 0 || rows_came || beats - ends_given_at >= HB_ENDS_EVERY);
	if (!felix_cp_heartbeat(&cp.session, unable, nunable, give_ends ? ends : NULL,
							give_ends ? nends : 0, ends_same,
							felix_nodes_probes_json(), agent_known(), NULL, &t_send,
							&shards, &nrows, &answer, elevel))
	{
		pgstat_report_activity(STATE_IDLE, NULL);
		note_store(false, true, beats);
		if (strcmp(felix_cp_last_sqlstate(), "55F06") == 0)
		{
			/* an older copy of this data directory: it becomes a new one */
			felix_incarnation_renew();
			shard_mark_stale_copies();
			agent_forget();
		}
		else if (strcmp(felix_cp_last_sqlstate(), "42710") == 0 &&
				 (beats - clash_noted_beat) * felix_heartbeat_interval >= HB_CLASH_NOTE_MS)
		{
			/* another server holds this node's name: let it (and everyone) know */
			clash_noted_beat = beats;
			(void) felix_cp_name_clash(&cp.session, DEBUG1);
		}
		worker_cp_failed(&cp, elevel);
		felix_count(FELIX_CTR_HEARTBEATS_FAILED, 1);
		failed_in_a_row++;
		ends_given_at = 0;
		return;
	}
	pgstat_report_activity(STATE_IDLE, NULL);
	note_store(true, true, beats);
	/*
	 * What this node has seen of the store, kept for its next start.  A
	 * full or failing disk must not stop the heartbeats that renew this
	 * node's leases (TAP 010: the worker exited at every try and every
	 * lease here lapsed): warned once, then written again every second
	 * until it lands.  Until then a restart compares an older revision.
	 */
	if (felix_monotonic_ns() - store_seen_written_ns >= HB_STORE_SEEN_WRITE_NS)
	{
		if (!felix_store_seen_persist(store_seen_failing ? DEBUG1 : WARNING))
			store_seen_failing = true;
		else if (store_seen_failing)
		{
			store_seen_failing = false;
			ereport(LOG,
					(errmsg("felix heartbeat: what this node has seen of the control plane is written to its data directory again")));
		}
		store_seen_written_ns = felix_monotonic_ns();
	}
	answered_again = failed_in_a_row > 0 || beats == 1;
	if (failed_in_a_row > 0)
		ereport(LOG,
				(errmsg("felix heartbeat: the control plane answers again after %d failed heartbeat%s",
						failed_in_a_row, failed_in_a_row == 1 ? "" : "s")));
	failed_in_a_row = 0;
	cp.logged_ns = 0;

	agent_ends_sent(give_ends ? ends : NULL, nends, ends_same, &answer);
	if (give_ends)
		ends_given_at = beats;
	rows = agent_take_answer(shards, nrows, &answer, t_send, &napply);
	rows_came = nrows > 0;
	agent_note_leaders(rows, napply);
	/*
	 * The next heartbeat must come before the leases this one renewed run
	 * out (t_send + lease - epsilon): costly work beyond the budget (a
	 * failover's new leads, a stream's creation) waits for it.
	 */
	agent_apply(rows, napply, felix_monotonic_ns() + apply_budget_ns());
	agent_note_served(rows, napply);
	agent_note_held(rows, napply);

	if (beats % HB_LISTS_EVERY == 0 || answered_again)
		refresh_lists();
}

/* ---------------------------------------------------------------------
 * The worker
 * ---------------------------------------------------------------------
 */

/*
 * What this node's last call to the control plane saw of its store: the
 * endpoint that answered, the etcd leader (asked every 25 beats), the last
 * failure.
 */
static void
note_store(bool ok, bool called, int64 beat_no)
{
	char		store[320];
	const char *error;

	if (felix_store_is_etcd())
	{
		const FelixStoreHealth *h;

		if (beat_no % 25 == 0)
			(void) felix_store_etcd_status(DEBUG1);
		h = felix_store_health();
		snprintf(store, sizeof(store), "etcd %s%s%s", h->endpoint,
				 h->leader[0] ? ", leader " : "", h->leader);
		error = ok ? "" : (h->last_error[0] ? h->last_error : felix_cp_last_error());
	}
	else
	{
		snprintf(store, sizeof(store), "embedded %s",
				 felix_cp_embedded() ? "(this node)" :
				 felix_conninfo_mask(felix_control_conninfo));
		error = ok ? "" : felix_cp_last_error();
	}
	/* a failure to connect has no SQLSTATE of its own: never an old one */
	felix_store_view_note(ok, store, error, ok || !called ? "" : felix_cp_last_sqlstate());
}

/*
 * felix.heartbeat_now(): heartbeat at once instead of at the next
 * interval.  A node handing a shard over calls it on the node taking it,
 * which then takes its new lease without waiting out an interval.
 */
PG_FUNCTION_INFO_V1(felix_heartbeat_now);
Datum
felix_heartbeat_now(PG_FUNCTION_ARGS)
{
	felix_require_preload();
	felix_require_replication_role("felix.heartbeat_now");
	felix_wake(FELIX_WORKER_HEARTBEAT);
	PG_RETURN_VOID();
}

void
felix_heartbeat_worker_register(void)
{
	felix_register_worker("felix_heartbeat_worker_main", "felix heartbeat", 1);
}

void
felix_heartbeat_worker_main(Datum arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	felix_worker_pin_search_path();
	pgstat_report_appname(HB_APPNAME);

	cycle_cxt = AllocSetContextCreate(TopMemoryContext, "felix heartbeat cycle",
									  ALLOCSET_DEFAULT_SIZES);
	agent_init();
	cp_snapshot_cache_enable();

	felix_wake_register(FELIX_WORKER_HEARTBEAT);
	woken_early = false;
	ereport(LOG,
			(errmsg("felix heartbeat worker started: node \"%s\" in database \"%s\", control plane %s",
					felix_node_name_resolved(), felix_database,
					felix_store_is_etcd() ? psprintf("in etcd (%s)", felix_etcd_endpoints) :
					felix_cp_embedded() ? "embedded (this node)" :
					felix_conninfo_mask(felix_control_conninfo))));

	for (;;)
	{
		int64		started = felix_monotonic_ns();
		int64		next_beat;
		bool		early;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		MemoryContextReset(cycle_cxt);
		/* the last beat's snapshots went with it */
		cp_snapshot_quiesce();
		MemoryContextSwitchTo(cycle_cxt);
		heartbeat_once();
		MemoryContextSwitchTo(TopMemoryContext);

		/*
		 * Beat at a steady interval, however long this one took.  A wake of
		 * the latch (felix.heartbeat_now, the duty worker's grant to this
		 * node) beats at once, and so does a grant notified on the
		 * control-plane session -- once per interval, so that wakes sent
		 * there by anyone else cost at most twice the usual beats.
		 */
		next_beat = started + (int64) felix_heartbeat_interval * 1000000;
		early = false;
		for (;;)
		{
			int64		now = felix_monotonic_ns();
			pgsocket	sock;
			int			rc;

			if (cp.open && !woken_early && felix_cp_woken(&cp.session, felix_node_name_resolved()))
			{
				woken_early = early = true;
				break;
			}
			if (cp.open && !felix_cp_usable(&cp.session))
				worker_cp_failed(&cp, worker_cp_elevel(&cp));
			if (next_beat <= now)
				break;
			/* only now: a session found broken above is closed, its socket with it */
			sock = cp.open ? felix_cp_socket(&cp.session) : PGINVALID_SOCKET;
			rc = WaitLatchOrSocket(MyLatch,
								   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH |
								   (sock != PGINVALID_SOCKET && !woken_early ? WL_SOCKET_READABLE : 0),
								   sock, (long) ((next_beat - now + 999999) / 1000000),
								   PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
			if (rc & WL_LATCH_SET)
				break;
		}
		if (!early)
			woken_early = false;
	}
}
