/*-------------------------------------------------------------------------
 *
 * isolate.h
 *	  Two things every felix worker and several SQL functions need: running
 *	  a piece of work in its own subtransaction so its error cannot take
 *	  the caller down, and registering a background worker.  See isolate.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_BASE_ISOLATE_H
#define FELIX_BASE_ISOLATE_H

#include "postgres.h"

/*
 * Run fn(arg) in an internal subtransaction.  Returns NULL when it
 * succeeded (the subtransaction is committed), or the error it raised,
 * copied into the caller's memory context, with the subtransaction rolled
 * back and the error state flushed.  The caller's memory context and
 * resource owner are restored either way.
 */
extern ErrorData *felix_run_isolated(void (*fn) (void *arg), void *arg);

/* Register a felix background worker connected to a database. */
extern void felix_register_worker(const char *function, const char *name,
								  int restart_seconds);

#endif							/* FELIX_BASE_ISOLATE_H */
