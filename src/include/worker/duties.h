/*-------------------------------------------------------------------------
 *
 * duties.h
 *	  The duty worker, "felix duties": this node's part in the
 *	  control-plane duties (failure detection and promotion), in a process
 *	  of its own so that they never delay the heartbeat.  See duties.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_WORKER_DUTIES_H
#define FELIX_WORKER_DUTIES_H

#include "postgres.h"

/* Register the worker (from _PG_init, while preloading). */
extern void felix_duty_worker_register(void);

#endif							/* FELIX_WORKER_DUTIES_H */
