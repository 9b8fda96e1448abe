/*-------------------------------------------------------------------------
 *
 * client.h
 *	  felix's libpq client, usable from a background worker and from a
 *	  backend: connect and query with a deadline, waiting on the latch
 *	  (interrupts serviced, postmaster death noticed), remote errors
 *	  re-reported with their SQLSTATE, detail and hint at the caller's
 *	  level; and non-blocking connections for a worker's event loop.  The
 *	  control-plane calls built on it are in cpcall.c.
 *
 * Locking rule: a connection belongs to the process that opened it; no
 * shared state.  A caller that may raise an ERROR while holding a
 * connection closes it in PG_FINALLY (or owns it for the process's life).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_CLIENT_H
#define FELIX_CONTROL_CLIENT_H

#include "postgres.h"

#include "libpq-fe.h"

/*
 * Connect to conninfo within timeout_ms; with several hosts (host=a,b),
 * each is tried in turn with its own share of the time (or libpq's
 * connect_timeout, per host).  On failure reports at elevel (ERROR raises;
 * a lower level logs) naming `purpose`, and returns NULL.  The connection
 * is in non-blocking mode; close it with felix_conn_close.
 */
extern PGconn *felix_conn_open(const char *conninfo, const char *purpose,
							   const char *application_name,
							   int timeout_ms, int elevel);
extern void felix_conn_close(PGconn *conn);

/* True if the connection can take another query (idle, not broken). */
extern bool felix_conn_usable(PGconn *conn);

/*
 * Run one parameterised statement (text parameters, NULL for SQL NULL) and
 * wait for its result until timeout_ms; `call` names it in messages.  Returns the PGresult (TUPLES_OK or
 * COMMAND_OK; PQclear it) or, after reporting at elevel, NULL: a remote
 * error keeps its SQLSTATE, detail and hint; a timeout or a broken
 * connection is 08006.  After NULL, check felix_conn_usable.
 */
extern PGresult *felix_conn_exec(PGconn *conn, const char *call,
								 const char *sql, int nparams,
								 const char *const *values,
								 int timeout_ms, int elevel);

/*
 * felix_conn_exec for a statement the session runs again and again: sql is
 * prepared there as stmt the first time (*prepared false; set once it is),
 * then only its name and parameters go out, and the server neither parses
 * nor plans it again.  *prepared belongs to the connection: false for a
 * new one.
 */
extern PGresult *felix_conn_exec_prepared(PGconn *conn, const char *call,
										  const char *stmt, const char *sql,
										  int nparams, const char *const *values,
										  bool *prepared, int timeout_ms, int elevel);

/*
 * felix_conn_exec in two halves, for calls on several connections at
 * once: send the query (false, reported at elevel, if it could not be
 * sent by deadline_ns, felix_monotonic_ns), then collect its result as
 * felix_conn_exec does.
 */
extern bool felix_conn_send(PGconn *conn, const char *call, const char *sql,
							int nparams, const char *const *values,
							int64 deadline_ns, int elevel);
extern PGresult *felix_conn_receive(PGconn *conn, const char *call,
									int64 deadline_ns, int elevel);

/* The SQLSTATE of the last remote error felix_conn_exec reported in this
 * process ("" after a success or a connection failure). */
extern const char *felix_conn_last_sqlstate(void);

/*
 * Re-report an error result at elevel with the remote SQLSTATE, message,
 * detail and hint (the remote context goes to the log only); frees res.
 */
extern void felix_conn_report_result(int elevel, PGresult *res, PGconn *conn,
									 const char *call);

/* What to do about a connection that failed for libpq's reason `why`
 * (a missing or refused password is named as such). */
extern const char *felix_conn_hint(const char *why);

/* The message of the last failure felix_conn_open or felix_conn_exec
 * reported in this process (no secrets). */
extern const char *felix_conn_last_error(void);

/*
 * Make the remote session cancel any statement running longer than
 * timeout_ms (statement_timeout), so a call this side gave up on does not
 * keep running there.  false (reported at elevel) if that failed.
 */
extern bool felix_conn_set_statement_timeout(PGconn *conn, int timeout_ms, int elevel);

/*
 * A connection to node `name` (its address from the node directory), or
 * NULL (reported at DEBUG1): callers use it to wake the node, a help and
 * never a need.
 */
extern PGconn *felix_node_connect(const char *name, const char *application_name,
								  int timeout_ms);

/* Ask the node on conn (may be NULL) to heartbeat now: felix.heartbeat_now(). */
extern void felix_node_wake_heartbeat(PGconn *conn, int timeout_ms);

/*
 * Connect to felix.node_conninfo and ask who answers: 1 this node (name
 * and incarnation), -1 another (a WARNING says which, once), 0 nobody
 * could be asked (connection failures reported at elevel).  The verdict
 * is kept for every process (felix_conninfo_verified).
 */
extern int	felix_verify_own_conninfo(int timeout_ms, int elevel);

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

#define FELIX_ASYNC_CONNECT_TIMEOUT_MS	5000
#define FELIX_ASYNC_BACKOFF_MIN_MS		100
#define FELIX_ASYNC_BACKOFF_MAX_MS		5000

extern void async_init(FelixAsyncConn *c, const char *what, bool pipeline);
/* Changes whenever any connection of this process opens or closes. */
extern uint64 felix_async_epoch(void);
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

#endif							/* FELIX_CONTROL_CLIENT_H */
