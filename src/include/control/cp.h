/*-------------------------------------------------------------------------
 *
 * cp.h
 *	  The control plane's rules, written once over the store (store.h) and
 *	  its records (cpstate.h).  Each call reads the state, decides, and
 *	  writes its decision in one compare-and-set transaction, reading again
 *	  and deciding again when another writer got there first.  They run
 *	  wherever the store is reachable with authority: in the control-plane
 *	  database behind the felix.cp_* functions (embedded store, cp_sql.c),
 *	  or in a node's own processes (etcd, cpcall.c).
 *
 *	  Every refusal is an ereport(ERROR) with its SQLSTATE, naming the
 *	  stream, shard or node, and a hint.  A store that cannot be reached
 *	  is an error too (08006).
 *
 *	  cp_heartbeat.c  node registration and lease claims
 *	  cp_report.c     a leader's replica reports
 *	  cp_duty.c       the duty holder: failure detection, promotion
 *	  cp_streams.c    stream create/drop, transfer, replica move
 *	  cp_promote.c    an operator's promotion of an unplaced shard's copy
 *
 * Locking rule: none in shared memory.  duty.c keeps its observations in
 * the memory of the process running the duties.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_CP_H
#define FELIX_CONTROL_CP_H

#include "postgres.h"

#include "control/cpstate.h"
#include "nodes/pg_list.h"

/* ---- heartbeat ---- */

typedef struct CpHeartbeatArgs
{
	const char *node;
	const char *conninfo;		/* the node's address (masked here) */
	const char *incarnation;
	int64		starts;
	const char *boot;
	bool		unable_given;	/* false: unchanged since the last heartbeat */
	int			nunable;
	char	  **unable;
	int			lease_ms;		/* the lease the node holds itself to */
	bool		ends_given;		/* false: none known (e.g. a first beat) */
	bool		ends_unchanged; /* (ends not given) they are those it gave at
								 * the heartbeat of known_commit */
	int			nends;
	char	  **ends;			/* "stream/shard=next_seq" of the shards it
								 * was last told it leads */
	const char *peers;			/* JSON object peer -> "" | why unreachable; NULL: unchanged */
	const char *seen_store_id;	/* the store the node saw last (NULL: none) */
	int64		seen_revision;	/* ... and the highest revision it saw in it */
	/*
	 * What the node holds of the assignments: all of them as of
	 * known_state, told by the answer that committed at known_commit (0:
	 * nothing; the answer is then every assignment).
	 */
	int64		known_state;
	int64		known_commit;
} CpHeartbeatArgs;

/* One shard as a heartbeat tells it, with its stream's definition. */
typedef struct CpAssignment
{
	const CpShard *shard;
	const CpStream *stream;
	const char *leader_conninfo;	/* NULL when unknown */
	bool		lease_granted;	/* this call claimed the lease for the caller */
	int			lease_ms;
} CpAssignment;

typedef struct CpHeartbeatResult
{
	int			n;
	CpAssignment *rows;
	CpSnapshot *snap;			/* the state it decided on (palloc'd) */
	char	   *store_id;		/* the store's id */
	int64		revision;		/* the store's revision after this heartbeat */
	/*
	 * full: rows are every assignment, and the node forgets any other it
	 * holds.  Otherwise rows are those changed since known_state, and
	 * those whose lease this call claims, or no longer claims, unlike the
	 * one at known_commit: every other lease the node was last told it
	 * holds, this call claimed again.
	 */
	bool		full;
	int64		state_revision; /* the state the rows are of */
} CpHeartbeatResult;

extern void cp_heartbeat(const CpHeartbeatArgs *args, CpHeartbeatResult *out);

/*
 * A server whose heartbeat was refused because node `node` is alive as
 * another data directory records that it tried (clashes/<node>), so that
 * felix_nodes everywhere, and the log of the server holding the name, say
 * so.  Does nothing unless the control plane still knows `node` alive
 * under another incarnation than `incarnation`.
 */
extern void cp_name_clash(const char *node, const char *incarnation, const char *conninfo);

/* ---- reports ---- */

typedef struct CpReportRow
{
	char	   *stream;
	int			shard;
	int64		generation;
	char	   *follower;
	char	   *incarnation;
	int64		acked_end;
	bool		caught_up;
	char	   *halted;			/* NULL or a halt reason */
	int64		position;		/* -1: none */
} CpReportRow;

/* Parse felix.cp_report's JSON array; refuses a malformed one (22023). */
extern int	cp_report_parse(const char *leader, const char *json, CpReportRow **rows);

/* Returns how many rows were written (fewer: some shard moved on). */
extern int	cp_report(const char *leader, const CpReportRow *rows, int nrows,
					  int64 token, const char *incarnation);

/* ---- duties ---- */

/*
 * One round of the duties for node (this boot): hold or campaign for the
 * duty, and while holding it, detect lapsed leases and promote.  Returns
 * the shards given a new generation, or -1 when this node does not hold
 * the duty.
 */
/*
 * With the embedded store, felix.cp_tick notifies each grantee on this
 * channel (the payload is its name); heartbeat workers listen on it.
 */
#define CP_GRANTS_CHANNEL	"felix_grants"

typedef struct CpTick
{
	int			promoted;		/* shards given a new generation; -1: not the holder */
	int			lapse_in_ms;	/* the first watched lease lapses then; -1: none */
	List	   *grantees;		/* String nodes given a generation, each once */
} CpTick;

extern void cp_duty_tick(const char *node, const char *boot, CpTick *tick);

/* ---- streams and moves ---- */

typedef struct CpCreateArgs
{
	const char *name;
	const char *schema;
	int			shards;
	int			replication_factor;
	const char *consistency;
	const char *payload_type;
	const char *storage;
	bool		has_retention_bytes;
	int64		retention_bytes;
	bool		has_retention;
	int32		retention_months;
	int32		retention_days;
	int64		retention_usec;
	const char *caller;			/* the creating node (counted alive) */
	bool		lead_caller;	/* the caller leads every shard (a restore) */
} CpCreateArgs;

/* The checks of a creation's arguments (the same wherever it is asked). */
extern void cp_validate_create(const CpCreateArgs *args);
/* Returns the new stream's creation id. */
extern char *cp_create_stream(const CpCreateArgs *args);
extern void cp_drop_stream(const char *name, const char *creation_id, bool missing_ok);
extern int64 cp_transfer(const char *stream, int shard, int64 generation,
						 const char *from_node, const char *to_node);
extern char *cp_move_replica(const char *stream, int shard,
							 const char *from_node, const char *to_node);
extern void cp_remove_node(const char *node);

/* ---- an operator's promotion (cp_promote.c) ---- */

typedef struct CpPromoted
{
	int64		generation;		/* granted to the chosen node */
	int64		copy_end;		/* where its copy ends: the new acked_floor */
	char	   *may_lose;		/* what may be lost, NULL when nothing is known to be */
} CpPromoted;

/*
 * Grant the next generation of an unplaced shard to the copy on node;
 * refuses (55000) while another alive replica may hold more.
 */
extern CpPromoted cp_promote_copy(const char *stream, int shard, const char *node);

/* ---- listings (of a snapshot) ---- */

typedef struct CpNodeRow
{
	const CpNode *node;
	bool		alive;			/* in the duty holder's alive list */
	bool		duty;			/* runs the duties */
	const CpClash *clash;		/* the last server refused its name, or NULL */
} CpNodeRow;

typedef struct CpHaltRow
{
	const char *stream;
	int			shard;
	const char *node;			/* the halted follower */
	int64		generation;
	const char *leader;
	int64		position;		/* -1: none */
	const char *reason;
	int64		since_ms;
} CpHaltRow;

/* Every node, by name. */
extern int	cp_list_nodes(const CpSnapshot *snap, CpNodeRow **rows);
/* The part of the state cp_list_nodes needs, read alone. */
extern bool cp_read_for_nodes(CpSnapshot *snap, int elevel);
/* Every follower its shard's current leader reports halted at the current generation. */
extern int	cp_list_halted(const CpSnapshot *snap, CpHaltRow **rows);

/* Validation shared by the calls. */
extern void cp_check_node_name(const char *node);
extern bool cp_is_uuid(const char *s);

/* Placement score of a node for one shard (hashtext of node/stream/shard). */
extern int32 cp_score(const char *node, const char *stream, int shard);

#endif							/* FELIX_CONTROL_CP_H */
