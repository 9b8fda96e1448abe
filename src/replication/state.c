/*-------------------------------------------------------------------------
 *
 * state.c
 *	  The leader's per-follower replication state in shared memory, an
 *	  array parallel to the shard slots (see state.h), and what reads it:
 *	  the felix_replication view (felix.replication_view) and the
 *	  replication gauges of felix_metrics.
 *
 *	  Only the ship worker writes an entry (ship.c: cursors and answers);
 *	  report.c reads it to compute quorum marks and replica reports.  An
 *	  entry describes one shard at one generation: when the shard's
 *	  generation changes, or its slot is given to another shard, the worker
 *	  resets it, because a cursor from an earlier leadership says nothing
 *	  about what a follower holds now.
 *
 *	  Beside the entries, a bitmap of the slots with new work for the ship
 *	  worker (repl_ship_due), set by whoever makes the work and cleared by
 *	  the worker as it takes the slots.
 *
 * Locking rule: each entry's spinlock guards all of its fields; it is held
 * only for plain copies in and out.  Shard fields are read under the
 * shard's own spinlock, never while holding an entry's.  The bitmap's
 * words are atomics: set with fetch-or after the work is visible, taken
 * with exchange before the worker reads the work.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/wake.h"
#include "felix.h"
#include "fmgr.h"
#include "funcapi.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "base/privilege.h"
#include "replication/state.h"
#include "storage/shard.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

/* One entry per shard slot. */
static FelixReplShard *repl_entries = NULL;
/* Slots with new work to ship, a bit each (after the entries). */
static pg_atomic_uint64 *ship_due_words = NULL;

#define DUE_WORDS	((felix_max_shards + 63) / 64)

Size
repl_state_shmem_size(void)
{
	return add_size(MAXALIGN(mul_size(sizeof(FelixReplShard), felix_max_shards)),
					mul_size(sizeof(pg_atomic_uint64), DUE_WORDS));
}

void
repl_state_shmem_init(void)
{
	bool		found;

	repl_entries = ShmemInitStruct("felix replication state",
								   repl_state_shmem_size(), &found);
	ship_due_words = (pg_atomic_uint64 *)
		((char *) repl_entries + MAXALIGN(mul_size(sizeof(FelixReplShard), felix_max_shards)));
	if (!found)
	{
		for (int i = 0; i < felix_max_shards; i++)
		{
			memset(&repl_entries[i], 0, sizeof(FelixReplShard));
			SpinLockInit(&repl_entries[i].mutex);
		}
		for (int w = 0; w < DUE_WORDS; w++)
			pg_atomic_init_u64(&ship_due_words[w], 0);
	}
}

void
repl_ship_due(int slot)
{
	felix_require_preload();
	Assert(slot >= 0 && slot < felix_max_shards);
	pg_atomic_fetch_or_u64(&ship_due_words[slot / 64], UINT64CONST(1) << (slot % 64));
	felix_wake(FELIX_WORKER_SHIP);
}

int
repl_ship_take_due(int *slots, int max)
{
	int			n = 0;

	Assert(max >= felix_max_shards);
	for (int w = 0; w < DUE_WORDS; w++)
	{
		uint64		bits;

		if (pg_atomic_read_u64(&ship_due_words[w]) == 0)
			continue;
		bits = pg_atomic_exchange_u64(&ship_due_words[w], 0);
		for (int b = 0; b < 64 && bits != 0; b++, bits >>= 1)
			if (bits & 1)
				slots[n++] = w * 64 + b;
	}
	return n;
}

FelixReplShard *
repl_state_entry(int slot)
{
	felix_require_preload();
	Assert(slot >= 0 && slot < felix_max_shards);
	return &repl_entries[slot];
}

void
repl_state_copy(int slot, FelixReplShard *out)
{
	FelixReplShard *e = repl_state_entry(slot);

	int			n;

	/*
	 * The header, and the followers only of a valid entry, only as many
	 * as it has: every reader looks at nothing else.  The ship worker
	 * copies every slot twice a pass, and the whole entry (seven followers
	 * with their error texts, some 3 KB) was most of what a pass cost at
	 * thousands of shards.
	 */
	SpinLockAcquire(&e->mutex);
	n = e->valid ? Min(Max(e->nfollowers, 0), FELIX_MAX_REPLICAS) : 0;
	memcpy(out, e, offsetof(FelixReplShard, followers) + n * sizeof(FelixFollower));
	SpinLockRelease(&e->mutex);
}

void
repl_state_reset(int slot, const FelixShardKey *key, const char *stream_name,
				 uint64 generation, char (*followers)[NAMEDATALEN],
				 int nfollowers, uint64 fresh_cursor)
{
	FelixReplShard *e = repl_state_entry(slot);
	FelixReplShard fresh;

	/* Build outside the spinlock; copy in under it. */
	memset(&fresh, 0, sizeof(fresh));
	fresh.valid = true;
	fresh.key = *key;
	strlcpy(fresh.stream_name, stream_name, NAMEDATALEN);
	fresh.generation = generation;
	fresh.nfollowers = Min(nfollowers, FELIX_MAX_REPLICAS);
	for (int i = 0; i < fresh.nfollowers; i++)
	{
		FelixFollower *f = &fresh.followers[i];

		strlcpy(f->name, followers[i], NAMEDATALEN);
		f->cursor = fresh_cursor;
		f->acked_end = 0;
		f->answered = false;
		f->state = FELIX_FOLLOWER_SHIPPING;
		f->halt = FELIX_HALT_NONE;
		f->last_answer_at = 0;
		f->last_error[0] = '\0';
	}

	SpinLockAcquire(&e->mutex);
	memcpy((char *) e + offsetof(FelixReplShard, valid),
		   (char *) &fresh + offsetof(FelixReplShard, valid),
		   sizeof(FelixReplShard) - offsetof(FelixReplShard, valid));
	SpinLockRelease(&e->mutex);
}

void
repl_state_clear(int slot)
{
	FelixReplShard *e = repl_state_entry(slot);

	SpinLockAcquire(&e->mutex);
	e->valid = false;
	e->nfollowers = 0;
	SpinLockRelease(&e->mutex);
}

void
repl_state_put_follower(int slot, int i, const FelixFollower *f)
{
	FelixReplShard *e = repl_state_entry(slot);

	bool		requested;

	Assert(i >= 0 && i < FELIX_MAX_REPLICAS);
	SpinLockAcquire(&e->mutex);
	requested = e->followers[i].rebuild_requested;
	e->followers[i] = *f;
	e->followers[i].rebuild_requested = requested;
	SpinLockRelease(&e->mutex);
}

bool
repl_state_take_rebuild_request(int slot, int i)
{
	FelixReplShard *e = repl_state_entry(slot);
	bool		requested;

	SpinLockAcquire(&e->mutex);
	requested = e->followers[i].rebuild_requested;
	e->followers[i].rebuild_requested = false;
	SpinLockRelease(&e->mutex);
	return requested;
}

FelixHalt
repl_request_rebuild(int slot, uint64 generation, const char *follower)
{
	FelixReplShard *e = repl_state_entry(slot);
	FelixHalt	halt = FELIX_HALT_NONE;

	SpinLockAcquire(&e->mutex);
	if (e->valid && e->generation == generation)
	{
		for (int i = 0; i < e->nfollowers; i++)
		{
			FelixFollower *f = &e->followers[i];

			if (strcmp(f->name, follower) == 0 && f->state == FELIX_FOLLOWER_HALTED)
			{
				f->rebuild_requested = true;
				halt = f->halt;
			}
		}
	}
	SpinLockRelease(&e->mutex);
	if (halt != FELIX_HALT_NONE)
		repl_ship_due(slot);
	return halt;
}

const char *
felix_follower_state_name(FelixFollowerState st)
{
	switch (st)
	{
		case FELIX_FOLLOWER_SHIPPING:
			return "shipping";
		case FELIX_FOLLOWER_BOOTSTRAP:
			return "bootstrapping";
		case FELIX_FOLLOWER_REBUILDING:
			return "rebuilding";
		case FELIX_FOLLOWER_HALTED:
			return "halted";
	}
	return "unknown";
}

const char *
felix_halt_name(FelixHalt h)
{
	switch (h)
	{
		case FELIX_HALT_NONE:
			break;
		case FELIX_HALT_DIVERGED:
			return "diverged";
		case FELIX_HALT_NEEDS_BOOTSTRAP:
			return "needs_bootstrap";
		case FELIX_HALT_FENCED:
			return "fenced";
		case FELIX_HALT_PROTOCOL:
			return "protocol";
	}
	return "";
}

/*
 * What the leader knows of the shard in `slot` right now, if it still
 * leads it at the entry's generation.  False when the entry is stale.
 */
static bool
leader_position(int slot, const FelixReplShard *e, uint64 *written_end)
{
	FelixShardView v;

	shard_read(shard_slot(slot), &v);
	*written_end = v.written_end;
	return v.in_use && v.role == FELIX_ROLE_LEADER &&
		v.generation == e->generation &&
		v.key.dboid == e->key.dboid && v.key.relid == e->key.relid &&
		v.key.shard == e->key.shard;
}

void
felix_replication_gauges(FelixReplGauges *g)
{
	int			nslots;
	uint64		requests;
	FelixReplShard *e = palloc(sizeof(FelixReplShard));

	memset(g, 0, sizeof(*g));
	nslots = shard_count_slots();
	for (int i = 0; i < nslots; i++)
	{
		uint64		written_end;
		uint64		slowest = PG_UINT64_MAX;

		if (!repl_entries[i].valid)
			continue;			/* a cheap peek; the copy below decides */
		repl_state_copy(i, e);
		if (!e->valid || !leader_position(i, e, &written_end))
			continue;
		for (int f = 0; f < e->nfollowers; f++)
		{
			FelixFollower *fl = &e->followers[f];

			if (fl->state == FELIX_FOLLOWER_HALTED)
			{
				g->halted++;
				g->halted_by[fl->halt]++;
				continue;
			}
			if (fl->state == FELIX_FOLLOWER_REBUILDING)
				g->rebuilding++;
			slowest = Min(slowest, fl->acked_end);
		}
		if (slowest != PG_UINT64_MAX && written_end > slowest)
			g->lag_records += written_end - slowest;
	}
	pfree(e);

	requests = felix_counter_value(FELIX_CTR_REPORT_REQUESTS);
	g->reports_per_request = requests == 0 ? 0.0 :
		(double) felix_counter_value(FELIX_CTR_REPLICA_REPORTS) / (double) requests;
}

/*
 * felix.replication_view(): on the leader, one row per follower of every
 * shard of this database led here with replication_factor > 1.
 */
PG_FUNCTION_INFO_V1(felix_replication_view);
Datum
felix_replication_view(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	FelixReplShard *e;
	int			nslots;

	felix_require_preload();
	InitMaterializedSRF(fcinfo, 0);

	e = palloc(sizeof(FelixReplShard));
	nslots = shard_count_slots();
	for (int i = 0; i < nslots; i++)
	{
		uint64		written_end;

		repl_state_copy(i, e);
		if (!e->valid || e->key.dboid != MyDatabaseId ||
			!leader_position(i, e, &written_end) ||
			!felix_sees_stream(e->key.relid))
			continue;

		for (int f = 0; f < e->nfollowers; f++)
		{
			FelixFollower *fl = &e->followers[f];
			Datum		values[9];
			bool		nulls[9];

			memset(nulls, 0, sizeof(nulls));
			values[0] = CStringGetTextDatum(e->stream_name);
			values[1] = Int32GetDatum(e->key.shard);
			values[2] = Int64GetDatum((int64) e->generation);
			values[3] = CStringGetTextDatum(fl->name);
			if (fl->answered && fl->acked_end > 0)
				values[4] = Int64GetDatum((int64) fl->acked_end - 1);
			else
				nulls[4] = true;
			values[5] = Int64GetDatum(written_end > fl->acked_end ?
									  (int64) (written_end - fl->acked_end) : 0);
			/*
			 * A follower shipped to that has not answered on its current
			 * connection and has an error to show -- its peers cannot log
			 * in to it, say -- is not shipping but unreachable.
			 */
			values[6] = CStringGetTextDatum(fl->state == FELIX_FOLLOWER_HALTED ?
											psprintf("halted_%s", felix_halt_name(fl->halt)) :
											fl->state == FELIX_FOLLOWER_SHIPPING && !fl->answered &&
											fl->last_error[0] != '\0' ? "unreachable" :
											felix_follower_state_name(fl->state));
			if (fl->last_answer_at != 0)
				values[7] = TimestampTzGetDatum(fl->last_answer_at);
			else
				nulls[7] = true;
			if (fl->last_error[0] != '\0')
				values[8] = CStringGetTextDatum(fl->last_error);
			else
				nulls[8] = true;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	pfree(e);
	return (Datum) 0;
}
