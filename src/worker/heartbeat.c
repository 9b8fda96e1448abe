/*-------------------------------------------------------------------------
 *
 * heartbeat.c
 *	  The node agent: background worker "felix heartbeat".  Every
 *	  felix.heartbeat_interval it
 *
 *	  1. reads the monotonic clock (t_send) and calls
 *		 felix.cp_heartbeat(node_name, node_conninfo) on the control plane
 *		 over the one libpq connection it keeps (control/client.c: non-
 *		 blocking, a deadline of two heartbeat intervals, reconnecting after
 *		 any failure).  The call registers the node, renews the leases it
 *		 holds, and returns every assignment of every stream;
 *	  2. applies each returned row to the local shard in its own
 *		 subtransaction (one bad shard cannot stop the rest): the stream is
 *		 looked up, the shard acquired and lease_apply_assignment() told
 *		 what the control plane said, with the lease anchored at t_send --
 *		 the instant the heartbeat was sent, which is at or before the
 *		 control plane's grant time, so the round trip comes out of this
 *		 node's lease and never out of the control plane's safety margin;
 *	  3. creates the tables of streams the control plane lists but this
 *		 node does not have yet (felix_stream_create_local), after the
 *		 leases of existing streams were applied and with lock_timeout set,
 *		 so a user's long transaction can delay a new stream's table but
 *		 never a lease renewal;
 *	  4. on the node hosting the control plane (felix_cp_embedded), runs
 *		 SELECT felix.cp_tick() on the same connection: failure detection
 *		 and promotion;
 *	  5. keeps the node directory (control/nodes.c) current: each shard's
 *		 leader and its conninfo from the rows, and the control plane's node
 *		 list (felix.cp_nodes()), with liveness, every heartbeat.
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
 *	  Streams dropped at the control plane are not dropped here (a later
 *	  issue); their rows simply stop arriving.
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
#include "commands/extension.h"
#include "common/hashfn.h"
#include "control/client.h"
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
/* A stream's creation may fail quietly for this long (a race, see below). */
#define HB_CREATE_GRACE_NS	(INT64CONST(2) * 1000000000)

/*
 * The heartbeat: every assignment, with its stream's definition.  The
 * retention interval travels as its three fields, so neither side's
 * IntervalStyle matters.
 */
#define HB_SQL \
	"SELECT stream, shard, generation, leader, leader_conninfo, replicas, " \
	"lease_granted, lease_ms, unplaced_reason, shards, replication_factor, " \
	"consistency, payload_type, retention_bytes, " \
	"((extract(year FROM retention) OPERATOR(pg_catalog.*) 12) " \
	"  OPERATOR(pg_catalog.+) extract(month FROM retention))::integer, " \
	"extract(day FROM retention)::integer, " \
	"((((extract(hour FROM retention) OPERATOR(pg_catalog.*) 3600) " \
	"    OPERATOR(pg_catalog.+) (extract(minute FROM retention) OPERATOR(pg_catalog.*) 60)) " \
	"   OPERATOR(pg_catalog.*) 1000000) " \
	"  OPERATOR(pg_catalog.+) extract(microseconds FROM retention))::bigint, " \
	"schema, creation_id, joining, leaving, leader_incarnation " \
	"FROM " FELIX_CP_HEARTBEAT_CALL
#define HB_NCOLS	22

/* One assignment as the control plane returned it. */
typedef struct HbRow
{
	char		stream[NAMEDATALEN];
	int			shard;
	FelixAssignment a;
	char	   *leader_conninfo;	/* untruncated, for the node directory */
	int			shards;
	int			replication_factor;
	char		consistency[NAMEDATALEN];
	char		payload_type[NAMEDATALEN];
	int64		retention_bytes;	/* 0: no limit */
	bool		has_retention;
	Interval	retention;
	char		schema[NAMEDATALEN];
	char		creation_id[FELIX_CREATION_ID_LEN];
	char	   *bad;			/* why the row is unusable, or NULL */
	bool		missing;		/* the stream has no table here yet */
	bool		created;		/* ... and this cycle created it */
	bool		applied;		/* the assignment reached the local shard */
} HbRow;

/* The worker's state; all of it is process-local. */
static PGconn *cp_conn = NULL;
static int	cp_conn_timeout = 0;	/* its statement_timeout, ms */
static MemoryContext cycle_cxt = NULL;
static int64 last_failure_log_ns = 0;	/* 0: next failure logs */
static int	failed_in_a_row = 0;
static bool waiting_logged = false;
static HTAB *row_errors = NULL;
/* Shards whose assignment could not be applied here, and since when. */
static HTAB *unserved = NULL;

/*
 * shard_streams_forgotten() just before this heartbeat's rows were asked
 * for.  A stream drop commits its control-plane change first and its local
 * one second, and a creation that rolls back undoes its control-plane
 * registration as it aborts, so rows fetched before either finished may
 * still list a stream that has gone here: a missing stream is created only
 * if no stream has gone since the rows were fetched.
 */
static uint64 drops_before_rows = 0;

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

/*
 * A usable connection to the control plane, or false (logged).  Its
 * statement_timeout is the heartbeat's deadline, so a call abandoned here
 * (a stalled control plane) is cancelled there too instead of piling up
 * one stuck session per heartbeat.
 */
static bool
cp_connect(void)
{
	int			elevel;
	int			timeout = Max(2 * felix_heartbeat_interval, 1000);

	if (felix_conn_usable(cp_conn) && cp_conn_timeout == 2 * felix_heartbeat_interval)
		return true;
	if (!felix_conn_usable(cp_conn))
	{
		felix_conn_close(cp_conn);
		cp_conn = NULL;
		elevel = failure_elevel();
		cp_conn = felix_conn_open(felix_cp_conninfo(), HB_PURPOSE, HB_APPNAME,
								  timeout, elevel);
		if (cp_conn == NULL)
		{
			failure_reported(elevel);
			return false;
		}
	}

	elevel = failure_elevel();
	if (!felix_conn_set_statement_timeout(cp_conn, 2 * felix_heartbeat_interval, elevel))
	{
		failure_reported(elevel);
		felix_conn_close(cp_conn);
		cp_conn = NULL;
		return false;
	}
	cp_conn_timeout = 2 * felix_heartbeat_interval;
	return true;
}

/* Run one call with a deadline of two heartbeat intervals; NULL: failed. */
static PGresult *
cp_exec(const char *fn, const char *sql, int nparams, const char *const *values)
{
	int			elevel = failure_elevel();
	PGresult   *res;

	res = felix_conn_exec(cp_conn, fn, sql, nparams, values,
						  2 * felix_heartbeat_interval, elevel);
	if (res == NULL)
	{
		failure_reported(elevel);
		if (!felix_conn_usable(cp_conn))
		{
			felix_conn_close(cp_conn);
			cp_conn = NULL;
		}
	}
	return res;
}

/* ---------------------------------------------------------------------
 * Reading the heartbeat's rows
 * ---------------------------------------------------------------------
 */
static bool
parse_int64(const char *s, int64 *out)
{
	char	   *end;
	long long	v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return false;
	*out = (int64) v;
	return true;
}

static bool
parse_int32(const char *s, int *out)
{
	int64		v;

	if (!parse_int64(s, &v) || v < PG_INT32_MIN || v > PG_INT32_MAX)
		return false;
	*out = (int) v;
	return true;
}

/* Copy a name; false when it does not fit a NAMEDATALEN buffer. */
static bool
copy_name(char *dst, const char *src)
{
	return strlcpy(dst, src, NAMEDATALEN) < NAMEDATALEN;
}

/*
 * Read a one-dimensional text[] in its text form ({a,"b c",NULL}) into
 * a->replicas.  NULL elements are skipped.  Returns why not, or NULL.
 */
static const char *
parse_replicas(const char *p, FelixAssignment *a)
{
	a->nreplicas = 0;
	if (*p != '{')
		return "replicas is not an array";
	p++;
	while (*p != '\0' && *p != '}')
	{
		char		name[NAMEDATALEN];
		int			len = 0;
		bool		quoted = (*p == '"');

		if (quoted)
		{
			for (p++; *p != '\0' && *p != '"'; p++)
			{
				if (*p == '\\' && p[1] != '\0')
					p++;
				if (len >= NAMEDATALEN - 1)
					return "a replica's name is too long";
				name[len++] = *p;
			}
			if (*p != '"')
				return "replicas is not a well-formed array";
			p++;
		}
		else
		{
			for (; *p != '\0' && *p != ',' && *p != '}'; p++)
			{
				if (len >= NAMEDATALEN - 1)
					return "a replica's name is too long";
				name[len++] = *p;
			}
		}
		name[len] = '\0';
		if (quoted || strcmp(name, "NULL") != 0)
		{
			if (a->nreplicas >= FELIX_MAX_REPLICAS)
				return psprintf("more than %d replicas", FELIX_MAX_REPLICAS);
			strlcpy(a->replicas[a->nreplicas++], name, NAMEDATALEN);
		}
		if (*p == ',')
			p++;
	}
	if (*p != '}')
		return "replicas is not a well-formed array";
	return NULL;
}

/* Column c of row i, or NULL when SQL NULL. */
static const char *
col(PGresult *res, int i, int c)
{
	return PQgetisnull(res, i, c) ? NULL : PQgetvalue(res, i, c);
}

/* Turn one result row into an HbRow; problems go to r->bad. */
static void
read_row(PGresult *res, int i, int64 t_send, HbRow *r)
{
	const char *v;
	int64		i64;
	int			months = 0,
				days = 0;
	int64		usec = 0;

	memset(r, 0, sizeof(HbRow));
	r->shard = -1;
	r->a.sent_at_ns = t_send;

	v = col(res, i, 0);
	if (v == NULL || !copy_name(r->stream, v))
	{
		r->bad = "the stream name is missing or too long";
		if (v != NULL)
			strlcpy(r->stream, v, NAMEDATALEN);
		return;
	}
	if ((v = col(res, i, 1)) == NULL || !parse_int32(v, &r->shard))
	{
		r->bad = "the shard number is missing";
		return;
	}
	if ((v = col(res, i, 2)) == NULL || !parse_int64(v, &i64) || i64 < 1)
	{
		r->bad = "the generation is missing or not positive";
		return;
	}
	r->a.generation = (uint64) i64;
	if ((v = col(res, i, 3)) != NULL && !copy_name(r->a.leader, v))
	{
		r->bad = "the leader's name is too long";
		return;
	}
	v = col(res, i, 4);
	r->leader_conninfo = pstrdup(v ? v : "");
	strlcpy(r->a.leader_conninfo, r->leader_conninfo, FELIX_CONNINFO_LEN);
	if ((v = col(res, i, 5)) != NULL && (r->bad = (char *) parse_replicas(v, &r->a)) != NULL)
		return;
	v = col(res, i, 6);
	r->a.lease_granted = (v != NULL && v[0] == 't');
	if ((v = col(res, i, 7)) != NULL && !parse_int64(v, &r->a.lease_ms))
	{
		r->bad = "lease_ms is not a number";
		return;
	}
	if (r->a.lease_granted && r->a.lease_ms <= 0)
	{
		r->bad = "a lease was granted without a positive duration";
		return;
	}
	v = col(res, i, 8);
	strlcpy(r->a.unplaced_reason, v ? v : "", FELIX_REASON_LEN);
	if ((v = col(res, i, 9)) == NULL || !parse_int32(v, &r->shards) || r->shards < 1)
	{
		r->bad = "the stream's shard count is missing";
		return;
	}
	if ((v = col(res, i, 10)) == NULL || !parse_int32(v, &r->replication_factor) ||
		r->replication_factor < 1)
	{
		r->bad = "the stream's replication_factor is missing";
		return;
	}
	if ((v = col(res, i, 11)) == NULL || !copy_name(r->consistency, v))
	{
		r->bad = "the stream's consistency is missing";
		return;
	}
	if ((v = col(res, i, 12)) == NULL || !copy_name(r->payload_type, v))
	{
		r->bad = "the stream's payload_type is missing";
		return;
	}
	if ((v = col(res, i, 13)) != NULL && !parse_int64(v, &r->retention_bytes))
	{
		r->bad = "retention_bytes is not a number";
		return;
	}
	if (col(res, i, 14) != NULL)
	{
		if (!parse_int32(col(res, i, 14), &months) ||
			(v = col(res, i, 15)) == NULL || !parse_int32(v, &days) ||
			(v = col(res, i, 16)) == NULL || !parse_int64(v, &usec))
		{
			r->bad = "retention is not an interval";
			return;
		}
		r->has_retention = true;
		r->retention.month = months;
		r->retention.day = days;
		r->retention.time = usec;
	}
	if ((v = col(res, i, 17)) == NULL || !copy_name(r->schema, v))
	{
		r->bad = "the stream's schema is missing";
		return;
	}
	if ((v = col(res, i, 18)) == NULL || strlen(v) >= FELIX_CREATION_ID_LEN)
	{
		r->bad = "the stream's creation id is missing";
		return;
	}
	strlcpy(r->creation_id, v, FELIX_CREATION_ID_LEN);
	if (((v = col(res, i, 19)) != NULL && !copy_name(r->a.joining, v)) ||
		((v = col(res, i, 20)) != NULL && !copy_name(r->a.leaving, v)) ||
		((r->a.joining[0] == '\0') != (r->a.leaving[0] == '\0')))
	{
		r->bad = "a replica move names only one of the joining and leaving nodes";
		return;
	}
	if ((v = col(res, i, 21)) != NULL)
		strlcpy(r->a.leader_incarnation, v, FELIX_INCARNATION_LEN);
}

/*
 * Copy the rows out of the result (so it can be freed before anything can
 * raise) and note each shard's leader in the node directory.
 */
static HbRow *
read_rows(PGresult *res, int64 t_send, int *nrows)
{
	int			n = PQntuples(res);
	HbRow	   *rows = palloc0(sizeof(HbRow) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		HbRow	   *r = &rows[i];

		read_row(res, i, t_send, r);
		if (r->bad != NULL)
			continue;
		if (r->a.leader[0] != '\0' && r->leader_conninfo[0] != '\0')
			felix_node_note(r->a.leader, r->leader_conninfo);
	}
	*nrows = n;
	return rows;
}

/* ---------------------------------------------------------------------
 * Applying rows
 * ---------------------------------------------------------------------
 */

/* Refuse a consistency this node does not know: never default it. */
static FelixConsistency
row_consistency(const HbRow *r)
{
	if (strcmp(r->consistency, "leader") == 0)
		return FELIX_CONSISTENCY_LEADER;
	if (strcmp(r->consistency, "quorum") == 0)
		return FELIX_CONSISTENCY_QUORUM;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("stream \"%s\": the control plane sent consistency \"%s\", which this node does not recognise",
					r->stream, r->consistency),
			 errdetail("The stream is not served here rather than served at a weaker guarantee."),
			 errhint("Run the same felix version on every node and on the control plane.")));
	return FELIX_CONSISTENCY_LEADER;	/* keep compiler quiet */
}

static void
refuse_bad_row(const HbRow *r)
{
	if (r->bad != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("stream \"%s\" shard %d: unusable assignment from the control plane: %s",
						r->stream, r->shard, r->bad),
				 errhint("Run the same felix version on every node and on the control plane.")));
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
	found = felix_stream_by_name(r->stream);
	stream = *found;

	if (strcmp(stream.creation_id, r->creation_id) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" here is not the stream the control plane knows by that name",
						r->stream),
				 errdetail("Its creation id is %s here and %s at the control plane: the stream was dropped and created again elsewhere.",
						   stream.creation_id, r->creation_id),
				 errhint("Drop the local stream \"%s\" (felix_drop_stream) to let this node "
						 "create the cluster's stream of that name.", r->stream)));
	if (stream.shards != r->shards ||
		stream.replication_factor != r->replication_factor ||
		stream.consistency != consistency)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" here differs from the control plane's: "
						"%d shards, replication_factor %d, consistency %s here; "
						"%d, %d, %s there",
						r->stream, stream.shards, stream.replication_factor,
						stream.consistency == FELIX_CONSISTENCY_QUORUM ? "quorum" : "leader",
						r->shards, r->replication_factor, r->consistency),
				 errdetail("The local stream was not created through the control plane."),
				 errhint("Drop the local stream \"%s\" (felix_drop_stream) to let this node "
						 "recreate it as the cluster defines it, or rename one of the two.",
						 r->stream)));

	/* Never wait for a user's lock: the next heartbeat comes soon. */
	if (!ConditionalLockRelationOid(stream.relid, AccessShareLock))
	{
		ereport(DEBUG1,
				(errmsg_internal("felix heartbeat: stream \"%s\" is locked; shard %d skipped this time",
								 r->stream, r->shard)));
		return;
	}
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(stream.relid)))
		return;					/* dropped meanwhile */

	s = felix_stream_shard(&stream, r->shard);
	lease_apply_assignment(s, &r->a);
	r->applied = true;
}

/*
 * The creating backend's half of felix_create_stream: one heartbeat of its
 * own, whose rows for the new stream are applied at once, so the stream is
 * led (and, on this node, writable) when the call returns rather than at
 * the worker's next heartbeat.  The lease is anchored at this heartbeat's
 * send time, exactly as the worker anchors its own; the worker's later
 * renewals only ever extend it.
 */
static void
apply_stream_guts(PGconn *conn, const char *stream)
{
	const char *me[FELIX_CP_HEARTBEAT_NARGS];
	PGresult   *res;
	HbRow	   *rows;
	int			nrows;
	int64		t_send;

	felix_cp_heartbeat_args(me, NULL);
	(void) felix_conn_set_statement_timeout(conn, FELIX_CP_CALL_TIMEOUT_MS, ERROR);
	t_send = felix_monotonic_ns();
	res = felix_conn_exec(conn, "felix.cp_heartbeat", HB_SQL, FELIX_CP_HEARTBEAT_NARGS, me,
						  FELIX_CP_CALL_TIMEOUT_MS, ERROR);
	rows = read_rows(res, t_send, &nrows);
	PQclear(res);
	for (int i = 0; i < nrows; i++)
		if (strcmp(rows[i].stream, stream) == 0)
			apply_row_guts(&rows[i]);
}

void
felix_heartbeat_apply_stream(const char *stream)
{
	PGconn	   *conn = felix_conn_open(felix_cp_conninfo(),
									   "the felix control plane", "felix",
									   FELIX_CP_CALL_TIMEOUT_MS, ERROR);

	PG_TRY();
	{
		apply_stream_guts(conn, stream);
	}
	PG_FINALLY();
	{
		felix_conn_close(conn);
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
	if (!felix_stream_lock_name(r->stream, false))
		return;
	if (shard_streams_forgotten() != drops_before_rows ||
		name_in(local_stream_names(), r->stream))
		return;
	refuse_bad_row(r);
	(void) row_consistency(r);
	(void) felix_stream_create_local(r->stream, r->schema, r->creation_id, r->shards,
									 r->replication_factor, r->consistency,
									 r->payload_type, r->retention_bytes,
									 r->has_retention ? &r->retention : NULL);
	ereport(LOG,
			(errmsg("felix heartbeat: created stream \"%s\" (%d shards, replication_factor %d, %s) as the control plane defines it",
					r->stream, r->shards, r->replication_factor, r->consistency)));
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
		report_row_error(r->stream, key_shard, edata, what);
		FreeErrorData(edata);
		return false;
	}
	row_error_cleared(r->stream, key_shard);
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
			if (r->bad == NULL && !name_in(local, r->stream))
			{
				r->missing = true;
				nmissing++;
				continue;
			}
			(void) run_isolated(apply_row_guts, r, r->shard,
								psprintf("applying the control plane's assignment of stream \"%s\" shard %d",
										 r->stream, r->shard));
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
			strlcpy(key, r->stream, NAMEDATALEN);
			(void) hash_search(tried, key, HASH_ENTER, &found);
			if (found)
				continue;
			if (run_isolated(create_stream_guts, r, -1,
							 psprintf("creating stream \"%s\" as the control plane defines it",
									  r->stream)))
			{
				ncreated++;
				for (int k = i; k < nrows; k++)
					if (rows[k].missing && strcmp(rows[k].stream, r->stream) == 0)
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
		(void) run_isolated(apply_row_guts, r, r->shard,
							psprintf("applying the control plane's assignment of stream \"%s\" shard %d",
									 r->stream, r->shard));
	}
	end_work();
}

/* ---------------------------------------------------------------------
 * One heartbeat
 * ---------------------------------------------------------------------
 */

/* Has CREATE EXTENSION felix run in felix.database? */
static bool
local_extension_ready(void)
{
	bool		ready;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ready = OidIsValid(get_extension_oid("felix", true));
	CommitTransactionCommand();
	MemoryContextSwitchTo(cycle_cxt);

	if (!ready && !waiting_logged)
		ereport(LOG,
				(errmsg("felix heartbeat: waiting for CREATE EXTENSION felix in database \"%s\" before joining the cluster",
						felix_database)));
	waiting_logged = !ready;
	return ready;
}

/* Microseconds since the Unix epoch to TimestampTz. */
static TimestampTz
unix_usec_to_timestamptz(int64 usec)
{
	return (TimestampTz) (usec -
						  ((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY));
}

/*
 * Re-read the control plane's node list (felix.cp_nodes(), the one view of
 * felix.nodes a node may read) into the node directory, with each node's
 * liveness: the felix_nodes view shows it from there.  Every heartbeat, so
 * the view is never more than one interval behind the control plane.
 */
static void
refresh_directory(void)
{
	/* Epoch microseconds: independent of either side's DateStyle. */
	PGresult   *res = cp_exec("felix.cp_nodes",
							  "SELECT name, conninfo, alive, "
							  "(extract(epoch FROM last_heartbeat) OPERATOR(pg_catalog.*) 1000000)::bigint, "
							  "incarnation FROM felix.cp_nodes()",
							  0, NULL);
	FelixNodeInfo *nodes;
	int			n = 0;

	if (res == NULL)
		return;
	if (PQnfields(res) != 5)
	{
		PQclear(res);
		return;
	}
	nodes = palloc0(sizeof(FelixNodeInfo) * Max(PQntuples(res), 1));
	for (int i = 0; i < PQntuples(res) && n < FELIX_MAX_NODES; i++)
	{
		const char *name = col(res, i, 0);
		const char *conninfo = col(res, i, 1);
		const char *alive = col(res, i, 2);
		const char *usec = col(res, i, 3);
		int64		us;

		if (name == NULL || conninfo == NULL || alive == NULL || usec == NULL ||
			!copy_name(nodes[n].name, name) || !parse_int64(usec, &us))
			continue;
		strlcpy(nodes[n].conninfo, conninfo, FELIX_NODE_CONNINFO_LEN);
		if (col(res, i, 4) != NULL)
			strlcpy(nodes[n].incarnation, col(res, i, 4), FELIX_INCARNATION_LEN);
		nodes[n].alive = alive[0] == 't';
		nodes[n].last_heartbeat = unix_usec_to_timestamptz(us);
		n++;
	}
	PQclear(res);
	felix_nodes_listed(nodes, n);
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

		if (r->bad != NULL || (r->missing && !r->created))
			continue;
		row_error_key(&key, r->stream, r->shard);
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

/*
 * The shards this node cannot serve, as a text[] literal of "stream/shard"
 * for felix.cp_heartbeat: those whose assignment has failed to reach the
 * local shard (damaged, the table locked, ...) for a whole lease.  The
 * control plane renews no lease of theirs here and counts this node out
 * of their promotions, so a shard this node leads but cannot serve fails
 * over instead of holding a lease nobody can use.
 */
static char *
unable_list(void)
{
	HASH_SEQ_STATUS seq;
	UnservedEntry *e;
	StringInfoData buf;
	int64		now = felix_monotonic_ns();
	bool		first = true;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	hash_seq_init(&seq, unserved);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		char	   *elem;

		if (now - e->since_ns < (int64) felix_lease_duration * 1000000)
			continue;
		elem = psprintf("%s/%d", e->key.stream, e->key.shard);
		appendStringInfoString(&buf, first ? "\"" : ",\"");
		for (const char *c = elem; *c; c++)
		{
			if (*c == '"' || *c == '\\')
				appendStringInfoChar(&buf, '\\');
			appendStringInfoChar(&buf, *c);
		}
		appendStringInfoChar(&buf, '"');
		first = false;
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
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
	PGresult   *res = cp_exec("felix.cp_halted",
							  "SELECT stream, shard, node, generation, leader, halted_at_seq, reason, "
							  "(extract(epoch FROM since) OPERATOR(pg_catalog.*) 1000000)::bigint "
							  "FROM felix.cp_halted()",
							  0, NULL);
	FelixHaltInfo *halts;
	int			n = 0;

	if (res == NULL)
		return;
	if (PQnfields(res) != 8)
	{
		PQclear(res);
		return;
	}
	halts = palloc0(sizeof(FelixHaltInfo) * FELIX_MAX_HALTS);
	for (int i = 0; i < PQntuples(res) && n < FELIX_MAX_HALTS; i++)
	{
		FelixHaltInfo *h = &halts[n];
		int64		v;

		if (col(res, i, 0) == NULL || col(res, i, 2) == NULL || col(res, i, 4) == NULL ||
			col(res, i, 6) == NULL || !copy_name(h->stream, col(res, i, 0)) ||
			!copy_name(h->node, col(res, i, 2)) || !copy_name(h->leader, col(res, i, 4)) ||
			col(res, i, 1) == NULL || !parse_int32(col(res, i, 1), &h->shard) ||
			col(res, i, 3) == NULL || !parse_int64(col(res, i, 3), &v))
			continue;
		h->generation = (uint64) v;
		h->has_position = col(res, i, 5) != NULL && parse_int64(col(res, i, 5), &v);
		h->position = h->has_position ? (uint64) v : 0;
		strlcpy(h->reason, col(res, i, 6), FELIX_HALT_REASON_LEN);
		h->since = col(res, i, 7) != NULL && parse_int64(col(res, i, 7), &v) ?
			unix_usec_to_timestamptz(v) : 0;
		n++;
	}
	PQclear(res);
	felix_halts_listed(halts, n);
}

static void
heartbeat_once(void)
{
	const char *me = felix_node_name_resolved();
	/* only where this node is: its credentials never leave it */
	const char *my_conninfo = felix_conninfo_address(felix_node_conninfo_resolved());
	const char *params[FELIX_CP_HEARTBEAT_NARGS];
	int64		t_send;
	PGresult   *res;
	HbRow	   *rows;
	int			nrows;

	if (!local_extension_ready())
		return;
	if (!own_conninfo_ok())
		return;
	felix_node_note(me, my_conninfo);
	felix_cp_heartbeat_args(params, unable_list());

	if (!cp_connect())
	{
		felix_count(FELIX_CTR_HEARTBEATS_FAILED, 1);
		failed_in_a_row++;
		return;
	}

	/*
	 * The lease is anchored here, before the request leaves: at or before
	 * the control plane's grant time t, so this node stops no later than
	 * t + L - epsilon by its own clock whatever the round trip costs.
	 */
	pgstat_report_activity(STATE_RUNNING, "felix: heartbeat");
	drops_before_rows = shard_streams_forgotten();
	t_send = felix_monotonic_ns();
	felix_count(FELIX_CTR_HEARTBEATS_SENT, 1);
	res = cp_exec("felix.cp_heartbeat", HB_SQL, FELIX_CP_HEARTBEAT_NARGS, params);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (res == NULL && strcmp(felix_conn_last_sqlstate(), "55F06") == 0)
	{
		/* an older copy of this data directory: it becomes a new one */
		felix_incarnation_renew();
		shard_mark_stale_copies();
	}
	if (res != NULL && PQnfields(res) != HB_NCOLS)
	{
		int			elevel = failure_elevel();

		ereport(elevel,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("felix.cp_heartbeat() on the control plane returned %d columns, expected %d",
						PQnfields(res), HB_NCOLS),
				 errhint("Run the same felix version on every node and on the control plane.")));
		failure_reported(elevel);
		PQclear(res);
		res = NULL;
	}
	if (res == NULL)
	{
		felix_count(FELIX_CTR_HEARTBEATS_FAILED, 1);
		failed_in_a_row++;
		return;
	}
	if (failed_in_a_row > 0)
		ereport(LOG,
				(errmsg("felix heartbeat: the control plane answers again after %d failed heartbeat%s",
						failed_in_a_row, failed_in_a_row == 1 ? "" : "s")));
	failed_in_a_row = 0;
	last_failure_log_ns = 0;

	rows = read_rows(res, t_send, &nrows);
	PQclear(res);

	apply_rows(rows, nrows);
	note_served(rows, nrows);

	if (felix_cp_embedded())
	{
		pgstat_report_activity(STATE_RUNNING, "felix: control plane tick");
		res = cp_exec("felix.cp_tick", "SELECT felix.cp_tick()", 0, NULL);
		pgstat_report_activity(STATE_IDLE, NULL);
		if (res != NULL)
		{
			if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0) &&
				strcmp(PQgetvalue(res, 0, 0), "0") != 0)
				ereport(LOG,
						(errmsg("felix control plane: %s promotion%s in this tick",
								PQgetvalue(res, 0, 0),
								strcmp(PQgetvalue(res, 0, 0), "1") == 0 ? "" : "s")));
			PQclear(res);
		}
	}

	if (cp_conn != NULL)
		refresh_directory();
	if (cp_conn != NULL)
		refresh_halts();
}

/* ---------------------------------------------------------------------
 * The worker
 * ---------------------------------------------------------------------
 */

/* The worker's latch, while it runs (shared memory). */
typedef struct FelixHeartbeatShared
{
	Latch	   *volatile latch;
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
		hb_shared->latch = NULL;
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
