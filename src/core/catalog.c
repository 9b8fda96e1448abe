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
 *	  Only a relation with a row here is a stream.  A table created USING
 *	  felix by hand has none: every read and write of it is refused
 *	  (tableam.c), and dropping it tells nobody anything (stream.c).
 *
 *	  felix.streams is readable by its owner only; every statement on it
 *	  runs as that owner with the search_path pinned (catalog_exec), so a
 *	  caller's search_path never picks an operator or type for it.
 *
 * Locking rule: backend-local; statements on felix.streams run through
 * SPI under the caller's snapshot.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/uuid.h"

#include "core/catalog.h"
#include "core/payload.h"
#include "felix.h"
#include "base/privilege.h"

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
static bool version_checked = false;	/* felix is installed at the library's version */

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
	version_checked = false;
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

/* The columns every catalog read fetches, in FelixStream order. */
#define CATALOG_COLUMNS \
	"id, relid, name, shards, replication_factor, consistency, payload_type, " \
	"storage, retention_bytes, retention, creation_id"

/* Milliseconds of an interval, counted as extract(epoch ...) counts them. */
static int64
interval_ms(const Interval *iv)
{
	double		secs = iv->time / 1000000.0 +
		((double) DAYS_PER_YEAR * SECS_PER_DAY) * (iv->month / MONTHS_PER_YEAR) +
		((double) DAYS_PER_MONTH * SECS_PER_DAY) * (iv->month % MONTHS_PER_YEAR) +
		((double) SECS_PER_DAY) * iv->day;

	return (int64) (secs * 1000.0);
}

/* Row i of the last SPI result (CATALOG_COLUMNS) as a FelixStream. */
static void
catalog_row(uint64 i, FelixStream *row)
{
	HeapTuple	tup = SPI_tuptable->vals[i];
	TupleDesc	desc = SPI_tuptable->tupdesc;
	bool		isnull;
	Datum		d;

	memset(row, 0, sizeof(FelixStream));
	row->id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	row->relid = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
	strlcpy(row->name, SPI_getvalue(tup, desc, 3), NAMEDATALEN);
	row->shards = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
	row->replication_factor = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
	row->consistency = strcmp(SPI_getvalue(tup, desc, 6), "quorum") == 0 ?
		FELIX_CONSISTENCY_QUORUM : FELIX_CONSISTENCY_LEADER;
	row->payload_type = DatumGetObjectId(SPI_getbinval(tup, desc, 7, &isnull));
	row->storage = strcmp(SPI_getvalue(tup, desc, 8), "object") == 0 ?
		FELIX_STORAGE_OBJECT : FELIX_STORAGE_LOCAL;
	d = SPI_getbinval(tup, desc, 9, &isnull);
	row->retention_bytes = isnull ? 0 : DatumGetInt64(d);
	d = SPI_getbinval(tup, desc, 10, &isnull);
	row->retention_ms = isnull ? 0 : interval_ms(DatumGetIntervalP(d));
	strlcpy(row->creation_id, SPI_getvalue(tup, desc, 11), FELIX_CREATION_ID_LEN);
}

/*
 * Run one statement on felix.streams as the catalog's owner, with the
 * search_path pinned (privilege.c): the caller's search_path must not
 * choose an operator or type for a query that runs with the owner's
 * privileges.  Between SPI_connect and SPI_finish, which the caller does.
 */
static void
catalog_exec(const char *sql, int nargs, Oid *argtypes, Datum *values,
			 const char *nulls, bool read_only, int expected)
{
	FelixContext cxt;
	int			rc;

	felix_context_begin(&cxt, felix_catalog_owner());
	/*
	 * Reads are not read-only either: a fresh snapshot sees rows this
	 * transaction wrote (a stream it just created).
	 */
	rc = SPI_execute_with_args(sql, nargs, argtypes, values, nulls, read_only, 0);
	felix_context_end(&cxt);
	if (rc != expected)
		elog(ERROR, "felix: statement on felix.streams failed (%s): %s",
			 SPI_result_code_string(rc), sql);
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

	sql = psprintf("SELECT " CATALOG_COLUMNS " FROM felix.streams "
				   "WHERE %s OPERATOR(pg_catalog.=) $1", column);
	streams_relid = get_relname_relid("streams", get_namespace_oid("felix", false));
	SPI_connect();
	catalog_exec(sql, 1, argtypes, values, NULL, false, SPI_OK_SELECT);
	if (SPI_processed == 1)
	{
		catalog_row(0, &row);
		found_row = true;
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

List *
felix_stream_list(void)
{
	List	   *streams = NIL;
	MemoryContext caller = CurrentMemoryContext;

	if (!OidIsValid(get_namespace_oid("felix", true)))
		return NIL;
	SPI_connect();
	catalog_exec("SELECT " CATALOG_COLUMNS " FROM felix.streams ORDER BY name",
				 0, NULL, NULL, NULL, false, SPI_OK_SELECT);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		FelixStream *row = MemoryContextAlloc(caller, sizeof(FelixStream));
		MemoryContext old;

		catalog_row(i, row);
		old = MemoryContextSwitchTo(caller);
		streams = lappend(streams, row);
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	return streams;
}

bool
felix_stream_name_taken(const char *name)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(name)};
	bool		taken;

	SPI_connect();
	catalog_exec("SELECT 1 FROM felix.streams WHERE name OPERATOR(pg_catalog.=) $1",
				 1, argtypes, values, NULL, false, SPI_OK_SELECT);
	taken = SPI_processed > 0;
	SPI_finish();
	return taken;
}

void
felix_catalog_owned(Oid role, int64 *streams, int64 *shards)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		values[1] = {ObjectIdGetDatum(role)};
	bool		isnull;

	SPI_connect();
	catalog_exec("SELECT pg_catalog.count(*), COALESCE(pg_catalog.sum(s.shards), 0) "
				 "FROM felix.streams s JOIN pg_catalog.pg_class c "
				 "ON c.oid OPERATOR(pg_catalog.=) s.relid "
				 "WHERE c.relowner OPERATOR(pg_catalog.=) $1",
				 1, argtypes, values, NULL, false, SPI_OK_SELECT);
	*streams = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	*shards = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();
}

void
felix_catalog_register(const FelixStream *def, Interval *retention)
{
	Oid			argtypes[10] = {TEXTOID, OIDOID, INT4OID, INT4OID, TEXTOID,
	REGTYPEOID, TEXTOID, INT8OID, INTERVALOID, UUIDOID};
	Datum		values[10];
	char		nulls[10] = "          ";

	values[0] = CStringGetTextDatum(def->name);
	values[1] = ObjectIdGetDatum(def->relid);
	values[2] = Int32GetDatum(def->shards);
	values[3] = Int32GetDatum(def->replication_factor);
	values[4] = CStringGetTextDatum(def->consistency == FELIX_CONSISTENCY_QUORUM ?
									"quorum" : "leader");
	values[5] = ObjectIdGetDatum(def->payload_type);
	values[6] = CStringGetTextDatum("local");
	values[7] = Int64GetDatum(def->retention_bytes);
	values[8] = PointerGetDatum(retention);
	values[9] = DirectFunctionCall1(uuid_in, CStringGetDatum(def->creation_id));
	if (def->retention_bytes <= 0)
		nulls[7] = 'n';
	if (retention == NULL)
		nulls[8] = 'n';
	SPI_connect();
	catalog_exec("INSERT INTO felix.streams (name, relid, shards, replication_factor, "
				 "consistency, payload_type, storage, retention_bytes, retention, creation_id) "
				 "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
				 10, argtypes, values, nulls, false, SPI_OK_INSERT);
	SPI_finish();
}

/* Does the stream have exactly these settings (seclabel.c)? */
bool
felix_stream_settings_match(const FelixStream *stream, const FelixStreamSettings *st)
{
	return stream->shards == st->shards &&
		stream->replication_factor == st->replication_factor &&
		strcmp(stream->consistency == FELIX_CONSISTENCY_QUORUM ? "quorum" : "leader",
			   st->consistency) == 0 &&
		strcmp(st->storage, "local") == 0 &&
		stream->retention_bytes == Max(st->retention_bytes, 0) &&
		stream->retention_ms == (st->retention ? interval_ms(st->retention) : 0);
}

static void
require_extension_schema(void)
{
	char		installed[NAMEDATALEN];

	felix_require_preload();
	if (version_checked)
		return;
	if (!OidIsValid(get_namespace_oid("felix", true)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the felix extension is not installed in this database"),
				 errhint("Run CREATE EXTENSION felix.")));
	/* the SQL objects this library reads must be the ones it was built for */
	if (!felix_extension_version(installed, sizeof(installed)) && installed[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("felix %s is installed in this database, and the felix library loaded is %s",
						installed, FELIX_SQL_VERSION),
				 errhint("Run ALTER EXTENSION felix UPDATE.")));
	version_checked = true;
}

const FelixStream *
felix_stream_lookup_name(const char *name)
{
	StreamByName *n;
	char		key[NAMEDATALEN];
	Oid			nsp;

	if (name == NULL || strlen(name) >= NAMEDATALEN)
		return NULL;
	cache_ensure();
	memset(key, 0, sizeof(key));
	strlcpy(key, name, NAMEDATALEN);
	n = hash_search(by_name, key, HASH_FIND, NULL);
	if (n != NULL)
		return n->stream;
	nsp = get_namespace_oid("felix", true);
	if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("streams", nsp)))
		return NULL;
	return catalog_fetch("name", CStringGetTextDatum(name), TEXTOID);
}

const FelixStream *
felix_stream_by_name(const char *name)
{
	const FelixStream *stream;

	if (name == NULL || name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL or empty"),
				 errhint("Pass the name given to felix_create_stream; felix_streams lists them.")));

	if (strlen(name) < NAMEDATALEN)
	{
		require_extension_schema();
		stream = felix_stream_lookup_name(name);
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
	Oid			nsp;

	cache_ensure();
	r = hash_search(by_relid, &relid, HASH_FIND, NULL);
	if (r != NULL)
		return r->stream;
	/* No catalog (not installed, or being dropped): no streams. */
	nsp = get_namespace_oid("felix", true);
	if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("streams", nsp)))
		return NULL;
	return catalog_fetch("relid", ObjectIdGetDatum(relid), OIDOID);
}

static Oid
felix_am_oid(void)
{
	return GetSysCacheOid1(AMNAME, Anum_pg_am_oid, CStringGetDatum("felix"));
}

bool
felix_uses_felix_am(Relation rel)
{
	return rel->rd_rel->relkind == RELKIND_RELATION &&
		OidIsValid(rel->rd_rel->relam) &&
		rel->rd_rel->relam == felix_am_oid();
}

bool
felix_uses_felix_am_relid(Oid relid)
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

/*
 * A stream's table as felix_create_stream makes it.  The types were named
 * schema-qualified when it was created and the shape cannot be altered
 * since (refuse.c), so a mismatch means the table is not what felix.streams
 * says it is; reading records into it as if it were could crash the
 * server (a payload in a column of another type), so it is refused.
 */
void
felix_stream_check_shape(const FelixStream *stream, TupleDesc desc)
{
	static const char *const names[FELIX_NATTS] = {"shard", "seq", "key", "payload", "published_at"};
	Oid			types[FELIX_NATTS] = {INT4OID, INT8OID, TEXTOID, stream->payload_type, TIMESTAMPTZOID};
	int			bad = -1;

	/* a definition naming another type is damaged, whatever the table says */
	if (felix_payload_type_name(stream->payload_type) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("stream \"%s\" is defined with payload type %s, which is not a payload type",
						stream->name,
						format_type_extended(stream->payload_type, -1, FORMAT_TYPE_ALLOW_INVALID)),
				 errhint("Drop the stream with felix_drop_stream('%s') and create it again.",
						 stream->name)));
	if (desc->natts != FELIX_NATTS)
		bad = Min(desc->natts, FELIX_NATTS);
	for (int i = 0; bad < 0 && i < FELIX_NATTS; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->atttypid != types[i] ||
			strcmp(NameStr(att->attname), names[i]) != 0)
			bad = i;
	}
	if (bad < 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("table of stream \"%s\" does not have the columns felix.streams describes",
					stream->name),
			 bad < desc->natts && bad < FELIX_NATTS ?
			 errdetail("Column %d is \"%s\" of type %s; a stream's column %d is \"%s\" of type %s.",
					   bad + 1, NameStr(TupleDescAttr(desc, bad)->attname),
					   format_type_be(TupleDescAttr(desc, bad)->atttypid),
					   bad + 1, names[bad], format_type_be(types[bad])) :
			 errdetail("The table has %d columns; a stream has %d.", desc->natts, FELIX_NATTS),
			 errhint("Drop the stream with felix_drop_stream('%s') and create it again.",
					 stream->name)));
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
