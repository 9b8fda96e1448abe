/*-------------------------------------------------------------------------
 *
 * quorum.h
 *	  When a write counts as acknowledged: writers wait here
 *	  (quorum_acknowledge) and are released by the mark moving -- with the
 *	  flush on a leader-consistency shard, by the ship worker's reports on
 *	  a quorum shard (quorum_release).  See quorum.c.
 *
 * Locking rule: the acknowledgement fields of a shard are read and written
 * under its mutex; waiters sleep on its ack_cv (storage/shard.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_QUORUM_H
#define FELIX_REPLICATION_QUORUM_H

#include "postgres.h"

#include "storage/shard.h"

/* Records are acknowledged once durable on the leader (leader consistency,
 * or a single copy). */
extern bool quorum_acks_on_flush(int consistency, int replication_factor);

/*
 * Wait until the records [.., end), admitted at `generation` and durable
 * on this node, are acknowledged: at once on a leader-consistency shard,
 * once a majority holds them on a quorum shard.  Succeeds only if this
 * node, leading at `generation`, moved the mark past them; if the
 * leadership moved first, raises 55F02 -- never success on another
 * leadership's word.  55F01 after felix.quorum_timeout.
 */
extern void quorum_acknowledge(FelixShard *s, uint64 generation, uint64 end);

/*
 * Move a quorum shard's mark to `mark`, if the shard is still led here at
 * `generation` under a lease that has not run out and it is an advance.
 * Called only when what the control plane believes of the followers is
 * true of the new mark (report.c).  Wakes the writers it releases; false
 * if the mark did not move.
 */
extern bool quorum_release(FelixShard *s, uint64 generation, uint64 mark);

/* This node just took the shard: a leader-consistency shard shows what is
 * durable here. */
extern void quorum_on_lead(FelixShard *s);

/* Leadership moved: wake every waiter to look again. */
extern void quorum_wake_all(FelixShard *s);

/* The storage notify hook (set from _PG_init). */
extern void quorum_notify(FelixShard *s, FelixShardEvent event);

#endif							/* FELIX_REPLICATION_QUORUM_H */
