/*-------------------------------------------------------------------------
 *
 * cp_session.h
 *	  A background worker's session with the control plane: opened again
 *	  when it broke, its failures logged at most once every few seconds.
 *	  See cp_session.c.
 *
 * Locking rule: none; each worker has its own.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_WORKER_CP_SESSION_H
#define FELIX_WORKER_CP_SESSION_H

#include "postgres.h"

#include "control/cpcall.h"

typedef struct WorkerCpSession
{
	FelixCpSession session;
	bool		open;
	const char *appname;		/* the session's application_name */
	bool		listen;			/* LISTEN for the control plane's wakes once opened */
	int64		logged_ns;		/* when a failure was last logged (0: the next one logs) */
} WorkerCpSession;

/* LOG if a failure may be logged now, else DEBUG1. */
extern int	worker_cp_elevel(WorkerCpSession *w);
/* A failure was reported at elevel. */
extern void worker_cp_reported(WorkerCpSession *w, int elevel);
/* Open it unless it is open and usable; false (reported) when it cannot be. */
extern bool worker_cp_connect(WorkerCpSession *w);
/* After a failed call: note the report, and drop a broken session. */
extern void worker_cp_failed(WorkerCpSession *w, int elevel);

#endif							/* FELIX_WORKER_CP_SESSION_H */
