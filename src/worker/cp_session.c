/*-------------------------------------------------------------------------
 *
 * cp_session.c
 *	  A background worker's session with the control plane (the heartbeat
 *	  worker's, the duty worker's): opened again at the next call once it
 *	  broke, and its failures logged at LOG at most once every
 *	  WORKER_CP_LOG_INTERVAL_NS (DEBUG1 in between), so a control plane
 *	  that is down costs the log a line every few seconds, not five a
 *	  second.
 *
 * Locking rule: none; each worker has its own, in process memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "felix.h"
#include "worker/cp_session.h"

#define WORKER_CP_LOG_INTERVAL_NS	(INT64CONST(5) * 1000000000)

int
worker_cp_elevel(WorkerCpSession *w)
{
	if (w->logged_ns == 0 ||
		felix_monotonic_ns() - w->logged_ns >= WORKER_CP_LOG_INTERVAL_NS)
		return LOG;
	return DEBUG1;
}

void
worker_cp_reported(WorkerCpSession *w, int elevel)
{
	if (elevel >= LOG)
		w->logged_ns = felix_monotonic_ns();
}

bool
worker_cp_connect(WorkerCpSession *w)
{
	int			elevel;

	if (w->open && felix_cp_usable(&w->session))
		return true;
	if (w->open)
		felix_cp_close(&w->session);
	elevel = worker_cp_elevel(w);
	w->open = felix_cp_open(&w->session, w->appname,
							Max(2 * felix_heartbeat_interval, 1000), elevel);
	if (w->open && w->listen && !felix_cp_listen_grants(&w->session, elevel))
	{
		felix_cp_close(&w->session);
		w->open = false;
	}
	if (!w->open)
		worker_cp_reported(w, elevel);
	return w->open;
}

void
worker_cp_failed(WorkerCpSession *w, int elevel)
{
	worker_cp_reported(w, elevel);
	if (w->open && !felix_cp_usable(&w->session))
	{
		felix_cp_close(&w->session);
		w->open = false;
	}
}
