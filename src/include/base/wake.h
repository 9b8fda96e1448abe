/*-------------------------------------------------------------------------
 *
 * wake.h
 *	  Waking a background worker at once, from any layer: each worker kind
 *	  has a latch slot in shared memory, which the worker fills while it
 *	  runs.  A module that wants a worker to act now sets its latch here
 *	  rather than calling into the worker's code.  See wake.c.
 *
 * Locking rule: a slot is written only by its worker (at start and exit)
 * and read without a lock: a pointer is read atomically, and a latch set
 * as its worker exits is harmless.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_BASE_WAKE_H
#define FELIX_BASE_WAKE_H

#include "postgres.h"

typedef enum FelixWorkerKind
{
	FELIX_WORKER_HEARTBEAT,		/* felix heartbeat: the node agent */
	FELIX_WORKER_SHIP,			/* felix ship: shipping to followers */
	FELIX_WORKER_KINDS
} FelixWorkerKind;

extern Size felix_wake_shmem_size(void);
extern void felix_wake_shmem_init(void);

/* The running worker of `kind` registers its latch (NULL as it exits). */
extern void felix_wake_register(FelixWorkerKind kind);

/* Set the latch of the worker of `kind`, if it runs. */
extern void felix_wake(FelixWorkerKind kind);

#endif							/* FELIX_BASE_WAKE_H */
