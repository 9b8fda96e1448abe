/*-------------------------------------------------------------------------
 *
 * nodes.h
 *	  The node directory: a small table in shared memory mapping a node's
 *	  name to the conninfo peers use to reach it, filled by the heartbeat
 *	  worker from what the control plane returns (each shard's leader and
 *	  its conninfo, and felix.cp_nodes()), read by whoever needs to reach a peer
 *	  (the ship worker, hints naming a leader).
 *
 * Locking rule: one LWLock over the whole table; writers (the heartbeat
 * worker) take it exclusive, readers shared, each for a short copy.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_NODES_H
#define FELIX_CONTROL_NODES_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "storage/incarnation.h"

/* Most nodes the directory remembers; the least recently seen is evicted. */
#define FELIX_MAX_NODES		128
#define FELIX_NODE_CONNINFO_LEN	1024
#define FELIX_NODE_PEERS_LEN	512

/* One node as the control plane's node list describes it. */
typedef struct FelixNodeInfo
{
	char		name[NAMEDATALEN];
	char		conninfo[FELIX_NODE_CONNINFO_LEN];	/* address, secrets masked */
	char		incarnation[FELIX_INCARNATION_LEN];	/* "" when unknown */
	bool		alive;
	bool		duty;			/* runs the control-plane duties */
	TimestampTz last_heartbeat;
	char		peers[FELIX_NODE_PEERS_LEN];	/* JSON: peer -> "" or why unreachable */
	/* the last server refused this node's name while it was alive ("": none) */
	char		clash_incarnation[FELIX_INCARNATION_LEN];
	char		clash_conninfo[256];
	TimestampTz clash_at;
} FelixNodeInfo;

/*
 * Copy the conninfo of node `name` into buf (len bytes, truncated) and
 * return true; false (buf set to "") when the node is not known here.
 */
extern bool felix_node_conninfo_of(const char *name, char *buf, Size len);

/*
 * Copy the incarnation the control plane last listed for node `name` into
 * buf (FELIX_INCARNATION_LEN) and return true; false (buf "") if unknown.
 */
extern bool felix_node_incarnation_of(const char *name, char *buf);

/*
 * A count that moves whenever a node's conninfo or incarnation in the
 * directory changes (never 0 once shared memory is up): what was looked up
 * at one value is still true while it stays.
 */
extern uint64 felix_nodes_identities(void);

/* Record (or refresh) a node's conninfo; its "last seen" becomes now. */
extern void felix_node_note(const char *name, const char *conninfo);

/*
 * The control plane's node list, as just read: these nodes (noted, as
 * felix_node_note would) are the listed ones, every other entry is not.
 */
extern void felix_nodes_listed(const FelixNodeInfo *nodes, int n);

/*
 * This node's latest probe of peer `name` (connect as this node's role and
 * ask who answers): ok, or why not.  The heartbeat tells the control plane
 * (felix_nodes_probes_json), so every node's felix_nodes shows a peer that
 * its peers cannot reach as such.  The peer is not probed again before
 * due_ns (felix_monotonic_ns).  Returns whether the outcome changed.
 */
extern bool felix_node_probed(const char *name, bool ok, const char *why, int64 due_ns);
/* {"peer": "" | "why", ...} of this node's latest probes (palloc'd). */
extern char *felix_nodes_probes_json(void);
/*
 * The name and address of the next listed peer whose probe is due at
 * now_ns, round robin; false if none.
 */
extern bool felix_nodes_next_probe(char *name, char *conninfo, Size len, int64 now_ns);

/* The listed nodes (palloc'd array into *out); returns how many. */
extern int	felix_nodes_list(FelixNodeInfo **out);

extern Size felix_nodes_shmem_size(void);
extern void felix_nodes_shmem_init(void);

#endif							/* FELIX_CONTROL_NODES_H */
