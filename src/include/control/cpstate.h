/*-------------------------------------------------------------------------
 *
 * cpstate.h
 *	  The control plane's state as records in the store (store.h): what
 *	  each key holds, read from and written to JSON.  One record per key:
 *
 *	    nodes/<name>              a node: identity, address, what it cannot
 *	                              serve, its heartbeat count (CpNode)
 *	    claims/<name>             the leases it claims (CpNodeClaims)
 *	    ends/<name>               its log ends, as its boot last gave them
 *	                              (CpNodeEnds)
 *	    leads/<name>              bumped whenever a shard is taken from
 *	                              leader <name>: its heartbeat compares it
 *	    streams/<name>            a stream's definition (CpStream)
 *	    shards/<stream>/<NNNNNN>  a shard's assignment (CpShard)
 *	    reports/<stream>/<NNNNNN> its leader's reports on followers (CpReports)
 *	    duty                      the node running the duties (CpDuty)
 *	    alive                     the nodes the duty holder sees alive (CpAlive)
 *	    clashes/<name>            the last server refused the name <name>
 *	                              while another held it (CpClash)
 *	    addresses                 bumped when a node registers or moves
 *	    store_id                  the store's identity
 *
 *	  and the store layer's own, which say what changed: deletions and
 *	  marks/<section> (store.h).
 *
 *	  Times in records are the writer's wall clock in ms since the Unix
 *	  epoch and are shown, never compared across hosts: every decision
 *	  that depends on elapsed time is taken on one host's monotonic clock
 *	  (duty.c).  A record that does not parse is reported and treated as
 *	  absent, never guessed at.
 *
 * Locking rule: none; pure functions over palloc'd records.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_CPSTATE_H
#define FELIX_CONTROL_CPSTATE_H

#include "postgres.h"

#include "control/store.h"
#include "lib/stringinfo.h"

#define CP_MAX_REPLICAS		7	/* FELIX_MAX_REPLICAS (storage/shard.h) */

/* A lease a node claims at a heartbeat: this shard, at this generation. */
typedef struct CpClaim
{
	char	   *stream;
	int			shard;
	int64		generation;
	int			lease_ms;
} CpClaim;

typedef struct CpNode
{
	char	   *name;
	char	   *conninfo;		/* address only, secrets masked */
	char	   *incarnation;
	int64		starts;
	char	   *boot;
	int			nunable;
	char	  **unable;			/* "stream/shard" */
	int			nends;
	char	  **ends;			/* "stream/shard=next_seq": its log ends, this
								 * boot, of the shards it was told it leads */
	int			nclaims;
	CpClaim    *claims;
	int64		beat;			/* heartbeats of this boot */
	int64		ends_beat;		/* ... of them that gave log ends (ends
								 * read by the node's heartbeat worker) */
	/*
	 * The last earlier boot that took a generation still current when this
	 * boot began, and its heartbeat count then (NULL, 0: none): what a duty
	 * holder that never saw that boot's claims bounds its last claim by.
	 */
	char	   *prev_boot;
	int64		prev_beat;
	int64		registered_ms;
	int64		heartbeat_ms;
	char	   *peers;			/* JSON object: peer -> "" or why unreachable */
	int64		rev;			/* mod_revision as read (0: new) */
	/*
	 * ends and claims are not in the node's record: they are in keys of
	 * their own, rewritten only when they change (a record rewritten at
	 * every heartbeat stays small), and a snapshot joins them to the node.
	 * Their mod_revisions (0: no such key).
	 */
	int64		ends_rev;
	int64		claims_rev;
	/*
	 * unable, ends and claims by "stream/shard", built at the first lookup
	 * (cp_node_end and the others): they must not change after it.
	 */
	struct HTAB *unable_index;
	struct HTAB *ends_index;
	struct HTAB *claims_index;
} CpNode;

/* ends/<name>: the log ends a node's boot gave at its last heartbeat that gave them. */
typedef struct CpNodeEnds
{
	char	   *boot;
	int			nends;
	char	  **ends;
	int64		rev;
} CpNodeEnds;

/* claims/<name>: the leases a node claims, renewed by each write of its record. */
typedef struct CpNodeClaims
{
	int			nclaims;
	CpClaim    *claims;
	int64		rev;
} CpNodeClaims;

typedef struct CpStream
{
	char	   *name;
	char	   *schema;
	char	   *creation_id;
	int			shards;
	int			replication_factor;
	char	   *consistency;
	char	   *payload_type;
	char	   *storage;
	int64		retention_bytes;	/* -1: none */
	bool		has_retention;	/* an age limit: months, days, microseconds */
	int32		retention_months;
	int32		retention_days;
	int64		retention_usec;
	int64		created_ms;
	int64		rev;
} CpStream;

typedef struct CpShard
{
	char	   *stream;
	int			shard;
	int64		generation;
	char	   *leader;			/* the last leader while unplaced */
	char	   *leader_incarnation;
	int			nreplicas;
	char	   *replicas[CP_MAX_REPLICAS + 1];
	char	   *joining;		/* NULL unless a replica move is under way */
	char	   *leaving;
	int64		taken_generation;	/* newest generation whose lease was taken */
	char	   *taken_boot;		/* ... by this boot of its leader */
	char	   *unplaced_reason;
	int64		assigned_ms;

	/*
	 * A leader of this shard must hold at least this much of the log: the
	 * acknowledged end its last promotion was based on (the promoted
	 * follower's report, or the reports a returning leader was checked
	 * against).  Reports are replaced as a new leader makes its own, and
	 * its first ones may say its followers hold nothing yet; this stays.
	 */
	int64		acked_floor;

	/*
	 * The grantee's log end, as its heartbeat of the boot then current gave
	 * it, when this generation was granted (0: unknown, or granted at
	 * creation).  Its first claim needs a log at least this long as well:
	 * acked_floor can trail what was acknowledged, and a copy put back
	 * between the grant and the claim must not take the generation.  Kept
	 * apart from acked_floor, which a later promotion carries over: a
	 * grantee's end may include a tail nobody acknowledged.
	 */
	int64		grant_end;
	int64		grant_last_generation;	/* ... and the generation of its last
										 * record then (-1: unknown) */

	/*
	 * Of the generation taken (taken_generation), as the heartbeat that
	 * took it gave them: the leader's log then (its end and the generation
	 * of its last record; -1: not given), and the token (CpCopy) of each
	 * replica's copy then, for the replicas that had given one.  The duty
	 * holder's promotion by log (cp_duty.c, copies_candidate) counts only
	 * copies whose token is still the same.
	 */
	int64		taken_end;
	int64		taken_last_generation;
	int			ntaken_copies;
	char	   *taken_copy_node[CP_MAX_REPLICAS + 1];
	char	   *taken_copy_token[CP_MAX_REPLICAS + 1];
	int64		rev;
} CpShard;

typedef struct CpReport
{
	char	   *follower;
	char	   *incarnation;	/* the follower's copy it speaks of */
	int64		generation;
	char	   *leader;
	int64		acked_end;
	bool		caught_up;
	char	   *halted;			/* NULL, or diverged | needs_bootstrap | ... */
	int64		halted_since_ms;
	int64		position;		/* -1: none */
	int64		token;			/* 0: none (a hand-made report) */
	int64		leader_beat;	/* the reporter's heartbeat count when made */
	int64		reported_ms;
} CpReport;

typedef struct CpReports
{
	int			n;
	CpReport	rows[CP_MAX_REPLICAS + 1];
	int64		rev;
} CpReports;

typedef struct CpDuty
{
	char	   *node;
	char	   *boot;
	int64		beat;			/* refreshes since it took over */
	int64		since_ms;
	int64		rev;
} CpDuty;

typedef struct CpAlive
{
	int			n;
	char	  **nodes;
	int64		rev;
} CpAlive;

/*
 * A second server that asked to be node `node` while the control plane
 * knew that node, alive, as another felix data directory: written by the
 * refused server (cp_name_clash), shown by every node's felix_nodes and
 * logged by the node that holds the name.  Never read by any rule.
 */
typedef struct CpClash
{
	char	   *node;
	char	   *incarnation;	/* the refused server's data directory */
	char	   *conninfo;		/* ... and its address (masked) */
	int64		at_ms;
} CpClash;

/* Keys. */
extern char *cp_key_node(const char *name);
extern char *cp_key_clash(const char *name);
extern char *cp_key_leads(const char *name);
extern char *cp_key_ends(const char *name);
extern char *cp_key_claims(const char *name);
extern char *cp_key_stream(const char *name);
extern char *cp_key_shard(const char *stream, int shard);
extern char *cp_key_reports(const char *stream, int shard);
#define CP_KEY_DUTY		"duty"
#define CP_KEY_ALIVE	"alive"
#define CP_KEY_STORE_ID	"store_id"	/* {"id": uuid}: this store, written once */
/* Rewritten whenever a node registers or changes its address. */
#define CP_KEY_ADDRESSES	"addresses"

/* Records from a key's value (false: malformed, logged at LOG). */
extern bool cp_node_read(const FelixKV *kv, CpNode *out);
extern bool cp_stream_read(const FelixKV *kv, CpStream *out);
extern bool cp_shard_read(const FelixKV *kv, CpShard *out);
extern bool cp_reports_read(const FelixKV *kv, CpReports *out);
extern bool cp_duty_read(const FelixKV *kv, CpDuty *out);
extern bool cp_alive_read(const FelixKV *kv, CpAlive *out);
extern bool cp_clash_read(const FelixKV *kv, CpClash *out);
extern bool cp_store_id_read(const FelixKV *kv, char **id);
extern bool cp_ends_read(const FelixKV *kv, CpNodeEnds *out);
extern bool cp_claims_read(const FelixKV *kv, CpNodeClaims *out);

/* ... and back (palloc'd JSON). */
extern char *cp_node_write(const CpNode *n);
extern char *cp_stream_write(const CpStream *s);
extern char *cp_shard_write(const CpShard *s);
extern char *cp_reports_write(const CpReports *r);
extern char *cp_duty_write(const CpDuty *d);
extern char *cp_alive_write(const CpAlive *a);
extern char *cp_store_id_write(const char *id);
extern char *cp_clash_write(const CpClash *c);
extern const char *cp_leads_value(void);
extern char *cp_ends_write(const char *boot, char *const *ends, int nends);
extern char *cp_claims_write(const CpClaim *claims, int nclaims);
extern bool cp_ends_equal(char *const *a, int na, char *const *b, int nb);
extern bool cp_claims_equal(const CpClaim *a, int na, const CpClaim *b, int nb);
/* Lookup tables of a node's ends and claims (in CurrentMemoryContext). */
extern struct HTAB *cp_ends_index(char *const *ends, int nends);
extern struct HTAB *cp_claims_index(const CpClaim *claims, int nclaims);

/* Helpers over records. */
extern bool cp_shard_has_replica(const CpShard *s, const char *node);
extern bool cp_node_unable(const CpNode *n, const char *stream, int shard);
/*
 * The incarnation named by state migrated from felix 1.0, which had none
 * (the nil uuid): a shard's leader granted then, and the followers its
 * reports speak of.  Such a leader may be any incarnation of its node,
 * provided its log holds what its reports say (cp_duty.c); such a report
 * qualifies no follower.
 */
#define CP_INCARNATION_UNKNOWN	"00000000-0000-0000-0000-000000000000"

/* The log end n last gave for (stream, shard) in this boot; -1 if none. */
extern int64 cp_node_end(const CpNode *n, const char *stream, int shard);

/*
 * A node's copy of a shard, as its heartbeat of this boot gave it with
 * the generation of its last record and its copy epoch
 * (agent_held_ends).  token is "<boot>#<copy epoch>": while a node's
 * token for a shard stays the same, its log there has lost nothing.
 * first_token is "<boot>#0" while that epoch is the copy's first in the
 * boot (else NULL): a copy that never began again since the boot started
 * has lost nothing it stored in that boot.
 */
typedef struct CpCopy
{
	int64		end;
	int64		last_generation;
	char	   *token;
	char	   *first_token;
} CpCopy;
extern bool cp_node_copy(const CpNode *n, const char *stream, int shard, CpCopy *copy);
/* "<boot>#0" of n's current boot: any copy's first epoch in it */
extern char *cp_first_copy_token(const CpNode *n);
/* Is copy the one a recorded token names (the same, or a first one)? */
extern bool cp_copy_kept(const CpCopy *copy, const char *token);
/* the generation of the copy's last record (-1: not given) */
extern int64 cp_node_last_generation(const CpNode *n, const char *stream, int shard);
extern const CpClaim *cp_node_claim(const CpNode *n, const char *stream, int shard);
extern bool cp_alive_has(const CpAlive *a, const char *node);
extern int64 cp_now_ms(void);
/* A new random uuid, as text (a stream's creation id, the store's id). */
extern char *cp_new_uuid(void);
/* How many times a rule retries a store transaction that met a conflict. */
#define CP_MAX_ATTEMPTS	32
/* After a lost compare-and-set (etcd): wait a few random ms, interruptibly. */
extern void cp_backoff(int attempt);

/* Every record under the store, read at once (one revision). */
typedef struct CpSnapshot
{
	int64		revision;
	int			nnodes;
	CpNode	   *nodes;
	int			nstreams;
	CpStream   *streams;
	int			nshards;
	CpShard    *shards;
	int			nreports;
	/*
	 * reports[i] of (report_stream[i], report_shard[i]): the records
	 * themselves, shared with this process's copy of the state (or the
	 * uncached read that made the snapshot), never copied -- a report is
	 * the largest record and most reads use few of them -- so they are
	 * read-only; a writer changes a copy of its own.
	 */
	const CpReports **reports;
	char	  **report_stream;
	int		   *report_shard;
	bool		have_duty;
	CpDuty		duty;
	bool		have_alive;
	CpAlive		alive;
	int			nleads;
	char	  **leads_node;
	int64	   *leads_rev;
	int			nclashes;
	CpClash    *clashes;
	char	   *store_id;		/* NULL: the store has none yet */
	int64		addresses_rev;	/* CP_KEY_ADDRESSES's mod_revision (0: none) */
	int64		deletions_rev;	/* FELIX_STORE_KEY_DELETIONS's (0: none) */
	struct HTAB *index;			/* nodes, streams, shards and reports by name */
	struct CpShardOrder *shard_order;	/* cp_snapshot_led_by, ..._since
										 * (NULL: to build) */
} CpSnapshot;

/*
 * The whole state, as of one revision; false (reported at elevel) if a
 * read failed.  guarded: a compare-and-set checks whatever is decided on
 * it (felix_store_range_guarded).  The process keeps a decoded copy of the
 * state and asks the store only for what changed since (cpstate.c); the
 * snapshot's strings and arrays are that copy's, valid until the next
 * cp_snapshot_quiesce, and never to be written to.
 */
extern bool cp_snapshot_read(CpSnapshot *snap, bool guarded, int elevel);
/*
 * The same for node's heartbeat, except that the other nodes' log ends
 * (their ends/ keys) may be those of an earlier read: the rule reads them
 * again, with cp_snapshot_read, only when it takes a generation.
 */
extern bool cp_snapshot_read_for_heartbeat(CpSnapshot *snap, const char *node, int elevel);

/*
 * A background worker that reads snapshots calls cp_snapshot_cache_enable
 * once, and cp_snapshot_quiesce whenever it holds no snapshot (the top of
 * its loop); without it, it reads the whole state every time.  A backend
 * keeps the copy on its own and quiesces at the end of each transaction.
 */
extern void cp_snapshot_cache_enable(void);
extern void cp_snapshot_quiesce(void);
/*
 * The next read reads everything again: the store was found put back
 * from an older copy, and what this process holds may mix its lines.
 */
extern void cp_snapshot_forget(void);
/*
 * The guard against keys changed outside felix, called by the duty holder
 * at every tick: every felix.store_guard_interval (sooner after a failed
 * try) it reads the whole state again, one page of keys per call, and
 * returns how many keys of the page this process's copy had missed --
 * written or deleted without felix's marks, so that no read of what
 * changed shows them.  0 when no pass is under way, when a read failed
 * (reported at elevel), or when the copy was cold.
 */
extern int	cp_snapshot_guard(int elevel);
/*
 * felix_store_serialize, with this process's copy of the state brought up
 * to date before (not while) the embedded store's lock is held.
 */
extern void cp_serialize(void);
/* Attempt `attempt` of a rule: back off (after the first), serialize, read it all. */
extern void cp_snapshot_read_attempt(CpSnapshot *snap, int attempt);
/*
 * The keys under each of prefixes (a prefix may be a whole key, as
 * CP_KEY_DUTY), the rest of the snapshot empty: for a call that needs a
 * part of the state only.  Each prefix is its own read, so the parts need
 * not be of one revision (revision is the newest).
 */
extern bool cp_snapshot_read_parts(CpSnapshot *snap, const char *const *prefixes,
								   int nprefixes, int elevel);

extern CpNode *cp_snapshot_node(const CpSnapshot *snap, const char *name);
extern CpStream *cp_snapshot_stream(const CpSnapshot *snap, const char *name);
extern CpShard *cp_snapshot_shard(const CpSnapshot *snap, const char *stream, int shard);
extern const CpReports *cp_snapshot_reports(const CpSnapshot *snap, const char *stream, int shard);
extern int64 cp_snapshot_leads_rev(const CpSnapshot *snap, const char *node);
/*
 * The places in snap->shards of the shards `node` is the leader of, in
 * that order (*n of them); and of the shards written after revision
 * `since`, newest first.  Built once per state of the shards -- kept with
 * this process's copy until a shard record changes -- so a heartbeat with
 * nothing to say costs what the node leads, not what the cluster holds.
 */
extern const int *cp_snapshot_led_by(const CpSnapshot *snap, const char *node, int *n);
extern const int *cp_snapshot_shards_since(const CpSnapshot *snap, int64 since, int *n);
/* The stream of the shard at snap->shards[place]; NULL if it has none. */
extern CpStream *cp_snapshot_stream_at(const CpSnapshot *snap, int place);
extern CpClash *cp_snapshot_clash(const CpSnapshot *snap, const char *node);

#endif							/* FELIX_CONTROL_CPSTATE_H */
