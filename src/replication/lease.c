/*-------------------------------------------------------------------------
 *
 * lease.c
 *	  Leadership of a shard on this node.  The control plane grants a
 *	  lease on (shard, generation) and renews it through the heartbeat;
 *	  this file applies what it says (lease_apply_assignment), keeps the
 *	  write rule a leader obeys -- a lease at generation G, this node's
 *	  monotonic clock before its expiry minus felix.lease_epsilon, the
 *	  shard open at exactly G -- at admission (lease_admit) and again right
 *	  before the bytes go down (lease_recheck), and steps down the moment
 *	  this node learns that a newer generation exists (lease_step_down).
 *
 *	  A lease is anchored at the instant the heartbeat carrying the grant
 *	  was sent, which is at or before the control plane's grant time, so
 *	  the round trip comes out of this node's lease and never out of the
 *	  control plane's safety margin.
 *
 * Locking rule: role, generation and lease expiry are written with the
 * shard's tail held (shard_lock_tail) and under its mutex; readers take
 * the mutex.  A change wakes the shard's waiters: writers admitting on
 * tail_cv, quorum waiters on ack_cv (quorum_wake_all).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "control/conninfo.h"
#include "felix.h"
#include "base/metrics.h"
#include "replication/lease.h"
#include "replication/quorum.h"
#include "replication/state.h"

typedef enum Writable
{
	WRITABLE,
	WRITABLE_NOT_YET,			/* lease or assignment pending for this node */
	WRITABLE_ELSEWHERE,			/* another node leads */
	WRITABLE_EXPIRED,			/* our lease ran out */
	WRITABLE_HANDING_OFF		/* the leadership is being handed over */
} Writable;

bool
felix_is_this_node(const char *node)
{
	return node != NULL && strcmp(node, felix_node_name_resolved()) == 0;
}

bool
lease_live_locked(FelixShard *s, uint64 generation)
{
	/* lease_expiry_ns already has felix.lease_epsilon taken off */
	return s->role == FELIX_ROLE_LEADER && s->generation == generation &&
		s->lease_expiry_ns != 0 && felix_monotonic_ns() < s->lease_expiry_ns;
}

/*
 * Conditions 1-3 of the write rule, read once under the spinlock: this node
 * holds a lease for the shard at `expect_generation` (any, when 0), its
 * monotonic clock is before expiry - epsilon, and the shard is open at
 * exactly that generation.
 */
static Writable
lease_writable(FelixShard *s, uint64 expect_generation, uint64 *generation)
{
	FelixShardPhase phase;
	FelixRole	role;
	int64		expiry;
	bool		expired_now = false;
	bool		leader_elsewhere;
	bool		handing_off;

	SpinLockAcquire(&s->mutex);
	phase = s->phase;
	role = s->role;
	*generation = s->generation;
	expiry = s->lease_expiry_ns;
	if (role == FELIX_ROLE_LEADER && expiry != 0 &&
		felix_monotonic_ns() >= expiry)
	{
		/* The lease lapsed: forget it, so the expiry is counted once. */
		s->lease_expiry_ns = expiry = 0;
		expired_now = true;
	}
	leader_elsewhere = s->leader[0] != '\0' && !felix_is_this_node(s->leader);
	handing_off = s->handing_to[0] != '\0';
	SpinLockRelease(&s->mutex);

	if (expired_now)
		felix_count(FELIX_CTR_LEASE_EXPIRIES, 1);
	if (phase == FELIX_SHARD_FAILED)
		shard_check_serving(s);

	if (phase != FELIX_SHARD_OPEN)
		return WRITABLE_NOT_YET;
	if (role == FELIX_ROLE_LEADER && handing_off)
		return WRITABLE_HANDING_OFF;
	if (role == FELIX_ROLE_LEADER && expiry != 0)
		return (expect_generation == 0 || *generation == expect_generation) ?
			WRITABLE : WRITABLE_ELSEWHERE;
	if (role == FELIX_ROLE_LEADER)
		return expired_now ? WRITABLE_EXPIRED : WRITABLE_NOT_YET;
	return leader_elsewhere ? WRITABLE_ELSEWHERE : WRITABLE_NOT_YET;
}

static void
lease_refuse(FelixShard *s, Writable why, uint64 generation)
{
	FelixShardView v;

	shard_read(s, &v);
	if (why == WRITABLE_HANDING_OFF)
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_NOT_LEADER),
				 errmsg("stream \"%s\" shard %d: this node is handing its leadership to node \"%s\"",
						v.stream_name, v.key.shard, v.handing_to),
				 errdetail("A planned transfer (felix_transfer_leadership) admits no new write here."),
				 errhint("Publish on node \"%s\", which leads the shard once the transfer completes.",
						 v.handing_to)));
	if (why == WRITABLE_EXPIRED)
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_LEASE_EXPIRED),
				 errmsg("stream \"%s\" shard %d: this node's lease for generation " UINT64_FORMAT " has expired",
						v.stream_name, v.key.shard, generation),
				 errdetail("The lease was not renewed in time; the control plane may be unreachable."),
				 errhint("Retry the publish; the shard is served again once a lease is granted.")));
	if (v.leader[0] != '\0' && !felix_is_this_node(v.leader))
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_NOT_LEADER),
				 errmsg("stream \"%s\" shard %d is led by node \"%s\", not by this node",
						v.stream_name, v.key.shard, v.leader),
				 errhint("Publish on the leader: node \"%s\" (%s).",
						 v.leader, felix_conninfo_mask(v.leader_conninfo))));
	ereport(ERROR,
			(errcode(FELIX_ERRCODE_NOT_LEADER),
			 errmsg("stream \"%s\" shard %d has no leader with a lease on this node",
					v.stream_name, v.key.shard),
			 v.unplaced_reason[0] ? errdetail("%s", v.unplaced_reason) : 0,
			 errhint("felix_shards shows the shard's leader; retry once a lease is granted.")));
}

uint64
lease_admit(FelixShard *s)
{
	uint64		generation;
	Writable	w = lease_writable(s, 0, &generation);
	TimestampTz deadline;

	if (w == WRITABLE)
		return generation;
	if (w != WRITABLE_NOT_YET)
		lease_refuse(s, w, generation);

	/*
	 * Long enough for a server that just started and runs the duties itself
	 * to be granted its shards again: the duty holder waits out a lease and
	 * margin after taking over, then a heartbeat claims the new generation.
	 */
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   2 * felix_lease_duration + felix_lease_margin +
										   2 * felix_heartbeat_interval);
	ConditionVariablePrepareToSleep(&s->tail_cv);
	for (;;)
	{
		long		left;

		w = lease_writable(s, 0, &generation);
		if (w != WRITABLE_NOT_YET)
			break;
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
			break;
		ConditionVariableTimedSleep(&s->tail_cv, Min(left, felix_heartbeat_interval),
									PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	if (w != WRITABLE)
		lease_refuse(s, w, generation);
	return generation;
}

void
lease_recheck(FelixShard *s, uint64 generation)
{
	uint64		now_generation;
	Writable	w = lease_writable(s, generation, &now_generation);

	/*
	 * Invariant: conditions 1-3 are checked again immediately before the
	 * bytes go down, at the generation admission saw.  Waiting for the tail
	 * can take arbitrarily long (a slow fsync, a paused process, another
	 * commit's gate), and a lease valid at admission may have lapsed by now.
	 * (The error's abort lets go of the tail.)
	 */
	if (w != WRITABLE)
		lease_refuse(s, w, now_generation);

	/*
	 * Invariant: a generation's start is durable in the generation map
	 * before any record of it is written.  Taking the lead wrote it; the
	 * first write of the generation makes it durable, here, with the tail
	 * held -- so a failover that hands this node a thousand shards costs
	 * its heartbeat a thousand writes, not a thousand fsyncs.
	 */
	if (s->genmap_unsynced)
	{
		char		dir[MAXPGPATH];
		char	   *what = shard_what(s);

		shard_dir(s, dir);
		genmap_sync(dir, what);
		s->genmap_unsynced = false;
		pfree(what);
	}
}

/* Role or generation changed: wake everyone who decides on them. */
static void
lease_wake(FelixShard *s)
{
	ConditionVariableBroadcast(&s->tail_cv);
	quorum_wake_all(s);
}

static bool assignment_leads(const FelixAssignment *a);

void
lease_apply_assignment(FelixShard *s, const FelixAssignment *a)
{
	bool		lead;
	bool		gated;
	int64		expiry = 0;
	FelixShardView v;

	/*
	 * This node leads only as the incarnation the generation was granted
	 * to: with a data directory that replaced the granted one it holds
	 * nothing of the shard, and must neither write nor speak for it.
	 */
	lead = assignment_leads(a);

	if (a->lease_granted)
		expiry = a->sent_at_ns + (a->lease_ms - felix_lease_epsilon) * INT64CONST(1000000);

	/*
	 * A commit's staged batches may wait behind the shard's gate for as
	 * long as its other leaders take to stage theirs (api/forward_commit.c):
	 * never wait for them here, where every shard's renewal waits in turn.
	 * A renewal or a word on the replicas needs only the lock; a change of
	 * role or generation waits for the next heartbeat.
	 */
	gated = shard_lock_tail_nowait_gate(s);
	shard_read(s, &v);
	if (v.phase != FELIX_SHARD_OPEN ||
		(gated && a->generation >= v.generation &&
		 (lead ? (a->generation > v.generation || v.role != FELIX_ROLE_LEADER) :
		  (a->generation > v.generation || v.role != FELIX_ROLE_FOLLOWER))))
	{
		shard_unlock_tail(s);
		return;
	}

	SpinLockAcquire(&s->mutex);
	strlcpy(s->leader, a->leader, NAMEDATALEN);
	strlcpy(s->leader_conninfo, a->leader_conninfo, FELIX_CONNINFO_LEN);
	s->nreplicas = Min(a->nreplicas, FELIX_MAX_REPLICAS);
	for (int i = 0; i < s->nreplicas; i++)
		strlcpy(s->replicas[i], a->replicas[i], NAMEDATALEN);
	strlcpy(s->joining, a->joining, NAMEDATALEN);
	strlcpy(s->leaving, a->leaving, NAMEDATALEN);
	strlcpy(s->unplaced_reason, a->unplaced_reason, FELIX_REASON_LEN);
	s->clustered = true;
	/* a hand-off ends when the control plane moves the shard on */
	if (a->generation > v.generation)
		s->handing_to[0] = '\0';
	SpinLockRelease(&s->mutex);

	/* a replica move this node led has completed */
	if (v.role == FELIX_ROLE_LEADER && v.joining[0] != '\0' && a->joining[0] == '\0' &&
		a->generation == v.generation)
		felix_count(FELIX_CTR_PLANNED_MOVES, 1);

	if (a->generation < v.generation)
	{
		/* Stale word from the control plane: never lower the generation. */
	}
	else if (lead && (a->generation > v.generation || v.role != FELIX_ROLE_LEADER))
	{
		char		dir[MAXPGPATH];
		char	   *what = shard_what(s);

		/*
		 * Taking the shard at a new generation.  Its start is recorded in
		 * the generation map before any write of it can exist: with the
		 * tail held, the tail is exactly where the generation begins.  It
		 * is made durable before the first write (lease_recheck).
		 */
		shard_dir(s, dir);
		genmap_note(dir, what, a->generation, s->log.next_seq, false);
		s->genmap_unsynced = true;
		pfree(what);

		SpinLockAcquire(&s->mutex);
		s->role = FELIX_ROLE_LEADER;
		s->generation = a->generation;
		s->lease_expiry_ns = expiry;
		SpinLockRelease(&s->mutex);
		shard_note_changed();
		quorum_on_lead(s);
		if (a->generation > 1 && a->generation > v.generation)
			felix_count(FELIX_CTR_PROMOTIONS, 1);
	}
	else if (lead)
	{
		/*
		 * Renewal at the same generation, anchored at the heartbeat's send
		 * -- but not while the lease is being handed over, nor by a grant
		 * sent before this node gave the lease up for a transfer: the
		 * control plane may already have granted the next generation.
		 */
		if (a->lease_granted)
		{
			SpinLockAcquire(&s->mutex);
			if (expiry > s->lease_expiry_ns && s->handing_to[0] == '\0' &&
				a->sent_at_ns > s->lease_released_ns)
				s->lease_expiry_ns = expiry;
			SpinLockRelease(&s->mutex);
		}
	}
	else
	{
		SpinLockAcquire(&s->mutex);
		s->role = FELIX_ROLE_FOLLOWER;
		s->generation = a->generation;
		s->lease_expiry_ns = 0;
		SpinLockRelease(&s->mutex);
		shard_note_changed();
	}
	shard_unlock_tail(s);
	lease_wake(s);
	if (lead && v.replication_factor > 1)
		repl_ship_due(shard_slot_index(s));
}

/* Does a give this node, at this incarnation, the lead? */
static bool
assignment_leads_as(const FelixAssignment *a, const char *incarnation)
{
	return a->leader[0] != '\0' && felix_is_this_node(a->leader) &&
		strcmp(a->leader_incarnation, incarnation) == 0;
}

/* Does a give this node the lead (as the incarnation it was granted to)? */
static bool
assignment_leads(const FelixAssignment *a)
{
	char		incarnation[FELIX_INCARNATION_LEN];

	felix_incarnation(incarnation, NULL);
	return assignment_leads_as(a, incarnation);
}

bool
lease_assignment_takes_lead(FelixShard *s, const FelixAssignment *a)
{
	FelixShardView v;

	if (!assignment_leads(a))
		return false;
	shard_read(s, &v);
	return v.phase == FELIX_SHARD_OPEN && a->generation >= v.generation &&
		(a->generation > v.generation || v.role != FELIX_ROLE_LEADER);
}

bool
lease_reassert(int slot, const FelixShardKey *key, const FelixAssignment *a,
			   const char *incarnation)
{
	FelixShard *s = shard_slot(slot);
	bool		lead = assignment_leads_as(a, incarnation);
	int64		expiry = a->sent_at_ns + (a->lease_ms - felix_lease_epsilon) * INT64CONST(1000000);
	/* the clock only for a lease it may renew (a third of the rows or so) */
	int64		now = lead && a->lease_granted ? felix_monotonic_ns() : 0;
	bool		current;
	bool		revived = false;

	/*
	 * Under the shard's mutex alone, for every shard at every heartbeat:
	 * phase, role and generation are written under it (with the tail held
	 * as well), so they are read here as one state; and the renewal is
	 * lease_apply_assignment's, under the same mutex, with the same checks
	 * against a hand-off begun or a lease given up since the grant.
	 */
	SpinLockAcquire(&s->mutex);
	current = s->in_use && memcmp(&s->key, key, sizeof(FelixShardKey)) == 0 &&
		s->phase == FELIX_SHARD_OPEN && s->generation == a->generation &&
		s->role == (lead ? FELIX_ROLE_LEADER : FELIX_ROLE_FOLLOWER);
	if (current && lead && a->lease_granted && expiry > s->lease_expiry_ns &&
		s->handing_to[0] == '\0' && a->sent_at_ns > s->lease_released_ns)
	{
		revived = s->lease_expiry_ns <= now;
		s->lease_expiry_ns = expiry;
	}
	SpinLockRelease(&s->mutex);
	/* a lease that had lapsed: whoever waits for one may go on */
	if (revived)
		lease_wake(s);
	return current;
}

uint64
lease_hand_off_begin(FelixShard *s, const char *target, uint64 *written_end)
{
	uint64		generation;
	Writable	w;

	shard_lock_tail(s);
	w = lease_writable(s, 0, &generation);
	if (w != WRITABLE)
	{
		shard_unlock_tail(s);
		lease_refuse(s, w, generation);
	}
	/* with the tail held no append is half-way: the written end is final */
	SpinLockAcquire(&s->mutex);
	strlcpy(s->handing_to, target, NAMEDATALEN);
	*written_end = s->written_end;
	SpinLockRelease(&s->mutex);
	shard_unlock_tail(s);
	return generation;
}

void
lease_hand_off_release(FelixShard *s, uint64 generation)
{
	shard_lock_tail(s);
	SpinLockAcquire(&s->mutex);
	if (s->role == FELIX_ROLE_LEADER && s->generation == generation)
	{
		s->lease_expiry_ns = 0;
		s->lease_released_ns = felix_monotonic_ns();
	}
	SpinLockRelease(&s->mutex);
	shard_unlock_tail(s);
	lease_wake(s);
}

void
lease_hand_off_cancel(FelixShard *s)
{
	shard_lock_tail(s);
	SpinLockAcquire(&s->mutex);
	s->handing_to[0] = '\0';
	SpinLockRelease(&s->mutex);
	shard_unlock_tail(s);
	lease_wake(s);
}

bool
lease_step_down_locked(FelixShard *s, uint64 newer_generation, const char *why)
{
	bool		was_leading;
	uint64		generation;

	SpinLockAcquire(&s->mutex);
	generation = s->generation;
	was_leading = s->role == FELIX_ROLE_LEADER && newer_generation > s->generation;
	if (was_leading)
	{
		s->role = FELIX_ROLE_FOLLOWER;
		s->lease_expiry_ns = 0;
		s->leader[0] = '\0';
	}
	SpinLockRelease(&s->mutex);
	if (!was_leading)
		return false;
	shard_note_changed();
	felix_count(FELIX_CTR_STEP_DOWNS, 1);
	ereport(LOG,
			(errmsg("stream \"%s\" shard %d: this node stops leading generation " UINT64_FORMAT ": %s",
					s->stream_name, s->key.shard, generation, why),
			 errdetail("Generation " UINT64_FORMAT " exists; writes waiting to be acknowledged at generation " UINT64_FORMAT " fail.",
					   newer_generation, generation)));
	lease_wake(s);
	return true;
}

bool
lease_step_down(FelixShard *s, uint64 newer_generation, const char *why)
{
	bool		was_leading;

	/*
	 * Stepping down moves no tail: it need not wait for a commit's staged
	 * part (whose acknowledgement then fails, as any waiter's does), and
	 * the ship worker calling it must not wait on a gate held across a
	 * round trip.
	 */
	(void) shard_lock_tail_nowait_gate(s);
	was_leading = lease_step_down_locked(s, newer_generation, why);
	shard_unlock_tail(s);
	return was_leading;
}
