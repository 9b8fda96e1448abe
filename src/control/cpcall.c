/*-------------------------------------------------------------------------
 *
 * cpcall.c
 *	  A node's calls to the control plane, typed.  Each call has two ways
 *	  to the same rule (cp.h):
 *
 *	  - embedded store: a felix.cp_* function on the control-plane
 *		database, over libpq (client.c: a deadline, the latch, the remote
 *		SQLSTATE, detail and hint kept);
 *	  - etcd: the rule itself, run in this process over the etcd store.  A
 *		caller that carries on after a failure (a worker, elevel < ERROR)
 *		gets the rule's error re-reported at its elevel; nothing the rule
 *		touches needs cleaning up (no locks, no transaction; http.c cleans
 *		its own handles).
 *
 *	  The heartbeat's answer comes back as FelixCpShard rows either way.
 *
 * Locking rule: none.  A session belongs to the process that opened it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>

#include "control/client.h"
#include "control/conninfo.h"
#include "control/cp.h"
#include "control/cpcall.h"
#include "control/json.h"
#include "control/store.h"
#include "felix.h"
#include "storage/incarnation.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define CP_PURPOSE	"the felix control plane"

static char last_sqlstate[6];
static char last_error[256];

/*
 * etcd: the state this process's last heartbeat read, which the node and
 * halt lists of the same beat (for the views only) use instead of reading
 * it again (in the caller's memory: valid until its next heartbeat).  The
 * duties read their own: they decide on it.
 */
static CpSnapshot *beat_snap = NULL;

const char *
felix_cp_last_sqlstate(void)
{
	return felix_store_is_etcd() ? last_sqlstate : felix_conn_last_sqlstate();
}

const char *
felix_cp_last_error(void)
{
	return felix_store_is_etcd() ? last_error : felix_conn_last_error();
}

/* ---------------------------------------------------------------------
 * Sessions
 * ---------------------------------------------------------------------
 */

bool
felix_cp_open(FelixCpSession *s, const char *application_name, int timeout_ms, int elevel)
{
	felix_require_preload();
	s->timeout_ms = timeout_ms;
	s->conn = NULL;
	s->warm = false;
	s->ran = s->prepared = 0;
	if (felix_store_is_etcd())
		return true;
	s->conn = felix_conn_open(felix_cp_conninfo(), CP_PURPOSE, application_name,
							  timeout_ms, elevel);
	if (s->conn != NULL &&
		!felix_conn_set_statement_timeout(s->conn, Max(timeout_ms, FELIX_CP_CALL_TIMEOUT_MS), elevel))
	{
		felix_conn_close(s->conn);
		s->conn = NULL;
	}
	return s->conn != NULL;
}

void
felix_cp_close(FelixCpSession *s)
{
	felix_conn_close(s->conn);
	s->conn = NULL;
	s->ran = s->prepared = 0;
}

bool
felix_cp_usable(FelixCpSession *s)
{
	return felix_store_is_etcd() || felix_conn_usable(s->conn);
}

/*
 * The calls a worker's session makes again and again.  Each is prepared on
 * the connection the second time the session runs it (its bit in s->ran,
 * then in s->prepared), and from then on the host neither parses nor plans
 * it again; a backend's session, which runs it once, pays no round trip
 * for that.
 */
typedef enum CpStmt
{
	CP_STMT_NONE = -1,
	CP_STMT_HEARTBEAT,
	CP_STMT_TICK,
	CP_STMT_NODES,
	CP_STMT_HALTED
} CpStmt;

static const char *const cp_stmt_name[] = {
	[CP_STMT_HEARTBEAT] = "felix_cp_heartbeat",
	[CP_STMT_TICK] = "felix_cp_tick",
	[CP_STMT_NODES] = "felix_cp_nodes",
	[CP_STMT_HALTED] = "felix_cp_halted",
};

/* Run sql on the session's connection, prepared there when stmt says so. */
static PGresult *
run_call(FelixCpSession *s, CpStmt stmt, const char *fn, const char *sql,
		 int nparams, const char *const *values, int timeout_ms, int elevel)
{
	uint32		bit = stmt == CP_STMT_NONE ? 0 : (uint32) 1 << stmt;
	bool		prepared = (s->prepared & bit) != 0;
	PGresult   *res;

	if (bit == 0 || (s->ran & bit) == 0)
	{
		s->ran |= bit;
		return felix_conn_exec(s->conn, fn, sql, nparams, values, timeout_ms, elevel);
	}
	res = felix_conn_exec_prepared(s->conn, fn, cp_stmt_name[stmt], sql, nparams, values,
								   &prepared, timeout_ms, elevel);
	if (prepared)
		s->prepared |= bit;
	return res;
}

/*
 * An embedded call on the session; NULL (reported at elevel) on failure.
 *
 * The first call that reads the state (every one but LISTEN) may take up
 * to FELIX_CP_CALL_TIMEOUT_MS, whatever the session's own timeout: the
 * backend serving a new session reads and decodes the whole state, most
 * of a second at thousands of shards on a busy host.  Cut at the
 * heartbeat's 1 s, the session closed with its copy, and the next one
 * started cold again: after the host restarted, no heartbeat got through.
 * Once one has, the session's own timeout applies, on both ends.
 */
static PGresult *
remote(FelixCpSession *s, CpStmt stmt, const char *fn, const char *sql, int nparams,
	   const char *const *values, int elevel)
{
	bool		reads = strcmp(fn, "LISTEN") != 0;
	bool		cold = !s->warm && reads;
	PGresult   *res = run_call(s, stmt, fn, sql, nparams, values,
							   cold ? Max(s->timeout_ms, FELIX_CP_CALL_TIMEOUT_MS) : s->timeout_ms,
							   elevel);

	if (res == NULL && !felix_conn_usable(s->conn))
		felix_cp_close(s);
	else if (cold && felix_conn_usable(s->conn))
	{
		s->warm = true;
		if (s->timeout_ms < FELIX_CP_CALL_TIMEOUT_MS &&
			!felix_conn_set_statement_timeout(s->conn, s->timeout_ms, elevel))
		{
			if (res != NULL)
				PQclear(res);
			felix_cp_close(s);
			return NULL;
		}
	}
	return res;
}

/*
 * Run a rule here (etcd).  At ERROR its error propagates; below, it is
 * caught, re-reported at elevel, and false returned.
 */
static bool
local(void (*fn) (void *), void *arg, int elevel)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool ok = true;

	last_sqlstate[0] = '\0';
	if (elevel >= ERROR)
	{
		fn(arg);
		return true;
	}
	PG_TRY();
	{
		fn(arg);
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		FlushErrorState();
		strlcpy(last_sqlstate, unpack_sql_state(e->sqlerrcode), sizeof(last_sqlstate));
		strlcpy(last_error, e->message ? e->message : "", sizeof(last_error));
		e->elevel = elevel;
		ThrowErrorData(e);
		ok = false;
	}
	PG_END_TRY();
	return ok;
}

/* This node's identity for a heartbeat. */
typedef struct Identity
{
	char		incarnation[FELIX_INCARNATION_LEN];
	char		boot[FELIX_INCARNATION_LEN];
	uint64		starts;
} Identity;

static void
identity(Identity *id)
{
	felix_incarnation_boot(id->incarnation, &id->starts, id->boot);
}

/* ---------------------------------------------------------------------
 * Heartbeat
 * ---------------------------------------------------------------------
 */

/*
 * The heartbeat, embedded: every assignment with its stream's definition.
 * The retention interval travels as its three fields, so neither side's
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
	"schema, creation_id, joining, leaving, leader_incarnation, store_id, store_revision, " \
	"state_revision, full_answer " \
	"FROM felix.cp_heartbeat($1, $2, $3, $4, $5, $6, $7::integer, $8::jsonb, $9, $10, $11::bigint, " \
	"$12::bigint, $13::bigint, $14::boolean) " \
	"WHERE $15::text IS NULL OR stream IS NULL OR stream OPERATOR(pg_catalog.=) $15"
#define HB_NCOLS	26
#define HB_COL_STORE_ID	22
#define HB_COL_STORE_REVISION 23
#define HB_COL_STATE_REVISION 24
#define HB_COL_FULL	25

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

/* One result row into a FelixCpShard; problems go to r->bad. */
static void
read_row(PGresult *res, int i, int64 t_send, FelixCpShard *r)
{
	const char *v;
	int64		i64;
	int			months = 0,
				days = 0;
	int64		usec = 0;

	memset(r, 0, sizeof(FelixCpShard));
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
 * A node makes a stream's table of the payload type a row names, so a row
 * naming any type but felix's three is unusable, however it was stored.
 */
static void
check_payload_type(FelixCpShard *r)
{
	if (r->bad == NULL && strcmp(r->payload_type, "jsonb") != 0 &&
		strcmp(r->payload_type, "text") != 0 && strcmp(r->payload_type, "bytea") != 0)
		r->bad = "the stream's payload_type is not jsonb, text or bytea";
}

/* One assignment the rule returned (etcd) into a FelixCpShard. */
static void
convert_row(const CpAssignment *c, int64 t_send, FelixCpShard *r)
{
	const CpShard *s = c->shard;
	const CpStream *st = c->stream;

	memset(r, 0, sizeof(FelixCpShard));
	r->a.sent_at_ns = t_send;
	r->shard = s->shard;
	if (!copy_name(r->stream, s->stream))
	{
		r->bad = "the stream name is too long";
		return;
	}
	r->a.generation = (uint64) s->generation;
	if (s->leader && !copy_name(r->a.leader, s->leader))
	{
		r->bad = "the leader's name is too long";
		return;
	}
	r->leader_conninfo = pstrdup(c->leader_conninfo ? c->leader_conninfo : "");
	strlcpy(r->a.leader_conninfo, r->leader_conninfo, FELIX_CONNINFO_LEN);
	if (s->nreplicas > FELIX_MAX_REPLICAS)
	{
		r->bad = psprintf("more than %d replicas", FELIX_MAX_REPLICAS);
		return;
	}
	for (int i = 0; i < s->nreplicas; i++)
		if (!copy_name(r->a.replicas[r->a.nreplicas++], s->replicas[i]))
		{
			r->bad = "a replica's name is too long";
			return;
		}
	r->a.lease_granted = c->lease_granted;
	r->a.lease_ms = c->lease_ms;
	strlcpy(r->a.unplaced_reason, s->unplaced_reason ? s->unplaced_reason : "", FELIX_REASON_LEN);
	r->shards = st->shards;
	r->replication_factor = st->replication_factor;
	strlcpy(r->consistency, st->consistency, NAMEDATALEN);
	strlcpy(r->payload_type, st->payload_type, NAMEDATALEN);
	r->retention_bytes = st->retention_bytes < 0 ? 0 : st->retention_bytes;
	r->has_retention = st->has_retention;
	r->retention.month = st->retention_months;
	r->retention.day = st->retention_days;
	r->retention.time = st->retention_usec;
	if (!copy_name(r->schema, st->schema) ||
		strlcpy(r->creation_id, st->creation_id, FELIX_CREATION_ID_LEN) >= FELIX_CREATION_ID_LEN)
	{
		r->bad = "the stream's schema or creation id is malformed";
		return;
	}
	if (s->joining)
		strlcpy(r->a.joining, s->joining, NAMEDATALEN);
	if (s->leaving)
		strlcpy(r->a.leaving, s->leaving, NAMEDATALEN);
	if (s->leader_incarnation)
		strlcpy(r->a.leader_incarnation, s->leader_incarnation, FELIX_INCARNATION_LEN);
}

/* A text[] literal of names for a remote call. */
static char *
array_literal(char **items, int n)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	for (int i = 0; i < n; i++)
	{
		appendStringInfoString(&b, i ? ",\"" : "\"");
		for (const char *c = items[i]; *c; c++)
		{
			if (*c == '"' || *c == '\\')
				appendStringInfoChar(&b, '\\');
			appendStringInfoChar(&b, *c);
		}
		appendStringInfoChar(&b, '"');
	}
	appendStringInfoChar(&b, '}');
	return b.data;
}

typedef struct HeartbeatCall
{
	CpHeartbeatArgs args;
	CpHeartbeatResult result;
} HeartbeatCall;

static void
heartbeat_local(void *arg)
{
	HeartbeatCall *c = arg;

	cp_heartbeat(&c->args, &c->result);
}

bool
felix_cp_heartbeat(FelixCpSession *s, char **unable, int nunable, char **ends, int nends,
				   bool ends_unchanged, const char *peers, const FelixCpAnswer *known,
				   const char *only_stream, int64 *t_send,
				   FelixCpShard **rows, int *nrows, FelixCpAnswer *answer, int elevel)
{
	Identity	id;
	const char *address = felix_conninfo_address(felix_node_conninfo_resolved());
	char		seen_id[FELIX_INCARNATION_LEN];
	uint64		seen_rev;
	char		seen_rev_s[24];

	identity(&id);
	felix_store_seen(seen_id, &seen_rev);
	*rows = NULL;
	*nrows = 0;
	if (felix_store_is_etcd())
	{
		HeartbeatCall c;

		memset(&c, 0, sizeof(c));
		c.args.node = felix_node_name_resolved();
		c.args.conninfo = address;
		c.args.incarnation = id.incarnation;
		c.args.starts = (int64) id.starts;
		c.args.boot = id.boot;
		c.args.unable_given = unable != NULL;
		c.args.unable = unable;
		c.args.nunable = nunable;
		c.args.lease_ms = felix_lease_duration;
		c.args.ends_given = ends != NULL;
		c.args.ends = ends;
		c.args.nends = nends;
		c.args.peers = peers;
		c.args.seen_store_id = seen_id[0] ? seen_id : NULL;
		c.args.seen_revision = (int64) seen_rev;
		c.args.known_state = known ? known->state_revision : 0;
		c.args.known_commit = known ? known->commit_revision : 0;
		c.args.ends_unchanged = ends_unchanged && known != NULL;
		/* the lease is anchored before the request leaves */
		beat_snap = NULL;
		*t_send = felix_monotonic_ns();
		if (!local(heartbeat_local, &c, elevel))
			return false;
		felix_store_seen_note(c.result.store_id, (uint64) c.result.revision);
		beat_snap = c.result.snap;
		answer->full = c.result.full;
		answer->state_revision = c.result.state_revision;
		answer->commit_revision = c.result.revision;
		*rows = palloc0(sizeof(FelixCpShard) * (c.result.n + 1));
		for (int i = 0; i < c.result.n; i++)
		{
			FelixCpShard *r = &(*rows)[*nrows];

			if (only_stream && strcmp(c.result.rows[i].shard->stream, only_stream) != 0)
				continue;
			convert_row(&c.result.rows[i], *t_send, r);
			check_payload_type(r);
			(*nrows)++;
		}
		return true;
	}
	else
	{
		const char *values[15];
		char		starts[24];
		char		lease[16];
		char		known_state[24];
		char		known_commit[24];
		PGresult   *res;
		const char *v;

		snprintf(starts, sizeof(starts), UINT64_FORMAT, id.starts);
		snprintf(lease, sizeof(lease), "%d", felix_lease_duration);
		values[0] = felix_node_name_resolved();
		values[1] = address;
		values[2] = id.incarnation;
		values[3] = starts;
		values[4] = id.boot;
		values[5] = unable ? array_literal(unable, nunable) : NULL;
		values[6] = lease;
		values[7] = peers;
		values[8] = ends ? array_literal(ends, nends) : NULL;
		snprintf(seen_rev_s, sizeof(seen_rev_s), UINT64_FORMAT, seen_rev);
		values[9] = seen_id[0] ? seen_id : NULL;
		values[10] = seen_id[0] ? seen_rev_s : NULL;
		snprintf(known_state, sizeof(known_state), INT64_FORMAT, known ? known->state_revision : 0);
		snprintf(known_commit, sizeof(known_commit), INT64_FORMAT, known ? known->commit_revision : 0);
		values[11] = known_state;
		values[12] = known_commit;
		values[13] = ends_unchanged && known != NULL ? "true" : "false";
		values[14] = only_stream;
		*t_send = felix_monotonic_ns();
		res = remote(s, CP_STMT_HEARTBEAT, "felix.cp_heartbeat", HB_SQL, 15, values, elevel);
		if (res == NULL)
			return false;
		if (PQnfields(res) != HB_NCOLS)
		{
			int			got = PQnfields(res);

			PQclear(res);
			ereport(elevel,
					(errcode(ERRCODE_PROTOCOL_VIOLATION),
					 errmsg("felix.cp_heartbeat() on the control plane returned %d columns, expected %d",
							got, HB_NCOLS),
					 errhint("Run the same felix version on every node and on the control plane.")));
			return false;
		}
		/* the header first (no stream), then the assignments */
		if (PQntuples(res) < 1 || !PQgetisnull(res, 0, 0) ||
			(v = col(res, 0, HB_COL_STATE_REVISION)) == NULL ||
			!parse_int64(v, &answer->state_revision) ||
			(v = col(res, 0, HB_COL_STORE_REVISION)) == NULL ||
			!parse_int64(v, &answer->commit_revision) ||
			(v = col(res, 0, HB_COL_FULL)) == NULL || col(res, 0, HB_COL_STORE_ID) == NULL)
		{
			PQclear(res);
			ereport(elevel,
					(errcode(ERRCODE_PROTOCOL_VIOLATION),
					 errmsg("felix.cp_heartbeat() on the control plane answered without the header felix expects"),
					 errhint("Run the same felix version on every node and on the control plane.")));
			return false;
		}
		answer->full = strcmp(v, "t") == 0;
		if (answer->commit_revision > 0)
			felix_store_seen_note(PQgetvalue(res, 0, HB_COL_STORE_ID),
								  (uint64) answer->commit_revision);
		*nrows = PQntuples(res) - 1;
		*rows = palloc0(sizeof(FelixCpShard) * (*nrows + 1));
		for (int i = 0; i < *nrows; i++)
		{
			read_row(res, i + 1, *t_send, &(*rows)[i]);
			check_payload_type(&(*rows)[i]);
		}
		PQclear(res);
		return true;
	}
}

/* ---------------------------------------------------------------------
 * Duties (the duty worker) and listings (the heartbeat worker)
 * ---------------------------------------------------------------------
 */

typedef struct TickCall
{
	const char *node;
	const char *boot;
	CpTick		tick;
} TickCall;

static void
tick_local(void *arg)
{
	TickCall   *c = arg;

	cp_duty_tick(c->node, c->boot, &c->tick);
}

void
felix_cp_duty_tick(FelixCpSession *s, int elevel, CpTick *tick)
{
	Identity	id;
	TickCall	c;

	identity(&id);
	c.node = felix_node_name_resolved();
	c.boot = id.boot;
	tick->promoted = -1;
	tick->lapse_in_ms = -1;
	tick->grantees = NIL;
	if (felix_store_is_etcd())
	{
		if (local(tick_local, &c, elevel))
			*tick = c.tick;
	}
	else
	{
		/* the control plane wakes the grantees itself (cp_sql.c) */
		const char *values[2] = {c.node, c.boot};
		PGresult   *res = remote(s, CP_STMT_TICK, "felix.cp_tick",
								 "SELECT promoted, lapse_in_ms FROM felix.cp_tick($1, $2)",
								 2, values, elevel);

		if (res == NULL)
			return;
		if (PQntuples(res) == 1 && PQnfields(res) == 2)
		{
			if (!PQgetisnull(res, 0, 0))
				(void) parse_int32(PQgetvalue(res, 0, 0), &tick->promoted);
			if (!PQgetisnull(res, 0, 1) &&
				!parse_int32(PQgetvalue(res, 0, 1), &tick->lapse_in_ms))
				tick->lapse_in_ms = -1;
		}
		PQclear(res);
	}
}

/*
 * Listen for the control plane's wakes of this node's heartbeat (grants
 * to it) on session s; with etcd there is no session, and the duty holder
 * wakes a grantee over a connection of its own.  False when the session
 * failed.
 */
bool
felix_cp_listen_grants(FelixCpSession *s, int elevel)
{
	PGresult   *res;

	if (felix_store_is_etcd())
		return true;
	res = remote(s, CP_STMT_NONE, "LISTEN", "LISTEN " CP_GRANTS_CHANNEL, 0, NULL, elevel);
	if (res == NULL)
		return false;
	PQclear(res);
	return true;
}

/* The socket to wait on for those wakes, or PGINVALID_SOCKET. */
pgsocket
felix_cp_socket(FelixCpSession *s)
{
	return s->conn ? PQsocket(s->conn) : PGINVALID_SOCKET;
}

/*
 * Has the control plane woken node `me` since the last look?  Reads what
 * the session has received without waiting.  A session that fails here is
 * closed (felix_cp_usable says so).
 */
bool
felix_cp_woken(FelixCpSession *s, const char *me)
{
	PGnotify   *n;
	bool		woken = false;

	if (s->conn == NULL)
		return false;
	if (!PQconsumeInput(s->conn))
	{
		felix_cp_close(s);
		return false;
	}
	while ((n = PQnotifies(s->conn)) != NULL)
	{
		if (strcmp(n->relname, CP_GRANTS_CHANNEL) == 0 && strcmp(n->extra, me) == 0)
			woken = true;
		PQfreemem(n);
	}
	return woken;
}

static TimestampTz
ms_to_timestamptz(int64 ms)
{
	return (TimestampTz) (ms * 1000 -
						  ((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY));
}

typedef struct SnapshotCall
{
	CpSnapshot	snap;
} SnapshotCall;

static void
snapshot_local(void *arg)
{
	if (beat_snap != NULL)
		((SnapshotCall *) arg)->snap = *beat_snap;
	else
		(void) cp_snapshot_read(&((SnapshotCall *) arg)->snap, false, ERROR);
}

/* The last server refused the name of node x, if any, into x. */
static void
clash_from(FelixNodeInfo *x, const char *incarnation, const char *conninfo, int64 at_ms)
{
	if (incarnation == NULL || conninfo == NULL)
		return;
	strlcpy(x->clash_incarnation, incarnation, FELIX_INCARNATION_LEN);
	strlcpy(x->clash_conninfo, conninfo, sizeof(x->clash_conninfo));
	x->clash_at = ms_to_timestamptz(at_ms);
}

bool
felix_cp_nodes(FelixCpSession *s, FelixNodeInfo **nodes, int *n, int elevel)
{
	*n = 0;
	if (felix_store_is_etcd())
	{
		SnapshotCall c;
		CpNodeRow  *rows;
		int			count;

		if (!local(snapshot_local, &c, elevel))
			return false;
		count = cp_list_nodes(&c.snap, &rows);
		*nodes = palloc0(sizeof(FelixNodeInfo) * (count + 1));
		for (int i = 0; i < count && *n < FELIX_MAX_NODES; i++)
		{
			FelixNodeInfo *x = &(*nodes)[*n];

			if (!copy_name(x->name, rows[i].node->name))
				continue;
			strlcpy(x->conninfo, rows[i].node->conninfo, FELIX_NODE_CONNINFO_LEN);
			strlcpy(x->incarnation, rows[i].node->incarnation, FELIX_INCARNATION_LEN);
			x->alive = rows[i].alive;
			x->duty = rows[i].duty;
			x->last_heartbeat = ms_to_timestamptz(rows[i].node->heartbeat_ms);
			strlcpy(x->peers, rows[i].node->peers, FELIX_NODE_PEERS_LEN);
			if (rows[i].clash)
				clash_from(x, rows[i].clash->incarnation, rows[i].clash->conninfo,
						   rows[i].clash->at_ms);
			(*n)++;
		}
		return true;
	}
	else
	{
		PGresult   *res = remote(s, CP_STMT_NODES, "felix.cp_nodes",
								 "SELECT name, conninfo, alive, "
								 "(extract(epoch FROM last_heartbeat) OPERATOR(pg_catalog.*) 1000)::bigint, "
								 "incarnation, duty, peers::text, clash_incarnation, clash_conninfo, "
								 "(extract(epoch FROM clash_at) OPERATOR(pg_catalog.*) 1000)::bigint "
								 "FROM felix.cp_nodes()",
								 0, NULL, elevel);

		if (res == NULL)
			return false;
		*nodes = palloc0(sizeof(FelixNodeInfo) * (PQntuples(res) + 1));
		for (int i = 0; i < PQntuples(res) && *n < FELIX_MAX_NODES && PQnfields(res) == 10; i++)
		{
			int64		clash_ms;

			FelixNodeInfo *x = &(*nodes)[*n];
			int64		ms;

			if (col(res, i, 0) == NULL || col(res, i, 1) == NULL || col(res, i, 2) == NULL ||
				col(res, i, 3) == NULL || !copy_name(x->name, col(res, i, 0)) ||
				!parse_int64(col(res, i, 3), &ms))
				continue;
			strlcpy(x->conninfo, col(res, i, 1), FELIX_NODE_CONNINFO_LEN);
			if (col(res, i, 4) != NULL)
				strlcpy(x->incarnation, col(res, i, 4), FELIX_INCARNATION_LEN);
			x->alive = col(res, i, 2)[0] == 't';
			x->duty = col(res, i, 5) != NULL && col(res, i, 5)[0] == 't';
			x->last_heartbeat = ms_to_timestamptz(ms);
			strlcpy(x->peers, col(res, i, 6) ? col(res, i, 6) : "{}", FELIX_NODE_PEERS_LEN);
			if (col(res, i, 9) != NULL && parse_int64(col(res, i, 9), &clash_ms))
				clash_from(x, col(res, i, 7), col(res, i, 8), clash_ms);
			(*n)++;
		}
		PQclear(res);
		return true;
	}
}

typedef struct ClashCall
{
	const char *node;
	const char *incarnation;
	const char *conninfo;
} ClashCall;

static void
clash_local(void *arg)
{
	ClashCall  *c = arg;

	cp_name_clash(c->node, c->incarnation, c->conninfo);
}

bool
felix_cp_name_clash(FelixCpSession *s, int elevel)
{
	char		incarnation[FELIX_INCARNATION_LEN];
	ClashCall	c;

	felix_incarnation(incarnation, NULL);
	c.node = felix_node_name_resolved();
	c.incarnation = incarnation;
	/* only where this server is: its credentials never leave it */
	c.conninfo = felix_conninfo_address(felix_node_conninfo_resolved());
	if (felix_store_is_etcd())
		return local(clash_local, &c, elevel);
	else
	{
		const char *values[3] = {c.node, c.incarnation, c.conninfo};
		PGresult   *res = remote(s, CP_STMT_NONE, "felix.cp_name_clash",
								 "SELECT felix.cp_name_clash($1, $2, $3)", 3, values, elevel);

		PQclear(res);
		return res != NULL;
	}
}

bool
felix_cp_halted(FelixCpSession *s, FelixHaltInfo **halts, int *n, int elevel)
{
	*n = 0;
	*halts = palloc0(sizeof(FelixHaltInfo) * FELIX_MAX_HALTS);
	if (felix_store_is_etcd())
	{
		SnapshotCall c;
		CpHaltRow  *rows;
		int			count;

		if (!local(snapshot_local, &c, elevel))
			return false;
		count = cp_list_halted(&c.snap, &rows);
		for (int i = 0; i < count && *n < FELIX_MAX_HALTS; i++)
		{
			FelixHaltInfo *h = &(*halts)[*n];

			if (!copy_name(h->stream, rows[i].stream) || !copy_name(h->node, rows[i].node) ||
				!copy_name(h->leader, rows[i].leader))
				continue;
			h->shard = rows[i].shard;
			h->generation = (uint64) rows[i].generation;
			h->has_position = rows[i].position >= 0;
			h->position = h->has_position ? (uint64) rows[i].position : 0;
			strlcpy(h->reason, rows[i].reason, FELIX_HALT_REASON_LEN);
			h->since = ms_to_timestamptz(rows[i].since_ms);
			(*n)++;
		}
		return true;
	}
	else
	{
		PGresult   *res = remote(s, CP_STMT_HALTED, "felix.cp_halted",
								 "SELECT stream, shard, node, generation, leader, halted_at_seq, reason, "
								 "(extract(epoch FROM since) OPERATOR(pg_catalog.*) 1000)::bigint "
								 "FROM felix.cp_halted()",
								 0, NULL, elevel);

		if (res == NULL)
			return false;
		for (int i = 0; i < PQntuples(res) && *n < FELIX_MAX_HALTS && PQnfields(res) == 8; i++)
		{
			FelixHaltInfo *h = &(*halts)[*n];
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
				ms_to_timestamptz(v) : 0;
			(*n)++;
		}
		PQclear(res);
		return true;
	}
}

/* ---------------------------------------------------------------------
 * Replica reports (etcd; see replication/report.c for the embedded way)
 * ---------------------------------------------------------------------
 */

typedef struct ReportCall
{
	const char *reports;
	int64		token;
	int			accepted;
} ReportCall;

static void
report_local(void *arg)
{
	ReportCall *c = arg;
	const char *me = felix_node_name_resolved();
	char		incarnation[FELIX_INCARNATION_LEN];
	CpReportRow *rows;
	int			n = cp_report_parse(me, c->reports, &rows);

	felix_incarnation(incarnation, NULL);
	c->accepted = cp_report(me, rows, n, c->token, incarnation);
}

int
felix_cp_report(const char *reports, int64 token, int elevel)
{
	ReportCall	c = {reports, token, -1};

	Assert(felix_store_is_etcd());
	if (!local(report_local, &c, elevel))
		return -1;
	return c.accepted;
}

/* ---------------------------------------------------------------------
 * Backend calls
 * ---------------------------------------------------------------------
 */

/* A node registers only at an address that reaches it. */
static void
require_own_conninfo(int timeout_ms)
{
	int			verdict;

	if (felix_conninfo_verified() > 0)
		return;
	verdict = felix_verify_own_conninfo(timeout_ms, WARNING);
	if (verdict < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("node \"%s\" cannot join the cluster: felix.node_conninfo reaches another felix node",
						felix_node_name_resolved()),
				 errhint("Set felix.node_conninfo to an address of this server (the WARNING above says what it reached) and restart it.")));
	if (verdict == 0)
		/* most often: the node's own role may not log in here (yet) */
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("node \"%s\" cannot join the cluster: it cannot log in to itself through felix.node_conninfo",
						felix_node_name_resolved()),
				 errdetail("Logging in as role %s failed: %s",
						   felix_node_role(felix_node_name_resolved()), felix_conn_last_error()),
				 errhint("Let that role log in to this server: a pg_hba.conf line for +felix_replication, and its password in the passfile felix.node_conninfo names (scripts/felix-node-credentials writes both; docs/security.md, \"How nodes log in\").")));
}

/* Open a session for one backend call; its connection is closed by the caller. */
static void
open_for_call(FelixCpSession *s, int timeout_ms)
{
	(void) felix_cp_open(s, "felix", timeout_ms, ERROR);
}

/* One value of a one-row, one-column answer (ERROR otherwise). */
static char *
single_value(PGresult *res, const char *fn)
{
	char	   *v;

	if (PQntuples(res) != 1 || PQnfields(res) != 1 || PQgetisnull(res, 0, 0))
	{
		PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("%s on the control plane returned no value", fn),
				 errhint("Run the same felix version on every node and on the control plane.")));
	}
	v = pstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

/*
 * One call on a session of its own, closed whatever happens: the answer's
 * single value (want_value), or NULL.
 */
static char *
call_once(const char *fn, const char *sql, int nparams, const char *const *values,
		  bool want_value)
{
	FelixCpSession s;
	char	   *volatile v = NULL;

	open_for_call(&s, FELIX_CP_CALL_TIMEOUT_MS);
	PG_TRY();
	{
		PGresult   *res = remote(&s, CP_STMT_NONE, fn, sql, nparams, values, ERROR);

		if (want_value)
			v = single_value(res, fn);
		else
			PQclear(res);
	}
	PG_FINALLY();
	{
		felix_cp_close(&s);
	}
	PG_END_TRY();
	return v;
}

char *
felix_cp_create_stream(FelixCpSession *s, const char *name, const char *schema, int shards,
					   int replication_factor, const char *consistency,
					   const char *payload_type, const char *storage,
					   int64 retention_bytes, const char *retention, bool lead_here)
{
	char	   *creation_id;
	FelixCpShard *rows;
	int			nrows;
	int64		t_send;
	Identity	id;
	char		listed[FELIX_INCARNATION_LEN];
	FelixCpAnswer answer;

	require_own_conninfo(FELIX_CP_CALL_TIMEOUT_MS);

	/*
	 * Register first, unless the control plane's node list already holds
	 * this node at this incarnation: a placement counts only alive nodes
	 * and the caller, whose record it must find, even before its worker's
	 * first beat.  (A heartbeat reads the whole state; at thousands of
	 * shards it was half of each call.)  This heartbeat's answer is not
	 * applied here; a lease it claims is one this node does not use until
	 * its worker claims it again, so the node only ever believes in less
	 * lease than it holds.
	 */
	identity(&id);
	if (!felix_node_incarnation_of(felix_node_name_resolved(), listed) ||
		strcmp(listed, id.incarnation) != 0)
		(void) felix_cp_heartbeat(s, NULL, 0, NULL, 0, false, NULL, NULL, NULL, &t_send, &rows, &nrows, &answer, ERROR);
	if (felix_store_is_etcd())
	{
		CpCreateArgs a;

		memset(&a, 0, sizeof(a));
		a.name = name;
		a.schema = schema;
		a.shards = shards;
		a.replication_factor = replication_factor;
		a.consistency = consistency;
		a.payload_type = payload_type;
		a.storage = storage;
		a.has_retention_bytes = retention_bytes >= 0;
		a.retention_bytes = retention_bytes;
		a.caller = felix_node_name_resolved();
		a.lead_caller = lead_here;
		if (retention != NULL)
		{
			Interval   *iv = DatumGetIntervalP(DirectFunctionCall3(interval_in,
																   CStringGetDatum(retention),
																   ObjectIdGetDatum(InvalidOid),
																   Int32GetDatum(-1)));

			a.has_retention = true;
			a.retention_months = iv->month;
			a.retention_days = iv->day;
			a.retention_usec = iv->time;
		}
		creation_id = cp_create_stream(&a);
	}
	else
	{
		char		shards_s[16];
		char		rf_s[16];
		char		rb_s[32];
		const char *values[10];

		snprintf(shards_s, sizeof(shards_s), "%d", shards);
		snprintf(rf_s, sizeof(rf_s), "%d", replication_factor);
		snprintf(rb_s, sizeof(rb_s), INT64_FORMAT, retention_bytes);
		values[0] = name;
		values[1] = schema;
		values[2] = shards_s;
		values[3] = rf_s;
		values[4] = consistency;
		values[5] = payload_type;
		values[6] = storage;
		values[7] = retention_bytes < 0 ? NULL : rb_s;
		values[8] = retention;
		values[9] = lead_here ? "true" : "false";
		creation_id = single_value(remote(s, CP_STMT_NONE, "felix.cp_create_stream",
										  "SELECT felix.cp_create_stream($1, $3::integer, $4::integer, $5, $6, $7, "
										  "$8::bigint, $9::interval, schema => $2, lead_here => $10::boolean)",
										  10, values, ERROR),
								   "felix.cp_create_stream");
	}
	if (!cp_is_uuid(creation_id))
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("felix.cp_create_stream on the control plane returned a creation id that is not a uuid"),
				 errhint("Run the same felix version on every node and on the control plane.")));
	return creation_id;
}

typedef struct DropCall
{
	const char *name;
	const char *creation_id;
} DropCall;

static void
drop_local(void *arg)
{
	DropCall   *c = arg;

	cp_drop_stream(c->name, c->creation_id, true);
}

static bool
drop_stream(const char *name, const char *creation_id, int elevel, int timeout_ms)
{
	FelixCpSession s;
	volatile bool ok = false;
	DropCall	c = {name, creation_id};

	if (!felix_cp_open(&s, "felix", timeout_ms, elevel))
		return false;
	PG_TRY();
	{
		if (felix_store_is_etcd())
			ok = local(drop_local, &c, elevel);
		else
		{
			const char *values[2] = {name, creation_id};
			PGresult   *res = remote(&s, CP_STMT_NONE, "felix.cp_drop_stream",
									 "SELECT felix.cp_drop_stream($1, $2::pg_catalog.uuid, true)",
									 2, values, elevel);

			ok = res != NULL;
			PQclear(res);
		}
	}
	PG_FINALLY();
	{
		felix_cp_close(&s);
	}
	PG_END_TRY();
	return ok;
}

void
felix_cp_drop_stream(const char *name, const char *creation_id)
{
	(void) drop_stream(name, creation_id, ERROR, FELIX_CP_CALL_TIMEOUT_MS);
}

bool
felix_cp_unregister_stream(const char *name, const char *creation_id)
{
	return drop_stream(name, creation_id, WARNING, FELIX_CP_ABORT_TIMEOUT_MS);
}

uint64
felix_cp_transfer(FelixCpSession *s, const char *stream, int shard, uint64 generation,
				  const char *to_node)
{
	if (felix_store_is_etcd())
		return (uint64) cp_transfer(stream, shard, (int64) generation,
									felix_node_name_resolved(), to_node);
	else
	{
		char		shard_s[16];
		char		gen_s[24];
		const char *values[5];

		snprintf(shard_s, sizeof(shard_s), "%d", shard);
		snprintf(gen_s, sizeof(gen_s), UINT64_FORMAT, generation);
		values[0] = stream;
		values[1] = shard_s;
		values[2] = gen_s;
		values[3] = felix_node_name_resolved();
		values[4] = to_node;
		return strtou64(single_value(remote(s, CP_STMT_NONE, "felix.cp_transfer",
											"SELECT felix.cp_transfer($1, $2::integer, $3::bigint, $4, $5)",
											5, values, ERROR),
									 "felix.cp_transfer"), NULL, 10);
	}
}

char *
felix_cp_move_replica(const char *stream, int shard, const char *from_node,
					  const char *to_node)
{
	char		shard_s[16];
	const char *values[4];

	if (felix_store_is_etcd())
		return cp_move_replica(stream, shard, from_node, to_node);
	snprintf(shard_s, sizeof(shard_s), "%d", shard);
	values[0] = stream;
	values[1] = shard_s;
	values[2] = from_node;
	values[3] = to_node;
	return call_once("felix.cp_move_replica", "SELECT felix.cp_move_replica($1, $2::integer, $3, $4)",
					 4, values, true);
}

CpPromoted
felix_cp_promote_copy(const char *stream, int shard, const char *node)
{
	CpPromoted	p;
	char		shard_s[16];
	const char *values[3];
	char	   *json;
	char		err[256];
	JsonbContainer *o;

	if (felix_store_is_etcd())
		return cp_promote_copy(stream, shard, node);
	memset(&p, 0, sizeof(p));
	snprintf(shard_s, sizeof(shard_s), "%d", shard);
	values[0] = stream;
	values[1] = shard_s;
	values[2] = node;
	json = call_once("felix.cp_promote_copy", "SELECT felix.cp_promote_copy($1, $2::integer, $3)",
					 3, values, true);
	o = felix_json_parse(json, strlen(json), err, sizeof(err));
	if (o == NULL || !felix_json_int64(o, "generation", &p.generation) ||
		!felix_json_int64(o, "copy_end", &p.copy_end))
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("felix.cp_promote_copy on the control plane answered \"%s\"", json),
				 errhint("Run the same felix version on every node and on the control plane.")));
	if (!felix_json_string(o, "may_lose", &p.may_lose))
		p.may_lose = NULL;
	return p;
}

void
felix_cp_remove_node(const char *node)
{
	const char *values[1] = {node};

	if (felix_store_is_etcd())
	{
		cp_remove_node(node);
		return;
	}
	(void) call_once("felix.cp_remove_node", "SELECT felix.cp_remove_node($1)", 1, values, false);
}
