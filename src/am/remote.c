/*-------------------------------------------------------------------------
 *
 * remote.c
 *	  Reading a shard this node holds no copy of.  A stream of replication
 *	  factor R on more than R nodes has shards some nodes do not hold; a
 *	  read of such a shard there (a SELECT, a pg_dump's COPY) is served by
 *	  a node that holds it, so a read on any node sees every shard and
 *	  never a silent part of the stream.  Both halves are here:
 *
 *	  - the asking side (remote_reader_*): FelixCursor (tableam.c) opens a
 *	    reader for each such shard.  It connects as this node's role to
 *	    the shard's leader, else to another replica, and fetches the
 *	    records in chunks by seq.  The first chunk fixes the end of what
 *	    the cursor sees of the shard: the high-water mark of the replica
 *	    that answered, as a local read is bounded by this node's;
 *	  - the answering side (felix.read_shard): reads its own copy up to
 *	    its high-water mark, for a caller acting for the cluster (a member
 *	    of felix_replication), and refuses when it holds no copy either
 *	    or when the stream of that name is another one (dropped and
 *	    created again: the creation_id differs).
 *
 *	  The caller's privileges are checked where it asked: the executor
 *	  checked SELECT on the stream's table before the scan began.  What a
 *	  peer answers is believed only as far as it can be checked: seqs must
 *	  lie in the range asked for, and every key and payload is validated
 *	  as the stream's type by the cursor (tableam.c, cursor_fill) before
 *	  it becomes a value, as every record read from anywhere is.  Nothing
 *	  here blocks without a deadline (client.c waits on the latch and
 *	  services interrupts).
 *
 * Locking rule: backend-local.  Every open connection is listed in
 * open_reads (TopMemoryContext) and closed at the end of the transaction
 * at the latest, so an error in the middle of a scan leaks neither the
 * connection nor its file descriptor.  The answering side holds
 * AccessShareLock on the stream's table while it reads.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "libpq-fe.h"

#include "access/table.h"
#include "access/xact.h"
#include "am/am.h"
#include "am/remote.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "control/nodes.h"
#include "executor/tuptable.h"
#include "felix.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "base/privilege.h"
#include "replication/lease.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

/* Records per chunk asked for, and the bytes a chunk stops after. */
#define REMOTE_CHUNK_RECORDS	2000
#define REMOTE_CHUNK_BYTES		(8 * 1024 * 1024)
/* How long connecting to one replica, and one chunk, may take. */
#define REMOTE_CONNECT_TIMEOUT_MS	5000
#define REMOTE_CHUNK_TIMEOUT_MS		30000

/* An open connection and the chunk it last returned (TopMemoryContext). */
typedef struct OpenRead
{
	PGconn	   *conn;
	PGresult   *res;
} OpenRead;

static List *open_reads = NIL;

/* Bumped whenever open_reads is cleared at a transaction's end. */
static uint64 open_reads_epoch = 0;

struct FelixRemoteReader
{
	OpenRead   *open;			/* valid while epoch == open_reads_epoch */
	uint64		epoch;
	char		stream[NAMEDATALEN];
	char		creation_id[FELIX_CREATION_ID_LEN];
	int			shard;
	char		node[NAMEDATALEN];	/* the replica that answers */
	uint64		next;			/* the seq to ask for next */
	uint64		hi;				/* stop before this seq */
	int			row;			/* next row of open->res */
	char	   *buf;			/* the decoded payload of the last row */
	Size		cap;
};

bool
remote_shard_elsewhere(FelixShard *s)
{
	FelixShardView v;

	shard_read(s, &v);
	if (!v.clustered || v.nreplicas == 0)
		return false;
	if (v.joining[0] != '\0' && felix_is_this_node(v.joining))
		return false;
	for (int i = 0; i < v.nreplicas; i++)
		if (felix_is_this_node(v.replicas[i]))
			return false;
	return true;
}

static void
open_read_close(OpenRead *o)
{
	if (o->res != NULL)
		PQclear(o->res);
	o->res = NULL;
	if (o->conn != NULL)
		felix_conn_close(o->conn);
	o->conn = NULL;
}

static void
remote_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT &&
		event != XACT_EVENT_PARALLEL_COMMIT && event != XACT_EVENT_PARALLEL_ABORT &&
		event != XACT_EVENT_PREPARE)
		return;
	foreach(lc, open_reads)
	{
		open_read_close(lfirst(lc));
		pfree(lfirst(lc));
	}
	list_free(open_reads);
	open_reads = NIL;
	open_reads_epoch++;
}

void
remote_init(void)
{
	RegisterXactCallback(remote_xact_callback, NULL);
}

/* Ask for the next chunk; NULL (reported at elevel) if it failed. */
static PGresult *
fetch_chunk(FelixRemoteReader *r, int elevel)
{
	char		shard_s[16];
	char		from_s[32];
	char		to_s[32];
	char		max_s[16];
	const char *values[6];

	snprintf(shard_s, sizeof(shard_s), "%d", r->shard);
	snprintf(from_s, sizeof(from_s), UINT64_FORMAT, r->next);
	snprintf(to_s, sizeof(to_s), UINT64_FORMAT, Min(r->hi, (uint64) PG_INT64_MAX));
	snprintf(max_s, sizeof(max_s), "%d", REMOTE_CHUNK_RECORDS);
	values[0] = r->stream;
	values[1] = r->creation_id;
	values[2] = shard_s;
	values[3] = from_s;
	values[4] = to_s;
	values[5] = max_s;
	return felix_conn_exec(r->open->conn, "felix.read_shard",
						   "SELECT seq, key, pg_catalog.encode(payload, 'hex'), published_at, visible_end "
						   "FROM felix.read_shard($1, $2, $3::pg_catalog.int4, $4::pg_catalog.int8, $5::pg_catalog.int8, $6::pg_catalog.int4)",
						   6, values, REMOTE_CHUNK_TIMEOUT_MS, elevel);
}

/* Take a chunk as the reader's current one. */
static void
take_chunk(FelixRemoteReader *r, PGresult *res)
{
	int			nfields = PQnfields(res);

	if (nfields != 5)
	{
		PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("stream \"%s\" shard %d: node \"%s\" answered felix.read_shard with %d columns, expected 5",
						r->stream, r->shard, r->node, nfields),
				 errhint("Run the same felix version on every node.")));
	}
	if (r->open->res != NULL)
		PQclear(r->open->res);
	r->open->res = res;
	r->row = 0;
}

/* Try node `name`: connect and fetch the first chunk.  false if it failed. */
static bool
try_replica(FelixRemoteReader *r, const char *name, const char *address,
			StringInfo why)
{
	PGresult   *res;

	strlcpy(r->node, name, NAMEDATALEN);
	r->open->conn = felix_conn_open(felix_peer_conninfo(address), psprintf("node \"%s\"", name),
									"felix read", REMOTE_CONNECT_TIMEOUT_MS, DEBUG1);
	if (r->open->conn != NULL &&
		felix_conn_set_statement_timeout(r->open->conn, REMOTE_CHUNK_TIMEOUT_MS, DEBUG1) &&
		(res = fetch_chunk(r, DEBUG1)) != NULL)
	{
		take_chunk(r, res);
		return true;
	}
	appendStringInfo(why, "%s%s: %s", why->len > 0 ? "; " : "", name,
					 felix_conn_last_error());
	open_read_close(r->open);
	return false;
}

FelixRemoteReader *
remote_reader_open(const FelixStream *stream, int shard, uint64 lo, uint64 hi,
				   uint64 *visible_end)
{
	FelixRemoteReader *r = palloc0(sizeof(FelixRemoteReader));
	FelixShard *s = felix_stream_shard(stream, shard);
	FelixShardView v;
	StringInfoData why;
	bool		got = false;
	MemoryContext old;

	shard_read(s, &v);
	strlcpy(r->stream, stream->name, NAMEDATALEN);
	strlcpy(r->creation_id, stream->creation_id, FELIX_CREATION_ID_LEN);
	r->shard = shard;
	r->next = lo;
	r->hi = hi;
	old = MemoryContextSwitchTo(TopMemoryContext);
	r->open = palloc0(sizeof(OpenRead));
	r->epoch = open_reads_epoch;
	open_reads = lappend(open_reads, r->open);
	MemoryContextSwitchTo(old);

	/* the leader first: it knows the newest mark */
	initStringInfo(&why);
	if (v.leader[0] != '\0' && !felix_is_this_node(v.leader))
	{
		char		address[FELIX_NODE_CONNINFO_LEN];

		if (!felix_node_conninfo_of(v.leader, address, sizeof(address)))
			strlcpy(address, v.leader_conninfo, sizeof(address));
		got = try_replica(r, v.leader, address, &why);
	}
	for (int i = 0; !got && i < v.nreplicas; i++)
	{
		char		address[FELIX_NODE_CONNINFO_LEN];

		if (strcmp(v.replicas[i], v.leader) == 0 || felix_is_this_node(v.replicas[i]))
			continue;
		if (!felix_node_conninfo_of(v.replicas[i], address, sizeof(address)))
		{
			appendStringInfo(&why, "%s%s: its address is not known here",
							 why.len > 0 ? "; " : "", v.replicas[i]);
			continue;
		}
		got = try_replica(r, v.replicas[i], address, &why);
	}
	if (!got)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("stream \"%s\" shard %d: this node holds no copy of the shard, and no replica of it could be read",
						stream->name, shard),
				 why.len > 0 ? errdetail("%s.", why.data) :
				 errdetail("The control plane lists no replica of the shard."),
				 errhint("Read the shard once one of its replicas is up, or on a replica itself: felix_shards lists them.")));

	*visible_end = lo;
	if (PQntuples(r->open->res) > 0)
		*visible_end = strtou64(PQgetvalue(r->open->res, 0, 4), NULL, 10);
	r->hi = Min(r->hi, *visible_end);
	return r;
}

bool
remote_reader_next(FelixRemoteReader *r, FelixRecord *rec)
{
	PGresult   *res = r->open->res;
	const char *hex;
	int			hexlen;

	if (r->row >= PQntuples(res))
	{
		/* a chunk that returned nothing ends the read */
		if (PQntuples(res) == 0 || r->next >= r->hi)
			return false;
		res = fetch_chunk(r, ERROR);
		take_chunk(r, res);
		if (PQntuples(res) == 0)
			return false;
	}

	memset(rec, 0, sizeof(*rec));
	rec->seq = strtou64(PQgetvalue(res, r->row, 0), NULL, 10);
	if (rec->seq < r->next || rec->seq >= r->hi)
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("stream \"%s\" shard %d: node \"%s\" returned seq " UINT64_FORMAT " outside the range asked for [" UINT64_FORMAT ", " UINT64_FORMAT ")",
						r->stream, r->shard, r->node, rec->seq, r->next, r->hi),
				 errhint("Run the same felix version on every node.")));
	if (!PQgetisnull(res, r->row, 1))
	{
		rec->key = PQgetvalue(res, r->row, 1);
		rec->key_len = PQgetlength(res, r->row, 1);
	}
	/* the payload's bytes in hex (encode), whatever bytea_output says */
	hex = PQgetvalue(res, r->row, 2);
	hexlen = PQgetlength(res, r->row, 2);
	if (r->buf == NULL || (Size) hexlen / 2 > r->cap)
	{
		if (r->buf != NULL)
			pfree(r->buf);
		r->cap = Max((Size) hexlen / 2, 1024);
		r->buf = palloc(r->cap);
	}
	rec->payload_len = (uint32) hex_decode(hex, hexlen, r->buf);
	rec->payload = r->buf;
	rec->published_at = (TimestampTz) strtoi64(PQgetvalue(res, r->row, 3), NULL, 10);
	r->row++;
	r->next = rec->seq + 1;
	return true;
}

const char *
remote_reader_node(const FelixRemoteReader *r)
{
	return r->node;
}

void
remote_reader_close(FelixRemoteReader *r)
{
	/* a reader ended after its transaction: the connection went with it */
	if (r->epoch == open_reads_epoch)
	{
		open_read_close(r->open);
		open_reads = list_delete_ptr(open_reads, r->open);
		pfree(r->open);
	}
	if (r->buf != NULL)
		pfree(r->buf);
	pfree(r);
}

/* ---------------------------------------------------------------------
 * The answering side
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(felix_read_shard);
Datum
felix_read_shard(PG_FUNCTION_ARGS)
{
	const char *names[] = {"stream", "creation_id", "shard", "from_seq", "to_seq", "max_records"};
	const FelixStream *stream;
	char	   *name;
	char	   *creation_id;
	int32		shard;
	int64		from;
	int64		to;
	int32		max;
	FelixShard *s;
	Relation	rel;
	uint64		start;
	uint64		end;
	FelixCursor *c;
	TupleTableSlot *slot;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Size		bytes = 0;

	felix_require_preload();
	felix_require_replication_role("felix.read_shard");
	felix_require_nargs(fcinfo, 6, "felix.read_shard");
	for (int i = 0; i < 6; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.read_shard: %s must not be NULL", names[i]),
					 errhint("This is felix's internal protocol; nodes call it to read a shard they hold no copy of.")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	creation_id = text_to_cstring(PG_GETARG_TEXT_PP(1));
	shard = PG_GETARG_INT32(2);
	from = PG_GETARG_INT64(3);
	to = PG_GETARG_INT64(4);
	max = PG_GETARG_INT32(5);

	stream = felix_stream_by_name(name);
	if (strcmp(stream->creation_id, creation_id) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" has another stream of that name",
						name, shard, felix_node_name_resolved()),
				 errdetail("The stream of that name here is not the one the reader knows: it was dropped and created again."),
				 errhint("Read again once every node has learned of the stream's new creation.")));
	if (shard < 0 || shard >= stream->shards || from < 0 || to < from || max <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d: invalid read of seqs [" INT64_FORMAT ", " INT64_FORMAT "), at most %d records",
						name, shard, from, to, max),
				 errhint("The stream has shards 0 to %d; a read asks for from_seq <= to_seq and at least one record.",
						 stream->shards - 1)));
	s = felix_stream_shard(stream, shard);
	if (remote_shard_elsewhere(s))
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_WRONG_NODE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" holds no copy of the shard",
						name, shard, felix_node_name_resolved()),
				 errhint("Read the shard on one of its replicas: felix_shards lists them.")));

	/* the table's lock keeps the stream from being dropped underneath */
	rel = table_open(stream->relid, AccessShareLock);
	shard_visible(s, &start, &end);
	InitMaterializedSRF(fcinfo, 0);
	c = felix_cursor_begin(stream);
	felix_cursor_set_local(c);
	felix_cursor_set_range(c, shard, shard + 1, (uint64) from, Min((uint64) to, end));
	slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsVirtual);
	for (int n = 0; n < max && bytes < REMOTE_CHUNK_BYTES && felix_cursor_next(c, slot); n++)
	{
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		values[0] = slot->tts_values[FELIX_ATTNUM_SEQ - 1];
		values[1] = slot->tts_values[FELIX_ATTNUM_KEY - 1];
		nulls[1] = slot->tts_isnull[FELIX_ATTNUM_KEY - 1];
		/* the payload's bytes, whatever its type: a varlena either way */
		values[2] = slot->tts_values[FELIX_ATTNUM_PAYLOAD - 1];
		values[3] = Int64GetDatum(DatumGetTimestampTz(slot->tts_values[FELIX_ATTNUM_PUBLISHED_AT - 1]));
		values[4] = Int64GetDatum((int64) end);
		bytes += VARSIZE_ANY(DatumGetPointer(values[2]));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	ExecDropSingleTupleTableSlot(slot);
	felix_cursor_end(c);
	table_close(rel, AccessShareLock);
	return (Datum) 0;
}
