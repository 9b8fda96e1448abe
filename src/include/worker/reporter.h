/*-------------------------------------------------------------------------
 *
 * reporter.h
 *	  Background worker "felix report" (etcd store only): makes the ship
 *	  worker's replica reports to the control plane, so that shipping never
 *	  waits for an etcd round trip.  The hand-over is
 *	  replication/report_queue.c.  See reporter.c.
 *
 * Locking rule: none of its own.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_WORKER_REPORTER_H
#define FELIX_WORKER_REPORTER_H

#include "postgres.h"

/* Register the worker (from _PG_init, with the etcd store). */
extern void felix_reporter_register(void);

#endif							/* FELIX_WORKER_REPORTER_H */
