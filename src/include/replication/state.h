/*-------------------------------------------------------------------------
 *
 * state.h
 *	  The leader's view of its followers, in shared memory: one entry per
 *	  shard slot (index = shard_slot_index), each holding, for the
 *	  generation it belongs to, every follower's cursor (where the next
 *	  shipment starts), acknowledged end, and whether shipping to it goes on
 *	  or has halted.  The ship worker is the only writer; the
 *	  felix_replication view, the metrics gauges and the quorum report
 *	  read it.
 *
 *	  A cursor is a belief about a follower's position under one
 *	  leadership, so the whole entry is reset whenever the shard's
 *	  generation (or the shard owning the slot) changes.
 *
 * Locking rule: `mutex` (a spinlock per entry) guards every field of the
 * entry.  The writer holds it only to copy a follower's fields in or out;
 * readers take it to copy the entry (repl_state_copy) and never call
 * anything while holding it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_STATE_H
#define FELIX_REPLICATION_STATE_H

#include "postgres.h"
#include "felix.h"
#include "storage/s_lock.h"
#include "storage/shard.h"
#include "utils/timestamp.h"

typedef enum FelixFollowerState
{
	FELIX_FOLLOWER_SHIPPING,		/* shipped to as its cursor says */
	FELIX_FOLLOWER_HALTED_CONFLICT, /* its log differs from the leader's */
	FELIX_FOLLOWER_HALTED_FENCED,	/* it is at a newer generation */
	FELIX_FOLLOWER_HALTED_BEHIND,	/* its log ends before the leader's
									 * oldest record (retention trimmed
									 * what it needs): needs a rebuild */
	FELIX_FOLLOWER_HALTED_PROTOCOL	/* it answered what the leader cannot
									 * believe (a position past what was
									 * sent to it) */
} FelixFollowerState;

#define FELIX_REPL_ERROR_LEN	200

typedef struct FelixFollower
{
	char		name[NAMEDATALEN];
	uint64		cursor;			/* next shipment starts with the batch
								 * holding this seq */
	uint64		acked_end;		/* durable on the follower up to here
								 * (exclusive), per its last 'stored'
								 * answer at this generation */
	bool		answered;		/* acked_end comes from an answer */
	FelixFollowerState state;
	TimestampTz last_answer_at; /* 0: no answer at this generation */
	char		last_error[FELIX_REPL_ERROR_LEN];	/* "" when none */
} FelixFollower;

typedef struct FelixReplShard
{
	slock_t		mutex;
	bool		valid;			/* led here with followers at `generation` */
	FelixShardKey key;			/* the shard the entry belongs to */
	char		stream_name[NAMEDATALEN];
	uint64		generation;
	int			nfollowers;
	FelixFollower followers[FELIX_MAX_REPLICAS];
} FelixReplShard;

extern Size repl_state_shmem_size(void);
extern void repl_state_shmem_init(void);

/* Entry for shard slot `slot` (0 <= slot < felix.max_shards). */
extern FelixReplShard *repl_state_entry(int slot);

/* Copy the entry under its spinlock. */
extern void repl_state_copy(int slot, FelixReplShard *out);

/*
 * (Ship worker only.)  Start the entry afresh for `key` at `generation`
 * with these followers, every cursor at fresh_cursor, nothing
 * acknowledged.
 */
extern void repl_state_reset(int slot, const FelixShardKey *key,
							 const char *stream_name, uint64 generation,
							 char (*followers)[NAMEDATALEN], int nfollowers,
							 uint64 fresh_cursor);
/* (Ship worker only.)  The shard is no longer shipped from here. */
extern void repl_state_clear(int slot);
/* (Ship worker only.)  Write one follower's fields back. */
extern void repl_state_put_follower(int slot, int i, const FelixFollower *f);

/*
 * Gauges for felix_metrics: replication_lag_records (the lag in records
 * of the slowest non-halted follower, summed over the shards led here),
 * halted_followers, and replica_reports_per_request (replica reports
 * sent / report requests made since the start; 0 before the first).
 * Reads every entry under its spinlock.
 */
extern void felix_replication_gauges(uint64 *lag_records,
									 uint64 *halted_followers,
									 double *reports_per_request);

extern const char *felix_follower_state_name(FelixFollowerState st);

#endif							/* FELIX_REPLICATION_STATE_H */
