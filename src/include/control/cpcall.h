/*-------------------------------------------------------------------------
 *
 * cpcall.h
 *	  Every call a node makes to the control plane, typed: the heartbeat
 *	  worker's (heartbeat, duties, node and halt lists), a backend's (create,
 *	  drop, transfer, move, remove a node) and the ship worker's (replica
 *	  reports).  With the embedded store each is a libpq call of a
 *	  felix.cp_* function on the control-plane database (client.c); with
 *	  etcd the same rule (cp.h) runs right here over the etcd store.
 *	  Either way a failure is reported at the caller's elevel with the
 *	  rule's SQLSTATE, message, detail and hint.  See cpcall.c.
 *
 * Locking rule: none; a session is private to the process that opened it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_CPCALL_H
#define FELIX_CONTROL_CPCALL_H

#include "postgres.h"

#include "core/catalog.h"
#include "control/halts.h"
#include "control/nodes.h"
#include "datatype/timestamp.h"
#include "libpq-fe.h"
#include "control/assignment.h"
#include "control/cp.h"

/*
 * What a heartbeat's answer is of: the state its rows are of, the store
 * revision it committed at, and whether its rows are every assignment
 * (full) or what changed since the state the node said it holds (cp.h,
 * CpHeartbeatResult).
 */
typedef struct FelixCpAnswer
{
	bool		full;
	int64		state_revision;
	int64		commit_revision;
} FelixCpAnswer;

/* Deadline for a backend's call to the control plane (connect + query). */
#define FELIX_CP_CALL_TIMEOUT_MS	10000
#define FELIX_CP_ABORT_TIMEOUT_MS	2000

/* A way to the control plane: a libpq connection (embedded) or none (etcd). */
typedef struct FelixCpSession
{
	PGconn	   *conn;
	int			timeout_ms;		/* per call */
	bool		warm;			/* a call that read the state has returned */
	uint32		ran;			/* statements run on conn (cpcall.c) */
	uint32		prepared;		/* ... and prepared there */
} FelixCpSession;

/* Open; false (reported at elevel) when the control plane cannot be reached. */
extern bool felix_cp_open(FelixCpSession *s, const char *application_name,
						  int timeout_ms, int elevel);
extern void felix_cp_close(FelixCpSession *s);
/* Can it take another call (or must it be opened again)? */
extern bool felix_cp_usable(FelixCpSession *s);

/* The SQLSTATE and message of the last failed call in this process. */
extern const char *felix_cp_last_sqlstate(void);
extern const char *felix_cp_last_error(void);

/* One shard as the heartbeat told it. */
typedef struct FelixCpShard
{
	char		stream[NAMEDATALEN];
	int			shard;
	FelixAssignment a;
	char	   *leader_conninfo;	/* untruncated, for the node directory */
	int			shards;
	int			replication_factor;
	char		consistency[NAMEDATALEN];
	char		payload_type[NAMEDATALEN];
	int64		retention_bytes;	/* 0: no limit */
	bool		has_retention;
	Interval	retention;
	char		schema[NAMEDATALEN];
	char		creation_id[FELIX_CREATION_ID_LEN];
	char	   *bad;			/* why the row is unusable, or NULL */
} FelixCpShard;

/*
 * Heartbeat for this node: register it, claim its leases (anchored at
 * *t_send, read just before the call leaves), and learn the shards.
 * unable: the shards it cannot serve ("stream/shard"), NULL: unchanged.
 * ends: its log ends ("stream/shard=next_seq") of the shards it was last
 * told it holds, NULL: none known yet, or (ends_unchanged, with known)
 * those it gave at the heartbeat of known.
 * peers: JSON object of what it sees of its peers, NULL: unchanged.
 * known: the answer whose rows, with those before it, the caller holds
 * (NULL: none; the rows are then every shard).  *answer says what the
 * rows are.  only_stream: the rows of that stream only (NULL: all), for a
 * caller that keeps no other -- the answer it was cut from is still what
 * *answer says.
 */
extern bool felix_cp_heartbeat(FelixCpSession *s, char **unable, int nunable,
							   char **ends, int nends, bool ends_unchanged, const char *peers,
							   const FelixCpAnswer *known, const char *only_stream, int64 *t_send,
							   FelixCpShard **rows, int *nrows, FelixCpAnswer *answer,
							   int elevel);

/*
 * One round of the duties (cp_duty_tick: promoted is -1 when this node does
 * not hold them, or the call failed).  Grantees are listed only with etcd:
 * with the embedded store the control plane wakes them.
 */
extern void felix_cp_duty_tick(FelixCpSession *s, int elevel, CpTick *tick);

/* Wakes of this node's heartbeat by the embedded control plane. */
extern bool felix_cp_listen_grants(FelixCpSession *s, int elevel);
extern pgsocket felix_cp_socket(FelixCpSession *s);
extern bool felix_cp_woken(FelixCpSession *s, const char *me);

/* The cluster's nodes and halted followers, for the caches the views read. */
extern bool felix_cp_nodes(FelixCpSession *s, FelixNodeInfo **nodes, int *n, int elevel);
/* After a heartbeat refused because another server holds this node's name:
 * tell the control plane this server tried (cp_name_clash). */
extern bool felix_cp_name_clash(FelixCpSession *s, int elevel);
extern bool felix_cp_halted(FelixCpSession *s, FelixHaltInfo **halts, int *n, int elevel);

/*
 * Replica reports (reports: felix.cp_report's JSON array), synchronously:
 * how many rows landed, -1 on failure (reported at elevel).  With etcd
 * the report worker makes it for the ship worker (worker/reporter.c);
 * with the embedded store the ship worker sends the same call without
 * waiting (replication/report.c).
 */
extern int	felix_cp_report(const char *reports, int64 token, int elevel);
#define FELIX_CP_REPORT_SQL	"SELECT felix.cp_report($1, $2, $3, $4)"

/*
 * Backend calls (ERROR on failure).  Creating registers the stream on the
 * caller's session s, which the caller's own heartbeat then uses to take
 * the new stream's leases (agent_apply_stream): the host reads the state
 * once for both.  It first registers this node (a heartbeat), so a stream
 * can be created before the heartbeat worker's first beat; it returns the
 * stream's creation id; with lead_here (a restore, which writes every
 * shard from here) this node leads every shard.  The other calls each use
 * a session of their own.  A drop forgets only the stream registered under
 * that name with that creation id.
 */
extern char *felix_cp_create_stream(FelixCpSession *s, const char *name, const char *schema,
									int shards, int replication_factor,
									const char *consistency,
									const char *payload_type,
									const char *storage,
									int64 retention_bytes,
									const char *retention,
									bool lead_here);
extern void felix_cp_drop_stream(const char *name, const char *creation_id);
/* As a transaction aborts: never raises; false (a WARNING) on failure. */
extern bool felix_cp_unregister_stream(const char *name, const char *creation_id);
/* On an open session: this node hands `generation` + 1 to to_node. */
extern uint64 felix_cp_transfer(FelixCpSession *s, const char *stream, int shard,
								uint64 generation, const char *to_node);
extern char *felix_cp_move_replica(const char *stream, int shard,
								   const char *from_node, const char *to_node);
extern void felix_cp_remove_node(const char *node);
/* cp_promote_copy, wherever the control plane is. */
extern CpPromoted felix_cp_promote_copy(const char *stream, int shard, const char *node);

#endif							/* FELIX_CONTROL_CPCALL_H */
