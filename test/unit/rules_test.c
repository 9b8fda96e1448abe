/*
 * rules_test.c: unit tests of the pure replication rules (rules.c):
 * quorum_mark and replicate_decide, case by case.  Built and run by
 * `make unit` (scripts/test-all runs it as the "unit" suite); prints TAP.
 */
#include "c.h"

#include <stdio.h>

#include "replication/rules.h"

static int	ntests = 0;
static int	nfailed = 0;

static void
check(bool ok, const char *what)
{
	ntests++;
	if (!ok)
		nfailed++;
	printf("%sok %d - %s\n", ok ? "" : "not ", ntests, what);
}

static uint64
mark_of(const uint64 *in, int n, int majority, uint64 flushed, bool *held)
{
	uint64		acks[16];

	memcpy(acks, in, sizeof(uint64) * n);
	return quorum_mark(acks, n, majority, flushed, held);
}

static void
test_quorum_mark(void)
{
	bool		held;

	/* three replicas: the leader and the first follower to answer make it */
	{
		uint64		a[] = {10, 7, 3};

		check(mark_of(a, 3, 2, 10, &held) == 7 && !held,
			  "rf 3: the second largest of {leader 10, 7, 3} is the mark");
	}
	{
		uint64		a[] = {3, 10, 7};

		check(mark_of(a, 3, 2, 10, &held) == 7, "order of the ends does not matter");
	}
	/* the leader's own flush is the last to come */
	{
		uint64		a[] = {5, 9, 9};

		check(mark_of(a, 3, 2, 5, &held) == 5 && held,
			  "two followers at 9, leader durable to 5: the mark waits at 5 for the flush");
	}
	/* a halted follower is not passed in: fewer ends than a majority */
	{
		uint64		a[] = {10};

		check(mark_of(a, 1, 2, 10, &held) == 0 && !held,
			  "one end of a majority of two: no mark");
	}
	/* five replicas need three */
	{
		uint64		a[] = {20, 18, 4, 3, 2};

		check(mark_of(a, 5, 3, 20, &held) == 4, "rf 5: the third largest");
	}
	/* a replica set grown by a move (4 replicas, majority 3) */
	{
		uint64		a[] = {20, 20, 0, 19};

		check(mark_of(a, 4, 3, 20, &held) == 19, "4 replicas: the third largest");
	}
	{
		uint64		a[] = {1};

		check(mark_of(a, 1, 0, 1, &held) == 0, "a majority below one is no majority");
	}
}

static void
test_quorum_mark_joint(void)
{
	bool		held;

	/* no move: one set of three */
	{
		QuorumMember m[] = {{10, true, true}, {7, true, true}, {3, true, true}};

		check(quorum_mark_joint(m, 3, 3, 3, 10, &held) == 7,
			  "no move: the plain majority of three");
	}
	/* {L, F, D} -> {L, F, N}: D (dead, leaving) gives nothing, N joins at 0 */
	{
		QuorumMember m[] = {{10, true, true},	/* leader */
		{9, true, true},		/* F, in both */
		{0, false, true}};		/* N joining */

		check(quorum_mark_joint(m, 3, 3, 3, 10, &held) == 9,
			  "replacing a dead replica: leader and the remaining follower make both majorities");
	}
	/* the old set's majority without the leaving node's help */
	{
		QuorumMember m[] = {{10, true, true},	/* leader */
		{2, true, true},		/* F, behind */
		{9, true, false},		/* D leaving, ahead */
		{8, false, true}};		/* N joining */

		check(quorum_mark_joint(m, 4, 3, 3, 10, &held) == 8,
			  "both sets: old {L 10, F 2, D 9} gives 9, new {L 10, F 2, N 8} gives 8; the mark is 8");
	}
	{
		QuorumMember m[] = {{10, true, true}, {9, false, true}};

		check(quorum_mark_joint(m, 2, 3, 3, 10, &held) == 0,
			  "a majority of the new set alone is not enough");
	}
}

/* A follower at generation 3, its log [0, 10), mark 8, leader known. */
static ReplicateFacts
base_facts(void)
{
	ReplicateFacts f;

	memset(&f, 0, sizeof(f));
	f.op = REPLICATE_SHIP;
	f.generation = 3;
	f.from_seq = 10;
	f.addressed_here = true;
	f.superuser = false;
	f.caller_is_node = true;
	f.sender_is_leader = true;
	f.our_generation = 3;
	f.we_lead = false;
	f.leader_known = true;
	f.start_seq = 0;
	f.tail = 10;
	f.last_generation = 3;
	f.copy_stale = false;
	f.nbatches = 1;
	f.first_generation = 3;
	f.nbelow = 0;
	f.mismatch = -1;
	f.hwm_end = 8;
	return f;
}

static bool
decides(ReplicateFacts f, ReplicateAction action, uint64 seq)
{
	ReplicateDecision d = replicate_decide(&f);

	return d.action == action && d.seq == seq;
}

static void
test_replicate_decide(void)
{
	ReplicateFacts f;

	f = base_facts();
	check(decides(f, REPLICATE_APPEND, 10), "a shipment at our tail is appended");

	f = base_facts();
	f.addressed_here = false;
	check(decides(f, REPLICATE_REFUSE_ADDRESS, 10), "a shipment for another node is refused first");
	f.generation = 1;
	check(decides(f, REPLICATE_REFUSE_ADDRESS, 10), "... before anything else, even fencing");

	f = base_facts();
	f.generation = 2;
	check(decides(f, REPLICATE_ANSWER_FENCED, 10), "an older generation is fenced with our tail");

	f = base_facts();
	f.we_lead = true;
	check(decides(f, REPLICATE_REFUSE_LEADER, 10), "a leader takes nothing of its own generation");
	f.generation = 4;
	check(decides(f, REPLICATE_STEP_DOWN, 10), "a leader shipped a newer generation by a node steps down");
	f.caller_is_node = false;
	check(decides(f, REPLICATE_REFUSE_SENDER, 10), "... but not on the word of a role that is no node's");

	f = base_facts();
	f.generation = 4;
	check(decides(f, REPLICATE_REFUSE_UNKNOWN, 10), "a newer generation whose leader is not known yet waits");
	f = base_facts();
	f.leader_known = false;
	check(decides(f, REPLICATE_REFUSE_UNKNOWN, 10), "no known leader: refused as unknown");
	f = base_facts();
	f.sender_is_leader = false;
	check(decides(f, REPLICATE_REFUSE_SENDER, 10), "a node that is not the leader may not ship");
	f.superuser = true;
	check(decides(f, REPLICATE_APPEND, 10), "a superuser may act for the leader");

	f = base_facts();
	f.from_seq = 12;
	check(decides(f, REPLICATE_ANSWER_GAP, 10), "a shipment past our tail: gap at our tail");

	f = base_facts();
	f.last_generation = 2;
	check(decides(f, REPLICATE_ANSWER_GAP, 10),
		  "a shipment at our tail after a record of another generation: gap, to compare it");
	f.first_generation = 2;
	f.last_generation = 1;
	check(decides(f, REPLICATE_ANSWER_GAP, 10), "... whichever generations they are");
	f.last_generation = 2;
	check(decides(f, REPLICATE_APPEND, 10), "... and after one of the first batch's generation, appended");
	f.last_generation = 1;
	f.nbatches = 0;
	check(decides(f, REPLICATE_APPEND, 10), "an empty shipment appends nothing: no comparison asked");
	f.nbatches = 1;
	f.start_seq = 10;
	check(decides(f, REPLICATE_APPEND, 10), "a copy holding no record has nothing to compare");
	f.start_seq = 0;
	f.nbelow = 1;
	f.from_seq = 9;
	check(decides(f, REPLICATE_APPEND, 10), "a shipment overlapping our log was compared: appended");

	f = base_facts();
	f.from_seq = 9;
	f.nbelow = 1;
	f.mismatch = 0;
	f.mismatch_seq = 9;
	f.droppable = true;
	check(decides(f, REPLICATE_DROP_THEN_GAP, 9),
		  "an earlier leader's unadopted tail above the mark is dropped");
	f.hwm_end = 10;
	check(decides(f, REPLICATE_ANSWER_CONFLICT, 9),
		  "... but never at or below the mark: a conflict (diverged)");
	f.hwm_end = 8;
	f.droppable = false;
	check(decides(f, REPLICATE_ANSWER_CONFLICT, 9),
		  "a difference the generation map cannot justify is a conflict");

	f = base_facts();
	f.copy_stale = true;
	check(decides(f, REPLICATE_ANSWER_STALE, 10),
		  "a copy older than the node's incarnation is not built on");
	f.tail = f.start_seq = 10;
	check(decides(f, REPLICATE_APPEND, 10), "... unless it holds nothing");

	f = base_facts();
	f.op = REPLICATE_BOOTSTRAP;
	f.from_seq = 50;
	check(decides(f, REPLICATE_ANSWER_NEEDS_BOOTSTRAP, 10),
		  "a copy holding records refuses a bootstrap");
	f.start_seq = f.tail = 0;
	check(decides(f, REPLICATE_BEGIN_AT, 50), "an empty copy takes it, beginning at the offer");

	f = base_facts();
	f.op = REPLICATE_REBUILD;
	f.from_seq = 50;
	check(decides(f, REPLICATE_BEGIN_AT, 50), "a rebuild from the known leader begins the copy afresh");
	f.generation = 2;
	check(decides(f, REPLICATE_ANSWER_FENCED, 10), "a superseded leader cannot make us discard anything");
	f = base_facts();
	f.op = REPLICATE_REBUILD;
	f.sender_is_leader = false;
	check(decides(f, REPLICATE_REFUSE_SENDER, 10), "nor can a node that does not lead");
}

static bool
resumes(uint64 tail, uint64 from_seq, uint64 start_seq, GapResume want, uint64 want_cursor)
{
	uint64		cursor;

	return gap_resume(tail, from_seq, start_seq, &cursor) == want && cursor == want_cursor;
}

static void
test_gap_resume(void)
{
	check(resumes(10, 20, 0, GAP_SHIP, 9), "a gap: resume one record below the tail, to compare it");
	check(resumes(10, 10, 0, GAP_SHIP, 9), "a gap at the shipment's start (compare first): the same");
	check(resumes(10, 20, 10, GAP_SHIP, 10),
		  "a tail at our oldest record, the shipment later: ship from the tail, there is nothing to compare");
	check(resumes(10, 10, 10, GAP_BOOTSTRAP_UNCOMPARABLE, 10),
		  "a last record to compare below our oldest: offer a copy");
	check(resumes(5, 20, 10, GAP_BOOTSTRAP_LACKS, 5), "a tail below our oldest record: offer a copy");
	check(resumes(0, 0, 0, GAP_SHIP, 0), "an empty log at an empty leader's start: ship");
}

int
main(void)
{
	test_quorum_mark();
	test_quorum_mark_joint();
	test_replicate_decide();
	test_gap_resume();
	printf("1..%d\n", ntests);
	return nfailed == 0 ? 0 : 1;
}
