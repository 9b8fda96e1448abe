/*-------------------------------------------------------------------------
 *
 * reporter.h
 *	  Background worker "felix report" (etcd store only): makes the ship
 *	  worker's replica reports to the control plane, so that shipping never
 *	  waits for an etcd round trip.  One request at a time, handed over in
 *	  shared memory.  See reporter.c.
 *
 * Locking rule: one spinlock over the request slot; the JSON buffer is
 * written by the ship worker only while no request is pending, and read
 * by the reporter only while one is.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_WORKER_REPORTER_H
#define FELIX_WORKER_REPORTER_H

#include "postgres.h"

/* Register the worker (from _PG_init, with the etcd store). */
extern void felix_reporter_register(void);

extern Size felix_reporter_shmem_size(void);
extern void felix_reporter_shmem_init(void);

/*
 * The ship worker hands a report (felix.cp_report's JSON array and its
 * token) over; returns its request number, or 0 when it could not (too
 * large, no reporter running) -- then the report did not leave.
 */
extern uint64 felix_reporter_submit(const char *json, int64 token);

/* Is a request handed over and not finished (perhaps one given up on)? */
extern bool felix_reporter_busy(void);

/*
 * The outcome of request `seq`: false while it runs; then true with
 * *accepted the rows written (-1: failed, *error says why).
 */
extern bool felix_reporter_outcome(uint64 seq, int *accepted, char *error, Size errlen);

#endif							/* FELIX_WORKER_REPORTER_H */
