/*-------------------------------------------------------------------------
 *
 * report.h
 *	  The quorum mark and the replica report (report.c), called from the
 *	  ship worker's loop.  For each shard led here with followers it moves
 *	  the quorum mark when what the control plane may believe is still true
 *	  of it; otherwise it decides what the control plane must be told
 *	  (which followers hold what, and whether they are caught up), sends
 *	  every queued report in one request, and only once that request has
 *	  landed moves the marks it justified.
 *
 * Locking rule: the worker's own memory; shards and follower state are
 * read through shard.h / state.h under their rules.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_REPORT_H
#define FELIX_REPLICATION_REPORT_H

#include "postgres.h"
#include "replication/ship.h"

extern void report_init(void);

/*
 * Queue and send reports that are due, and move marks; call once per loop
 * pass, with the pass's slots (slots[0..n), or NULL for every slot).  all:
 * they include every slot the worker ships from (a full pass).
 */
extern void report_tick(int64 now_ns, const int *slots, int n, bool all);

/* The control-plane connection, for the worker's wait set. */
extern FelixAsyncConn *report_conn(void);

/* The control-plane socket had these events (WL_SOCKET_*). */
extern void report_on_event(int64 now_ns, uint32 events);

/* Deadlines without an event: connect and answer time-outs. */
extern void report_check(int64 now_ns);

/* Earliest instant report.c needs a pass without an event. */
extern int64 report_deadline(int64 now_ns);

/* ... of those, the earliest that needs a tick over every slot. */
extern int64 report_timer(int64 now_ns);

/*
 * Has the last tick that looked at slot found nothing for it to do until
 * the periodic refresh of a quorum shard's report (no report due or
 * deferred, no mark waiting)?  Such a slot is left to the sweeps unless
 * something marks it (ship.c).
 */
extern bool report_settled(int slot);

/* Has something happened since the last full tick that needs another? */
extern bool report_wants_all(void);

/* Drop the connection (worker error recovery). */
extern void report_close(const char *why, int64 now_ns);

#endif							/* FELIX_REPLICATION_REPORT_H */
