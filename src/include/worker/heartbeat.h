/*-------------------------------------------------------------------------
 *
 * heartbeat.h
 *	  The node agent: background worker "felix heartbeat", which registers
 *	  this node at the control plane, renews its leases, applies the
 *	  control plane's assignments to the local shards, creates the tables
 *	  of streams created elsewhere in the cluster, keeps the node directory
 *	  and takes part in the control-plane duties.  See heartbeat.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_WORKER_HEARTBEAT_H
#define FELIX_WORKER_HEARTBEAT_H

#include "postgres.h"

/* Register the worker (from _PG_init, while preloading). */
extern void felix_heartbeat_worker_register(void);

#endif							/* FELIX_WORKER_HEARTBEAT_H */
