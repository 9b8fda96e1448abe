/*-------------------------------------------------------------------------
 *
 * shard.h
 *	  A shard slot in shared memory, and what the storage layer does with
 *	  it: open (recover) the shard's log, append at its tail, flush (one
 *	  fdatasync serving a group of writers), bound what readers see (the
 *	  high-water mark, kept durable), trim, truncate, forget.  Storage
 *	  decides nothing about who may write or when a write is acknowledged:
 *	  leases and roles are replication/lease.c's, acknowledgement
 *	  replication/quorum.c's, and the write path that strings them together
 *	  replication/leader.c's.  Storage calls none of them; it tells
 *	  replication what happened through one notify hook.
 *
 *	  The slot carries every group's fields, each written only by the
 *	  module that owns it (marked below); everyone reads them through one
 *	  snapshot, shard_read().
 *
 * Locking rule:
 *	 - FelixShardRegistry->lock (LWLock) guards the key -> slot hash and slot
 *	   allocation: shared to look up, exclusive to add or free a slot.
 *	 - The tail: append_lock (LWLock, exclusive) behind the commit gate
 *	   (shard_lock_tail).  It serialises appends, recovery, trim,
 *	   truncation and changes of phase, role or generation, and guards
 *	   `log`.  The commit gate (commit_holder, written with append_lock
 *	   held, read under mutex) holds a shard's tail for a commit spanning
 *	   several shards, from its append on this shard until every shard's
 *	   append has succeeded (then the batches are published) or one failed
 *	   (then they are cut back); gates are taken in slot order, so two
 *	   commits never wait for each other in a cycle.
 *	 - flush_lock (LWLock) is held by the one backend doing a group flush;
 *	   others wait on it with LWLockAcquireOrWait, as XLogFlush does.
 *	 - mark_lock (LWLock, exclusive) guards the durable mark file and
 *	   hwm_persisted.  The mark is made durable without the tail, so no
 *	   append waits for that fdatasync; a path holding both (divergence,
 *	   discard, open, truncation) takes the tail first.
 *	 - mutex (spinlock) guards the fields marked (mutex), so readers and
 *	   flushers see them without the tail.
 *	 - tail_cv is broadcast whenever the phase, role or generation changes
 *	   or a commit gate is released; quorum waiters sleep on ack_cv
 *	   (quorum.h).
 *	 No path takes two shards' LWLocks, and the tail is never held while
 *	 waiting for a flush.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_SHARD_H
#define FELIX_STORAGE_SHARD_H

#include "postgres.h"

#include "lib/stringinfo.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/s_lock.h"

#include "felix.h"
#include "storage/log.h"

/* Condition variables quorum waiters are spread over, by record end. */
#define FELIX_ACK_CVS	32

typedef enum FelixShardPhase
{
	FELIX_SHARD_CLOSED,			/* slot allocated, log not recovered yet */
	FELIX_SHARD_OPEN,			/* recovered, serving */
	FELIX_SHARD_FAILED			/* damaged: refuses to serve */
} FelixShardPhase;

typedef enum FelixRole
{
	FELIX_ROLE_LEADER,
	FELIX_ROLE_FOLLOWER
} FelixRole;

#define FELIX_SHARD_ERROR_LEN 512
#define FELIX_MAX_REPLICAS		7
#define FELIX_CONNINFO_LEN		256
#define FELIX_REASON_LEN		400

typedef struct FelixShard
{
	/* set when the slot is allocated, under the registry lock; then fixed */
	FelixShardKey key;
	char		stream_name[NAMEDATALEN];
	bool		in_use;

	LWLock		append_lock;
	LWLock		flush_lock;
	LWLock		mark_lock;
	slock_t		mutex;
	ConditionVariable tail_cv;

	/* ---- storage (storage/shard.c) ---- */
	/* (mutex; written with the tail held) */
	FelixShardPhase phase;
	/* (mutex) positions, all exclusive ends */
	uint64		start_seq;		/* copy of log.start_seq */
	uint64		written_end;	/* copy of log.next_seq (tail) */
	uint64		written_base;	/* copy of log.active_base (tail) */
	uint64		last_generation;	/* copy of log.last_generation: of the
									 * record before written_end (tail) */
	/*
	 * (mutex; written with the tail held) which beginning of this log the
	 * slot holds: a number from a counter of the server start, taken anew
	 * each time the log is opened from its files or begun again empty
	 * (shard_begin_at_locked).  While it stays the same, this start of the
	 * server has lost nothing the log held: the control plane counts a
	 * copy whose epoch and boot are those it recorded when a generation
	 * was taken as holding whatever it stored since (cp_duty.c).
	 */
	uint64		copy_epoch;
	/* (mutex; written with the tail held) how many epochs the slot's log
	 * had in this server start: 1 while its first beginning lasts */
	uint32		copy_beginnings;
	uint64		flushed_end;	/* durable on this node (flush_lock) */
	uint64		hwm_end;		/* readers see [start_seq, hwm_end) */
	uint64		total_bytes;	/* copy of log.total_bytes */
	int64		retention_bytes;	/* the stream's retention */
	int64		retention_ms;
	/* (mutex; written with the tail held) the commit gate: pgprocno + 1
	 * of the backend whose appended batches are not published yet */
	int			commit_holder;
	/* (mutex) why the shard is FAILED */
	char		error[FELIX_SHARD_ERROR_LEN];
	/* (mutex; written with the tail held) the copy was made under an
	 * older incarnation of this node (incarnation.h) */
	bool		copy_stale;
	/* (mutex) the leader's log differs from this copy from here on:
	 * readers see nothing at or after it; PG_UINT64_MAX when none */
	uint64		diverged_at;
	/* (mark_lock) the high-water mark last made durable
	 * (shard_persist_hwm) */
	uint64		hwm_persisted;
	/* (mutex; written with the tail held) where the log ended when the
	 * shard was opened from its files, and below which of those records
	 * every one has been checked as a value since (shard_unchecked) */
	uint64		opened_end;
	uint64		checked_end;
	/* (tail) the storage layer's tail bookkeeping */
	FelixLogState log;

	/* ---- leadership (replication/lease.c) ---- */
	/* (mutex; written with the tail held) */
	FelixRole	role;
	uint64		generation;
	int64		lease_expiry_ns;	/* felix_monotonic_ns() after which this
									 * node must not write (epsilon already
									 * taken off); 0: no lease */
	/* (tail) the generation map's entry for the generation this node took
	 * the lead at is written, not yet durable (lease_recheck syncs it) */
	bool		genmap_unsynced;
	/* (mutex) the stream's replication settings */
	int			consistency;	/* FelixConsistency */
	int			replication_factor;
	/* (mutex) what the control plane last said */
	char		leader[NAMEDATALEN];	/* "" = unknown or unplaced */
	char		leader_conninfo[FELIX_CONNINFO_LEN];
	int			nreplicas;
	char		replicas[FELIX_MAX_REPLICAS][NAMEDATALEN];
	char		joining[NAMEDATALEN];	/* a replica move in progress: who joins */
	char		leaving[NAMEDATALEN];	/* ... and who leaves ("" when none) */
	char		unplaced_reason[FELIX_REASON_LEN];
	bool		clustered;		/* an assignment has been applied */
	/* (mutex; written with the tail held) a planned transfer: admit nothing,
	 * the leadership goes to this node ("" when none); and when this node
	 * last gave its lease up for one (no grant sent before renews it) */
	char		handing_to[NAMEDATALEN];
	int64		lease_released_ns;

	/* ---- acknowledgement (replication/quorum.c) ---- */
	/* (mutex) how far this node, leading at acked_generation, has
	 * acknowledged: a waiter succeeds only on its own generation's word */
	uint64		acked_generation;
	uint64		acked_end;
	ConditionVariable ack_cv[FELIX_ACK_CVS];
} FelixShard;

/* The (mutex) fields of a slot, copied at one instant (shard_read). */
typedef struct FelixShardView
{
	FelixShardKey key;
	char		stream_name[NAMEDATALEN];
	bool		in_use;
	FelixShardPhase phase;
	uint64		start_seq;
	uint64		written_end;
	uint64		written_base;
	uint64		flushed_end;
	uint64		hwm_end;
	uint64		total_bytes;
	int64		retention_bytes;
	int64		retention_ms;
	FelixRole	role;
	uint64		generation;
	int64		lease_expiry_ns;
	int			consistency;
	int			replication_factor;
	char		leader[NAMEDATALEN];
	char		leader_conninfo[FELIX_CONNINFO_LEN];
	int			nreplicas;
	char		replicas[FELIX_MAX_REPLICAS][NAMEDATALEN];
	char		joining[NAMEDATALEN];
	char		leaving[NAMEDATALEN];
	char		unplaced_reason[FELIX_REASON_LEN];
	bool		clustered;
	char		handing_to[NAMEDATALEN];
	uint64		acked_generation;
	uint64		acked_end;
	char		error[FELIX_SHARD_ERROR_LEN];
	bool		copy_stale;
	uint64		diverged_at;
} FelixShardView;

/*
 * The few (mutex) fields every write, acknowledgement and shipment looks
 * at, copied at one instant (shard_read_positions): the hot paths take
 * this instead of the whole view, so that a busy shard's spinlock is held
 * for a small copy.
 */
typedef struct FelixShardPositions
{
	FelixShardKey key;
	bool		in_use;
	FelixShardPhase phase;
	uint64		start_seq;
	uint64		written_end;
	uint64		last_generation;
	uint64		copy_epoch;
	bool		copy_first;		/* copy_beginnings == 1 */
	uint64		flushed_end;
	uint64		hwm_end;
	uint64		total_bytes;
	uint64		diverged_at;
	FelixRole	role;
	uint64		generation;
	int64		lease_expiry_ns;
	int			consistency;
	int			replication_factor;
	int			nreplicas;
	uint64		acked_generation;
	uint64		acked_end;
	bool		copy_stale;
	char		leader[NAMEDATALEN];
	char		joining[NAMEDATALEN];
	char		leaving[NAMEDATALEN];
} FelixShardPositions;

/*
 * Fewer still: what a copy's log holds, for the log ends every heartbeat
 * gives (shard_read_ends).  Read for every copy at every beat, so it
 * touches only the first lines of the slot.
 */
typedef struct FelixShardEnds
{
	FelixShardKey key;
	bool		in_use;
	FelixShardPhase phase;
	uint64		written_end;
	uint64		flushed_end;
	uint64		last_generation;
	uint64		copy_epoch;
	bool		copy_first;		/* copy_beginnings == 1 */
} FelixShardEnds;

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

/* ---- slots ---- */

/*
 * Find the shard's slot, allocating it and recovering its log on first use
 * after a start.  Errors (ERRCODE_DATA_CORRUPTED) if the shard is FAILED,
 * and with a hint if felix.max_shards slots are taken.
 */
extern FelixShard *shard_acquire(const FelixShardSpec *spec);
/* Slot if allocated, else NULL; never opens anything. */
extern FelixShard *shard_lookup(const FelixShardKey *key);

/* Copy the slot's (mutex) fields at one instant: all of them, the
 * positions only, or the log's ends only. */
extern void shard_read(FelixShard *s, FelixShardView *out);
extern void shard_read_positions(FelixShard *s, FelixShardPositions *out);
extern void shard_read_ends(FelixShard *s, FelixShardEnds *out);

/* Iterate the slots (for views and the workers): every slot ever used has
 * an index below shard_count_slots(); check in_use in a shard_read.  A slot
 * taken after the count was read is seen by the next iteration. */
extern int	shard_count_slots(void);
extern FelixShard *shard_slot(int i);
/* Index of the slot in the registry: replication keeps parallel arrays. */
extern int	shard_slot_index(FelixShard *s);

/* "stream \"name\" shard N", palloc'd: the prefix of every message. */
extern char *shard_what(FelixShard *s);
/* Directory of the shard's files (MAXPGPATH buffer). */
extern void shard_dir(FelixShard *s, char *buf);

/* Error (ERRCODE_DATA_CORRUPTED, naming the damage) if the shard is FAILED. */
extern void shard_check_serving(FelixShard *s);

/* ---- the tail ---- */

/* Take / release the tail: the append lock, once no other backend's
 * commit gate holds it. */
extern void shard_lock_tail(FelixShard *s);
/* The append lock alone, without waiting for another backend's gate;
 * true if one holds it (its staged batches sit at the tail: nothing that
 * moves the tail or the leadership may be done until it is released). */
extern bool shard_lock_tail_nowait_gate(FelixShard *s);
extern void shard_lock_tail_open(FelixShard *s);
extern void shard_unlock_tail(FelixShard *s);
/* After an error: let go of the tail if this backend still holds it. */
extern void shard_unlock_tail_if_held(FelixShard *s);

/*
 * With the tail held: append n finished batches, stamped with their seqs,
 * `generation` and now (or, restoring records, with stamps[i]), at the
 * end of the log.  With at >= 0 (a restore) the log must end at seq `at`,
 * so that the records keep the seqs they had: otherwise nothing is
 * appended and the error says so -- a restore never renumbers.  If batch
 * k fails (a full disk, an I/O error) the ones before it are cut back
 * before the error goes on.  Nothing appended is visible to flushers,
 * readers or shippers until shard_publish_tail.  Returns the first
 * record's seq.
 */
extern uint64 shard_append_locked(FelixShard *s, uint64 generation,
								  StringInfo *batches, int n,
								  const TimestampTz *stamps, int64 at);

/*
 * With the tail held: cut the log back to end before seq `end`, removing
 * what an append that failed (or a commit abandoned) wrote -- never
 * published, so never flushed or visible.  If the cut fails the shard
 * refuses to serve (FAILED) until a restart, and the error goes on.
 */
extern void shard_cut_back(FelixShard *s, uint64 end);

/* With the tail held: make everything appended visible to flushers,
 * shippers (the notify hook hears of it) and -- once acknowledged --
 * readers. */
extern void shard_publish_tail(FelixShard *s);

/*
 * The commit gate (see the locking rule).  With the tail held: hold the
 * gate for this backend (until shard_release_gate), so that the tail can
 * be let go while the batches just appended stay unpublished.  Released
 * (the tail not held): publishing the batches, or cutting them back to
 * `cut_to` (never raising: a cut that fails leaves the shard FAILED, with
 * a WARNING).  A backend that exits holding gates cuts them back on its
 * way out.
 */
extern void shard_hold_gate(FelixShard *s, uint64 cut_to);
extern void shard_release_gate(FelixShard *s, bool publish);

/* ---- durability ---- */

/*
 * Wait until [.., upto) is durable on this node, doing the fdatasync
 * ourselves if no one else is (a group flush).  The notify hook hears of
 * every flush.
 */
extern void shard_flush(FelixShard *s, uint64 upto);

/* ---- what readers see ---- */

/*
 * Snapshot [start_seq, end): what a reader may see right now -- up to the
 * high-water mark, but nothing from where the copy is known to differ
 * from the leader's (shard_mark_diverged).
 */
extern void shard_visible(FelixShard *s, uint64 *start_seq, uint64 *end);

/*
 * The records of this node's segment files, as they were when the shard
 * opened, not yet checked as values of the stream's types: [*lo, *hi), in
 * which a reader checks each record it turns into values (empty: nothing
 * to check).  Records appended since the shard opened were checked before
 * they were written.  The node worker checks the rest once (worker/node.c)
 * and records how far it got with shard_set_checked, passing the *hi it
 * was given, so a shard opened again meanwhile is checked again.
 */
extern void shard_unchecked(FelixShard *s, uint64 *lo, uint64 *hi);
extern void shard_set_checked(FelixShard *s, uint64 opened_end, uint64 checked_end);

/*
 * With the tail held: the leader's records differ from this copy's from
 * seq `at` on, in a way the copy cannot repair itself (replication halts
 * it): readers stop seeing anything from there, across restarts (it is
 * made durable with the mark), until the copy is begun again.
 */
extern void shard_mark_diverged_locked(FelixShard *s, uint64 at);

/*
 * Move the high-water mark up to hwm_end (never down, never past the
 * flushed end).  Returns the previous mark.  Caller holds nothing;
 * `only_if` (may be NULL) runs under the slot's mutex when the mark would
 * move -- it must not call anything, and may update its own module's
 * (mutex) fields -- and the mark moves only if it returns true.
 */
extern uint64 shard_advance_hwm(FelixShard *s, uint64 hwm_end,
								bool (*only_if) (FelixShard *s, void *arg),
								void *arg);

/*
 * Make the high-water mark durable if it moved since it last was (a
 * shard with one copy needs none: all it holds is visible after a
 * restart).  Called by the node worker every heartbeat interval and as it
 * exits, so a restarted replica serves at once what it knew to be
 * acknowledged that long before, and the truncation guard protects
 * everything at or below a persisted mark across restarts.
 */
extern void shard_persist_hwm(FelixShard *s);

/*
 * Follower side, with the tail held after appending shipped batches (and
 * syncing them): publish the tail, mark it flushed, and move the mark to
 * min(leader_hwm_end, flushed end).
 */
extern void shard_after_replicated(FelixShard *s, uint64 leader_hwm_end);

/*
 * With the tail held: discard the whole copy and begin it again, empty,
 * at start_seq (a bootstrap or a rebuild from the leader of `generation`;
 * log_discard).  The mark, the divergence and the staleness go with it,
 * and the copy is stamped with this node's incarnation.
 */
extern void shard_begin_at_locked(FelixShard *s, uint64 start_seq, uint64 generation);

/* This node's incarnation changed (incarnation.h): every open copy not
 * stamped with the new one is stale from now on. */
extern void shard_mark_stale_copies(void);
/* With the tail held: an empty stale copy begins to be filled under this
 * node's incarnation -- stamp it so (no-op when not stale). */
extern void shard_claim_copy_locked(FelixShard *s);

/* ---- retention, truncation, drop ---- */

/* Apply retention now; returns segments removed. */
extern int	shard_trim(FelixShard *s);

/* Cut everything after seq; refuses at or below the high-water mark
 * (the one in memory and the one last made durable).  _locked: the tail
 * is held. */
extern void shard_truncate_after(FelixShard *s, uint64 seq);
extern void shard_truncate_to_locked(FelixShard *s, uint64 cut);

/* A stream's table was dropped and that drop committed: forget its
 * shards' slots and remove its files. */
extern void shard_forget_stream(Oid dboid, Oid relid);

/* How many streams have come or gone since startup (any database): drops
 * and creations that committed, creations undone at the control plane as
 * they rolled back.  A change tells the node agent its control-plane rows
 * may predate one. */
extern void shard_note_streams_changed(void);
extern uint64 shard_streams_changes(void);

/* How many times a slot's identity, phase, role, generation or log
 * positions (written, flushed, high-water mark, copy epoch) changed since
 * startup: a pass over every slot that finds the count it saw before its
 * last pass may skip the slots (the node worker's marks, the log ends a
 * heartbeat gives, the follower rows it renews) -- provided it read the
 * count right before that pass.  Whoever writes one of those fields calls
 * shard_note_changed() after the write; only a change after a read of the
 * count moves it. */
extern void shard_note_changed(void);
extern uint64 shard_changes(void);

/* ---- the notify hook ---- */

typedef enum FelixShardEvent
{
	FELIX_SHARD_PUBLISHED,		/* new records at the tail (shard_publish_tail) */
	FELIX_SHARD_FLUSHED			/* flushed_end moved (called with flush_lock
								 * held, right after the move) */
} FelixShardEvent;

typedef void (*FelixShardNotify) (FelixShard *s, FelixShardEvent event);

/* Set once, from _PG_init, by replication. */
extern void shard_set_notify(FelixShardNotify fn);

extern Size shard_registry_size(void);
extern void shard_registry_init(void);

#endif							/* FELIX_STORAGE_SHARD_H */
