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

#include "datatype/timestamp.h"

/* Register the worker (from _PG_init, while preloading). */
extern void felix_heartbeat_worker_register(void);

/* In a backend that just created `stream`: heartbeat once and apply the
 * control plane's assignments of that stream to this node's shards. */
extern void felix_heartbeat_apply_stream(const char *stream);

/* The control-plane store as this node's heartbeat last saw it. */
typedef struct FelixStoreView
{
	bool		ok;				/* the last call succeeded */
	char		store[320];		/* which store, the endpoint, the etcd leader */
	char		error[256];		/* the last failure ("" if ok) */
	char		sqlstate[6];	/* ... and its SQLSTATE, when it had one */
	TimestampTz ok_at;			/* the last heartbeat the store took (0: none) */
	TimestampTz failing_since;	/* the first failure since then (0 if ok) */
} FelixStoreView;

extern void felix_heartbeat_store_view(FelixStoreView *out);

/* Where the heartbeat worker's latch is kept, so it can be woken at once
 * (felix.heartbeat_now, after a planned transfer). */
extern Size felix_heartbeat_shmem_size(void);
extern void felix_heartbeat_shmem_init(void);
extern void felix_heartbeat_wake(void);

#endif							/* FELIX_WORKER_HEARTBEAT_H */
