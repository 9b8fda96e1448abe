/*-------------------------------------------------------------------------
 *
 * store_table.c
 *	  The embedded control-plane store: table felix.cp_store (key, value,
 *	  mod_revision) in the control-plane database, revisions drawn from
 *	  the sequence felix.cp_store_revision.  Used by the felix.cp_*
 *	  functions running there, inside the caller's transaction, through
 *	  SPI with fully qualified names.
 *
 *	  A transaction takes SHARE ROW EXCLUSIVE on the table (it conflicts
 *	  with itself, not with reads) before it compares, and holds it to the
 *	  end of the calling transaction: so compares and writes of concurrent
 *	  callers serialize, revisions are drawn in commit order, and a read
 *	  (a fresh snapshot per statement under READ COMMITTED) sees every
 *	  transaction that committed before it began -- linearizable, as the
 *	  lease rules need.  (Reads run with read_only false for that reason:
 *	  a read-only SPI command would reuse the calling query's snapshot,
 *	  taken before the lock was.)
 *
 * Locking rule: the table lock above, taken only by felix_store_txn and
 * released at commit or abort; nothing in shared memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "control/store.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"

/*
 * The statements, each planned once per process: a control-plane host
 * runs them thousands of times a second, and planning them every time was
 * a tenth of its idle CPU.  (Plancache plans again when felix.cp_store
 * changes.)
 */
typedef enum TableStmt
{
	STMT_ALL,					/* every key, in key order */
	STMT_ALL_CHANGED,			/* every key written after $1 */
	STMT_RANGE,					/* keys in [$1, $2), in key order */
	STMT_RANGE_CHANGED,			/* ... written after $3 */
	STMT_FROM,					/* keys from $1 on, in key order */
	STMT_FROM_CHANGED,			/* ... written after $2 */
	STMT_AFTER,					/* keys after $1, in key order (a page) */
	STMT_KEY_CHANGED,			/* key $1, written after $2 */
	STMT_REVISION_OF,			/* key $1's mod_revision */
	STMT_PUT,
	STMT_DELETE,
	STMT_REVISION,				/* the store's revision */
	STMT_COUNT
} TableStmt;

#define KV_COLS		"SELECT key, value, mod_revision FROM felix.cp_store "

/*
 * Each planned once, for any arguments (CURSOR_OPT_GENERIC_PLAN): every
 * condition is one an index answers whatever its value.  (What changed
 * comes in no order: that index is on mod_revision.)
 */
static const struct
{
	const char *sql;
	int			nargs;
	Oid			types[3];
}			stmt_def[STMT_COUNT] = {
	[STMT_ALL] = {KV_COLS "ORDER BY key", 0, {InvalidOid}},
	[STMT_ALL_CHANGED] = {KV_COLS "WHERE mod_revision OPERATOR(pg_catalog.>) $1", 1, {INT8OID}},
	[STMT_RANGE] = {KV_COLS "WHERE key OPERATOR(pg_catalog.>=) $1 AND key OPERATOR(pg_catalog.<) $2 "
	"ORDER BY key", 2, {TEXTOID, TEXTOID}},
	[STMT_RANGE_CHANGED] = {KV_COLS "WHERE key OPERATOR(pg_catalog.>=) $1 AND key OPERATOR(pg_catalog.<) $2 "
	"AND mod_revision OPERATOR(pg_catalog.>) $3", 3, {TEXTOID, TEXTOID, INT8OID}},
	[STMT_FROM] = {KV_COLS "WHERE key OPERATOR(pg_catalog.>=) $1 ORDER BY key", 1, {TEXTOID}},
	[STMT_FROM_CHANGED] = {KV_COLS "WHERE key OPERATOR(pg_catalog.>=) $1 "
	"AND mod_revision OPERATOR(pg_catalog.>) $2", 2, {TEXTOID, INT8OID}},
	[STMT_AFTER] = {KV_COLS "WHERE key OPERATOR(pg_catalog.>) $1 ORDER BY key", 1, {TEXTOID}},
	[STMT_KEY_CHANGED] = {KV_COLS "WHERE key OPERATOR(pg_catalog.=) $1 "
	"AND mod_revision OPERATOR(pg_catalog.>) $2", 2, {TEXTOID, INT8OID}},
	[STMT_REVISION_OF] = {"SELECT mod_revision FROM felix.cp_store "
	"WHERE key OPERATOR(pg_catalog.=) $1", 1, {TEXTOID}},
	[STMT_PUT] = {"INSERT INTO felix.cp_store AS s (key, value, mod_revision) "
		"VALUES ($1, $2, $3) ON CONFLICT (key) DO UPDATE "
	"SET value = EXCLUDED.value, mod_revision = EXCLUDED.mod_revision", 3, {TEXTOID, TEXTOID, INT8OID}},
	[STMT_DELETE] = {"DELETE FROM felix.cp_store WHERE key OPERATOR(pg_catalog.=) $1", 1, {TEXTOID}},
	[STMT_REVISION] = {"SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
	"FROM felix.cp_store_revision", 0, {InvalidOid}},
};

static SPIPlanPtr stmt_plan[STMT_COUNT];

/* Run statement which (inside SPI_connect) with its arguments. */
static int
run_stmt(TableStmt which, Datum *values, long count)
{
	if (stmt_plan[which] == NULL)
	{
		SPIPlanPtr	plan;

		plan = SPI_prepare_cursor(stmt_def[which].sql, stmt_def[which].nargs,
								  (Oid *) stmt_def[which].types, CURSOR_OPT_GENERIC_PLAN);
		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "felix: could not prepare a statement on felix.cp_store: %s",
				 SPI_result_code_string(SPI_result));
		stmt_plan[which] = plan;
	}
	return SPI_execute_plan(stmt_plan[which], values, NULL, false, count);
}

/*
 * LOCK TABLE felix.cp_store IN SHARE ROW EXCLUSIVE MODE, without a
 * statement to parse at every call: the caller must hold a privilege LOCK
 * TABLE would ask for at that mode, checked before the lock is taken.
 */
static void
check_lock_privilege(const RangeVar *rv, Oid relid, Oid oldrelid, void *arg)
{
	if (OidIsValid(relid) &&
		pg_class_aclmask(relid, GetUserId(), ACL_UPDATE | ACL_DELETE | ACL_TRUNCATE,
						 ACLMASK_ANY) == 0)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_TABLE, rv->relname);
}

static void
lock_store(void)
{
	(void) RangeVarGetRelidExtended(makeRangeVar("felix", "cp_store", -1),
									ShareRowExclusiveLock, 0,
									check_lock_privilege, NULL);
}

/* nextval('felix.cp_store_revision'), privileges checked as nextval does. */
static int64
next_revision(void)
{
	return nextval_internal(RangeVarGetRelid(makeRangeVar("felix", "cp_store_revision", -1),
											 NoLock, false),
							true);
}

/* The local transaction that last wrote (felix_store_table_wrote). */
static LocalTransactionId wrote_lxid = InvalidLocalTransactionId;

bool
felix_store_table_wrote(void)
{
	return wrote_lxid != InvalidLocalTransactionId && MyProc != NULL &&
		wrote_lxid == MyProc->lxid;
}

static int64
current_revision(void)
{
	bool		isnull;
	int64		rev;

	if (run_stmt(STMT_REVISION, NULL, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "felix: could not read felix.cp_store_revision");
	rev = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	return isnull ? 0 : rev;
}

/* The rows SPI returned, copied out of its memory into caller. */
static void
copy_kvs(MemoryContext caller, FelixKV **kvs, int *nkvs)
{
	*nkvs = (int) SPI_processed;
	*kvs = *nkvs > 0 ? MemoryContextAllocZero(caller, sizeof(FelixKV) * *nkvs) : NULL;
	for (int i = 0; i < *nkvs; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		(*kvs)[i].key = MemoryContextStrdup(caller, SPI_getvalue(tup, desc, 1));
		(*kvs)[i].value = MemoryContextStrdup(caller, SPI_getvalue(tup, desc, 2));
		(*kvs)[i].mod_revision = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
	}
}

static FelixStoreStatus
table_range(const char *key, bool prefix, bool guarded, int64 changed_after,
			FelixKV **kvs, int *nkvs, int64 *revision, int elevel)
{
	Datum		values[3];
	int			rc;
	MemoryContext caller = CurrentMemoryContext;

	SPI_connect();
	if (prefix && key[0] == '\0')
	{
		values[0] = Int64GetDatum(changed_after);
		rc = run_stmt(changed_after > 0 ? STMT_ALL_CHANGED : STMT_ALL, values, 0);
	}
	else if (prefix)
	{
		/* the first key past the prefix, in byte ("C") order, if any */
		char	   *end = pstrdup(key);
		int			len = strlen(end);

		while (len > 0 && (unsigned char) end[len - 1] == 0xff)
			end[--len] = '\0';
		values[0] = CStringGetTextDatum(key);
		if (len > 0)
		{
			end[len - 1]++;
			values[1] = CStringGetTextDatum(end);
			values[2] = Int64GetDatum(changed_after);
			rc = run_stmt(changed_after > 0 ? STMT_RANGE_CHANGED : STMT_RANGE, values, 0);
		}
		else
		{
			/* every key from an all-0xff prefix on has that prefix */
			values[1] = Int64GetDatum(changed_after);
			rc = run_stmt(changed_after > 0 ? STMT_FROM_CHANGED : STMT_FROM, values, 0);
		}
	}
	else
	{
		values[0] = CStringGetTextDatum(key);
		values[1] = Int64GetDatum(changed_after);
		rc = run_stmt(STMT_KEY_CHANGED, values, 0);
	}
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "felix: could not read felix.cp_store");
	copy_kvs(caller, kvs, nkvs);
	*revision = current_revision();
	SPI_finish();
	return FELIX_STORE_OK;
}

static FelixStoreStatus
table_page(const char *after, int limit, FelixKV **kvs, int *nkvs, bool *more,
		   int64 *revision, int elevel)
{
	Datum		values[1];
	MemoryContext caller = CurrentMemoryContext;

	SPI_connect();
	values[0] = CStringGetTextDatum(after);
	/* one more than asked: whether more follow */
	if (run_stmt(STMT_AFTER, values, limit + 1) != SPI_OK_SELECT)
		elog(ERROR, "felix: could not read felix.cp_store");
	*more = SPI_processed > (uint64) limit;
	if (*more)
		SPI_processed = limit;
	copy_kvs(caller, kvs, nkvs);
	*revision = current_revision();
	SPI_finish();
	return FELIX_STORE_OK;
}

static FelixStoreStatus
table_txn(const FelixStoreCmp *cmps, int ncmps, const FelixStoreOp *ops, int nops,
		  int64 *revision, int elevel)
{
	Datum		values[3];
	int64		rev;

	lock_store();
	SPI_connect();
	for (int i = 0; i < ncmps; i++)
	{
		int64		have = 0;

		values[0] = CStringGetTextDatum(cmps[i].key);
		if (run_stmt(STMT_REVISION_OF, values, 1) != SPI_OK_SELECT)
			elog(ERROR, "felix: could not read felix.cp_store");
		if (SPI_processed == 1)
		{
			bool		isnull;

			have = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1, &isnull));
		}
		if (have != cmps[i].mod_revision)
		{
			*revision = current_revision();
			SPI_finish();
			return FELIX_STORE_CONFLICT;
		}
	}
	if (nops == 0)
	{
		*revision = current_revision();
		SPI_finish();
		return FELIX_STORE_OK;
	}
	rev = next_revision();
	wrote_lxid = MyProc->lxid;
	for (int i = 0; i < nops; i++)
	{
		int			rc;

		values[0] = CStringGetTextDatum(ops[i].key);
		if (ops[i].value != NULL)
		{
			values[1] = CStringGetTextDatum(ops[i].value);
			values[2] = Int64GetDatum(rev);
			rc = run_stmt(STMT_PUT, values, 0);
			if (rc != SPI_OK_INSERT)
				elog(ERROR, "felix: could not write felix.cp_store");
		}
		else
		{
			rc = run_stmt(STMT_DELETE, values, 0);
			if (rc != SPI_OK_DELETE)
				elog(ERROR, "felix: could not write felix.cp_store");
		}
	}
	*revision = rev;
	SPI_finish();
	return FELIX_STORE_OK;
}

static void
table_serialize(void)
{
	lock_store();
}

const FelixStoreMethods felix_store_table = {
	"embedded",
	table_range,
	table_page,
	table_txn,
	table_serialize
};
