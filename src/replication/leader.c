/*-------------------------------------------------------------------------
 *
 * leader.c
 *	  A leader's write path, step by step:
 *	    1. admission: the write conditions hold (a live lease at generation
 *	       G, the shard open at G) -- lease_admit;
 *	    2. the tail is taken and the same conditions checked again at G,
 *	       immediately before the bytes go down -- lease_recheck;
 *	    3. the batches are appended, stamped with their seqs and G, and
 *	       published to flushers and shippers together -- storage;
 *	    4. the group flush makes them durable -- storage;
 *	    5. the acknowledgement: at once with leader consistency, once a
 *	       majority holds them with quorum, and only at G -- quorum.c.
 *	  Each module decides its own step; this file only orders them.
 *
 *	  A commit over several shards (INSERT, COPY) runs steps 1 for every
 *	  shard first, then 2-3 for each shard in slot order behind that
 *	  shard's commit gate, publishing nothing until every append is down,
 *	  cutting every part back if one fails; then 4-5 for each.  The
 *	  stages are separate calls (stage, publish or cancel, acknowledge) so
 *	  that a commit whose other shards are led elsewhere can stage here,
 *	  stage there, and publish only once every leader has staged
 *	  (api/forward_commit.c).
 *
 * Locking rule: no lock of its own; the tail is held only between steps 2
 * and 3, and never while waiting for a flush or an acknowledgement.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/metrics.h"
#include "replication/lease.h"
#include "replication/leader.h"
#include "replication/quorum.h"
#include "storage/format.h"

/* Check that each batch holds what its caller says; returns the total. */
static uint64
count_records(FelixShard *s, StringInfo *batches, const uint32 *counts, int n)
{
	uint64		total = 0;

	/* A batch that disagrees with its caller must never become durable. */
	for (int i = 0; i < n; i++)
	{
		if (counts[i] == 0 || batch_count(batches[i]->data) != counts[i])
			elog(ERROR, "felix: batch for %s claims %u records, caller expects %u",
				 shard_what(s), batch_count(batches[i]->data), counts[i]);
		total += counts[i];
	}
	Assert(n > 0);
	return total;
}

uint64
leader_publish(FelixShard *s, StringInfo *batches, const uint32 *counts, int n)
{
	return leader_publish_admitted(s, lease_admit(s), batches, counts, n);
}

uint64
leader_publish_admitted(FelixShard *s, uint64 generation, StringInfo *batches,
						const uint32 *counts, int n)
{
	uint64		total = count_records(s, batches, counts, n);
	uint64		base;

	shard_lock_tail(s);
	lease_recheck(s, generation);
	base = shard_append_locked(s, generation, batches, n, NULL, -1);
	shard_publish_tail(s);
	shard_unlock_tail(s);
	felix_count(FELIX_CTR_RECORDS_PUBLISHED, total);

	shard_flush(s, base + total);
	quorum_acknowledge(s, generation, base + total);
	return base;
}

static int
cmp_slot(const void *a, const void *b)
{
	int			x = shard_slot_index(((const FelixCommitPart *) a)->s);
	int			y = shard_slot_index(((const FelixCommitPart *) b)->s);

	return x < y ? -1 : (x > y ? 1 : 0);
}

void
leader_commit_stage(FelixCommitPart *parts, int nparts)
{
	volatile int appended = 0;
	MemoryContext oldcxt;

	/*
	 * Admit every shard first, so a shard this node cannot write (damaged,
	 * not led here) refuses the commit before any gate is held.
	 */
	for (int i = 0; i < nparts; i++)
		parts[i].end = count_records(parts[i].s, parts[i].batches, parts[i].counts,
									 parts[i].nbatches);
	for (int i = 0; i < nparts; i++)
		parts[i].generation = lease_admit(parts[i].s);

	qsort(parts, nparts, sizeof(FelixCommitPart), cmp_slot);
	oldcxt = CurrentMemoryContext;
	PG_TRY();
	{
		for (int i = 0; i < nparts; i++)
		{
			FelixCommitPart *p = &parts[i];

			shard_lock_tail(p->s);
			lease_recheck(p->s, p->generation);
			p->base = shard_append_locked(p->s, p->generation, p->batches, p->nbatches,
										  p->restore ? p->stamps : NULL,
										  p->restore ? (int64) p->restore_at : -1);
			p->end += p->base;	/* it held the part's record count */
			/* the tail may go; the batches stay unpublished behind the gate */
			shard_hold_gate(p->s, p->base);
			shard_unlock_tail(p->s);
			appended = i + 1;
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* the part that failed may still hold its tail: let it go first */
		if (appended < nparts)
			shard_unlock_tail_if_held(parts[appended].s);
		for (int i = 0; i < appended; i++)
			shard_release_gate(parts[i].s, false);
		ReThrowError(edata);
	}
	PG_END_TRY();
}

void
leader_commit_cancel(FelixCommitPart *parts, int nparts)
{
	for (int i = 0; i < nparts; i++)
		shard_release_gate(parts[i].s, false);
}

void
leader_commit_publish(FelixCommitPart *parts, int nparts)
{
	for (int i = 0; i < nparts; i++)
	{
		shard_release_gate(parts[i].s, true);
		felix_count(FELIX_CTR_RECORDS_PUBLISHED, parts[i].end - parts[i].base);
	}
}

void
leader_commit_acknowledge(FelixCommitPart *parts, int nparts)
{
	for (int i = 0; i < nparts; i++)
	{
		shard_flush(parts[i].s, parts[i].end);
		quorum_acknowledge(parts[i].s, parts[i].generation, parts[i].end);
	}
}

void
leader_commit(FelixCommitPart *parts, int nparts)
{
	if (nparts == 1 && !parts[0].restore)
	{
		parts[0].base = leader_publish(parts[0].s, parts[0].batches, parts[0].counts,
									   parts[0].nbatches);
		return;
	}
	leader_commit_stage(parts, nparts);
	leader_commit_publish(parts, nparts);
	leader_commit_acknowledge(parts, nparts);
}
