/*-------------------------------------------------------------------------
 *
 * rules.c
 *	  Pure decisions of replication (see rules.h): the quorum mark, the
 *	  follower's append rule, and where the leader resumes after a gap.
 *	  Nothing here reads shared memory, files or the clock, and nothing
 *	  raises: callers gather the facts and apply the decision.
 *	  test/unit/rules_test.c exercises all three.
 *
 * Locking rule: none.
 *
 *-------------------------------------------------------------------------
 */
#include "c.h"

#include "replication/rules.h"

static int
cmp_desc(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? 1 : (x > y ? -1 : 0);
}

uint64
quorum_mark(uint64 *acks, int nacks, int majority, uint64 flushed_end,
			bool *held_by_flush)
{
	uint64		mark;

	*held_by_flush = false;
	if (majority < 1 || nacks < majority)
		return 0;
	qsort(acks, nacks, sizeof(uint64), cmp_desc);
	mark = acks[majority - 1];
	if (mark > flushed_end)
	{
		/* the leader's own flush is the last to come: wait for it */
		*held_by_flush = true;
		mark = flushed_end;
	}
	return mark;
}

uint64
quorum_mark_joint(const QuorumMember *members, int n, int size_old, int size_new,
				  uint64 flushed_end, bool *held_by_flush)
{
	uint64		ends[2][64];
	int			count[2] = {0, 0};
	uint64		mark[2];
	bool		held[2];

	for (int i = 0; i < n && i < 64; i++)
	{
		if (members[i].in_old)
			ends[0][count[0]++] = members[i].end;
		if (members[i].in_new)
			ends[1][count[1]++] = members[i].end;
	}
	mark[0] = quorum_mark(ends[0], count[0], size_old / 2 + 1, flushed_end, &held[0]);
	mark[1] = quorum_mark(ends[1], count[1], size_new / 2 + 1, flushed_end, &held[1]);
	*held_by_flush = (mark[0] <= mark[1] ? held[0] : held[1]);
	return Min(mark[0], mark[1]);
}

static ReplicateDecision
decision(ReplicateAction action, uint64 seq)
{
	ReplicateDecision d;

	d.action = action;
	d.seq = seq;
	return d;
}

/*
 * The follower's rule, in the order it is checked.  Each step assumes
 * the ones before it passed.
 */
ReplicateDecision
replicate_decide(const ReplicateFacts *f)
{
	/* 1. Meant for another node (a conninfo pointing at the wrong server,
	 * or a copy of this node's data directory): nothing here may count as
	 * that node's copy. */
	if (!f->addressed_here)
		return decision(REPLICATE_REFUSE_ADDRESS, f->tail);

	/* 2. A superseded leader can make us store or discard nothing. */
	if (f->generation < f->our_generation)
		return decision(REPLICATE_ANSWER_FENCED, f->tail);

	/* 3. We lead.  A node ships a newer generation, so we were deposed:
	 * step down before anything else.  The same generation: two nodes
	 * believe they lead it, and nothing of the sender's may land here. */
	if (f->we_lead)
	{
		if (f->generation == f->our_generation)
			return decision(REPLICATE_REFUSE_LEADER, f->tail);
		/* only a node's word deposes (any member of the group could send) */
		return decision(f->caller_is_node ? REPLICATE_STEP_DOWN : REPLICATE_REFUSE_SENDER,
						f->tail);
	}

	/* 4. Only the leader we know for the generation may send.  A newer
	 * generation's leader is not known until the control plane says. */
	if (!f->superuser)
	{
		if (f->generation > f->our_generation || !f->leader_known)
			return decision(REPLICATE_REFUSE_UNKNOWN, f->tail);
		if (!f->sender_is_leader)
			return decision(REPLICATE_REFUSE_SENDER, f->tail);
	}

	switch (f->op)
	{
		case REPLICATE_REBUILD:
			/* fenced like a store: only this generation's leader gets here */
			return decision(REPLICATE_BEGIN_AT, f->from_seq);

		case REPLICATE_BOOTSTRAP:
			/* a log placed over records of our own would hide a hole */
			if (f->tail > f->start_seq)
				return decision(REPLICATE_ANSWER_NEEDS_BOOTSTRAP, f->tail);
			return decision(REPLICATE_BEGIN_AT, f->from_seq);

		case REPLICATE_SHIP:
			break;
	}

	/* 5. A copy older than this node's incarnation is not trusted. */
	if (f->copy_stale && f->tail > f->start_seq)
		return decision(REPLICATE_ANSWER_STALE, f->tail);

	/* 6. We lack records before the shipment: the leader rewinds. */
	if (f->from_seq > f->tail)
		return decision(REPLICATE_ANSWER_GAP, f->tail);

	/* 7. The overlap disagrees.  Our records from there on may go only if
	 * the generation map says they are an earlier leader's proposals and
	 * all of them lie above our mark; anything else halts. */
	if (f->mismatch >= 0)
	{
		if (f->droppable && f->mismatch_seq >= f->hwm_end)
			return decision(REPLICATE_DROP_THEN_GAP, f->mismatch_seq);
		return decision(REPLICATE_ANSWER_CONFLICT, f->mismatch_seq);
	}

	/* 8. Nothing of the shipment overlaps our log: it begins exactly at
	 * our tail, so nothing was compared.  A record of generation G exists
	 * only as G's one leader wrote it, and whoever holds it holds that
	 * leader's log below it.  So when our last record is of the generation
	 * of the shipment's first batch, that leader wrote the two one after
	 * the other, and our log below the tail is the sender's (Raft's log
	 * matching).  Of another generation, our last record may be an earlier
	 * leader's proposal that the sender's log does not hold: answer with a
	 * gap at our tail, and the leader resends from the batch holding our
	 * last record, to be compared (step 7). */
	if (f->nbatches > 0 && f->nbelow == 0 &&
		f->from_seq == f->tail && f->tail > f->start_seq &&
		f->first_generation != f->last_generation)
		return decision(REPLICATE_ANSWER_GAP, f->tail);

	/* 9. Append the rest. */
	return decision(REPLICATE_APPEND, f->tail);
}

/*
 * Resume one record below the follower's tail, so that the next shipment
 * overlaps its last record and the two are compared (prevLogIndex, in
 * Raft's terms).  Resuming at the tail itself took that record on trust:
 * an old leader's unadopted record there, from before generations it
 * missed, stayed in its log below the mark and was served as
 * acknowledged (the fault harness found it: seed 2005 of the long
 * profile).  A tail below our oldest record, or a last record the
 * follower asked to have compared (its gap is at the very start of the
 * shipment, step 8 of replicate_decide) that lies below it, cannot be
 * shipped to: the leader offers a copy of its log as it is.
 */
GapResume
gap_resume(uint64 tail, uint64 from_seq, uint64 start_seq, uint64 *cursor)
{
	*cursor = tail > start_seq ? tail - 1 : tail;
	if (tail < start_seq)
		return GAP_BOOTSTRAP_LACKS;
	if (tail == from_seq && tail == start_seq && tail > 0)
		return GAP_BOOTSTRAP_UNCOMPARABLE;
	return GAP_SHIP;
}
