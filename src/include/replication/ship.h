/*-------------------------------------------------------------------------
 *
 * ship.h
 *	  The ship worker ("felix ship"): for every shard led here with
 *	  replication_factor > 1 it ships bounded runs of whole batches from
 *	  each follower's cursor to the leader's written end, over one
 *	  pipelined, non-blocking libpq connection per peer node, and hands
 *	  the answers to the quorum report (report.h).
 *
 *	  Also the small non-blocking connection driver the worker uses for
 *	  its peers and for the control plane: connect with a deadline and a
 *	  backoff between attempts, all inside the worker's one wait loop.
 *
 * Locking rule: everything here is the worker's own memory; shared state
 * is reached only through shard.h and state.h under their rules.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_REPLICATION_SHIP_H
#define FELIX_REPLICATION_SHIP_H

#include "postgres.h"
#include "felix.h"
#include "libpq-fe.h"

/* Register the worker (from _PG_init). */
extern void felix_ship_worker_register(void);

PGDLLEXPORT void felix_ship_worker_main(Datum arg);

/* ---- non-blocking libpq connections driven by the worker's loop ---- */

typedef enum FelixAsyncState
{
	FELIX_ASYNC_DOWN,			/* no connection; next_attempt_ns says when */
	FELIX_ASYNC_CONNECTING,		/* PQconnectPoll in progress */
	FELIX_ASYNC_READY			/* connected, non-blocking */
} FelixAsyncState;

#define FELIX_ASYNC_CONNINFO_LEN	1024

typedef struct FelixAsyncConn
{
	PGconn	   *conn;
	uint64		serial;			/* which connection conn is: new per connect */
	FelixAsyncState state;
	bool		pipeline;		/* enter pipeline mode once connected */
	bool		want_read;		/* wait for the socket to be readable */
	bool		want_write;		/* ... writeable */
	int64		started_ns;		/* connect began (felix_monotonic_ns) */
	int64		next_attempt_ns;	/* DOWN: earliest reconnect */
	int			backoff_ms;		/* next delay after a failure */
	char		what[NAMEDATALEN + 32];	/* for messages: node "n2" */
	char		conninfo[FELIX_ASYNC_CONNINFO_LEN];
	char		problem[256];	/* last problem logged; "" when healthy */
} FelixAsyncConn;

#define FELIX_SHIP_CONNECT_TIMEOUT_MS	5000
#define FELIX_SHIP_BACKOFF_MIN_MS		100
#define FELIX_SHIP_BACKOFF_MAX_MS		5000

extern void async_init(FelixAsyncConn *c, const char *what, bool pipeline);
/* Begin connecting if DOWN and the backoff has passed. */
extern void async_begin(FelixAsyncConn *c, int64 now_ns);
/* Drive a connect in progress (socket event or timeout). */
extern void async_connect_poll(FelixAsyncConn *c, int64 now_ns);
/* Close without a word (shutdown, recovery). */
extern void async_close(FelixAsyncConn *c);
/* Give up a connect that has taken longer than its deadline. */
extern void async_check_timeout(FelixAsyncConn *c, int64 now_ns);
/* Close (if open) after a problem, which is logged once; back off. */
extern void async_fail(FelixAsyncConn *c, const char *problem, int64 now_ns);
/* Send what libpq has buffered; false (connection failed) on error. */
extern bool async_flush(FelixAsyncConn *c, int64 now_ns);
/* Earliest instant the connection needs attention without an event. */
extern int64 async_deadline(FelixAsyncConn *c);

/*
 * When the shipment in flight to follower fidx of the shard in `slot` (at
 * `generation`) left, if it carries every record below `end`; 0 if no
 * shipment in flight does.
 */
extern int64 ship_in_flight_since(int slot, const FelixShardKey *key,
								  uint64 generation, int fidx, uint64 end);

#endif							/* FELIX_REPLICATION_SHIP_H */
