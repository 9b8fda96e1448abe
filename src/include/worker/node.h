/*-------------------------------------------------------------------------
 *
 * node.h
 *	  The node worker: opens (recovers) every shard of felix.database's
 *	  streams after a start and applies retention on a timer.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_WORKER_NODE_H
#define FELIX_WORKER_NODE_H

extern void felix_node_worker_register(void);

#endif							/* FELIX_WORKER_NODE_H */
