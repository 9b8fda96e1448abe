/*-------------------------------------------------------------------------
 *
 * quorum.c
 *	  When a write counts as acknowledged, in one file, as PostgreSQL keeps
 *	  synchronous replication in syncrep.c: writers wait in
 *	  quorum_acknowledge, and are released by the mark moving -- on a
 *	  leader-consistency shard by the flush itself (quorum_notify, the
 *	  storage hook), on a quorum shard by the ship worker once a majority
 *	  holds the records and the control plane knows who does
 *	  (quorum_release, called from report.c with the mark quorum_mark
 *	  computes).
 *
 *	  The rule a waiter keeps: it succeeds only when this node, leading the
 *	  shard at the waiter's own generation, moved the mark past its records
 *	  (acked_generation, acked_end).  The high-water mark alone says
 *	  nothing about whose records sit below it -- a deposed leader learning
 *	  of a newer generation may hold another leadership's records at the
 *	  same seqs -- so a waiter whose leadership moved first gets 55F02,
 *	  never success.  The mark moves only under a live lease
 *	  (lease_live_locked), so nothing is acknowledged at G once G+1 can
 *	  exist.
 *
 * Locking rule: acked_generation and acked_end are written under the
 * shard's mutex together with the mark (inside shard_advance_hwm's check);
 * waiters read them under the mutex and sleep on ack_cv[end % FELIX_ACK_CVS],
 * broadcast when the mark passes one of their ends (so a mark move wakes
 * the writers it releases, not every waiter) and all of them whenever the
 * leadership moves.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "felix.h"
#include "base/metrics.h"
#include "replication/lease.h"
#include "replication/quorum.h"
#include "replication/state.h"

bool
quorum_acks_on_flush(int consistency, int replication_factor)
{
	return consistency == FELIX_CONSISTENCY_LEADER || replication_factor <= 1;
}

/* Under the mutex, inside shard_advance_hwm: may this leadership move it? */
typedef struct ReleaseArg
{
	uint64		generation;
	uint64		mark;
	bool		require_lease;
} ReleaseArg;

static bool
may_release(FelixShard *s, void *varg)
{
	ReleaseArg *a = (ReleaseArg *) varg;

	if (a->require_lease ? !lease_live_locked(s, a->generation) :
		(s->role != FELIX_ROLE_LEADER || s->generation != a->generation))
		return false;
	/* the word a waiter goes by: this generation acknowledged up to mark */
	if (s->acked_generation != a->generation || s->acked_end < a->mark)
	{
		s->acked_generation = a->generation;
		s->acked_end = a->mark;
	}
	return true;
}

/* The mark moved from old_end to new_end: wake the waiters it released. */
static void
wake_acks(FelixShard *s, uint64 old_end, uint64 new_end)
{
	if (new_end <= old_end)
		return;
	if (new_end - old_end >= FELIX_ACK_CVS)
	{
		quorum_wake_all(s);
		return;
	}
	for (uint64 end = old_end + 1; end <= new_end; end++)
		ConditionVariableBroadcast(&s->ack_cv[end % FELIX_ACK_CVS]);
}

void
quorum_wake_all(FelixShard *s)
{
	for (int k = 0; k < FELIX_ACK_CVS; k++)
		ConditionVariableBroadcast(&s->ack_cv[k]);
}

bool
quorum_release(FelixShard *s, uint64 generation, uint64 mark)
{
	ReleaseArg	a = {generation, mark, true};
	uint64		old_end = shard_advance_hwm(s, mark, may_release, &a);
	FelixShardPositions v;

	shard_read_positions(s, &v);
	if (v.hwm_end < mark || v.acked_generation != generation || v.acked_end < mark)
		return false;
	wake_acks(s, old_end, mark);
	return old_end < mark;
}

/*
 * A leader-consistency shard led here at `generation`: what is durable on
 * this node is acknowledged, and the mark moves with the flush.  (A lapsed
 * lease does not stop it: the records were written under a live one, and
 * with leader consistency durable on the leader is the whole promise; a
 * leadership that moved on stops it.)
 */
static void
release_flushed(FelixShard *s, uint64 generation, uint64 flushed_end)
{
	ReleaseArg	a = {generation, flushed_end, false};
	uint64		old_end = shard_advance_hwm(s, flushed_end, may_release, &a);

	wake_acks(s, old_end, flushed_end);
}

void
quorum_on_lead(FelixShard *s)
{
	FelixShardPositions v;

	shard_read_positions(s, &v);
	if (quorum_acks_on_flush(v.consistency, v.replication_factor) &&
		v.role == FELIX_ROLE_LEADER)
		release_flushed(s, v.generation, v.flushed_end);
}

void
quorum_notify(FelixShard *s, FelixShardEvent event)
{
	FelixShardPositions v;

	shard_read_positions(s, &v);
	if (event == FELIX_SHARD_FLUSHED && v.role == FELIX_ROLE_LEADER &&
		quorum_acks_on_flush(v.consistency, v.replication_factor))
		release_flushed(s, v.generation, v.flushed_end);
	/* new records to ship, or a new durable end that may move the mark */
	if (v.replication_factor > 1)
		repl_ship_due(shard_slot_index(s));
}

void
quorum_acknowledge(FelixShard *s, uint64 generation, uint64 end)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   felix_quorum_timeout);
	ConditionVariable *cv = &s->ack_cv[end % FELIX_ACK_CVS];
	FelixShardPositions v;

	shard_read_positions(s, &v);
	if (quorum_acks_on_flush(v.consistency, v.replication_factor))
	{
		/*
		 * The flush that made the records durable moved the mark, unless
		 * a group flush returned before its hook ran: move it here too, so
		 * the writer reads its own records once told they are published.
		 */
		release_flushed(s, generation, end);
	}

	ConditionVariablePrepareToSleep(cv);
	for (;;)
	{
		long		left;

		shard_read_positions(s, &v);
		/* only this leadership's own word acknowledges */
		if (v.acked_generation == generation && v.acked_end >= end)
			break;
		if (v.role != FELIX_ROLE_LEADER || v.generation != generation)
		{
			ConditionVariableCancelSleep();
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_NOT_LEADER),
					 errmsg("stream \"%s\" shard %d: this node no longer leads generation " UINT64_FORMAT ", at which the records were written",
							s->stream_name, s->key.shard, generation),
					 errdetail("The records up to seq " UINT64_FORMAT " are durable on this node but were not acknowledged at generation " UINT64_FORMAT ".",
							   end - 1, generation),
					 errhint("Read the stream on the new leader to see whether the records survived, and publish again if not.")));
		}
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
		{
			ConditionVariableCancelSleep();
			felix_count(FELIX_CTR_QUORUM_TIMEOUTS, 1);
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
					 errmsg("stream \"%s\" shard %d: no quorum within felix.quorum_timeout (%d ms)",
							s->stream_name, s->key.shard, felix_quorum_timeout),
					 errdetail("The records up to seq " UINT64_FORMAT " are durable on the leader and may still reach a majority; they are not acknowledged.",
							   end - 1),
					 errhint("Check felix_replication for followers that are down or halted.")));
		}
		ConditionVariableTimedSleep(cv, left, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}
