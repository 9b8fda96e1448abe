/*-------------------------------------------------------------------------
 *
 * store.c
 *	  Which control-plane store this process uses, the counters every
 *	  request through it feeds (felix_metrics: store_requests,
 *	  store_failures, store_request_us, store_bytes_read,
 *	  store_bytes_written), and what a reader of changes needs of every
 *	  write, whichever the store: the marks of the sections it writes and
 *	  the deletions key (felix_store_txn, felix_store_range_changed).  See
 *	  store.h.
 *
 * Locking rule: none; the counters are atomics (metrics.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/store.h"
#include "felix.h"
#include "fmgr.h"
#include "funcapi.h"
#include "base/metrics.h"
#include "base/privilege.h"
#include "utils/builtins.h"

const FelixStoreMethods *
felix_store(void)
{
	return felix_store_is_etcd() ? &felix_store_etcd : &felix_store_table;
}

void
felix_store_serialize(void)
{
	if (felix_store()->serialize)
		felix_store()->serialize();
}

static void
count(FelixStoreStatus st, int64 start_ns)
{
	felix_count(FELIX_CTR_STORE_REQUESTS, 1);
	felix_count(FELIX_CTR_STORE_REQUEST_US, (felix_monotonic_ns() - start_ns) / 1000);
	if (st == FELIX_STORE_FAILED || st == FELIX_STORE_UNKNOWN)
		felix_count(FELIX_CTR_STORE_FAILURES, 1);
}

/* What a range returned: the cost of reading the state grows with it. */
static void
count_read(FelixStoreStatus st, const FelixKV *kvs, int nkvs)
{
	int64		bytes = 0;

	if (st != FELIX_STORE_OK)
		return;
	for (int i = 0; i < nkvs; i++)
		bytes += strlen(kvs[i].key) + strlen(kvs[i].value);
	felix_count(FELIX_CTR_STORE_BYTES_READ, bytes);
}

FelixStoreStatus
felix_store_range(const char *key, bool prefix, FelixKV **kvs, int *nkvs,
				  int64 *revision, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixStoreStatus st = felix_store()->range(key, prefix, false, 0, kvs, nkvs, revision, elevel);

	count(st, start);
	count_read(st, *kvs, *nkvs);
	return st;
}

FelixStoreStatus
felix_store_range_guarded(const char *key, bool prefix, FelixKV **kvs, int *nkvs,
						  int64 *revision, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixStoreStatus st = felix_store()->range(key, prefix, true, 0, kvs, nkvs, revision, elevel);

	count(st, start);
	count_read(st, *kvs, *nkvs);
	return st;
}

FelixStoreStatus
felix_store_range_page(const char *after, int limit, FelixKV **kvs, int *nkvs,
					   bool *more, int64 *revision, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixStoreStatus st = felix_store()->page(after, limit, kvs, nkvs, more, revision, elevel);

	count(st, start);
	count_read(st, *kvs, *nkvs);
	return st;
}

/* The section of key: up to and including its first '/', or all of it. */
static char *
section_of(const char *key)
{
	const char *slash = strchr(key, '/');

	return slash ? pnstrdup(key, slash - key + 1) : pstrdup(key);
}

FelixStoreStatus
felix_store_range_changed(const char *prefix, int64 changed_after, bool guarded,
						  const FelixStoreApart *apart, FelixKV **kvs, int *nkvs,
						  int64 *revision, int64 *complete_to, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixKV    *marks;
	int			nmarks;
	FelixKV    *out;
	int			nout;
	FelixStoreStatus st;

	/*
	 * The marks first; then each section marked after changed_after, for
	 * its keys written after it.  A write that commits between the two
	 * reads is in the second if its section is read, and its mark is
	 * newer than complete_to either way: read next time.
	 */
	st = felix_store()->range(FELIX_STORE_MARKS, true, guarded, 0, &marks, &nmarks,
							  revision, elevel);
	count(st, start);
	if (st != FELIX_STORE_OK)
		return st;
	count_read(st, marks, nmarks);
	out = palloc(sizeof(FelixKV) * (nmarks + 1));
	memcpy(out, marks, sizeof(FelixKV) * nmarks);
	nout = nmarks;
	*complete_to = 0;
	for (int i = 0; i < nmarks; i++)
		*complete_to = Max(*complete_to, marks[i].mod_revision);
	for (int i = 0; i < nmarks; i++)
	{
		const char *section = marks[i].key + strlen(FELIX_STORE_MARKS);
		bool		is_apart = apart != NULL && strcmp(section, apart->section) == 0;
		int64		after = is_apart ? apart->changed_after : changed_after;
		const char *only = is_apart ? apart->only_key : NULL;
		FelixKV    *got;
		int			ngot;
		int64		rev;

		if (marks[i].mod_revision <= after || strncmp(section, prefix, strlen(prefix)) != 0)
			continue;
		start = felix_monotonic_ns();
		st = felix_store()->range(only ? only : section, only == NULL, guarded, after,
								  &got, &ngot, &rev, elevel);
		count(st, start);
		if (st != FELIX_STORE_OK)
			return st;
		count_read(st, got, ngot);
		out = repalloc(out, sizeof(FelixKV) * (nout + ngot + 1));
		memcpy(out + nout, got, sizeof(FelixKV) * ngot);
		nout += ngot;
	}
	*kvs = out;
	*nkvs = nout;
	return FELIX_STORE_OK;
}

/* Transactions of this process whose compares failed (felix_store_conflicts). */
static uint64 conflicts = 0;

uint64
felix_store_conflicts(void)
{
	return conflicts;
}

FelixStoreStatus
felix_store_txn(const FelixStoreCmp *cmps, int ncmps, const FelixStoreOp *ops, int nops,
				int64 *revision, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixStoreStatus st;
	int64		bytes = 0;

	/*
	 * What a reader of what changed (felix_store_range_changed) finds: a
	 * deletion leaves nothing behind, so the marker key stands for it; and
	 * every section written is marked.
	 */
	if (nops > 0)
	{
		FelixStoreOp *all = palloc(sizeof(FelixStoreOp) * (2 * nops + 2));
		int			n = nops;
		bool		deletes = false;

		memcpy(all, ops, sizeof(FelixStoreOp) * nops);
		for (int i = 0; i < nops; i++)
			deletes = deletes || ops[i].value == NULL;
		if (deletes)
		{
			all[n].key = FELIX_STORE_KEY_DELETIONS;
			all[n++].value = "{}";
		}
		for (int i = 0, m = n; i < m; i++)
		{
			char	   *mark;
			bool		have = false;

			if (strncmp(all[i].key, FELIX_STORE_MARKS, strlen(FELIX_STORE_MARKS)) == 0)
				continue;
			mark = psprintf("%s%s", FELIX_STORE_MARKS, section_of(all[i].key));
			for (int j = m; j < n && !have; j++)
				have = strcmp(all[j].key, mark) == 0;
			if (have)
				continue;
			all[n].key = mark;
			all[n++].value = "{}";
		}
		ops = all;
		nops = n;
	}
	st = felix_store()->txn(cmps, ncmps, ops, nops, revision, elevel);
	if (st == FELIX_STORE_CONFLICT)
		conflicts++;

	count(st, start);
	for (int i = 0; i < nops; i++)
		bytes += strlen(ops[i].key) + (ops[i].value ? strlen(ops[i].value) : 0);
	felix_count(FELIX_CTR_STORE_BYTES_WRITTEN, bytes);
	return st;
}

/*
 * felix.store_read(prefix): every key of the control-plane store under
 * prefix, as this node's store holds it.  Superusers only: it shows the
 * whole cluster's state (addresses included, never a secret: nodes
 * register only masked addresses).
 */
PG_FUNCTION_INFO_V1(felix_store_read);
Datum
felix_store_read(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *prefix = text_to_cstring(PG_GETARG_TEXT_PP(0));
	FelixKV    *kvs;
	int			n;
	int64		revision;
	FelixContext cxt;

	felix_require_superuser("felix.store_read");
	InitMaterializedSRF(fcinfo, 0);
	if (!felix_store_is_etcd())
		felix_context_begin(&cxt, felix_catalog_owner());
	(void) felix_store_range(prefix, true, &kvs, &n, &revision, ERROR);
	if (!felix_store_is_etcd())
		felix_context_end(&cxt);
	for (int i = 0; i < n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = CStringGetTextDatum(kvs[i].key);
		values[1] = CStringGetTextDatum(kvs[i].value);
		values[2] = Int64GetDatum(kvs[i].mod_revision);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
