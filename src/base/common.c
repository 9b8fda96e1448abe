/*-------------------------------------------------------------------------
 *
 * common.c
 *	  What every layer needs that is not a setting: the preload and
 *	  argument checks of the SQL entry points, the installed extension's
 *	  version, where the felix data directory and a stream's and shard's
 *	  files are, the monotonic clock, and a nap on the latch.
 *
 * Locking rule: none; felix_preloaded is written once, by _PG_init in
 * the postmaster.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <time.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_extension.h"
#include "felix.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/wait_event.h"

bool		felix_preloaded = false;

void
felix_require_preload(void)
{
	if (!felix_preloaded)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("felix must be loaded via shared_preload_libraries"),
				 errhint("Add felix to shared_preload_libraries in postgresql.conf "
						 "(shared_preload_libraries = 'felix') and restart the server.")));
}

/*
 * Refuse a call whose SQL declaration passes other than the nargs
 * arguments this library reads: the SQL of an older felix version still
 * bound to this library (the binaries replaced, ALTER EXTENSION felix
 * UPDATE not run yet).  Reading an argument that was never passed would
 * read whatever lies there.
 */
void
felix_require_nargs(FunctionCallInfo fcinfo, int nargs, const char *function)
{
	if (PG_NARGS() != nargs)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s was called with %d arguments, but this felix library takes %d",
						function, PG_NARGS(), nargs),
				 errdetail("The function's SQL declaration is from another felix version than the library loaded."),
				 errhint("Run ALTER EXTENSION felix UPDATE in every database with felix, and the same felix version on every node.")));
}

/*
 * The version of felix installed in this database ("" if none), into buf;
 * true if it is the one this library serves.  Needs a transaction.
 */
bool
felix_extension_version(char *buf, Size len)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;

	buf[0] = '\0';
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("felix"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			text_to_cstring_buffer(DatumGetTextPP(d), buf, len);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return strcmp(buf, FELIX_SQL_VERSION) == 0;
}

PG_FUNCTION_INFO_V1(felix_require_preload_sql);
Datum
felix_require_preload_sql(PG_FUNCTION_ARGS)
{
	felix_require_preload();
	PG_RETURN_VOID();
}

const char *
felix_data_root(void)
{
	static char root[MAXPGPATH];

	if (root[0] == '\0')
	{
		if (felix_data_directory == NULL || felix_data_directory[0] == '\0')
			snprintf(root, MAXPGPATH, "%s/felix", DataDir);
		else if (is_absolute_path(felix_data_directory))
			strlcpy(root, felix_data_directory, MAXPGPATH);
		else
			snprintf(root, MAXPGPATH, "%s/%s", DataDir, felix_data_directory);
	}
	return root;
}

void
felix_stream_dir(Oid dboid, Oid relid, char *buf)
{
	snprintf(buf, MAXPGPATH, "%s/%u/%u", felix_data_root(), dboid, relid);
}

void
felix_shard_dir(const FelixShardKey *key, char *buf)
{
	snprintf(buf, MAXPGPATH, "%s/%u/%u/%d", felix_data_root(),
			 key->dboid, key->relid, key->shard);
}

int64
felix_monotonic_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64) ts.tv_sec * INT64CONST(1000000000) + ts.tv_nsec;
}

void
felix_nap(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}
