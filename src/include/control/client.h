/*-------------------------------------------------------------------------
 *
 * client.h
 *	  felix's libpq client, usable from a background worker and from a
 *	  backend: connect and query with a deadline, waiting on the latch
 *	  (interrupts serviced, postmaster death noticed), remote errors
 *	  re-reported with their SQLSTATE, detail and hint at the caller's
 *	  level.  The control-plane calls built on it are in cpcall.c.
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

/* The SQLSTATE of the last remote error felix_conn_exec reported in this
 * process ("" after a success or a connection failure). */
extern const char *felix_conn_last_sqlstate(void);

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
 * Connect to felix.node_conninfo and ask who answers: 1 this node (name
 * and incarnation), -1 another (a WARNING says which, once), 0 nobody
 * could be asked (connection failures reported at elevel).  The verdict
 * is kept for every process (felix_conninfo_verified).
 */
extern int	felix_verify_own_conninfo(int timeout_ms, int elevel);

#endif							/* FELIX_CONTROL_CLIENT_H */
