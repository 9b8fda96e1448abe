/*-------------------------------------------------------------------------
 *
 * store_view.h
 *	  The control-plane store as this node's heartbeat last saw it: which
 *	  store and endpoint, whether the last call succeeded, since when it
 *	  has been failing.  The heartbeat writes it; felix_nodes shows it on
 *	  this node's row.  See store_view.c.
 *
 * Locking rule: one spinlock over the whole view.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_STORE_VIEW_H
#define FELIX_CONTROL_STORE_VIEW_H

#include "postgres.h"

#include "datatype/timestamp.h"

typedef struct FelixStoreView
{
	bool		ok;				/* the last call succeeded */
	char		store[320];		/* which store, the endpoint, the etcd leader */
	char		error[256];		/* the last failure ("" if ok) */
	char		sqlstate[6];	/* ... and its SQLSTATE, when it had one */
	TimestampTz ok_at;			/* the last heartbeat the store took (0: none) */
	int64		ok_mono_ns;		/* ... on the monotonic clock, for liveness */
	TimestampTz failing_since;	/* the first failure since then (0 if ok) */
} FelixStoreView;

extern Size felix_store_view_shmem_size(void);
extern void felix_store_view_shmem_init(void);

/* A call to the store ended: ok or not, with what store said it was and
 * the failure's message and SQLSTATE ("" for none). */
extern void felix_store_view_note(bool ok, const char *store, const char *error,
								  const char *sqlstate);
/* This node does not call the store at all, for this reason. */
extern void felix_store_view_blocked(const char *why);

/* A copy of the view. */
extern void felix_store_view(FelixStoreView *out);

#endif							/* FELIX_CONTROL_STORE_VIEW_H */
