/*-------------------------------------------------------------------------
 *
 * report_queue.h
 *	  The hand-over of one replica report at a time from the ship worker
 *	  to the report worker (etcd store only), in shared memory.  See
 *	  report_queue.c.
 *
 * Locking rule: one spinlock over the request slot; the JSON buffer is
 * written by the ship worker only while no request is pending, and read
 * by the report worker only while one is.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_REPORT_QUEUE_H
#define FELIX_REPLICATION_REPORT_QUEUE_H

#include "postgres.h"

extern Size report_queue_shmem_size(void);
extern void report_queue_shmem_init(void);

/* ---- the ship worker's side ---- */

/*
 * Hand a report (felix.cp_report's JSON array and its token) over; returns
 * its request number, or 0 when it could not (too large, no report worker
 * running) -- then the report did not leave.
 */
extern uint64 report_queue_submit(const char *json, int64 token);
/* Is a request handed over and not finished (perhaps one given up on)? */
extern bool report_queue_busy(void);
/*
 * The outcome of request `seq`: false while it runs; then true with
 * *accepted the rows written (-1: failed, *error says why).
 */
extern bool report_queue_outcome(uint64 seq, int *accepted, char *error, Size errlen);

/* ---- the report worker's side ---- */

/* Serve the queue from this process until it exits. */
extern void report_queue_attach(void);
/* The pending request's JSON (palloc'd), its number and token; NULL if none. */
extern char *report_queue_take(uint64 *seq, int64 *token);
/* Its outcome: rows written (-1: failed, error says why); wakes the ship worker. */
extern void report_queue_finish(uint64 seq, int accepted, const char *error);

#endif							/* FELIX_REPLICATION_REPORT_QUEUE_H */
