/*-------------------------------------------------------------------------
 *
 * leader.h
 *	  A leader's write path: admission under the lease, the append, the
 *	  group flush and the acknowledgement, in that order, for one shard's
 *	  batches or for a commit over several shards.  See leader.c.
 *
 * Locking rule: as the modules it strings together (storage/shard.h,
 * replication/lease.h, replication/quorum.h); it holds no lock of its own.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_LEADER_H
#define FELIX_REPLICATION_LEADER_H

#include "postgres.h"

#include "storage/shard.h"

/*
 * Publish n batch bodies (built with batch_begin/batch_add/batch_seal_body)
 * holding counts[i] records each, on one shard: they get contiguous seqs,
 * become visible together, and are acknowledged before this returns -- or,
 * if any append fails, none of them was ever visible.  Returns the first
 * record's seq.
 */
extern uint64 leader_publish(FelixShard *s, StringInfo *batches,
							 const uint32 *counts, int n);
/* ... the same, for a write its caller already admitted at `generation`
 * (lease_admit): the tail is taken and the lease checked again there. */
extern uint64 leader_publish_admitted(FelixShard *s, uint64 generation, StringInfo *batches,
									  const uint32 *counts, int n);

/* One shard's part of a commit. */
typedef struct FelixCommitPart
{
	FelixShard *s;
	StringInfo *batches;
	uint32	   *counts;
	int			nbatches;
	/* restored records: they must land at restore_at, stamped stamps[i] */
	bool		restore;
	uint64		restore_at;
	TimestampTz *stamps;
	/* filled in by leader_commit */
	uint64		generation;
	uint64		base;
	uint64		end;
} FelixCommitPart;

/*
 * Publish a commit over several shards, all or nothing: every shard is
 * admitted first, then every shard's batches appended behind its commit
 * gate (in slot order), and only once all of them are down are any
 * published; if one append fails, every part is cut back and the error
 * goes on with nothing published.  Then each part is acknowledged.
 * `parts` is reordered.
 */
extern void leader_commit(FelixCommitPart *parts, int nparts);

/*
 * leader_commit in its steps, for a commit that spans leaders:
 *  - stage: admit every part, then append each behind its gate (slot
 *    order; `parts` is reordered); nothing is published, and if it raises,
 *    nothing of any part remains;
 *  - then either cancel (cut every staged part back) or publish (release
 *    the gates: the parts reach flushers, shippers and readers);
 *  - acknowledge: wait for each published part's flush and
 *    acknowledgement at the generation it was staged at.
 * Gates a backend still holds when it exits are cut back (storage/shard.c).
 */
extern void leader_commit_stage(FelixCommitPart *parts, int nparts);
extern void leader_commit_cancel(FelixCommitPart *parts, int nparts);
extern void leader_commit_publish(FelixCommitPart *parts, int nparts);
extern void leader_commit_acknowledge(FelixCommitPart *parts, int nparts);

#endif							/* FELIX_REPLICATION_LEADER_H */
