/*-------------------------------------------------------------------------
 *
 * store.c
 *	  Which control-plane store this process uses, and the counters every
 *	  request through it feeds (felix_metrics: store_requests,
 *	  store_failures, store_request_us, store_bytes_read,
 *	  store_bytes_written).  See store.h.
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
	FelixStoreStatus st = felix_store()->range(key, prefix, false, kvs, nkvs, revision, elevel);

	count(st, start);
	count_read(st, *kvs, *nkvs);
	return st;
}

FelixStoreStatus
felix_store_range_guarded(const char *key, bool prefix, FelixKV **kvs, int *nkvs,
						  int64 *revision, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixStoreStatus st = felix_store()->range(key, prefix, true, kvs, nkvs, revision, elevel);

	count(st, start);
	count_read(st, *kvs, *nkvs);
	return st;
}

FelixStoreStatus
felix_store_txn(const FelixStoreCmp *cmps, int ncmps, const FelixStoreOp *ops, int nops,
				int64 *revision, int elevel)
{
	int64		start = felix_monotonic_ns();
	FelixStoreStatus st = felix_store()->txn(cmps, ncmps, ops, nops, revision, elevel);
	int64		bytes = 0;

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
