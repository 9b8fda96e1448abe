/*-------------------------------------------------------------------------
 *
 * rules.h
 *	  The decisions of replication that depend on nothing but their inputs:
 *	  the quorum mark of a shard (quorum.c and report.c move it), the
 *	  follower's append rule (append.c applies it) and where the leader
 *	  resumes after a gap (ship.c).  Pure functions over plain values, so
 *	  that test/unit can check them case by case without a server.
 *
 * Locking rule: none; callers gather the inputs under their own locks.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_RULES_H
#define FELIX_REPLICATION_RULES_H

#include "c.h"

/*
 * The quorum mark of a shard: the majority-th largest of the leader's
 * durable end and each counted follower's acknowledged end (acks holds
 * them, the leader's included, in any order; it is sorted here), but
 * never past the leader's own durable end: *held_by_flush says when the
 * leader's flush is the last to come.  0 when fewer than `majority` ends
 * are given.
 */
extern uint64 quorum_mark(uint64 *acks, int nacks, int majority,
						  uint64 flushed_end, bool *held_by_flush);

/*
 * The quorum mark while a replica is being moved (or not): each member
 * that counts -- the leader, and every follower not halted -- gives its
 * end and the configurations it belongs to; the old set is the replica
 * set without the joining node, the new one without the leaving node
 * (with no move both are the whole set, and the sizes equal).  A write is
 * acknowledged once a majority of each set holds it, so the mark is the
 * lesser of the two sets' marks (quorum_mark over each, majority of its
 * size).
 */
typedef struct QuorumMember
{
	uint64		end;
	bool		in_old;
	bool		in_new;
} QuorumMember;

extern uint64 quorum_mark_joint(const QuorumMember *members, int n,
								int size_old, int size_new,
								uint64 flushed_end, bool *held_by_flush);

/* What a leader asks of a follower in one felix.replicate call. */
typedef enum ReplicateOp
{
	REPLICATE_SHIP,				/* store these batches */
	REPLICATE_BOOTSTRAP,		/* my log begins at from_seq: an empty copy
								 * may begin there too */
	REPLICATE_REBUILD			/* discard your copy; begin at from_seq */
} ReplicateOp;

/* Everything the follower's rule looks at, gathered with the tail held. */
typedef struct ReplicateFacts
{
	/* the request */
	ReplicateOp op;
	uint64		generation;		/* the sender's */
	uint64		from_seq;
	bool		addressed_here; /* it names this node and its incarnation */
	bool		superuser;		/* the caller may act for any node */
	bool		caller_is_node; /* the caller is a node (its felix_node_<name>
								 * role, or a superuser) */
	bool		sender_is_leader;	/* the caller logs in as the role of the
									 * node this one knows to lead */
	/* this node's copy of the shard */
	uint64		our_generation;
	bool		we_lead;
	bool		leader_known;	/* the control plane named a leader */
	uint64		start_seq;
	uint64		tail;			/* next_seq */
	uint64		last_generation;	/* of our last record (tail - 1) */
	bool		copy_stale;		/* it predates this node's incarnation */
	/* the shipment against the copy (REPLICATE_SHIP) */
	int			nbatches;
	uint64		first_generation;	/* of the shipment's first batch */
	int			nbelow;			/* batches wholly below the tail */
	int			mismatch;		/* first batch (< nbatches) whose bytes
								 * differ from ours, or that straddles our
								 * tail; -1: none */
	uint64		mismatch_seq;	/* that batch's first seq */
	bool		droppable;		/* the generation map says our records
								 * from mismatch_seq on are an earlier
								 * leader's unadopted tail */
	uint64		hwm_end;		/* our mark: nothing below it is ever cut */
} ReplicateFacts;

typedef enum ReplicateAction
{
	REPLICATE_REFUSE_ADDRESS,	/* error: meant for another node */
	REPLICATE_ANSWER_FENCED,	/* ('fenced', tail): the sender was deposed */
	REPLICATE_STEP_DOWN,		/* we lead an older generation and a node
								 * says so: step down at once, then as
								 * ..._UNKNOWN */
	REPLICATE_REFUSE_LEADER,	/* error: we lead this very generation */
	REPLICATE_REFUSE_UNKNOWN,	/* error 55F04: we have not learnt who leads
								 * this generation (the sender retries) */
	REPLICATE_REFUSE_SENDER,	/* error: the caller is not that leader */
	REPLICATE_ANSWER_GAP,		/* ('gap', tail): resend from one record
								 * below our tail */
	REPLICATE_ANSWER_CONFLICT,	/* ('conflict', seq): the copy diverged
								 * where the rule cannot justify it */
	REPLICATE_DROP_THEN_GAP,	/* cut our records from seq on (above the
								 * mark), answer ('gap', seq) */
	REPLICATE_APPEND,			/* append batches [nbelow, nbatches) */
	REPLICATE_ANSWER_STALE,		/* ('needs_bootstrap', tail): our copy
								 * predates our incarnation; only a rebuild
								 * may replace it */
	REPLICATE_BEGIN_AT,			/* (bootstrap, rebuild) discard the copy and
								 * begin it at from_seq: ('bootstrapped' or
								 * 'rebuilt', from_seq) */
	REPLICATE_ANSWER_NEEDS_BOOTSTRAP	/* (bootstrap) ('needs_bootstrap',
										 * tail): we hold records of our own */
} ReplicateAction;

typedef struct ReplicateDecision
{
	ReplicateAction action;
	uint64		seq;			/* the position answered or cut at */
} ReplicateDecision;

/* The follower's rule; see append.c for the reasons of each step. */
extern ReplicateDecision replicate_decide(const ReplicateFacts *f);

/*
 * The leader's side of a gap: a follower answered ('gap', tail) to a
 * shipment from from_seq; the leader's log begins at start_seq.
 */
typedef enum GapResume
{
	GAP_SHIP,					/* ship again from the batch holding the
								 * cursor */
	GAP_BOOTSTRAP_LACKS,		/* what it lacks is gone from here too */
	GAP_BOOTSTRAP_UNCOMPARABLE	/* its last record, which it asked to have
								 * compared, is older than all we hold */
} GapResume;

extern GapResume gap_resume(uint64 tail, uint64 from_seq, uint64 start_seq,
							uint64 *cursor);

#endif							/* FELIX_REPLICATION_RULES_H */
