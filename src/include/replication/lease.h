/*-------------------------------------------------------------------------
 *
 * lease.h
 *	  Leadership of a shard on this node: the control plane's word about
 *	  it (assignments), the write conditions a leader keeps (a live lease
 *	  at exactly the shard's generation), and deposition.  See lease.c.
 *
 * Locking rule: role, generation and lease expiry are written with the
 * shard's tail held and read under its mutex (storage/shard.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_LEASE_H
#define FELIX_REPLICATION_LEASE_H

#include "postgres.h"

#include "control/assignment.h"
#include "storage/shard.h"


/* True if `node` names this node. */
extern bool felix_is_this_node(const char *node);

/*
 * Apply the control plane's word about the shard: open as leader at a new
 * generation (its start recorded in the generation map first), renew the
 * lease, or follow another leader.  Never lowers the generation.
 */
extern void lease_apply_assignment(FelixShard *s, const FelixAssignment *a);

/*
 * Would applying a to s take the lead at a new generation (the costly
 * case: a durable write of the generation map)?  A hint for scheduling
 * only; lease_apply_assignment decides again under the tail.
 */
extern bool lease_assignment_takes_lead(FelixShard *s, const FelixAssignment *a);

/*
 * The same word, unchanged since it was applied to the shard in slot
 * `slot` (shard key): if that shard is still as it left it -- open, at
 * its generation, in the role it gives this node -- renew the lease it
 * grants (as above) and return true; otherwise return false, and the
 * caller applies it anew.  Takes no transaction and no table lock.
 * `incarnation` is this node's (felix_incarnation), read once by a caller
 * that renews many.
 */
extern bool lease_reassert(int slot, const FelixShardKey *key, const FelixAssignment *a,
						   const char *incarnation);

/*
 * Admission (conditions 1-3 of the write rule: a lease for the shard at a
 * generation, this node's clock before its expiry minus epsilon, the shard
 * open at exactly that generation), waiting a little while this node is
 * about to hold the lease (just started, just created the stream) and
 * refusing at once when another node leads (55F02) or the lease ran out
 * (55F03).  Returns the generation the write is admitted at.
 */
extern uint64 lease_admit(FelixShard *s);

/*
 * The same conditions again, at the admitted generation, with the tail
 * held, immediately before the bytes go down; on refusal raises (the
 * abort lets go of the tail).
 */
extern void lease_recheck(FelixShard *s, uint64 generation);

/*
 * (Under the shard's mutex.)  Does this node lead the shard at
 * `generation` under a lease that has not run out?
 */
extern bool lease_live_locked(FelixShard *s, uint64 generation);

/*
 * A planned transfer of the leadership to `target` (felix_transfer_leadership).
 * hand_off_begin, with the shard led here under a live lease: admit
 * nothing more (55F02 naming the target), and return the generation and
 * the written end the target must reach.  hand_off_release: stop writing
 * at that generation -- the lease is given up, so the control plane may
 * grant the next one at once.  hand_off_cancel: the transfer failed; admit
 * again (the next heartbeat renews the lease if it was released).  The
 * hand-off ends by itself when the assignment moves on.
 */
extern uint64 lease_hand_off_begin(FelixShard *s, const char *target, uint64 *written_end);
extern void lease_hand_off_release(FelixShard *s, uint64 generation);
extern void lease_hand_off_cancel(FelixShard *s);

/*
 * Deposition.  This node learnt that a generation newer than the one it
 * leads at exists (a shipment of it, a follower fenced by it): it stops
 * leading before doing anything else, and every write waiting for an
 * acknowledgement at the old generation gets an error.  The newer
 * generation is not adopted here (its leader is not known yet; the
 * control plane's next assignment says).  _locked: the tail is held.
 * Returns whether this node was leading.
 */
extern bool lease_step_down(FelixShard *s, uint64 newer_generation, const char *why);
extern bool lease_step_down_locked(FelixShard *s, uint64 newer_generation, const char *why);

#endif							/* FELIX_REPLICATION_LEASE_H */
