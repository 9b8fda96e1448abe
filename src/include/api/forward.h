/*-------------------------------------------------------------------------
 *
 * forward.h
 *	  Publishing on a node that does not lead the shard: the publish goes
 *	  to the shard's leader (forward.c).
 *
 * Locking rule: backend-local; see forward.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_FORWARD_H
#define FELIX_API_FORWARD_H

#include "postgres.h"

#include "api/catalog.h"
#include "lib/stringinfo.h"
#include "storage/shard.h"

/*
 * Should a publish of shard s go to its leader?  When felix.forward_publishes
 * is on and the control plane names another node as its leader.
 */
extern bool forward_wanted(FelixShard *s);

/*
 * Publish the sealed batch of `count` records on shard `shard` through its
 * leader, as the current user; returns the first record's seq once it is
 * acknowledged there.  Follows a change of leader until felix.quorum_timeout;
 * raises the leader's error, or 55F01 when the answer never came.
 */
extern uint64 forward_publish(const FelixStream *stream, int shard,
							  StringInfo batch, uint32 count);

#endif							/* FELIX_API_FORWARD_H */
