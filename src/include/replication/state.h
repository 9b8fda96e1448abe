/*-------------------------------------------------------------------------
 *
 * state.h
 *	  The leader's view of its followers, in shared memory: one entry per
 *	  shard slot (index = shard_slot_index), each holding, for the
 *	  generation it belongs to, every follower's cursor (where the next
 *	  shipment starts), acknowledged end, and whether shipping to it goes on
 *	  or has halted, been offered a bootstrap or is being rebuilt.  The
 *	  ship worker is the only writer but for one flag, rebuild_requested,
 *	  which felix_rebuild sets and the worker takes; the felix_replication
 *	  view, the metrics gauges and the quorum report read it.
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
#include "storage/latch.h"
#include "storage/s_lock.h"
#include "storage/incarnation.h"
#include "storage/shard.h"
#include "utils/timestamp.h"

typedef enum FelixFollowerState
{
	FELIX_FOLLOWER_SHIPPING,		/* shipped to as its cursor says */
	FELIX_FOLLOWER_BOOTSTRAP,		/* its log ends before the leader's oldest
									 * record: offered a copy beginning there
									 * (op bootstrap) next */
	FELIX_FOLLOWER_REBUILDING,		/* holds a rebuild slot: told to discard
									 * its copy (op rebuild), then shipped to
									 * at the paced rate until level */
	FELIX_FOLLOWER_HALTED			/* stopped, for `halt`; out of every
									 * quorum and never reported caught up */
} FelixFollowerState;

/* Why a follower halted (felix_halted.reason). */
typedef enum FelixHalt
{
	FELIX_HALT_NONE,
	FELIX_HALT_DIVERGED,			/* its log differs from the leader's where
									 * the generation-map rule cannot repair
									 * it (or at or below its mark) */
	FELIX_HALT_NEEDS_BOOTSTRAP,		/* the leader's retention trimmed past its
									 * position and it holds records of its
									 * own, or its copy predates its node's
									 * incarnation */
	FELIX_HALT_FENCED,				/* it is at a newer generation */
	FELIX_HALT_PROTOCOL				/* it answered what the leader cannot
									 * believe */
} FelixHalt;

#define FELIX_REPL_ERROR_LEN	200

typedef struct FelixFollower
{
	char		name[NAMEDATALEN];
	char		incarnation[FELIX_INCARNATION_LEN];	/* the copy shipped to:
													 * its node's incarnation
													 * when shipping began */
	uint64		cursor;			/* next shipment starts with the batch
								 * holding this seq */
	uint64		acked_end;		/* durable on the follower up to here
								 * (exclusive), per its last 'stored'
								 * answer at this generation */
	bool		answered;		/* acked_end comes from an answer */
	FelixFollowerState state;
	FelixHalt	halt;			/* HALTED: why (REBUILDING: what it repairs) */
	uint64		halt_position;	/* HALTED: where it stood (a conflict's seq,
								 * else its log's end) */
	TimestampTz halted_at;		/* HALTED: when */
	bool		rebuild_requested;	/* felix_rebuild asked for one (written
									 * by backends, under the spinlock) */
	TimestampTz rebuild_started_at; /* REBUILDING: when the slot was taken */
	uint64		rebuild_bytes;	/* REBUILDING: shipped since */
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

/*
 * Shard slots with new work for the ship worker: records to ship, a new
 * durable end, a new leadership, a rebuild asked for.  repl_ship_due marks
 * the slot and wakes the worker; the worker's repl_ship_take_due collects
 * and clears the marks (into slots[], room for max >= felix.max_shards;
 * returns how many).  A mark only hurries the worker: the shards it ships
 * from are still looked at every heartbeat interval, every slot every
 * few (ship.c).
 */
extern void repl_ship_due(int slot);
extern int	repl_ship_take_due(int *slots, int max);

/* Entry for shard slot `slot` (0 <= slot < felix.max_shards). */
extern FelixReplShard *repl_state_entry(int slot);

/*
 * Copy the entry under its spinlock: the header, and of a valid entry its
 * nfollowers followers (the rest of *out is not written).
 */
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
/* (Ship worker only.)  Write one follower's fields back (all but
 * rebuild_requested, which stays as backends left it). */
extern void repl_state_put_follower(int slot, int i, const FelixFollower *f);
/* (Ship worker only.)  Clear follower i's rebuild request; was there one? */
extern bool repl_state_take_rebuild_request(int slot, int i);

/*
 * Gauges for felix_metrics, over every shard led here: the lag in records
 * of the slowest follower that is not halted (summed over the shards --
 * the leader loss window), followers halted (and by reason), followers
 * being rebuilt, and replica reports sent per report request made since
 * the start (0 before the first).  Reads every entry under its spinlock.
 */
typedef struct FelixReplGauges
{
	uint64		lag_records;
	uint64		halted;
	uint64		halted_by[FELIX_HALT_PROTOCOL + 1];	/* by FelixHalt */
	uint64		rebuilding;
	double		reports_per_request;
} FelixReplGauges;

extern void felix_replication_gauges(FelixReplGauges *g);

extern const char *felix_follower_state_name(FelixFollowerState st);
extern const char *felix_halt_name(FelixHalt h);

/*
 * (Backends.)  Ask the ship worker to rebuild a halted follower of the
 * shard in `slot` at `generation`, under felix.rebuild_max_concurrent (at
 * least one at a time, even at 0).  Returns the follower's halt, or
 * FELIX_HALT_NONE (nothing asked) when no such follower is halted there.
 */
extern FelixHalt repl_request_rebuild(int slot, uint64 generation, const char *follower);

#endif							/* FELIX_REPLICATION_STATE_H */
