/*-------------------------------------------------------------------------
 *
 * client.h
 *	  felix's libpq client, usable from a background worker and from a
 *	  backend: connect and query with a deadline, waiting on the latch
 *	  (interrupts serviced, postmaster death noticed), remote errors
 *	  re-reported with their SQLSTATE, detail and hint at the caller's
 *	  level.  Also the calls a backend makes to the control plane.
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

/* Deadline for a backend's call to the control plane (connect + query). */
#define FELIX_CP_CALL_TIMEOUT_MS	10000
#define FELIX_CP_ABORT_TIMEOUT_MS	2000

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

/*
 * felix.cp_heartbeat's arguments for this node: its name, the address
 * part of felix.node_conninfo, its incarnation, start count and this
 * start's boot id, and the shards it cannot serve ("{stream/shard,...}";
 * NULL: unchanged since its last heartbeat).  values[] points into static
 * storage until the next call.
 */
#define FELIX_CP_HEARTBEAT_NARGS	6
#define FELIX_CP_HEARTBEAT_CALL		"felix.cp_heartbeat($1, $2, $3, $4, $5, $6)"
extern void felix_cp_heartbeat_args(const char *values[FELIX_CP_HEARTBEAT_NARGS],
									const char *unable);

/*
 * Make the remote session cancel any statement running longer than
 * timeout_ms (statement_timeout), so a call this side gave up on does not
 * keep running there.  false (reported at elevel) if that failed.
 */
extern bool felix_conn_set_statement_timeout(PGconn *conn, int timeout_ms, int elevel);

/*
 * Backend calls to the control plane (felix_cp_conninfo()): each opens a
 * connection, calls the function and closes it; the control plane's error
 * is raised here with its SQLSTATE, detail and hint.  retention_bytes < 0
 * and retention == NULL mean "none".  Creating first registers this node
 * (a heartbeat on the same connection), so a stream can be created the
 * moment the extension exists, before the heartbeat worker's first beat;
 * it returns the stream's creation id (a uuid's text).  A drop forgets
 * only the stream registered under that name with that creation id.
 */
extern char *felix_cp_call_create_stream(const char *name, const char *schema,
										 int shards, int replication_factor,
										 const char *consistency,
										 const char *payload_type,
										 const char *storage,
										 int64 retention_bytes,
										 const char *retention);
extern void felix_cp_call_drop_stream(const char *name, const char *creation_id);

/*
 * Connect to felix.node_conninfo and ask who answers: 1 this node (name
 * and incarnation), -1 another (a WARNING says which, once), 0 nobody
 * could be asked (connection failures reported at elevel).  The verdict
 * is kept for every process (felix_conninfo_verified).
 */
extern int	felix_verify_own_conninfo(int timeout_ms, int elevel);

/*
 * A connection to the control plane kept for a few calls (a planned
 * transfer opens it before it stops admitting, so the connection's setup
 * is not part of the window); close it with felix_conn_close.  Raises on
 * failure.
 */
extern PGconn *felix_cp_connect(int timeout_ms);

/*
 * Planned moves (api/operations.c).  A transfer, on `conn`: this node,
 * which led the shard at `generation` and has stopped writing, hands the
 * next generation to to_node; returns it.  A move: to_node joins the
 * shard's replica set to replace from_node; returns the replica set as
 * text.
 */
extern uint64 felix_cp_call_transfer(PGconn *conn, const char *stream, int shard,
									 uint64 generation, const char *to_node);
extern char *felix_cp_call_move_replica(const char *stream, int shard,
										const char *from_node, const char *to_node);

/*
 * Forget a stream this transaction registered, as it aborts: never raises
 * (a failure is a WARNING and false), and each step gives up after
 * FELIX_CP_ABORT_TIMEOUT_MS, since an abort must not hang on the network.
 */
extern bool felix_cp_call_unregister_stream(const char *name, const char *creation_id);

#endif							/* FELIX_CONTROL_CLIENT_H */
