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
 *	  2. applies each returned row to the local shard in its own
 *		 subtransaction (one bad shard cannot stop the rest): the stream is
 *		 looked up, the shard acquired and lease_apply_assignment() told
 *		 what the control plane said, with the lease anchored at t_send --
 *		 the instant the heartbeat was sent, before its claim was written,
 *		 so the round trip comes out of this node's lease and never out of
 *		 the duty holder's safety margin;
 *	  3. creates the tables of streams the control plane lists but this
 *		 node does not have yet (felix_stream_create_local), after the
 *		 leases of existing streams were applied and with lock_timeout set,
 *		 so a user's long transaction can delay a new stream's table but
 *		 never a lease renewal;
 *	  4. takes part in the control-plane duties (felix_cp_duty_tick):
 *		 failure detection and promotion, run by exactly one node at a
 *		 time (control/cp_duty.c), unless felix.control_plane_duties is off;
 *	  5. keeps the node directory (control/nodes.c) current: each shard's
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
 *	  A node joins once CREATE EXTENSION felix has run in felix.database;
 *	  until then the worker waits without contacting the control plane.
 *	  A stream dropped at the control plane keeps its table here while its
 *	  name stays unused (its rows simply stop arriving); once the name is
 *	  used again, the control plane's rows name another creation of it, and
 *	  the old one is dropped here before the new one is created.
 *
 * Locking rule: holds AccessShareLock on a stream's table while applying
 * an assignment to one of its shards, taken conditionally: a stream being
 * dropped or altered is skipped until the next heartbeat rather than
 * waited for.  The shard's own locks are taken inside shard.c; the node
 * directory's inside nodes.c.  Never waits on the network inside a
 * transaction.  Sleeps on its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>

#include "libpq-fe.h"

#include "access/xact.h"
#include "api/catalog.h"
#include "api/stream.h"
#include "common/hashfn.h"
#include "control/client.h"
#include "control/cpcall.h"
#include "control/store.h"
#include "storage/spin.h"
#include "control/conninfo.h"
#include "control/halts.h"
#include "control/nodes.h"
#include "executor/spi.h"
#include "felix.h"
#include "isolate.h"
#include "metrics.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "privilege.h"
#include "replication/lease.h"
#include "storage/incarnation.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/shard.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "worker/heartbeat.h"

PGDLLEXPORT void felix_heartbeat_worker_main(Datum arg);

#define HB_APPNAME			"felix heartbeat"
#define HB_PURPOSE			"the felix control plane"
/* At most one line per this interval for a repeating failure. */
#define HB_LOG_INTERVAL_NS	(INT64CONST(5) * 1000000000)
/* How often a failed check of felix.node_conninfo is tried again. */
#define HB_SELF_CHECK_NS	(INT64CONST(1) * 1000000000)
/* How often a server refused its node name tells the control plane so. */
#define HB_CLASH_NOTE_MS	2000
/* A stream's creation may fail quietly for this long (a race, see below). */
#define HB_CREATE_GRACE_NS	(INT64CONST(2) * 1000000000)

/* One assignment as the control plane returned it, and what became of it here. */
typedef struct HbRow
{
	FelixCpShard c;
	bool		missing;		/* the stream has no table here yet, or only
								 * one of an older creation (superseded) */
	bool		superseded;
	bool		created;		/* ... and this cycle created it */
	bool		applied;		/* the assignment reached the local shard */
	int			slot;			/* its local shard's slot if it names this
								 * node a replica, else -1 */
	FelixShardKey key;			/* ... and that shard */
} HbRow;

/* The worker's state; all of it is process-local. */
static FelixCpSession cp_session;
static bool cp_open = false;
static MemoryContext cycle_cxt = NULL;
static int64 last_failure_log_ns = 0;	/* 0: next failure logs */
static int	failed_in_a_row = 0;
static bool waiting_logged = false;
static HTAB *row_errors = NULL;
/* Shards whose assignment could not be applied here, and since when. */
static HTAB *unserved = NULL;
/*
 * The shards the control plane last named this node a replica of (leader
 * or follower), whose log ends the next heartbeat gives (held_ends); NULL:
 * none known yet.
 */
typedef struct HeldShard
{
	char		stream[NAMEDATALEN];
	int			shard;
	int			slot;
	FelixShardKey key;
} HeldShard;
static HeldShard *held = NULL;
static int	nheld = 0;

/*
 * shard_streams_changes() just before this heartbeat's rows were asked
 * for.  A stream drop commits its control-plane change first and its local
 * one second, and a creation that rolls back undoes its control-plane
 * registration as it aborts, so rows fetched before either finished may
 * still list a stream that has gone here: a missing stream is created only
 * if no stream has gone since the rows were fetched.  Likewise a stream
 * created here registers at the control plane before its table commits,
 * so rows fetched before it may name an older creation of that name: a
 * stream here is taken for one the control plane replaced only if no
 * stream has come or gone since the rows were fetched.
 */
static uint64 changes_before_rows = 0;

/* ---------------------------------------------------------------------
 * Rate-limited reporting
 * ---------------------------------------------------------------------
 */

/* LOG if a control-plane failure may be logged now, else DEBUG1. */
static int
failure_elevel(void)
{
	if (last_failure_log_ns == 0 ||
		felix_monotonic_ns() - last_failure_log_ns >= HB_LOG_INTERVAL_NS)
		return LOG;
	return DEBUG1;
}

static void
failure_reported(int elevel)
{
	if (elevel >= LOG)
		last_failure_log_ns = felix_monotonic_ns();
}

typedef struct RowErrorKey
{
	char		stream[NAMEDATALEN];
	int32		shard;			/* -1: the stream as a whole */
} RowErrorKey;

typedef struct RowErrorEntry
{
	RowErrorKey key;
	int64		last_ns;
	uint32		msg_hash;
} RowErrorEntry;

typedef struct UnservedEntry
{
	RowErrorKey key;
	int64		since_ns;
} UnservedEntry;

static void
row_error_key(RowErrorKey *key, const char *stream, int shard)
{
	memset(key, 0, sizeof(RowErrorKey));
	strlcpy(key->stream, stream, NAMEDATALEN);
	key->shard = shard;
}

/*
 * Log a shard's (or stream's) error unless the same one was logged for it
 * within the last few seconds: the same failure repeats every heartbeat.
 *
 * A stream's creation (shard -1) is allowed to fail once quietly: this
 * node may race the backend that created the stream here through
 * felix_create_stream (its table is uncommitted, or committed a moment
 * after we looked), which resolves by the next heartbeat.  A failure that
 * persists is logged.
 */
static void
report_row_error(const char *stream, int shard, ErrorData *edata, const char *what)
{
	RowErrorKey key;
	RowErrorEntry *e;
	bool		found;
	uint32		h = hash_bytes((const unsigned char *) (edata->message ? edata->message : ""),
							   edata->message ? strlen(edata->message) : 0);
	int64		now = felix_monotonic_ns();

	row_error_key(&key, stream, shard);
	e = hash_search(row_errors, &key, HASH_ENTER, &found);
	if (!found && shard < 0)
	{
		/* First failure of a creation: remember it, say nothing yet. */
		e->msg_hash = 0;
		e->last_ns = now - HB_LOG_INTERVAL_NS + HB_CREATE_GRACE_NS;
		ereport(DEBUG1,
				(errmsg_internal("felix heartbeat: %s: %s", what,
								 edata->message ? edata->message : "")));
		return;
	}
	if (found && (e->msg_hash == h || e->msg_hash == 0) &&
		now - e->last_ns < HB_LOG_INTERVAL_NS)
		return;
	e->msg_hash = h;
	e->last_ns = now;

	edata->elevel = LOG;
	edata->context = edata->context ?
		psprintf("%s\n%s", edata->context, what) : pstrdup(what);
	ThrowErrorData(edata);
}

static void
row_error_cleared(const char *stream, int shard)
{
	RowErrorKey key;

	row_error_key(&key, stream, shard);
	(void) hash_search(row_errors, &key, HASH_REMOVE, NULL);
}

/* ---------------------------------------------------------------------
 * Talking to the control plane
 * ---------------------------------------------------------------------
 */

static bool
cp_connect(void)
{
	int			elevel;

	if (cp_open && felix_cp_usable(&cp_session))
		return true;
	if (cp_open)
		felix_cp_close(&cp_session);
	elevel = failure_elevel();
	cp_open = felix_cp_open(&cp_session, HB_APPNAME,
							Max(2 * felix_heartbeat_interval, 1000), elevel);
	if (!cp_open)
		failure_reported(elevel);
	return cp_open;
}

/* After a failed call: log it (rate-limited) and drop a broken session. */
static void
cp_failed(int elevel)
{
	failure_reported(elevel);
	if (cp_open && !felix_cp_usable(&cp_session))
	{
		felix_cp_close(&cp_session);
		cp_open = false;
	}
}

/* ---------------------------------------------------------------------
 * Applying rows
 * ---------------------------------------------------------------------
 */

/* Refuse a consistency this node does not know: never default it. */
static FelixConsistency
row_consistency(const HbRow *r)
{
	if (strcmp(r->c.consistency, "leader") == 0)
		return FELIX_CONSISTENCY_LEADER;
	if (strcmp(r->c.consistency, "quorum") == 0)
		return FELIX_CONSISTENCY_QUORUM;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("stream \"%s\": the control plane sent consistency \"%s\", which this node does not recognise",
					r->c.stream, r->c.consistency),
			 errdetail("The stream is not served here rather than served at a weaker guarantee."),
			 errhint("Run the same felix version on every node and on the control plane.")));
	return FELIX_CONSISTENCY_LEADER;	/* keep compiler quiet */
}

static void
refuse_bad_row(const HbRow *r)
{
	if (r->c.bad != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("stream \"%s\" shard %d: unusable assignment from the control plane: %s",
						r->c.stream, r->c.shard, r->c.bad),
				 errhint("Run the same felix version on every node and on the control plane.")));
}

/* Is this node in the assignment's replica set (or joining it)? */
static bool
holds_copy(const FelixAssignment *a)
{
	if (felix_is_this_node(a->leader) ||
		(a->joining[0] != '\0' && felix_is_this_node(a->joining)))
		return true;
	for (int i = 0; i < a->nreplicas; i++)
		if (felix_is_this_node(a->replicas[i]))
			return true;
	return false;
}

/* Apply one assignment to its local shard (inside a subtransaction). */
static void
apply_row_guts(void *arg)
{
	HbRow	   *r = arg;
	const FelixStream *found;
	FelixStream stream;
	FelixConsistency consistency;
	FelixShard *s;

	refuse_bad_row(r);
	consistency = row_consistency(r);
	found = felix_stream_by_name(r->c.stream);
	stream = *found;

	if (strcmp(stream.creation_id, r->c.creation_id) != 0)
	{
		/* an older creation: replaced with the streams to create */
		r->superseded = true;
		return;
	}
	if (stream.shards != r->c.shards ||
		stream.replication_factor != r->c.replication_factor ||
		stream.consistency != consistency)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" here differs from the control plane's: "
						"%d shards, replication_factor %d, consistency %s here; "
						"%d, %d, %s there",
						r->c.stream, stream.shards, stream.replication_factor,
						stream.consistency == FELIX_CONSISTENCY_QUORUM ? "quorum" : "leader",
						r->c.shards, r->c.replication_factor, r->c.consistency),
				 errdetail("The local stream was not created through the control plane."),
				 errhint("Drop the local stream \"%s\" (felix_drop_stream) to let this node "
						 "recreate it as the cluster defines it, or rename one of the two.",
						 r->c.stream)));

	/* Never wait for a user's lock: the next heartbeat comes soon. */
	if (!ConditionalLockRelationOid(stream.relid, AccessShareLock))
	{
		ereport(DEBUG1,
				(errmsg_internal("felix heartbeat: stream \"%s\" is locked; shard %d skipped this time",
								 r->c.stream, r->c.shard)));
		return;
	}
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(stream.relid)))
		return;					/* dropped meanwhile */

	s = felix_stream_shard(&stream, r->c.shard);
	lease_apply_assignment(s, &r->c.a);
	r->applied = true;
	if (holds_copy(&r->c.a))
	{
		r->slot = shard_slot_index(s);
		r->key = s->key;
	}
}

/*
 * The creating backend's half of felix_create_stream: one heartbeat of its
 * own, whose rows for the new stream are applied at once, so the stream is
 * led (and, on this node, writable) when the call returns rather than at
 * the worker's next heartbeat.  The lease is anchored at this heartbeat's
 * send time, exactly as the worker anchors its own; the worker's later
 * renewals only ever extend it.
 */
/* Note each shard's leader and its address in the node directory. */
static void
note_leaders(HbRow *rows, int nrows)
{
	for (int i = 0; i < nrows; i++)
	{
		HbRow	   *r = &rows[i];

		if (r->c.bad == NULL && r->c.a.leader[0] != '\0' && r->c.leader_conninfo[0] != '\0')
			felix_node_note(r->c.a.leader, r->c.leader_conninfo);
	}
}

/* The heartbeat's shards as rows to apply. */
static HbRow *
wrap_rows(FelixCpShard *shards, int n)
{
	HbRow	   *rows = palloc0(sizeof(HbRow) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		rows[i].c = shards[i];
		rows[i].slot = -1;
	}
	return rows;
}

void
felix_heartbeat_apply_stream(const char *stream)
{
	FelixCpSession s;

	(void) felix_cp_open(&s, "felix", FELIX_CP_CALL_TIMEOUT_MS, ERROR);
	PG_TRY();
	{
		FelixCpShard *shards;
		int			n;
		int64		t_send;
		HbRow	   *rows;

		(void) felix_cp_heartbeat(&s, NULL, 0, NULL, 0, NULL, &t_send, &shards, &n, ERROR);
		rows = wrap_rows(shards, n);
		note_leaders(rows, n);
		for (int i = 0; i < n; i++)
			if (strcmp(rows[i].c.stream, stream) == 0)
				apply_row_guts(&rows[i]);
	}
	PG_FINALLY();
	{
		felix_cp_close(&s);
	}
	PG_END_TRY();
}

/* An empty set of stream names, in the current context. */
static HTAB *
name_set(const char *what, long size)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = NAMEDATALEN;
	ctl.hcxt = CurrentMemoryContext;
	return hash_create(what, size, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/* Names of the streams this database has (a set, in the current context). */
static HTAB *
local_stream_names(void)
{
	HTAB	   *names = name_set("felix heartbeat: local streams", 64);
	ListCell   *lc;

	/* Each call reads with a fresh snapshot. */
	foreach(lc, felix_stream_list())
		(void) hash_search(names, ((FelixStream *) lfirst(lc))->name, HASH_ENTER, NULL);
	return names;
}

static bool
name_in(HTAB *names, const char *name)
{
	char		key[NAMEDATALEN];

	memset(key, 0, sizeof(key));
	strlcpy(key, name, NAMEDATALEN);
	return hash_search(names, key, HASH_FIND, NULL) != NULL;
}

static void create_stream_guts(void *arg);

/*
 * The control plane lists another creation of a stream this node has: the
 * one here was dropped elsewhere and its name used again.  It goes here
 * too, with its records, as it went everywhere else, and the new one is
 * created in its place (inside a subtransaction).  Not while someone
 * holds the name, nor on rows that may predate a stream made here.
 */
static void
replace_stream_guts(void *arg)
{
	HbRow	   *r = arg;
	const FelixStream *found;

	if (shard_streams_changes() != changes_before_rows ||
		!felix_stream_lock_name(r->c.stream, false))
		return;
	found = felix_stream_by_name(r->c.stream);
	if (strcmp(found->creation_id, r->c.creation_id) == 0)
		return;
	ereport(LOG,
			(errmsg("felix heartbeat: dropping stream \"%s\" here: it was dropped elsewhere and created again",
					r->c.stream),
			 errdetail("Its creation id is %s here and %s at the control plane.",
					   found->creation_id, r->c.creation_id)));
	felix_stream_drop_superseded(found);
	create_stream_guts(r);
}

/* Create a stream the control plane lists (inside a subtransaction). */
static void
create_stream_guts(void *arg)
{
	HbRow	   *r = arg;

	/*
	 * A backend creating or dropping this very stream holds the name until
	 * it commits or aborts: the backend makes (or removed) the table.
	 * Holding the name ourselves, the facts below cannot change under us:
	 * the table is looked for with a fresh snapshot, and a stream gone
	 * since the rows were fetched means they may be stale (the next
	 * heartbeat's rows will say).
	 */
	if (!felix_stream_lock_name(r->c.stream, false))
		return;
	if (shard_streams_changes() != changes_before_rows ||
		name_in(local_stream_names(), r->c.stream))
		return;
	refuse_bad_row(r);
	(void) row_consistency(r);
	{
		FelixStreamSettings st;

		memset(&st, 0, sizeof(st));
		st.shards = r->c.shards;
		st.replication_factor = r->c.replication_factor;
		st.consistency = r->c.consistency;
		st.storage = "local";
		st.retention_bytes = Max(r->c.retention_bytes, 0);
		st.retention = r->c.has_retention ? &r->c.retention : NULL;
		(void) felix_stream_create_local(r->c.stream, r->c.schema, r->c.creation_id,
										 r->c.payload_type, &st);
	}
	ereport(LOG,
			(errmsg("felix heartbeat: created stream \"%s\" (%d shards, replication_factor %d, %s) as the control plane defines it",
					r->c.stream, r->c.shards, r->c.replication_factor, r->c.consistency)));
}

/*
 * Run fn(r) in a subtransaction: an error is logged (rate-limited per
 * stream and shard) and rolled back, and the caller goes on.
 */
static bool
run_isolated(void (*fn) (void *), HbRow *r, int key_shard, const char *what)
{
	ErrorData  *edata = felix_run_isolated(fn, r);

	if (edata != NULL)
	{
		report_row_error(r->c.stream, key_shard, edata, what);
		FreeErrorData(edata);
		return false;
	}
	row_error_cleared(r->c.stream, key_shard);
	return true;
}

static void
begin_work(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

static void
end_work(void)
{
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(cycle_cxt);
}

/*
 * Apply every row: first the shards of streams that exist here (lease
 * renewals must not wait behind a table creation), then create the missing
 * streams, then apply their rows, each step in its own transaction.
 */
static void
apply_rows(HbRow *rows, int nrows)
{
	int			nmissing = 0;
	int			ncreated = 0;

	begin_work("felix: applying the control plane's assignments");
	{
		HTAB	   *local = local_stream_names();

		for (int i = 0; i < nrows; i++)
		{
			HbRow	   *r = &rows[i];

			CHECK_FOR_INTERRUPTS();
			if (r->c.bad == NULL && !name_in(local, r->c.stream))
			{
				r->missing = true;
				nmissing++;
				continue;
			}
			(void) run_isolated(apply_row_guts, r, r->c.shard,
								psprintf("applying the control plane's assignment of stream \"%s\" shard %d",
										 r->c.stream, r->c.shard));
			if (r->superseded)
			{
				r->missing = true;
				nmissing++;
			}
		}
	}
	end_work();

	if (nmissing == 0)
		return;

	begin_work("felix: creating streams defined at the control plane");
	{
		char		timeout[32];
		HTAB	   *tried;

		/* A user's lock on the schema delays a creation, not the worker. */
		snprintf(timeout, sizeof(timeout), "%d", Max(felix_heartbeat_interval, 100));
		(void) set_config_option("lock_timeout", timeout, PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);

		tried = name_set("felix heartbeat: created streams", 16);

		for (int i = 0; i < nrows; i++)
		{
			HbRow	   *r = &rows[i];
			char		key[NAMEDATALEN];
			bool		found;

			if (!r->missing)
				continue;
			CHECK_FOR_INTERRUPTS();
			memset(key, 0, sizeof(key));
			strlcpy(key, r->c.stream, NAMEDATALEN);
			(void) hash_search(tried, key, HASH_ENTER, &found);
			if (found)
				continue;
			if (run_isolated(r->superseded ? replace_stream_guts : create_stream_guts, r, -1,
							 psprintf("creating stream \"%s\" as the control plane defines it",
									  r->c.stream)))
			{
				ncreated++;
				for (int k = i; k < nrows; k++)
					if (rows[k].missing && strcmp(rows[k].c.stream, r->c.stream) == 0)
						rows[k].created = true;
			}
		}
	}
	end_work();

	if (ncreated == 0)
		return;

	begin_work("felix: applying the control plane's assignments");
	for (int i = 0; i < nrows; i++)
	{
		HbRow	   *r = &rows[i];

		if (!r->created)
			continue;
		CHECK_FOR_INTERRUPTS();
		(void) run_isolated(apply_row_guts, r, r->c.shard,
							psprintf("applying the control plane's assignment of stream \"%s\" shard %d",
									 r->c.stream, r->c.shard));
	}
	end_work();
}

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
 * shows it from there.  Every heartbeat, so the view is never more than
 * one interval behind the control plane.
 */
static void
refresh_directory(void)
{
	static TimestampTz clash_logged = 0;
	FelixNodeInfo *nodes;
	int			n;
	int			elevel = failure_elevel();

	if (!felix_cp_nodes(&cp_session, &nodes, &n, elevel))
	{
		cp_failed(elevel);
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
 * Remember which shards' assignments reached their local shard this time
 * (see unable_list).  Rows of streams this node has no table for, or that
 * it cannot read, say nothing about serving.
 */
static void
note_served(HbRow *rows, int nrows)
{
	int64		now = felix_monotonic_ns();

	for (int i = 0; i < nrows; i++)
	{
		HbRow	   *r = &rows[i];
		RowErrorKey key;
		UnservedEntry *e;
		bool		found;

		if (r->c.bad != NULL || (r->missing && !r->created))
			continue;
		row_error_key(&key, r->c.stream, r->c.shard);
		if (r->applied)
		{
			(void) hash_search(unserved, &key, HASH_REMOVE, NULL);
			continue;
		}
		e = hash_search(unserved, &key, HASH_ENTER, &found);
		if (!found)
			e->since_ns = now;
	}
}

/* Remember the shards this heartbeat named this node a replica of. */
static void
note_held(HbRow *rows, int nrows)
{
	if (held)
		pfree(held);
	held = MemoryContextAllocZero(TopMemoryContext, sizeof(HeldShard) * (nrows + 1));
	nheld = 0;
	for (int i = 0; i < nrows; i++)
	{
		if (rows[i].slot < 0)
			continue;
		strlcpy(held[nheld].stream, rows[i].c.stream, NAMEDATALEN);
		held[nheld].shard = rows[i].c.shard;
		held[nheld].slot = rows[i].slot;
		held[nheld].key = rows[i].key;
		nheld++;
	}
}

/*
 * The durable log ends, now, of the shards this node was last named a
 * replica of ("stream/shard=end"), for the heartbeat to give; NULL before
 * the first heartbeat of this boot has named any.  The duty holder gives
 * a lapsed leader its shard back, and promotes a follower, only if its log
 * still ends at or after what the reports say it held: a node whose felix
 * directory was put back from an older copy (same identity, fewer records)
 * does not lead.
 */
static char **
held_ends(int *n)
{
	char	  **out;

	*n = 0;
	if (held == NULL)
		return NULL;
	out = palloc0(sizeof(char *) * (nheld + 1));
	for (int i = 0; i < nheld; i++)
	{
		FelixShardPositions pos;

		shard_read_positions(shard_slot(held[i].slot), &pos);
		if (!pos.in_use || memcmp(&pos.key, &held[i].key, sizeof(FelixShardKey)) != 0)
			continue;			/* forgotten or reused since */
		if (pos.phase != FELIX_SHARD_OPEN)
			continue;			/* its positions are not its disk's (a failed discard) */
		out[(*n)++] = psprintf("%s/%d=" UINT64_FORMAT, held[i].stream, held[i].shard,
							   pos.flushed_end);
	}
	return out;
}

/*
 * The shards this node cannot serve ("stream/shard")
 * for felix.cp_heartbeat: those whose assignment has failed to reach the
 * local shard (damaged, the table locked, ...) for a whole lease.  The
 * control plane renews no lease of theirs here and counts this node out
 * of their promotions, so a shard this node leads but cannot serve fails
 * over instead of holding a lease nobody can use.
 */
static char **
unable_list(int *n)
{
	HASH_SEQ_STATUS seq;
	UnservedEntry *e;
	int64		now = felix_monotonic_ns();
	char	  **out = palloc0(sizeof(char *) * (hash_get_num_entries(unserved) + 1));

	*n = 0;
	hash_seq_init(&seq, unserved);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (now - e->since_ns < (int64) felix_lease_duration * 1000000)
			continue;
		out[(*n)++] = psprintf("%s/%d", e->key.stream, e->key.shard);
	}
	return out;
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
	int			elevel = failure_elevel();

	if (felix_cp_halted(&cp_session, &halts, &n, elevel))
		felix_halts_listed(halts, n);
	else
		cp_failed(elevel);
}

static void note_store(bool ok, bool called, int64 beat_no);
static void note_blocked(const char *why);

static void
heartbeat_once(void)
{
	static int64 beats = 0;
	static int64 clash_noted_beat = -1000000;
	const char *me = felix_node_name_resolved();
	/* only where this node is: its credentials never leave it */
	const char *my_conninfo = felix_conninfo_address(felix_node_conninfo_resolved());
	int64		t_send;
	FelixCpShard *shards;
	HbRow	   *rows;
	int			nrows;
	int			nunable;
	char	  **unable;
	int			nends;
	char	  **ends;
	int			elevel;
	int			promoted;

	if (!local_extension_ready())
		return;
	if (!own_conninfo_ok())
	{
		note_blocked(felix_conninfo_verified() < 0 ?
					 "felix.node_conninfo reaches another felix node, not this server, so this node does not join "
					 "(the server log names it): set felix.node_conninfo to this server's own address and restart" :
					 psprintf("felix.node_conninfo does not reach this server, so this node does not join yet: %s",
							  felix_conn_last_error()));
		return;
	}
	felix_node_note(me, my_conninfo);
	unable = unable_list(&nunable);
	ends = held_ends(&nends);

	beats++;
	if (!cp_connect())
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
	changes_before_rows = shard_streams_changes();
	felix_count(FELIX_CTR_HEARTBEATS_SENT, 1);
	elevel = failure_elevel();
	if (!felix_cp_heartbeat(&cp_session, unable, nunable, ends, nends,
							felix_nodes_probes_json(), &t_send,
							&shards, &nrows, elevel))
	{
		pgstat_report_activity(STATE_IDLE, NULL);
		note_store(false, true, beats);
		if (strcmp(felix_cp_last_sqlstate(), "55F06") == 0)
		{
			/* an older copy of this data directory: it becomes a new one */
			felix_incarnation_renew();
			shard_mark_stale_copies();
		}
		else if (strcmp(felix_cp_last_sqlstate(), "42710") == 0 &&
				 (beats - clash_noted_beat) * felix_heartbeat_interval >= HB_CLASH_NOTE_MS)
		{
			/* another server holds this node's name: let it (and everyone) know */
			clash_noted_beat = beats;
			(void) felix_cp_name_clash(&cp_session, DEBUG1);
		}
		cp_failed(elevel);
		felix_count(FELIX_CTR_HEARTBEATS_FAILED, 1);
		failed_in_a_row++;
		return;
	}
	pgstat_report_activity(STATE_IDLE, NULL);
	note_store(true, true, beats);
	if (failed_in_a_row > 0)
		ereport(LOG,
				(errmsg("felix heartbeat: the control plane answers again after %d failed heartbeat%s",
						failed_in_a_row, failed_in_a_row == 1 ? "" : "s")));
	failed_in_a_row = 0;
	last_failure_log_ns = 0;

	rows = wrap_rows(shards, nrows);
	note_leaders(rows, nrows);
	apply_rows(rows, nrows);
	note_served(rows, nrows);
	note_held(rows, nrows);

	/*
	 * The duties, if this node holds them or may take them over.  A node
	 * with felix.control_plane_duties off does not take part: if it held
	 * them, its refreshes stop and another node takes over.
	 */
	if (felix_control_plane_duties)
	{
		pgstat_report_activity(STATE_RUNNING, "felix: control-plane duties");
		elevel = failure_elevel();
		promoted = felix_cp_duty_tick(&cp_session, elevel);
		pgstat_report_activity(STATE_IDLE, NULL);
		if (promoted > 0)
			ereport(LOG,
					(errmsg("felix control plane: %d promotion%s in this tick",
							promoted, promoted == 1 ? "" : "s")));
		if (!felix_cp_usable(&cp_session))
			cp_failed(elevel);
	}

	if (cp_open)
		refresh_directory();
	if (cp_open)
		refresh_halts();
}

/* ---------------------------------------------------------------------
 * The worker
 * ---------------------------------------------------------------------
 */

/*
 * The worker's latch, while it runs, and the control-plane store as it
 * last saw it (felix_nodes shows this on the row of this node).
 */
typedef struct FelixHeartbeatShared
{
	Latch	   *volatile latch;
	slock_t		mutex;			/* protects the store fields */
	FelixStoreView store;
} FelixHeartbeatShared;

static FelixHeartbeatShared *hb_shared = NULL;

Size
felix_heartbeat_shmem_size(void)
{
	return MAXALIGN(sizeof(FelixHeartbeatShared));
}

void
felix_heartbeat_shmem_init(void)
{
	bool		found;

	hb_shared = ShmemInitStruct("felix heartbeat", sizeof(FelixHeartbeatShared), &found);
	if (!found)
	{
		hb_shared->latch = NULL;
		SpinLockInit(&hb_shared->mutex);
		memset(&hb_shared->store, 0, sizeof(FelixStoreView));
	}
}

void
felix_heartbeat_store_view(FelixStoreView *out)
{
	memset(out, 0, sizeof(*out));
	if (hb_shared == NULL)
		return;
	SpinLockAcquire(&hb_shared->mutex);
	*out = hb_shared->store;
	SpinLockRelease(&hb_shared->mutex);
}

/*
 * What this node's last call to the control plane saw of its store: the
 * endpoint that answered, the etcd leader (asked every 25 beats), the last
 * failure.
 */
static void
note_store(bool ok, bool called, int64 beat_no)
{
	FelixStoreView v;
	TimestampTz now = GetCurrentTimestamp();

	memset(&v, 0, sizeof(v));
	if (felix_store_is_etcd())
	{
		const FelixStoreHealth *h;

		if (beat_no % 25 == 0)
			(void) felix_store_etcd_status(DEBUG1);
		h = felix_store_health();
		snprintf(v.store, sizeof(v.store), "etcd %s%s%s", h->endpoint,
				 h->leader[0] ? ", leader " : "", h->leader);
		strlcpy(v.error, ok ? "" : (h->last_error[0] ? h->last_error : felix_cp_last_error()),
				sizeof(v.error));
	}
	else
	{
		snprintf(v.store, sizeof(v.store), "embedded %s",
				 felix_cp_embedded() ? "(this node)" :
				 felix_conninfo_mask(felix_control_conninfo));
		strlcpy(v.error, ok ? "" : felix_cp_last_error(), sizeof(v.error));
	}
	v.ok = ok;
	/* a failure to connect has no SQLSTATE of its own: never an old one */
	strlcpy(v.sqlstate, ok || !called ? "" : felix_cp_last_sqlstate(), sizeof(v.sqlstate));
	SpinLockAcquire(&hb_shared->mutex);
	v.ok_at = ok ? now : hb_shared->store.ok_at;
	v.failing_since = ok ? 0 :
		hb_shared->store.failing_since != 0 ? hb_shared->store.failing_since : now;
	hb_shared->store = v;
	SpinLockRelease(&hb_shared->mutex);
}

/* This node does not call the control plane at all: why, for felix_nodes. */
static void
note_blocked(const char *why)
{
	TimestampTz now = GetCurrentTimestamp();

	SpinLockAcquire(&hb_shared->mutex);
	hb_shared->store.ok = false;
	hb_shared->store.sqlstate[0] = '\0';
	strlcpy(hb_shared->store.error, why, sizeof(hb_shared->store.error));
	if (hb_shared->store.failing_since == 0)
		hb_shared->store.failing_since = now;
	SpinLockRelease(&hb_shared->mutex);
}

void
felix_heartbeat_wake(void)
{
	Latch	   *latch = hb_shared != NULL ? hb_shared->latch : NULL;

	if (latch != NULL)
		SetLatch(latch);
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
	felix_heartbeat_wake();
	PG_RETURN_VOID();
}

static void
heartbeat_worker_exit(int code, Datum arg)
{
	hb_shared->latch = NULL;
}

void
felix_heartbeat_worker_register(void)
{
	felix_register_worker("felix_heartbeat_worker_main", "felix heartbeat", 1);
}

void
felix_heartbeat_worker_main(Datum arg)
{
	HASHCTL		ctl;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	felix_worker_pin_search_path();
	pgstat_report_appname(HB_APPNAME);

	cycle_cxt = AllocSetContextCreate(TopMemoryContext, "felix heartbeat cycle",
									  ALLOCSET_DEFAULT_SIZES);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(RowErrorKey);
	ctl.entrysize = sizeof(RowErrorEntry);
	row_errors = hash_create("felix heartbeat: reported errors", 64, &ctl,
							 HASH_ELEM | HASH_BLOBS);
	ctl.entrysize = sizeof(UnservedEntry);
	unserved = hash_create("felix heartbeat: shards not served", 64, &ctl,
						   HASH_ELEM | HASH_BLOBS);

	hb_shared->latch = MyLatch;
	before_shmem_exit(heartbeat_worker_exit, (Datum) 0);
	ereport(LOG,
			(errmsg("felix heartbeat worker started: node \"%s\" in database \"%s\", control plane %s",
					felix_node_name_resolved(), felix_database,
					felix_store_is_etcd() ? psprintf("in etcd (%s)", felix_etcd_endpoints) :
					felix_cp_embedded() ? "embedded (this node)" :
					felix_conninfo_mask(felix_control_conninfo))));

	for (;;)
	{
		int64		started = felix_monotonic_ns();
		int64		next;
		long		wait_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		MemoryContextReset(cycle_cxt);
		MemoryContextSwitchTo(cycle_cxt);
		heartbeat_once();
		MemoryContextSwitchTo(TopMemoryContext);

		/* Beat at a steady interval, however long this one took. */
		next = started + (int64) felix_heartbeat_interval * 1000000;
		wait_ms = (long) ((next - felix_monotonic_ns() + 999999) / 1000000);
		if (wait_ms > 0)
		{
			(void) WaitLatch(MyLatch,
							 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 wait_ms, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
	}
}
