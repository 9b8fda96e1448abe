/*-------------------------------------------------------------------------
 *
 * publish.c
 *	  felix_publish and felix_publish_batch: SQL values become records, are
 *	  routed to a shard (explicit shard, else a hash of the key, else spread
 *	  round-robin), and are appended through leader_publish, which returns
 *	  only once the records are acknowledged.  A publish is not undone by a
 *	  rollback of the calling transaction, like nextval().
 *
 *	  Routing, payload conversion and the owner's byte cap
 *	  (felix.max_bytes_per_role, publish_check_bytes) are shared with the
 *	  INSERT/COPY path (pending.c).
 *
 * Locking rule: takes RowExclusiveLock on the stream's table for the rest
 * of the transaction, as an INSERT would, so a concurrent drop waits --
 * after checking INSERT privilege, never before; the shard's own locks are
 * taken inside leader_publish.  Under that lock it refuses a caller whom
 * the stream's row-level security or INSERT triggers would check, since
 * these functions bypass the executor that applies them.  The byte cap
 * reads each shard slot's positions under its spinlock, one slot at a
 * time, and holds nothing while it decides.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/relation.h"
#include "core/catalog.h"
#include "api/forward.h"
#include "api/publish.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "control/conninfo.h"
#include "felix.h"
#include "base/privilege.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/pg_crc32c.h"
#include "storage/lmgr.h"
#include "replication/leader.h"
#include "storage/shard.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/tuplestore.h"

static uint32 spread_next = 0;

/* Does an INSERT trigger of the table fire in this session? */
static bool
insert_trigger_fires(Relation rel)
{
	TriggerDesc *td = rel->trigdesc;

	if (td == NULL)
		return false;
	for (int i = 0; i < td->numtriggers; i++)
	{
		Trigger    *t = &td->triggers[i];

		if (!(t->tgtype & TRIGGER_TYPE_INSERT) || t->tgenabled == TRIGGER_DISABLED)
			continue;
		/* as the executor's TriggerEnabled decides */
		if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA ?
			t->tgenabled != TRIGGER_FIRES_ON_ORIGIN :
			t->tgenabled != TRIGGER_FIRES_ON_REPLICA)
			return true;
	}
	return false;
}

/*
 * INSERT privilege first, then the lock: a role without the privilege
 * must not be able to queue behind (or hold up) the stream's lock.
 *
 * felix_publish and felix_publish_batch append without the executor, so
 * they cannot apply what an INSERT applies on the way in: the stream's
 * row-level security policies and its INSERT triggers.  Rather than let
 * them be a way around those checks, they refuse while any would apply
 * to this caller, and point to INSERT, which applies them all.
 */
void
publish_check_access(const FelixStream *stream)
{
	publish_check_access_as(stream, GetUserId());
}

void
publish_check_insert_as(const FelixStream *stream, Oid role)
{
	if (pg_class_aclcheck(stream->relid, role, ACL_INSERT) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to publish to stream \"%s\"", stream->name),
				 role != GetUserId() ?
				 errdetail("Role \"%s\" has no INSERT privilege on the stream's table on leader \"%s\".",
						   GetUserNameFromId(role, false), felix_node_name_resolved()) : 0,
				 errhint("It needs INSERT privilege on the stream's table, on every node: GRANT INSERT ON %s TO ...",
						 quote_identifier(stream->name))));
	LockRelationOid(stream->relid, RowExclusiveLock);
}

void
publish_check_access_as(const FelixStream *stream, Oid role)
{
	Relation	rel;

	publish_check_insert_as(stream, role);
	rel = relation_open(stream->relid, NoLock);
	if (check_enable_rls(stream->relid, role, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot publish to stream \"%s\" with a function: its row-level security policies apply to role \"%s\"",
						stream->name, GetUserNameFromId(role, false)),
				 errhint("Publish with INSERT INTO %s (key, payload) VALUES (...), which applies the policies.",
						 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
													RelationGetRelationName(rel)))));
	if (insert_trigger_fires(rel))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot publish to stream \"%s\" with a function: the stream has INSERT triggers",
						stream->name),
				 errhint("Publish with INSERT INTO %s (key, payload) VALUES (...), which fires them.",
						 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
													RelationGetRelationName(rel)))));
	relation_close(rel, NoLock);
}

/* One owner's side of publish_check_bytes. */
typedef struct OwnerBytes
{
	Oid			owner;
	const char *stream;			/* the first charged stream it owns */
	uint64		adding;			/* what the publish appends to its streams */
	uint64		held;			/* what its streams hold on this node */
} OwnerBytes;

static OwnerBytes *
owner_bytes(OwnerBytes *owners, int n, Oid owner)
{
	for (int i = 0; i < n; i++)
	{
		if (owners[i].owner == owner)
			return &owners[i];
	}
	return NULL;
}

/*
 * The owner pays, as for a table's disk space: a role with INSERT on a
 * stream fills its owner's quota.  What the owner's streams hold is summed
 * from the shard registry (each slot's total_bytes, as felix_shards shows
 * it) once per call, not per record, and not at all while the cap is 0.
 */
void
publish_check_bytes(const PublishCharge *charges, int n)
{
	OwnerBytes *owners;
	OwnerBytes *last = NULL;
	Oid			last_relid = InvalidOid;
	int			nowners = 0;
	int			nslots;
	uint64		cap;

	if (felix_max_bytes_per_role == 0 || n == 0 || superuser())
		return;

	owners = palloc(sizeof(OwnerBytes) * n);
	for (int i = 0; i < n; i++)
	{
		Oid			owner = felix_relation_owner(charges[i].stream->relid);
		OwnerBytes *o;

		if (superuser_arg(owner))
			continue;
		o = owner_bytes(owners, nowners, owner);
		if (o == NULL)
		{
			o = &owners[nowners++];
			o->owner = owner;
			o->stream = charges[i].stream->name;
			o->adding = o->held = 0;
		}
		o->adding += charges[i].bytes;
	}

	/*
	 * The shards of this database's streams that this node holds.  A slot
	 * whose table is gone (a drop committing) belongs to no one; slots of
	 * one stream are mostly adjacent, so their owner is looked up once.
	 */
	nslots = nowners > 0 ? shard_count_slots() : 0;
	for (int i = 0; i < nslots; i++)
	{
		FelixShardPositions p;

		shard_read_positions(shard_slot(i), &p);
		if (!p.in_use || p.key.dboid != MyDatabaseId)
			continue;
		if (p.key.relid != last_relid)
		{
			last_relid = p.key.relid;
			last = owner_bytes(owners, nowners,
							   felix_relation_owner_if_any(p.key.relid));
		}
		if (last != NULL)
			last->held += p.total_bytes;
	}

	cap = (uint64) felix_max_bytes_per_role * 1024 * 1024;
	for (int i = 0; i < nowners; i++)
	{
		OwnerBytes *o = &owners[i];
		char	   *role;

		if (o->held + o->adding <= cap)
			continue;
		role = GetUserNameFromId(o->owner, false);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("cannot publish to stream \"%s\": the streams of its owner, role \"%s\", would hold more than felix.max_bytes_per_role (%dMB) on this node",
						o->stream, role, felix_max_bytes_per_role),
				 errdetail("They hold " UINT64_FORMAT " bytes on this node; the publish would add " UINT64_FORMAT " bytes.",
						   o->held, o->adding),
				 errhint("Drop streams role \"%s\" no longer needs, free space with retention (retention_bytes, applied at once by felix_enforce_retention), or ask a superuser to raise felix.max_bytes_per_role.",
						 role)));
	}
	pfree(owners);
}

/* A batch's arrays are lists: refuse one of more dimensions, never flatten it. */
static void
require_one_dimension(const FelixStream *stream, ArrayType *a, const char *what)
{
	if (ARR_NDIM(a) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("stream \"%s\": %s must be a one-dimensional array, not one of %d dimensions",
						stream->name, what, ARR_NDIM(a)),
				 errhint("Pass one array element per record.")));
}

int
publish_route(const FelixStream *stream, int64 shard_arg, const char *key, int key_len)
{
	if (shard_arg >= 0)
	{
		felix_check_shard(stream, shard_arg);
		return (int) shard_arg;
	}
	if (key != NULL)
	{
		pg_crc32c	crc;

		/* CRC-32C: stable across nodes, builds and architectures. */
		INIT_CRC32C(crc);
		COMP_CRC32C(crc, key, key_len);
		FIN_CRC32C(crc);
		return (int) (crc % (uint32) stream->shards);
	}
	if (spread_next == 0)
		spread_next = (uint32) MyProcPid;
	return (int) (spread_next++ % (uint32) stream->shards);
}

typedef struct PayloadContext
{
	const FelixStream *stream;
	int			shard;
} PayloadContext;

static void
payload_error_context(void *arg)
{
	PayloadContext *pc = (PayloadContext *) arg;

	errcontext("converting the payload for stream \"%s\" shard %d to %s",
			   pc->stream->name, pc->shard, format_type_be(pc->stream->payload_type));
}

void
publish_payload_bytes(const FelixStream *stream, int shard,
					  Datum payload, bool isnull, Oid argtype,
					  const char **bytes, uint32 *len, int key_len)
{
	struct varlena *v;
	Size		record_bytes;

	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload for stream \"%s\" shard %d must not be NULL",
						stream->name, shard),
				 errhint("Publish a value; for a jsonb stream a JSON null is written 'null'::jsonb.")));

	if (argtype != stream->payload_type)
	{
		Oid			outfunc;
		bool		isvarlena;
		Oid			infunc;
		Oid			ioparam;
		char	   *str;
		PayloadContext pc = {stream, shard};
		ErrorContextCallback cb;

		/* Convert through the text form, as a cast of a literal would. */
		cb.callback = payload_error_context;
		cb.arg = &pc;
		cb.previous = error_context_stack;
		error_context_stack = &cb;

		getTypeOutputInfo(argtype, &outfunc, &isvarlena);
		str = OidOutputFunctionCall(outfunc, payload);
		getTypeInputInfo(stream->payload_type, &infunc, &ioparam);
		payload = OidInputFunctionCall(infunc, str, ioparam, -1);

		error_context_stack = cb.previous;
	}

	v = pg_detoast_datum_packed((struct varlena *) DatumGetPointer(payload));
	*bytes = VARDATA_ANY(v);
	*len = VARSIZE_ANY_EXHDR(v);

	record_bytes = (Size) *len + (key_len > 0 ? key_len : 0);
	if (record_bytes > (Size) felix_max_record_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("record for stream \"%s\" shard %d is too large: %zu bytes",
						stream->name, shard, record_bytes),
				 errdetail("felix.max_record_bytes is %d bytes (key plus payload).",
						   felix_max_record_bytes),
				 errhint("Split the payload into smaller records, or raise felix.max_record_bytes.")));
}

static const FelixStream *
stream_arg(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL"),
				 errhint("Pass the name given to felix_create_stream; felix_streams lists them.")));
	return felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
}

static Datum
position_datum(FunctionCallInfo fcinfo, int shard, uint64 seq)
{
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "felix_publish must return a composite type");
	desc = BlessTupleDesc(desc);
	values[0] = Int32GetDatum(shard);
	values[1] = Int64GetDatum((int64) seq);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

PG_FUNCTION_INFO_V1(felix_publish);
Datum
felix_publish(PG_FUNCTION_ARGS)
{
	const FelixStream *stream = stream_arg(fcinfo);
	const char *key = NULL;
	int			key_len = -1;
	int64		shard_arg = -1;
	int			shard;
	const char *bytes;
	uint32		len;
	StringInfoData batch;
	uint64		seq;

	publish_check_access(stream);

	if (!PG_ARGISNULL(2))
	{
		text	   *k = PG_GETARG_TEXT_PP(2);

		key = VARDATA_ANY(k);
		key_len = VARSIZE_ANY_EXHDR(k);
	}
	if (!PG_ARGISNULL(3))
	{
		/* An explicit shard, even a negative one, is checked, never ignored. */
		felix_check_shard(stream, PG_GETARG_INT32(3));
		shard_arg = PG_GETARG_INT32(3);
	}

	shard = publish_route(stream, shard_arg, key, key_len);
	publish_payload_bytes(stream, shard, PG_GETARG_DATUM(1), PG_ARGISNULL(1),
						  get_fn_expr_argtype(fcinfo->flinfo, 1),
						  &bytes, &len, key_len);

	initStringInfo(&batch);
	batch_begin(&batch);
	batch_add(&batch, key, key_len, bytes, len);
	batch_seal_body(&batch, FELIX_BATCH_RECORDS);

	{
		uint32		one = 1;
		StringInfo	b = &batch;
		FelixShard *s = felix_stream_shard(stream, shard);
		PublishCharge charge = {stream, batch.len};

		/* the owner's byte cap is the appending node's: the leader checks it */
		if (forward_wanted(s))
			seq = forward_publish(stream, shard, b, one);
		else
		{
			publish_check_bytes(&charge, 1);
			seq = leader_publish(s, &b, &one, 1);
		}
	}
	pfree(batch.data);

	PG_RETURN_DATUM(position_datum(fcinfo, shard, seq));
}

/* One shard's part of a felix_publish_batch call. */
typedef struct ShardBatch
{
	StringInfoData buf;
	uint32		count;
	uint64		base;
	bool		forward;		/* published through the shard's leader */
} ShardBatch;

PG_FUNCTION_INFO_V1(felix_publish_batch);
Datum
felix_publish_batch(PG_FUNCTION_ARGS)
{
	const FelixStream *stream;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			elemtype;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Datum	   *payloads;
	bool	   *payload_nulls;
	int			npayloads;
	Datum	   *keys = NULL;
	bool	   *key_nulls = NULL;
	int			nkeys = 0;
	int64		shard_arg = -1;
	int		   *shard_of;
	uint32	   *index_in_shard;
	ShardBatch *batches;

	felix_require_nargs(fcinfo, 4, "felix_publish_batch");
	stream = stream_arg(fcinfo);
	publish_check_access(stream);

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payloads for stream \"%s\" must not be NULL", stream->name),
				 errhint("Pass an array of payloads.")));

	require_one_dimension(stream, PG_GETARG_ARRAYTYPE_P(1), "payloads");
	elemtype = ARR_ELEMTYPE(PG_GETARG_ARRAYTYPE_P(1));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), elemtype, typlen, typbyval, typalign,
					  &payloads, &payload_nulls, &npayloads);

	if (!PG_ARGISNULL(2))
	{
		require_one_dimension(stream, PG_GETARG_ARRAYTYPE_P(2), "keys");
		deconstruct_array(PG_GETARG_ARRAYTYPE_P(2), TEXTOID, -1, false, TYPALIGN_INT,
						  &keys, &key_nulls, &nkeys);
		if (nkeys != npayloads)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("stream \"%s\": %d keys given for %d payloads",
							stream->name, nkeys, npayloads),
					 errhint("Pass one key per payload (NULL for no key), or no keys at all.")));
	}

	if (!PG_ARGISNULL(3))
	{
		/* every record to this shard: checked like felix_publish's */
		felix_check_shard(stream, PG_GETARG_INT32(3));
		shard_arg = PG_GETARG_INT32(3);
	}

	InitMaterializedSRF(fcinfo, 0);
	if (npayloads == 0)
		return (Datum) 0;

	shard_of = palloc(sizeof(int) * npayloads);
	index_in_shard = palloc(sizeof(uint32) * npayloads);
	batches = palloc0(sizeof(ShardBatch) * stream->shards);

	/* Route and encode every record; nothing is appended until all pass. */
	for (int i = 0; i < npayloads; i++)
	{
		const char *key = NULL;
		int			key_len = -1;
		const char *bytes;
		uint32		len;
		ShardBatch *b;

		CHECK_FOR_INTERRUPTS();
		if (keys != NULL && !key_nulls[i])
		{
			text	   *k = DatumGetTextPP(keys[i]);

			key = VARDATA_ANY(k);
			key_len = VARSIZE_ANY_EXHDR(k);
		}
		shard_of[i] = publish_route(stream, shard_arg, key, key_len);
		publish_payload_bytes(stream, shard_of[i], payloads[i], payload_nulls[i],
							  elemtype, &bytes, &len, key_len);
		b = &batches[shard_of[i]];
		if (b->count == 0)
		{
			initStringInfo(&b->buf);
			batch_begin(&b->buf);
		}
		if ((Size) b->buf.len + len + FELIX_RECORD_OVERHEAD + Max(key_len, 0) > FELIX_MAX_BATCH_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("batch for stream \"%s\" shard %d exceeds %d bytes",
							stream->name, shard_of[i], FELIX_MAX_BATCH_BYTES),
					 errhint("Publish the records in several smaller calls.")));
		batch_add(&b->buf, key, key_len, bytes, len);
		index_in_shard[i] = b->count++;
	}

	/*
	 * The owner's byte cap, for the whole call, before anything goes down:
	 * over the shards appended here (a forwarded shard's leader checks its
	 * own).
	 */
	{
		PublishCharge charge = {stream, 0};

		for (int sh = 0; sh < stream->shards; sh++)
		{
			if (batches[sh].count == 0)
				continue;
			batch_seal_body(&batches[sh].buf, FELIX_BATCH_RECORDS);
			batches[sh].forward = forward_wanted(felix_stream_shard(stream, sh));
			if (!batches[sh].forward)
				charge.bytes += batches[sh].buf.len;
		}
		if (charge.bytes > 0)
			publish_check_bytes(&charge, 1);
	}

	/* One batch per shard, in shard order. */
	for (int sh = 0; sh < stream->shards; sh++)
	{
		ShardBatch *b = &batches[sh];

		if (b->count == 0)
			continue;
		{
			StringInfo	buf = &b->buf;

			b->base = b->forward ? forward_publish(stream, sh, buf, b->count) :
				leader_publish(felix_stream_shard(stream, sh), &buf, &b->count, 1);
		}
		pfree(b->buf.data);
	}

	for (int i = 0; i < npayloads; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int32GetDatum(shard_of[i]);
		values[1] = Int64GetDatum((int64) (batches[shard_of[i]].base + index_in_shard[i]));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
