/*-------------------------------------------------------------------------
 *
 * halts.h
 *	  The halted followers the control plane knows of (felix.cp_halted():
 *	  what the shards' current leaders last reported), cached in shared
 *	  memory by the heartbeat worker so that felix_halted reads no network
 *	  and shows the same list on every node.  See halts.c.
 *
 * Locking rule: one LWLock over the list; the heartbeat worker replaces it
 * whole (exclusive), readers copy it out (shared).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_HALTS_H
#define FELIX_CONTROL_HALTS_H

#include "postgres.h"

#include "datatype/timestamp.h"

/* Most halts the cache holds; more are counted, not kept. */
#define FELIX_MAX_HALTS		256
#define FELIX_HALT_REASON_LEN	24

typedef struct FelixHaltInfo
{
	char		stream[NAMEDATALEN];
	int			shard;
	char		node[NAMEDATALEN];	/* the halted follower */
	uint64		generation;
	char		leader[NAMEDATALEN];	/* who reported it, and may rebuild it */
	bool		has_position;
	uint64		position;		/* the seq it stood at */
	char		reason[FELIX_HALT_REASON_LEN];
	TimestampTz since;
} FelixHaltInfo;

/* The control plane's list, as just read, replaces the cached one. */
extern void felix_halts_listed(const FelixHaltInfo *halts, int n);

/* The cached list (palloc'd into *out); returns how many. */
extern int	felix_halts_list(FelixHaltInfo **out);

extern Size felix_halts_shmem_size(void);
extern void felix_halts_shmem_init(void);

#endif							/* FELIX_CONTROL_HALTS_H */
