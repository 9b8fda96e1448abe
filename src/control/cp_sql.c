/*-------------------------------------------------------------------------
 *
 * cp_sql.c
 *	  The felix.cp_* functions: the control plane's rules (cp.h) over the
 *	  embedded store, for nodes that reach this database over libpq.  Each
 *	  checks its caller first -- a node logs in as its own role,
 *	  felix_node_<name>, and acts only for itself; calls that are not about
 *	  one node accept any node's role; superusers may act for any node --
 *	  then runs the rule as the extension's owner with search_path pinned
 *	  (privilege.c), so the caller's search_path and privileges play no
 *	  part.  A server whose control plane is etcd refuses them: its state
 *	  is not here.
 *
 * Locking rule: the embedded store's (store_table.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "control/conninfo.h"
#include "control/cp.h"
#include "control/json.h"
#include "felix.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "base/privilege.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

/*
 * libpq/libpq.h declares it, but also pulls in libpq-be.h, which needs the
 * GSSAPI headers whenever the server was built with them.
 */
extern bool pq_check_connection(void);

/* The session's login role, which a node's connection names. */
static char *
session_role(void)
{
	return GetUserNameFromId(GetSessionUserId(), false);
}

static bool
session_is_superuser(void)
{
	return superuser_arg(GetSessionUserId());
}

/*
 * Refuse a caller that does not act for `node` (NULL: any node's role).
 * Returns the node the caller is, or NULL for a superuser not being one.
 */
static const char *
require_node(const char *node, const char *call)
{
	char	   *role = session_role();
	Oid			repl = get_role_oid("felix_replication", true);
	bool		is_node_role = strncmp(role, FELIX_NODE_ROLE_PREFIX,
									   strlen(FELIX_NODE_ROLE_PREFIX)) == 0 &&
		OidIsValid(repl) && is_member_of_role(GetSessionUserId(), repl);
	const char *me = is_node_role ? role + strlen(FELIX_NODE_ROLE_PREFIX) : NULL;

	if (felix_store_is_etcd())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: this server keeps no control-plane state: the cluster's control plane is in etcd", call),
				 errhint("Point felix.etcd_endpoints of the calling node at the same etcd cluster.")));
	if (session_is_superuser())
		return me;
	if (node != NULL)
	{
		if (me != NULL && strcmp(me, node) == 0)
			return me;
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s: role \"%s\" may not act for node \"%s\"", call, role, node),
				 errdetail("Node \"%s\" logs in as role \"%s\".", node, felix_node_role(node)),
				 errhint("Set the user of felix.node_conninfo on node \"%s\" to %s (or leave it out), and create that role with felix_create_node_role('%s') on every server.",
						 node, felix_node_role(node), node)));
	}
	if (me != NULL)
		return me;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("%s: role \"%s\" is not the role of a felix node", call, role),
			 errhint("Only felix nodes call the control plane's functions, each as its felix_node_<name> role.")));
	return NULL;
}

static char *
text_arg(FunctionCallInfo fcinfo, int i)
{
	return PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
}

/* A text[] argument (not NULL) as a palloc'd array; NULL elements as "". */
static char **
text_array_arg(FunctionCallInfo fcinfo, int i, int *n)
{
	Datum	   *elems;
	bool	   *nulls;
	char	  **out;

	deconstruct_array(PG_GETARG_ARRAYTYPE_P(i), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, n);
	out = palloc0(sizeof(char *) * (*n + 1));
	for (int j = 0; j < *n; j++)
		out[j] = nulls[j] ? pstrdup("") : TextDatumGetCString(elems[j]);
	return out;
}

static TimestampTz
ms_to_timestamptz(int64 ms)
{
	return (TimestampTz) (ms * 1000 -
						  ((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY));
}

static Datum
text_array(char *const *items, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * (n + 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(items[i]);
	return PointerGetDatum(construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/* Run the rules as the extension's owner, search_path pinned. */
#define AS_OWNER(body) \
	do { \
		FelixContext cxt_; \
		felix_context_begin(&cxt_, felix_catalog_owner()); \
		body; \
		felix_context_end(&cxt_); \
	} while (0)

/* ---------------------------------------------------------------------
 * felix.cp_heartbeat
 * ---------------------------------------------------------------------
 */
/* felix.cp_heartbeat's columns: 20 of an assignment, then the header's. */
#define HB_SQL_STORE_ID			20
#define HB_SQL_STORE_REVISION	21
#define HB_SQL_STATE_REVISION	22
#define HB_SQL_FULL				23
#define HB_SQL_COLS				24

PG_FUNCTION_INFO_V1(felix_cp_heartbeat_sql);
Datum
felix_cp_heartbeat_sql(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	CpHeartbeatArgs a;
	CpHeartbeatResult res;

	memset(&a, 0, sizeof(a));
	a.node = text_arg(fcinfo, 0);
	cp_check_node_name(a.node);
	(void) require_node(a.node, "felix.cp_heartbeat");
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3) || PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("node \"%s\": conninfo, incarnation, starts and boot must not be NULL", a.node),
				 errhint("Pass the conninfo peers use to reach the node (felix.node_conninfo) and the identity of its felix data directory.")));
	a.conninfo = text_arg(fcinfo, 1);
	a.incarnation = text_arg(fcinfo, 2);
	a.starts = PG_GETARG_INT64(3);
	a.boot = text_arg(fcinfo, 4);
	a.unable_given = !PG_ARGISNULL(5);
	if (a.unable_given)
		a.unable = text_array_arg(fcinfo, 5, &a.nunable);
	a.lease_ms = PG_ARGISNULL(6) ? felix_lease_duration : PG_GETARG_INT32(6);
	a.peers = PG_ARGISNULL(7) ? NULL :
		JsonbToCString(NULL, &PG_GETARG_JSONB_P(7)->root, 64);
	a.ends_given = !PG_ARGISNULL(8);
	if (a.ends_given)
		a.ends = text_array_arg(fcinfo, 8, &a.nends);
	a.seen_store_id = text_arg(fcinfo, 9);
	a.seen_revision = PG_ARGISNULL(10) ? 0 : PG_GETARG_INT64(10);
	a.known_state = PG_ARGISNULL(11) ? 0 : PG_GETARG_INT64(11);
	a.known_commit = PG_ARGISNULL(12) ? 0 : PG_GETARG_INT64(12);
	a.ends_unchanged = !PG_ARGISNULL(13) && PG_GETARG_BOOL(13);

	InitMaterializedSRF(fcinfo, 0);
	AS_OWNER(cp_heartbeat(&a, &res));

	/*
	 * A node that gave up on this call has gone on to its next heartbeat,
	 * which reads its log ends again: log ends read before that one must
	 * not commit after it (the duty holder counts ends_beat to tell when
	 * ends were read; ends_read_after in cp_duty.c).  A call that reached
	 * the server late, after its client closed the connection, is
	 * refused here rather than committed.
	 */
	if ((a.ends_given || a.ends_unchanged) && MyProcPort != NULL && whereToSendOutput == DestRemote &&
		!pq_check_connection())
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("node \"%s\": the heartbeat's connection closed before it committed", a.node),
				 errhint("The node has given up on this call; its next heartbeat goes on.")));

	/*
	 * The answer's header first: no assignment (stream NULL), what the
	 * answer is of.  Every answer has it, an empty one too.
	 */
	{
		Datum		v[HB_SQL_COLS];
		bool		nulls[HB_SQL_COLS];

		memset(nulls, true, sizeof(nulls));
		nulls[HB_SQL_STORE_ID] = nulls[HB_SQL_STORE_REVISION] = false;
		nulls[HB_SQL_STATE_REVISION] = nulls[HB_SQL_FULL] = false;
		v[HB_SQL_STORE_ID] = CStringGetTextDatum(res.store_id);
		v[HB_SQL_STORE_REVISION] = Int64GetDatum(res.revision);
		v[HB_SQL_STATE_REVISION] = Int64GetDatum(res.state_revision);
		v[HB_SQL_FULL] = BoolGetDatum(res.full);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
	}
	for (int i = 0; i < res.n; i++)
	{
		const CpAssignment *r = &res.rows[i];
		const CpShard *s = r->shard;
		const CpStream *st = r->stream;
		Datum		v[HB_SQL_COLS];
		bool		nulls[HB_SQL_COLS];

		memset(nulls, 0, sizeof(nulls));
		v[0] = CStringGetTextDatum(s->stream);
		v[1] = Int32GetDatum(s->shard);
		v[2] = Int64GetDatum(s->generation);
		nulls[3] = s->leader == NULL;
		v[3] = s->leader ? CStringGetTextDatum(s->leader) : (Datum) 0;
		nulls[4] = r->leader_conninfo == NULL;
		v[4] = r->leader_conninfo ? CStringGetTextDatum(r->leader_conninfo) : (Datum) 0;
		v[5] = text_array(s->replicas, s->nreplicas);
		v[6] = BoolGetDatum(r->lease_granted);
		v[7] = Int32GetDatum(r->lease_ms);
		nulls[8] = s->unplaced_reason == NULL;
		v[8] = s->unplaced_reason ? CStringGetTextDatum(s->unplaced_reason) : (Datum) 0;
		v[9] = Int32GetDatum(st->shards);
		v[10] = Int32GetDatum(st->replication_factor);
		v[11] = CStringGetTextDatum(st->consistency);
		v[12] = CStringGetTextDatum(st->payload_type);
		nulls[13] = st->retention_bytes < 0;
		v[13] = Int64GetDatum(st->retention_bytes);
		nulls[14] = !st->has_retention;
		if (st->has_retention)
		{
			Interval   *iv = palloc(sizeof(Interval));

			iv->month = st->retention_months;
			iv->day = st->retention_days;
			iv->time = st->retention_usec;
			v[14] = IntervalPGetDatum(iv);
		}
		v[15] = CStringGetTextDatum(st->schema);
		v[16] = DirectFunctionCall1(uuid_in, CStringGetDatum(st->creation_id));
		nulls[17] = s->joining == NULL;
		v[17] = s->joining ? CStringGetTextDatum(s->joining) : (Datum) 0;
		nulls[18] = s->leaving == NULL;
		v[18] = s->leaving ? CStringGetTextDatum(s->leaving) : (Datum) 0;
		nulls[19] = s->leader_incarnation == NULL;
		v[19] = s->leader_incarnation ? CStringGetTextDatum(s->leader_incarnation) : (Datum) 0;
		nulls[HB_SQL_STORE_ID] = nulls[HB_SQL_STORE_REVISION] = true;
		nulls[HB_SQL_STATE_REVISION] = nulls[HB_SQL_FULL] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
	}
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * felix.cp_report
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(felix_cp_report_sql);
Datum
felix_cp_report_sql(PG_FUNCTION_ARGS)
{
	char	   *leader = text_arg(fcinfo, 0);
	char	   *json = PG_ARGISNULL(1) ? NULL :
		JsonbToCString(NULL, &PG_GETARG_JSONB_P(1)->root, 256);
	int64		token = PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2);
	char	   *incarnation = text_arg(fcinfo, 3);
	CpReportRow *rows;
	int			n;
	int			accepted = 0;

	if (leader == NULL || leader[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a reporting node name must not be NULL or empty"),
				 errhint("Pass the name of the node that leads the reported shards.")));
	/* only a node speaks for its own leaderships */
	(void) require_node(leader, "felix.cp_report");
	n = cp_report_parse(leader, json, &rows);
	AS_OWNER(accepted = cp_report(leader, rows, n, token, incarnation));
	PG_RETURN_INT32(accepted);
}

/* ---------------------------------------------------------------------
 * felix.cp_tick
 * ---------------------------------------------------------------------
 */
/*
 * felix.cp_name_clash(node, incarnation, conninfo): a server refused the
 * name `node` records that it tried (cp_name_clash), only as that node.
 */
PG_FUNCTION_INFO_V1(felix_cp_name_clash_sql);
Datum
felix_cp_name_clash_sql(PG_FUNCTION_ARGS)
{
	char	   *node = text_arg(fcinfo, 0);
	char	   *incarnation = text_arg(fcinfo, 1);
	char	   *conninfo = text_arg(fcinfo, 2);

	cp_check_node_name(node);
	(void) require_node(node, "felix.cp_name_clash");
	AS_OWNER(cp_name_clash(node, incarnation, conninfo));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(felix_cp_tick_sql);
Datum
felix_cp_tick_sql(PG_FUNCTION_ARGS)
{
	char	   *node = text_arg(fcinfo, 0);
	char	   *boot = text_arg(fcinfo, 1);
	CpTick		tick;
	ListCell   *lc;
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	cp_check_node_name(node);
	(void) require_node(node, "felix.cp_tick");
	if (!cp_is_uuid(boot))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\": boot %s is not a uuid", node, boot ? boot : "NULL"),
				 errhint("This is felix's internal protocol; node and control plane may run different felix versions.")));
	AS_OWNER(cp_duty_tick(node, boot, &tick));

	/*
	 * Each grantee claims its lease at its next heartbeat: wake it now.  The
	 * heartbeat worker of every node listens on its session here
	 * (worker/heartbeat.c); the notice goes out when this call commits,
	 * after the grants it names.  It says only "heartbeat now", which is
	 * all a forged one could make a node do.
	 */
	foreach(lc, tick.grantees)
		Async_Notify(CP_GRANTS_CHANNEL, strVal(lfirst(lc)));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "felix.cp_tick: return type must be a row type");
	values[0] = Int32GetDatum(tick.promoted);
	values[1] = Int32GetDatum(tick.lapse_in_ms);
	nulls[1] = tick.lapse_in_ms < 0;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* ---------------------------------------------------------------------
 * Streams and moves
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(felix_cp_create_stream_sql);
Datum
felix_cp_create_stream_sql(PG_FUNCTION_ARGS)
{
	CpCreateArgs a;
	char	   *id = NULL;
	const char *names[] = {"shards", "replication_factor", "consistency",
	"payload_type", "storage"};

	felix_require_nargs(fcinfo, 10, "felix.cp_create_stream");
	memset(&a, 0, sizeof(a));
	a.name = text_arg(fcinfo, 0);
	if (a.name == NULL || a.name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL or empty"),
				 errhint("Pass the stream's name as the first argument.")));
	a.caller = require_node(NULL, "felix.cp_create_stream");
	for (int i = 1; i <= 5; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("stream \"%s\": %s must not be NULL", a.name, names[i - 1]),
					 errhint("Leave the argument out to use its default.")));
	a.shards = PG_GETARG_INT32(1);
	a.replication_factor = PG_GETARG_INT32(2);
	a.consistency = text_arg(fcinfo, 3);
	a.payload_type = text_arg(fcinfo, 4);
	a.storage = text_arg(fcinfo, 5);
	a.has_retention_bytes = !PG_ARGISNULL(6);
	a.retention_bytes = a.has_retention_bytes ? PG_GETARG_INT64(6) : 0;
	a.has_retention = !PG_ARGISNULL(7);
	if (a.has_retention)
	{
		Interval   *iv = PG_GETARG_INTERVAL_P(7);

		a.retention_months = iv->month;
		a.retention_days = iv->day;
		a.retention_usec = iv->time;
	}
	a.schema = text_arg(fcinfo, 8);
	a.lead_caller = !PG_ARGISNULL(9) && PG_GETARG_BOOL(9);
	AS_OWNER(id = cp_create_stream(&a));
	PG_RETURN_DATUM(DirectFunctionCall1(uuid_in, CStringGetDatum(id)));
}

PG_FUNCTION_INFO_V1(felix_cp_drop_stream_sql);
Datum
felix_cp_drop_stream_sql(PG_FUNCTION_ARGS)
{
	char	   *name = text_arg(fcinfo, 0);
	char	   *id = PG_ARGISNULL(1) ? NULL :
		DatumGetCString(DirectFunctionCall1(uuid_out, PG_GETARG_DATUM(1)));
	bool		missing_ok = !PG_ARGISNULL(2) && PG_GETARG_BOOL(2);

	(void) require_node(NULL, "felix.cp_drop_stream");
	AS_OWNER(cp_drop_stream(name, id, missing_ok));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(felix_cp_transfer_sql);
Datum
felix_cp_transfer_sql(PG_FUNCTION_ARGS)
{
	char	   *from_node = text_arg(fcinfo, 3);
	int64		g = 0;

	/* only the leader hands its own leadership over */
	cp_check_node_name(from_node);
	(void) require_node(from_node, "felix.cp_transfer");
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix.cp_transfer: stream, shard, generation and to_node must not be NULL"),
				 errhint("Name the shard, the generation it is led at and the node taking it.")));
	AS_OWNER(g = cp_transfer(text_arg(fcinfo, 0), PG_GETARG_INT32(1), PG_GETARG_INT64(2),
							 from_node, text_arg(fcinfo, 4)));
	PG_RETURN_INT64(g);
}

PG_FUNCTION_INFO_V1(felix_cp_move_replica_sql);
Datum
felix_cp_move_replica_sql(PG_FUNCTION_ARGS)
{
	char	   *set = NULL;

	(void) require_node(NULL, "felix.cp_move_replica");
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix.cp_move_replica: stream and shard must not be NULL"),
				 errhint("Name the shard whose replica moves.")));
	AS_OWNER(set = cp_move_replica(text_arg(fcinfo, 0), PG_GETARG_INT32(1),
								   text_arg(fcinfo, 2), text_arg(fcinfo, 3)));
	PG_RETURN_TEXT_P(cstring_to_text(set));
}

PG_FUNCTION_INFO_V1(felix_cp_remove_node_sql);
Datum
felix_cp_remove_node_sql(PG_FUNCTION_ARGS)
{
	char	   *node = text_arg(fcinfo, 0);

	(void) require_node(NULL, "felix.cp_remove_node");
	AS_OWNER(cp_remove_node(node));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(felix_cp_promote_copy_sql);
Datum
felix_cp_promote_copy_sql(PG_FUNCTION_ARGS)
{
	char	   *node = text_arg(fcinfo, 2);
	CpPromoted	p;
	StringInfoData b;

	(void) require_node(NULL, "felix.cp_promote_copy");
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || node == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix.cp_promote_copy: stream, shard and node must not be NULL"),
				 errhint("Name the shard and the node whose copy is to lead it.")));
	cp_check_node_name(node);
	AS_OWNER(p = cp_promote_copy(text_arg(fcinfo, 0), PG_GETARG_INT32(1), node));
	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_int64(&b, "generation", p.generation);
	felix_json_put_int64(&b, "copy_end", p.copy_end);
	if (p.may_lose)
		felix_json_put_string(&b, "may_lose", p.may_lose);
	appendStringInfoChar(&b, '}');
	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(b.data)));
}

/* ---------------------------------------------------------------------
 * Listings
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(felix_cp_nodes_sql);
Datum
felix_cp_nodes_sql(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	CpSnapshot	snap;
	CpNodeRow  *rows;
	int			n = 0;

	(void) require_node(NULL, "felix.cp_nodes");
	InitMaterializedSRF(fcinfo, 0);
	AS_OWNER((void) cp_read_for_nodes(&snap, ERROR); n = cp_list_nodes(&snap, &rows));
	for (int i = 0; i < n; i++)
	{
		Datum		v[10];
		bool		nulls[10] = {0};
		const CpClash *c = rows[i].clash;

		v[0] = CStringGetTextDatum(rows[i].node->name);
		v[1] = CStringGetTextDatum(felix_conninfo_mask(rows[i].node->conninfo));
		v[2] = BoolGetDatum(rows[i].alive);
		v[3] = TimestampTzGetDatum(ms_to_timestamptz(rows[i].node->heartbeat_ms));
		v[4] = CStringGetTextDatum(rows[i].node->incarnation);
		v[5] = BoolGetDatum(rows[i].duty);
		v[6] = DirectFunctionCall1(jsonb_in, CStringGetDatum(rows[i].node->peers));
		nulls[7] = nulls[8] = nulls[9] = c == NULL;
		if (c != NULL)
		{
			v[7] = CStringGetTextDatum(c->incarnation);
			v[8] = CStringGetTextDatum(felix_conninfo_mask(c->conninfo));
			v[9] = TimestampTzGetDatum(ms_to_timestamptz(c->at_ms));
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
	}
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(felix_cp_halted_sql);
Datum
felix_cp_halted_sql(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	CpSnapshot	snap;
	CpHaltRow  *rows;
	int			n = 0;

	(void) require_node(NULL, "felix.cp_halted");
	InitMaterializedSRF(fcinfo, 0);
	AS_OWNER((void) cp_snapshot_read(&snap, false, ERROR); n = cp_list_halted(&snap, &rows));
	for (int i = 0; i < n; i++)
	{
		Datum		v[8];
		bool		nulls[8] = {0};

		v[0] = CStringGetTextDatum(rows[i].stream);
		v[1] = Int32GetDatum(rows[i].shard);
		v[2] = CStringGetTextDatum(rows[i].node);
		v[3] = Int64GetDatum(rows[i].generation);
		v[4] = CStringGetTextDatum(rows[i].leader);
		nulls[5] = rows[i].position < 0;
		v[5] = Int64GetDatum(rows[i].position);
		v[6] = CStringGetTextDatum(rows[i].reason);
		v[7] = TimestampTzGetDatum(ms_to_timestamptz(rows[i].since_ms));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
	}
	return (Datum) 0;
}

/*
 * felix.cp_score(node, stream, shard): the placement score (cp_score), so
 * that an operator -- or a test -- can tell where a stream will be placed.
 */
PG_FUNCTION_INFO_V1(felix_cp_score_sql);
Datum
felix_cp_score_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(cp_score(text_to_cstring(PG_GETARG_TEXT_PP(0)),
							 text_to_cstring(PG_GETARG_TEXT_PP(1)),
							 PG_GETARG_INT32(2)));
}
