/*-------------------------------------------------------------------------
 *
 * assignment.h
 *	  The control plane's word about one shard on this node, as a
 *	  heartbeat brings it (cpcall.c) and the node agent applies it
 *	  (lease_apply_assignment, replication/lease.c).
 *
 * Locking rule: a plain value; nothing to lock.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_ASSIGNMENT_H
#define FELIX_CONTROL_ASSIGNMENT_H

#include "postgres.h"

#include "storage/incarnation.h"
#include "storage/shard.h"

/*
 * What the control plane says about one shard, as applied by the node
 * agent after each heartbeat (lease_apply_assignment).
 */
typedef struct FelixAssignment
{
	uint64		generation;
	char		leader[NAMEDATALEN];	/* "" while unplaced */
	char		leader_incarnation[FELIX_INCARNATION_LEN];	/* the one granted */
	char		leader_conninfo[FELIX_CONNINFO_LEN];
	int			nreplicas;
	char		replicas[FELIX_MAX_REPLICAS][NAMEDATALEN];
	char		joining[NAMEDATALEN];	/* a replica move: who joins ("" none) */
	char		leaving[NAMEDATALEN];	/* ... and who leaves */
	bool		lease_granted;	/* this heartbeat granted/renewed our lease */
	int64		lease_ms;
	int64		sent_at_ns;		/* felix_monotonic_ns() when the heartbeat
								 * carrying the grant was sent */
	char		unplaced_reason[FELIX_REASON_LEN];
} FelixAssignment;

#endif							/* FELIX_CONTROL_ASSIGNMENT_H */
