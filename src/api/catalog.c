/*-------------------------------------------------------------------------
 *
 * catalog.c
 *	  Stream definitions from felix.streams, cached per backend so the
 *	  publish path does not run a query per record.  Entries are found by
 *	  name (felix_publish) or by table OID (INSERT, scans).
 *
 *	  The cache is emptied by any relcache invalidation of a cached stream's
 *	  table or of felix.streams, and by a full invalidation; a stream is
 *	  dropped by dropping its table, which sends exactly such an
 *	  invalidation, so a dropped or recreated stream is never served from a
 *	  stale entry.  Misses are never cached.
 *
 * Locking rule: backend-local; lookups read felix.streams through SPI
 * under the caller's snapshot.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "api/catalog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/spi.h"
#include "felix.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

typedef struct StreamByName
{
	char		name[NAMEDATALEN];
	FelixStream *stream;
} StreamByName;

typedef struct StreamByRelid
{
	Oid			relid;
	FelixStream *stream;
} StreamByRelid;

static MemoryContext cache_cxt = NULL;
static HTAB *by_name = NULL;
static HTAB *by_relid = NULL;
static Oid	streams_relid = InvalidOid;	/* felix.streams, seen at last fill */

/*
 * Forget every entry.  Callers may still hold pointers obtained earlier in
 * this transaction (an invalidation can arrive whenever a lock is taken),
 * so the old entries are handed to the transaction's memory and freed at
 * its end rather than now.
 */
static void
cache_reset(void)
{
	if (cache_cxt != NULL)
	{
		if (IsTransactionState())
			MemoryContextSetParent(cache_cxt, TopTransactionContext);
		else
			MemoryContextDelete(cache_cxt);
		cache_cxt = NULL;
	}
	by_name = NULL;
	by_relid = NULL;
}

static void
catalog_relcache_callback(Datum arg, Oid relid)
{
	if (by_relid == NULL)
		return;
	if (!OidIsValid(relid) || relid == streams_relid ||
		hash_search(by_relid, &relid, HASH_FIND, NULL) != NULL)
		cache_reset();
}

void
felix_catalog_init(void)
{
	CacheRegisterRelcacheCallback(catalog_relcache_callback, (Datum) 0);
}

static void
cache_ensure(void)
{
	HASHCTL		ctl;

	if (by_name != NULL)
		return;
	cache_cxt = AllocSetContextCreate(CacheMemoryContext, "felix stream cache",
									  ALLOCSET_SMALL_SIZES);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(StreamByName);
	ctl.hcxt = cache_cxt;
	by_name = hash_create("felix streams by name", 16, &ctl,
						  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(StreamByRelid);
	ctl.hcxt = cache_cxt;
	by_relid = hash_create("felix streams by relid", 16, &ctl,
						   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/* Read one stream's row into the cache; NULL when no row matches. */
static FelixStream *
catalog_fetch(const char *column, Datum value, Oid type)
{
	char	   *sql;
	Oid			argtypes[1] = {type};
	Datum		values[1] = {value};
	FelixStream row;
	bool		found_row = false;
	FelixStream *stream;
	StreamByName *n;
	StreamByRelid *r;
	bool		found;

	memset(&row, 0, sizeof(row));
	sql = psprintf("SELECT id, relid, name, shards, replication_factor, consistency, "
				   "payload_type::oid, storage, coalesce(retention_bytes, 0), "
				   "coalesce((extract(epoch from retention) * 1000)::bigint, 0) "
				   "FROM felix.streams WHERE %s = $1", column);
	streams_relid = get_relname_relid("streams", get_namespace_oid("felix", false));
	SPI_connect();
	/* Not read-only: see rows this transaction wrote (a stream it just created). */
	if (SPI_execute_with_args(sql, 1, argtypes, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "felix: reading felix.streams failed");
	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		found_row = true;
		row.id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		row.relid = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
		strlcpy(row.name, SPI_getvalue(tup, desc, 3), NAMEDATALEN);
		row.shards = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
		row.replication_factor = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
		row.consistency = strcmp(SPI_getvalue(tup, desc, 6), "quorum") == 0 ?
			FELIX_CONSISTENCY_QUORUM : FELIX_CONSISTENCY_LEADER;
		row.payload_type = DatumGetObjectId(SPI_getbinval(tup, desc, 7, &isnull));
		row.storage = strcmp(SPI_getvalue(tup, desc, 8), "object") == 0 ?
			FELIX_STORAGE_OBJECT : FELIX_STORAGE_LOCAL;
		row.retention_bytes = DatumGetInt64(SPI_getbinval(tup, desc, 9, &isnull));
		row.retention_ms = DatumGetInt64(SPI_getbinval(tup, desc, 10, &isnull));
	}
	SPI_finish();
	pfree(sql);
	if (!found_row)
		return NULL;

	/* Only now touch the cache: the query may have processed invalidations. */
	cache_ensure();
	stream = MemoryContextAlloc(cache_cxt, sizeof(FelixStream));
	*stream = row;
	n = hash_search(by_name, stream->name, HASH_ENTER, &found);
	n->stream = stream;
	r = hash_search(by_relid, &stream->relid, HASH_ENTER, &found);
	r->stream = stream;
	return stream;
}

static void
require_extension_schema(void)
{
	felix_require_preload();
	if (!OidIsValid(get_namespace_oid("felix", true)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the felix extension is not installed in this database"),
				 errhint("Run CREATE EXTENSION felix.")));
}

const FelixStream *
felix_stream_by_name(const char *name)
{
	StreamByName *n;
	FelixStream *stream;
	char		key[NAMEDATALEN];

	if (name == NULL || name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL or empty"),
				 errhint("Pass the name given to felix_create_stream; felix_streams lists them.")));

	if (strlen(name) < NAMEDATALEN)
	{
		cache_ensure();
		memset(key, 0, sizeof(key));
		strlcpy(key, name, NAMEDATALEN);
		n = hash_search(by_name, key, HASH_FIND, NULL);
		if (n != NULL)
			return n->stream;

		require_extension_schema();
		stream = catalog_fetch("name", CStringGetTextDatum(name), TEXTOID);
		if (stream != NULL)
			return stream;
	}

	/* Not a stream: say whether it is some other relation. */
	{
		List	   *names = list_make1(makeString(pstrdup(name)));
		Oid			relid = RangeVarGetRelid(makeRangeVarFromNameList(names), NoLock, true);

		if (OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("relation \"%s\" is not a felix stream", name),
					 errhint("Create a stream with felix_create_stream(); felix_streams lists the existing ones.")));
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_TABLE),
			 errmsg("stream \"%s\" does not exist", name),
			 errhint("Create it with felix_create_stream('%s'); felix_streams lists the existing ones.", name)));
	return NULL;				/* keep compiler quiet */
}

const FelixStream *
felix_stream_by_relid(Oid relid)
{
	StreamByRelid *r;

	cache_ensure();
	r = hash_search(by_relid, &relid, HASH_FIND, NULL);
	if (r != NULL)
		return r->stream;
	if (!OidIsValid(get_namespace_oid("felix", true)))
		return NULL;
	return catalog_fetch("relid", ObjectIdGetDatum(relid), OIDOID);
}

static Oid
felix_am_oid(void)
{
	return GetSysCacheOid1(AMNAME, Anum_pg_am_oid, CStringGetDatum("felix"));
}

bool
felix_is_stream_rel(Relation rel)
{
	return rel->rd_rel->relkind == RELKIND_RELATION &&
		OidIsValid(rel->rd_rel->relam) &&
		rel->rd_rel->relam == felix_am_oid();
}

bool
felix_is_stream_relid(Oid relid)
{
	HeapTuple	tup;
	bool		result = false;

	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (HeapTupleIsValid(tup))
	{
		Form_pg_class form = (Form_pg_class) GETSTRUCT(tup);

		result = form->relkind == RELKIND_RELATION &&
			OidIsValid(form->relam) && form->relam == felix_am_oid();
		ReleaseSysCache(tup);
	}
	return result;
}

void
felix_check_shard(const FelixStream *stream, int64 shard)
{
	if (shard < 0 || shard >= stream->shards)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" has no shard " INT64_FORMAT, stream->name, shard),
				 errhint("Shards of stream \"%s\" are numbered 0 to %d.",
						 stream->name, stream->shards - 1)));
}

FelixShard *
felix_stream_shard(const FelixStream *stream, int shard)
{
	FelixShardSpec spec;

	felix_check_shard(stream, shard);
	spec.key.dboid = MyDatabaseId;
	spec.key.relid = stream->relid;
	spec.key.shard = shard;
	spec.stream_name = stream->name;
	spec.retention_bytes = stream->retention_bytes;
	spec.retention_ms = stream->retention_ms;
	spec.consistency = stream->consistency;
	spec.replication_factor = stream->replication_factor;
	return shard_acquire(&spec);
}
