/*-------------------------------------------------------------------------
 *
 * shard.h
 *	  Per-shard shared state: where the shard's log ends, what is durable,
 *	  what readers may see, and who may write (role, generation, lease).
 *	  The write path (admission, append, group flush) lives here because it
 *	  is the one place that must see all of those at once.
 *
 * Locking rule:
 *	 - FelixShardRegistry->lock (LWLock) guards the key -> slot hash and slot
 *	   allocation: shared to look up, exclusive to add or free a slot.
 *	 - append_lock (LWLock, exclusive) serialises appends, recovery, trim,
 *	   truncation and phase changes, and guards `log`.
 *	 - the commit gate (commit_holder, written with append_lock held, read
 *	   under mutex) holds a shard's tail for a commit spanning several
 *	   shards, from its append on this shard until every shard's append
 *	   has succeeded (then the batches are published) or one failed (then
 *	   they are cut back).  Everything that takes append_lock to move the
 *	   tail, mirror it or change leadership waits for the gate first
 *	   (shard_lock_tail); gates are taken in slot order, so two commits
 *	   never wait for each other in a cycle.
 *	 - flush_lock (LWLock) is held by the one backend doing a group flush;
 *	   others wait on it with LWLockAcquireOrWait, as XLogFlush does.
 *	 - mutex (spinlock) guards the small fields marked (mutex) so readers
 *	   and flushers can read them without the append lock.  Writers update
 *	   them while also holding append_lock or flush_lock as noted.
 *	 - hwm_cv is broadcast whenever phase, role or generation changes.
 *	   A quorum waiter for the records ending at `end` sleeps on
 *	   ack_cv[end % FELIX_ACK_CVS] instead: those are broadcast when the
 *	   high-water mark passes one of their ends (only those, so a mark
 *	   move wakes the publishers it releases, not every waiter), and all
 *	   of them whenever hwm_cv is.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_SHARD_H
#define FELIX_STORAGE_SHARD_H

#include "postgres.h"
#include "felix.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/log.h"
#include "storage/lwlock.h"
#include "storage/s_lock.h"

/* Condition variables quorum waiters are spread over, by record end. */
#define FELIX_ACK_CVS	32

typedef enum FelixShardPhase
{
	FELIX_SHARD_CLOSED,			/* slot allocated, log not recovered yet */
	FELIX_SHARD_OPEN,			/* recovered, serving */
	FELIX_SHARD_FAILED			/* recovery found corruption: refuses */
} FelixShardPhase;

typedef enum FelixRole
{
	FELIX_ROLE_LEADER,
	FELIX_ROLE_FOLLOWER
} FelixRole;

#define FELIX_SHARD_ERROR_LEN 512
#define FELIX_MAX_REPLICAS		7
#define FELIX_CONNINFO_LEN		256
#define FELIX_REASON_LEN		160

/*
 * What the control plane says about one shard, as applied by the node
 * agent after each heartbeat (shard_apply_assignment).
 */
typedef struct FelixAssignment
{
	uint64		generation;
	char		leader[NAMEDATALEN];	/* "" while unplaced */
	char		leader_conninfo[FELIX_CONNINFO_LEN];
	int			nreplicas;
	char		replicas[FELIX_MAX_REPLICAS][NAMEDATALEN];
	bool		lease_granted;	/* this heartbeat granted/renewed our lease */
	int64		lease_ms;
	int64		sent_at_ns;		/* felix_monotonic_ns() when the heartbeat
								 * carrying the grant was sent */
	char		unplaced_reason[FELIX_REASON_LEN];
} FelixAssignment;

typedef struct FelixShard
{
	/* set when the slot is allocated, under the registry lock; then fixed */
	FelixShardKey key;
	char		stream_name[NAMEDATALEN];
	bool		in_use;

	LWLock		append_lock;
	LWLock		flush_lock;
	slock_t		mutex;

	/* (mutex) phase; written with append_lock held */
	FelixShardPhase phase;
	/* (mutex) leadership: written with append_lock held */
	FelixRole	role;
	uint64		generation;
	int64		lease_expiry_ns;	/* felix_monotonic_ns() after which this
									 * node must not write (epsilon already
									 * taken off); 0: no lease */
	/* (mutex) positions, all exclusive ends */
	uint64		start_seq;		/* copy of log.start_seq */
	uint64		written_end;	/* copy of log.next_seq (append_lock) */
	uint64		written_base;	/* copy of log.active_base (append_lock) */
	uint64		flushed_end;	/* durable on this node (flush_lock) */
	uint64		hwm_end;		/* readers see [start_seq, hwm_end) */
	uint64		total_bytes;	/* copy of log.total_bytes */
	/* (mutex) settings from the stream's definition */
	int64		retention_bytes;
	int64		retention_ms;
	int			consistency;	/* FelixConsistency */
	int			replication_factor;
	/* (mutex) what the control plane last said (written with append_lock) */
	char		leader[NAMEDATALEN];	/* "" = unknown or unplaced */
	char		leader_conninfo[FELIX_CONNINFO_LEN];
	int			nreplicas;
	char		replicas[FELIX_MAX_REPLICAS][NAMEDATALEN];
	char		unplaced_reason[FELIX_REASON_LEN];
	bool		clustered;		/* an assignment has been applied */
	/* (mutex) why the shard is FAILED */
	char		error[FELIX_SHARD_ERROR_LEN];
	/* (mutex; written with append_lock) the commit gate: pgprocno + 1 of
	 * the backend whose appended batches are not published yet, 0: none */
	int			commit_holder;

	ConditionVariable hwm_cv;
	ConditionVariable ack_cv[FELIX_ACK_CVS];

	/* (append_lock) the storage layer's tail bookkeeping */
	FelixLogState log;
} FelixShard;

/* What a caller needs to name and open a shard. */
typedef struct FelixShardSpec
{
	FelixShardKey key;
	const char *stream_name;
	int64		retention_bytes;
	int64		retention_ms;
	int			consistency;	/* FelixConsistency */
	int			replication_factor;
} FelixShardSpec;

/*
 * Find the shard's slot, allocating it and recovering its log on first use
 * after a start.  Errors (ERRCODE_DATA_CORRUPTED) if the shard is FAILED,
 * and with a hint if felix.max_shards slots are taken.
 */
extern FelixShard *shard_acquire(const FelixShardSpec *spec);
/* Slot if allocated, else NULL; never opens anything. */
extern FelixShard *shard_lookup(const FelixShardKey *key);

/*
 * Publish one batch body (built with batch_begin/batch_add/batch_seal_body)
 * holding `count` records: admission check, append under the lock with the
 * leadership re-checked right before the bytes go down, then wait for the
 * group flush and the high-water mark.  Returns the first record's seq;
 * the batch holds [result, result + count).
 */
extern uint64 shard_publish(FelixShard *s, StringInfo batch, uint32 count);

/*
 * The same for n batches appended back to back under one hold of the
 * append lock: they get contiguous seqs and become visible together, or,
 * if appending batch k fails, the ones before it are cut back and none is
 * ever visible.
 */
extern uint64 shard_publish_batches(FelixShard *s, StringInfo *batches,
									const uint32 *counts, int n);

/*
 * A commit over several shards publishes all of its batches or none.
 * Call shard_commit_append for each shard, in shard_slot_index order: it
 * admits, appends the shard's batches and keeps them unpublished behind
 * the shard's commit gate.  Once every shard's append succeeded,
 * shard_commit_publish each part, then shard_commit_wait each (flush and
 * acknowledgement, as a publish waits).  If any append failed,
 * shard_commit_abandon every part that succeeded: its batches are cut back
 * and were never visible.  A backend that exits holding gates abandons
 * them on its way out.
 */
typedef struct FelixCommitPart
{
	struct FelixShard *s;
	uint64		generation;		/* admitted at */
	uint64		base;			/* the first record's seq */
	uint64		end;			/* after the last record */
	bool		gated;			/* appended, not yet published or abandoned */
} FelixCommitPart;

extern void shard_commit_append(FelixShard *s, StringInfo *batches,
								const uint32 *counts, int n, FelixCommitPart *part);
extern void shard_commit_publish(FelixCommitPart *part);
extern void shard_commit_abandon(FelixCommitPart *part);
extern void shard_commit_wait(FelixCommitPart *part);

/*
 * Admission alone (conditions 1-3 of the write rule), raising the error a
 * publish would.  Lets a multi-shard commit find a shard it cannot write
 * before appending to any of them.
 */
extern void shard_admit(FelixShard *s);

/* Snapshot [start_seq, hwm_end): what a reader may see right now. */
extern void shard_visible(FelixShard *s, uint64 *start_seq, uint64 *hwm_end);

/* "stream \"name\" shard N", palloc'd: the prefix of every message. */
extern char *shard_what(FelixShard *s);

/* Directory of the shard's files (MAXPGPATH buffer). */
extern void shard_dir(FelixShard *s, char *buf);

/* Apply retention now; returns segments removed. */
extern int	shard_trim(FelixShard *s);

/* Cut everything after seq; refuses at or below the high-water mark. */
extern void shard_truncate_after(FelixShard *s, uint64 seq);

/* Iterate the slots (for views and the workers): every slot ever used has
 * an index below shard_count_slots(); check in_use under the slot's mutex.
 * A slot taken after the count was read is seen by the next iteration. */
extern int	shard_count_slots(void);
extern FelixShard *shard_slot(int i);

/* A stream's table was dropped and that drop committed: forget its
 * shards' slots and remove its files. */
extern void shard_forget_stream(Oid dboid, Oid relid);

/* How many streams have gone since startup (any database): drops that
 * committed, creations undone at the control plane as they rolled back.  A
 * change tells the node agent its control-plane rows may predate one. */
extern void shard_note_stream_gone(void);
extern uint64 shard_streams_forgotten(void);

/* ---- replication (issue 3) ---- */

/* Index of the slot in the registry: replication keeps parallel arrays. */
extern int	shard_slot_index(FelixShard *s);

/* True if `node` names this node. */
extern bool felix_is_this_node(const char *node);

/*
 * Apply the control plane's word about the shard: open as leader at a new
 * generation (its start recorded in the generation map first), renew the
 * lease, or follow another leader.  Never lowers the generation.
 */
extern void shard_apply_assignment(FelixShard *s, const FelixAssignment *a);

/*
 * Move a quorum shard's high-water mark to hwm_end, if the shard is still
 * led here at `generation` under a lease that has not run out, and it is
 * an advance.  Called only when what the control plane believes of the
 * followers is true of the new mark (report.c).  Wakes the quorum waiters
 * it releases; false if the mark did not move.
 */
extern bool shard_set_hwm(FelixShard *s, uint64 generation, uint64 hwm_end);

/*
 * Follower side: hold the append lock around a check-and-append of shipped
 * batches (s->log may be used while held), then publish the new tail.
 * shard_lock_tail waits for the commit gate, then takes the append lock.
 * shard_after_replicated mirrors the log, marks it flushed (the caller
 * synced it) and moves the hwm to min(leader_hwm_end, flushed).
 */
extern void shard_lock_tail(FelixShard *s);
extern void shard_unlock_tail(FelixShard *s);

/*
 * With the tail held: cut the log back to end before seq `end`, removing
 * what an append that failed (or a commit abandoned) wrote -- never
 * mirrored, so never flushed or visible.  If the cut fails the shard
 * refuses to serve (FAILED) until a restart, and the error goes on.
 */
extern void shard_cut_back(FelixShard *s, uint64 end);
extern void shard_after_replicated(FelixShard *s, uint64 leader_hwm_end);

/* Wake whoever ships this node's shards (set by the ship worker). */
extern void shard_wake_shipper(void);
extern void shard_set_shipper_latch(Latch *latch);

extern Size shard_registry_size(void);
extern void shard_registry_init(void);

#endif							/* FELIX_STORAGE_SHARD_H */
