/*-------------------------------------------------------------------------
 *
 * forward.c
 *	  Publishing on a node that does not lead the shard: the publish is
 *	  forwarded to the shard's leader, which appends it and answers with
 *	  its seq once it is acknowledged, so a client may connect to any node
 *	  of the cluster.  Both halves are here:
 *
 *	  - the asking side (forward_publish), used by felix_publish and
 *	    felix_publish_batch (publish.c) for a shard this node does not
 *	    lead while felix.forward_publishes is on.  It connects as this
 *	    node's own role to the leader the control plane names and calls
 *	    felix.forward_publish with the sealed batch and the publishing
 *	    role.  A leader that refuses at admission ("not_leader": nothing
 *	    of the batch was appended) or that has not learned of the stream
 *	    yet (42P01) is asked again, and so is the next leader once the
 *	    control plane names one, until felix.quorum_timeout;
 *	    so a publish follows a failover.  A call whose answer never came
 *	    (the connection broke once the request was sent) is not sent
 *	    again: its records may have been appended, and sending them again
 *	    could publish them twice.  It fails with 55F01, the fate-unknown
 *	    error of a quorum publish;
 *	  - the answering side (felix.forward_publish), on the leader: for a
 *	    caller acting for the cluster (a member of felix_replication), it
 *	    checks the publishing role's privileges as felix_publish does where
 *	    the client connected (INSERT, row security, INSERT triggers, the
 *	    owner's byte cap), checks every record as a follower checks a
 *	    shipment (the batch's checksum and shape, each key valid text and
 *	    each payload a valid value of the stream's type), builds its own
 *	    batch of them, and publishes it through the ordinary write path,
 *	    with the same durability.
 *
 *	  The peers trust a node to name the publishing role truthfully, as
 *	  they trust it with reads (remote.c): nodes are one trust domain for
 *	  that, never for the bytes they send (docs/security.md).
 *
 * Locking rule: backend-local.  The asking side keeps one connection per
 * leader for the life of the backend (closed when it breaks); nothing is
 * waited for without a deadline and an interrupt check (client.c).  The
 * answering side takes RowExclusiveLock on the stream's table, as a
 * publish does, after the privilege check.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "libpq-fe.h"

#include "access/htup_details.h"
#include "funcapi.h"

#include "core/catalog.h"
#include "api/forward.h"
#include "core/payload.h"
#include "api/publish.h"
#include "catalog/pg_type.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "control/nodes.h"
#include "base/wake.h"
#include "felix.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "base/privilege.h"
#include "replication/lease.h"
#include "replication/leader.h"
#include "storage/format.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* How long connecting to a leader may take. */
#define FORWARD_CONNECT_TIMEOUT_MS	2000
/* Leaders this backend keeps a connection to (and a commit may span). */
#define FORWARD_MAX_CONNS			32

typedef struct ForwardConn
{
	char		node[NAMEDATALEN];
	PGconn	   *conn;
} ForwardConn;

static ForwardConn conns[FORWARD_MAX_CONNS];

/* ---------------------------------------------------------------------
 * The asking side
 * ---------------------------------------------------------------------
 */

bool
forward_leader(FelixShard *s, char *leader)
{
	FelixShardView v;

	leader[0] = '\0';
	if (!felix_forward_publishes)
		return false;
	shard_read(s, &v);
	if (!v.clustered || v.role == FELIX_ROLE_LEADER || v.leader[0] == '\0' ||
		felix_is_this_node(v.leader))
		return false;
	strlcpy(leader, v.leader, NAMEDATALEN);
	return true;
}

bool
forward_wanted(FelixShard *s)
{
	char		leader[NAMEDATALEN];

	return forward_leader(s, leader);
}

bool
forward_conn_alive(PGconn *conn)
{
	return felix_conn_usable(conn) && PQconsumeInput(conn) == 1 &&
		PQstatus(conn) == CONNECTION_OK && !PQisBusy(conn);
}

/*
 * The forwarding session's own limits on the leader: a call this side gave
 * up on does not run on there for long (statement_timeout, and the check
 * that the client is still connected), and an idle session goes after a
 * minute, so that backends of every node that once forwarded do not hold
 * the leader's connection slots.
 */
static bool
limit_session(PGconn *conn)
{
	char		stmt[32];
	const char *values[1] = {stmt};
	PGresult   *res;

	snprintf(stmt, sizeof(stmt), "%dms", 2 * felix_quorum_timeout + 2 * felix_lease_duration + 1000);
	res = felix_conn_exec(conn, "set_config",
						  "SELECT pg_catalog.set_config('statement_timeout', $1, false), "
						  "pg_catalog.set_config('client_connection_check_interval', '1000ms', false), "
						  "pg_catalog.set_config('idle_session_timeout', '60s', false)",
						  1, values, FORWARD_CONNECT_TIMEOUT_MS, DEBUG1);
	PQclear(res);
	return res != NULL;
}

PGconn *
forward_conn(const char *name)
{
	char		address[FELIX_NODE_CONNINFO_LEN];
	ForwardConn *slot = NULL;

	for (int i = 0; i < FORWARD_MAX_CONNS; i++)
	{
		ForwardConn *c = &conns[i];

		if (c->conn != NULL && strcmp(c->node, name) == 0)
		{
			if (forward_conn_alive(c->conn))
				return c->conn;
			felix_conn_close(c->conn);
			c->conn = NULL;
		}
		if (c->conn == NULL && slot == NULL)
			slot = c;
	}
	if (slot == NULL)
	{
		/*
		 * Every slot taken: one whose session is idle goes (leaders are
		 * few).  Never one inside a transaction -- a commit staged there
		 * would be cut back under its feet.
		 */
		int			start = (int) (random() % FORWARD_MAX_CONNS);

		for (int i = 0; i < FORWARD_MAX_CONNS && slot == NULL; i++)
		{
			ForwardConn *c = &conns[(start + i) % FORWARD_MAX_CONNS];

			if (PQtransactionStatus(c->conn) != PQTRANS_INTRANS &&
				PQtransactionStatus(c->conn) != PQTRANS_INERROR)
				slot = c;
		}
		if (slot == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("a commit may span at most %d other leaders", FORWARD_MAX_CONNS),
					 errhint("Nothing of the transaction was published.  Commit in smaller transactions, or insert on a node that leads more of the shards.")));
		felix_conn_close(slot->conn);
		slot->conn = NULL;
	}
	if (!felix_node_conninfo_of(name, address, sizeof(address)))
		return NULL;
	slot->conn = felix_conn_open(felix_peer_conninfo(address), psprintf("node \"%s\"", name),
								 "felix forward", FORWARD_CONNECT_TIMEOUT_MS, DEBUG1);
	if (slot->conn != NULL && !limit_session(slot->conn))
	{
		felix_conn_close(slot->conn);
		slot->conn = NULL;
	}
	if (slot->conn == NULL)
		return NULL;
	strlcpy(slot->node, name, NAMEDATALEN);
	return slot->conn;
}

void
forward_drop_conn(const char *name)
{
	for (int i = 0; i < FORWARD_MAX_CONNS; i++)
		if (conns[i].conn != NULL && strcmp(conns[i].node, name) == 0)
		{
			felix_conn_close(conns[i].conn);
			conns[i].conn = NULL;
		}
}

bool
forward_outcome_unknown(int sqlerrcode)
{
	char	   *state = unpack_sql_state(sqlerrcode);

	return strncmp(state, "08", 2) == 0 || strncmp(state, "57", 2) == 0 ||
		sqlerrcode == FELIX_ERRCODE_QUORUM_TIMEOUT;
}

/* Ask node `leader` to publish; NULL when it does not know the stream yet. */
static PGresult *
call_leader(const FelixStream *stream, int shard, const char *leader, PGconn *conn,
			const char *const *values, long timeout_ms)
{
	MemoryContext cxt = CurrentMemoryContext;
	PGresult   *volatile res = NULL;

	PG_TRY();
	{
		res = felix_conn_exec(conn, "felix.forward_publish",
							  "SELECT status, seq FROM felix.forward_publish($1, $2, $3::pg_catalog.int4, $4, $5::pg_catalog.bytea)",
							  5, values, timeout_ms, ERROR);
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		FlushErrorState();
		/* whatever happened, the session may be mid-call: never reuse it */
		forward_drop_conn(leader);
		if (forward_outcome_unknown(e->sqlerrcode))
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
					 errmsg("stream \"%s\" shard %d: the publish forwarded to leader \"%s\" got no answer",
							stream->name, shard, leader),
					 errdetail("%s", e->message ? e->message : "the call failed"),
					 errhint("Its records may or may not have been published; read the shard to find out before publishing them again.")));
		/* a leader that has not learned of the stream yet: nothing was appended */
		if (e->sqlerrcode == ERRCODE_UNDEFINED_TABLE)
		{
			FreeErrorData(e);
			return NULL;
		}
		/* the leader's refusal, as the leader said it */
		e->elevel = ERROR;
		e->context = psprintf("publish forwarded to the leader of stream \"%s\" shard %d, node \"%s\"",
							  stream->name, shard, leader);
		ReThrowError(e);
	}
	PG_END_TRY();
	return res;
}

uint64
forward_publish(const FelixStream *stream, int shard, StringInfo batch, uint32 count)
{
	FelixShard *s = felix_stream_shard(stream, shard);
	int64		deadline = felix_monotonic_ns() + (int64) felix_quorum_timeout * 1000000;
	char	   *hex = palloc(batch->len * 2 + 3);
	char		shard_s[16];
	const char *values[5];
	StringInfoData why;
	bool		woke = false;

	/* the sealed batch as a bytea literal; its checksum travels inside */
	hex[0] = '\\';
	hex[1] = 'x';
	hex[2 + hex_encode(batch->data, batch->len, hex + 2)] = '\0';
	snprintf(shard_s, sizeof(shard_s), "%d", shard);
	values[0] = stream->name;
	values[1] = stream->creation_id;
	values[2] = shard_s;
	values[3] = GetUserNameFromId(GetUserId(), false);
	values[4] = hex;
	initStringInfo(&why);

	for (;;)
	{
		FelixShardView v;
		PGconn	   *conn;
		PGresult   *res;
		long		left_ms;

		CHECK_FOR_INTERRUPTS();
		shard_read(s, &v);
		/* led here now: the ordinary write path */
		if (v.role == FELIX_ROLE_LEADER)
			return leader_publish(s, &batch, &count, 1);
		left_ms = (long) ((deadline - felix_monotonic_ns()) / 1000000);
		if (left_ms <= 0)
			break;
		if (v.leader[0] == '\0' || felix_is_this_node(v.leader))
		{
			resetStringInfo(&why);
			appendStringInfoString(&why, "the control plane names no leader");
			felix_nap(FORWARD_RETRY_MS);
			continue;
		}
		conn = forward_conn(v.leader);
		if (conn == NULL)
		{
			/* nothing was sent: asking again (or another leader) is safe */
			resetStringInfo(&why);
			appendStringInfo(&why, "node \"%s\": %s", v.leader, felix_conn_last_error());
			if (!woke)
				felix_wake(FELIX_WORKER_HEARTBEAT);
			woke = true;
			felix_nap(FORWARD_RETRY_MS * 5);
			continue;
		}
		res = call_leader(stream, shard, v.leader, conn, values, left_ms + felix_quorum_timeout);
		if (res == NULL)
		{
			/* its heartbeat creates the stream there soon */
			resetStringInfo(&why);
			appendStringInfo(&why, "node \"%s\" has not learned of the stream yet", v.leader);
			felix_nap(FORWARD_RETRY_MS * 5);
			continue;
		}
		if (PQntuples(res) == 1 && PQnfields(res) == 2 &&
			strcmp(PQgetvalue(res, 0, 0), "published") == 0 && !PQgetisnull(res, 0, 1))
		{
			uint64		seq = strtou64(PQgetvalue(res, 0, 1), NULL, 10);

			PQclear(res);
			felix_count(FELIX_CTR_PUBLISHES_FORWARDED, 1);
			return seq;
		}
		if (PQntuples(res) == 1 && PQnfields(res) == 2 &&
			strcmp(PQgetvalue(res, 0, 0), "not_leader") == 0)
		{
			/* refused at admission, nothing appended: find the new leader */
			PQclear(res);
			resetStringInfo(&why);
			appendStringInfo(&why, "node \"%s\" does not lead it any more", v.leader);
			if (!woke)
				felix_wake(FELIX_WORKER_HEARTBEAT);
			woke = true;
			felix_nap(FORWARD_RETRY_MS);
			continue;
		}
		PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("stream \"%s\" shard %d: node \"%s\" answered felix.forward_publish with something it never says",
						stream->name, shard, v.leader),
				 errhint("Run the same felix version on every node.")));
	}
	ereport(ERROR,
			(errcode(FELIX_ERRCODE_NOT_LEADER),
			 errmsg("stream \"%s\" shard %d: no leader took the forwarded publish within felix.quorum_timeout (%d ms)",
					stream->name, shard, felix_quorum_timeout),
			 why.len > 0 ? errdetail("Last: %s.", why.data) : 0,
			 errhint("Nothing was published.  felix_shards shows the shard's leader; publish again once it has one.")));
	pg_unreachable();
}

/* ---------------------------------------------------------------------
 * The answering side
 * ---------------------------------------------------------------------
 */

uint64
forward_admit(FelixShard *s)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile uint64 generation = 0;

	PG_TRY();
	{
		generation = lease_admit(s);
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		if (e->sqlerrcode != FELIX_ERRCODE_NOT_LEADER && e->sqlerrcode != FELIX_ERRCODE_LEASE_EXPIRED)
			PG_RE_THROW();
		FlushErrorState();
		FreeErrorData(e);
	}
	PG_END_TRY();
	return generation;
}

const FelixStream *
forward_stream(const char *name, const char *creation_id)
{
	const FelixStream *stream = felix_stream_by_name(name);

	if (strcmp(stream->creation_id, creation_id) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("stream \"%s\" of creation %s does not exist on node \"%s\"",
						stream->name, creation_id, felix_node_name_resolved()),
				 errdetail("The stream of that name here is another creation (%s): it was dropped and created again.",
						   stream->creation_id),
				 errhint("Publish again once every node has learned of the stream's new creation.")));
	return stream;
}

void
forward_check_batch(const FelixStream *stream, int shard, const char *data, Size len,
				StringInfo rebuilt, uint32 *count)
{
	FelixBatchHeader h;
	FelixBatchIter it;
	FelixRecord rec;
	char	   *why;

	if (len < sizeof(FelixBatchHeader) + sizeof(FelixBatchTrailer))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("stream \"%s\" shard %d: a forwarded batch of %zu bytes is shorter than a batch",
						stream->name, shard, len),
				 errhint("This is felix's internal protocol; run the same felix version on every node.")));
	memcpy(&h, data, sizeof(h));
	if (h.kind != FELIX_BATCH_RECORDS || h.count == 0 || h.body_len > FELIX_MAX_BATCH_BYTES ||
		h.body_len != len - sizeof(FelixBatchHeader) - sizeof(FelixBatchTrailer) ||
		!batch_body_check(&h, data + sizeof(FelixBatchHeader)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("stream \"%s\" shard %d: a forwarded batch does not match its checksum or its record count",
						stream->name, shard),
				 errhint("This is felix's internal protocol; nothing of it was published.")));

	batch_begin(rebuilt);
	*count = 0;
	batch_iter_init(&it, &h, data + sizeof(FelixBatchHeader));
	while (batch_iter_next(&it, &rec))
	{
		if (rec.key != NULL && !payload_is_valid(TEXTOID, rec.key, rec.key_len, &why))
			ereport(ERROR,
					(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
					 errmsg("stream \"%s\" shard %d: forwarded record %u has an invalid key: %s",
							stream->name, shard, *count, why),
					 errhint("Nothing of the forwarded batch was published.")));
		if (!payload_is_valid(stream->payload_type, rec.payload, rec.payload_len, &why))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
					 errmsg("stream \"%s\" shard %d: forwarded record %u is not a valid %s value: %s",
							stream->name, shard, *count, format_type_be(stream->payload_type), why),
					 errhint("Nothing of the forwarded batch was published.")));
		if ((Size) rec.payload_len + (rec.key ? rec.key_len : 0) > (Size) felix_max_record_bytes)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("stream \"%s\" shard %d: forwarded record %u is larger than felix.max_record_bytes",
							stream->name, shard, *count),
					 errhint("Publish smaller records.")));
		batch_add(rebuilt, rec.key, rec.key ? (int32) rec.key_len : -1, rec.payload, rec.payload_len);
		(*count)++;
	}
	batch_seal_body(rebuilt, FELIX_BATCH_RECORDS);
}

PG_FUNCTION_INFO_V1(felix_forward_publish);
Datum
felix_forward_publish(PG_FUNCTION_ARGS)
{
	const char *names[] = {"stream", "creation_id", "shard", "as_role", "batch"};
	const FelixStream *stream;
	char	   *role_name;
	Oid			role;
	int32		shard;
	bytea	   *batch;
	StringInfoData rebuilt;
	StringInfo	b = &rebuilt;
	uint32		count;
	FelixShard *s;
	uint64		generation;
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	felix_require_preload();
	felix_require_replication_role("felix.forward_publish");
	felix_require_nargs(fcinfo, 5, "felix.forward_publish");
	for (int i = 0; i < 5; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.forward_publish: %s must not be NULL", names[i]),
					 errhint("This is felix's internal protocol; nodes call it to publish on a shard's leader.")));
	stream = forward_stream(text_to_cstring(PG_GETARG_TEXT_PP(0)),
							text_to_cstring(PG_GETARG_TEXT_PP(1)));
	shard = PG_GETARG_INT32(2);
	felix_check_shard(stream, shard);
	role_name = text_to_cstring(PG_GETARG_TEXT_PP(3));
	role = get_role_oid(role_name, true);
	if (!OidIsValid(role))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" shard %d: role \"%s\" does not exist on leader \"%s\"",
						stream->name, shard, role_name, felix_node_name_resolved()),
				 errhint("Roles are per server: create the role, with the same grants, on every node.")));

	/* the publishing role's rights, here as where it connected */
	publish_check_access_as(stream, role);
	batch = PG_GETARG_BYTEA_PP(4);
	initStringInfo(&rebuilt);
	forward_check_batch(stream, shard, VARDATA_ANY(batch), VARSIZE_ANY_EXHDR(batch), &rebuilt, &count);
	{
		PublishCharge charge = {stream, rebuilt.len};

		publish_check_bytes(&charge, 1);
	}

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "felix.forward_publish must return a composite type");
	desc = BlessTupleDesc(desc);

	/*
	 * Refused at admission, nothing was appended: the asking node may try
	 * the next leader.  Anything that fails later -- even 55F02 from the
	 * check right before the append, or from a leader deposed while it
	 * waited for the acknowledgement -- is an error of the publish, never
	 * retried.
	 */
	s = felix_stream_shard(stream, shard);
	generation = forward_admit(s);
	if (generation == 0)
	{
		values[0] = CStringGetTextDatum("not_leader");
		nulls[1] = true;
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
	}
	values[0] = CStringGetTextDatum("published");
	/* admitted once, here; the lease is checked again by the write path */
	values[1] = Int64GetDatum((int64) leader_publish_admitted(s, generation, &b, &count, 1));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
