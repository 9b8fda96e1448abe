/*-------------------------------------------------------------------------
 *
 * ship.c
 *	  The ship worker ("felix ship"): the leader's side of log shipping.
 *
 *	  Every pass of its loop it looks at each shard slot.  For a shard led
 *	  here with replication_factor > 1 it keeps one cursor per follower
 *	  (state.c) and, for every follower still shipping, sends the whole
 *	  batches from the cursor's batch towards the written end -- at most
 *	  FELIX_SHIP_MAX_BYTES per request -- as
 *	    SELECT status, seq FROM felix.replicate(stream, shard, generation,
 *	                                            from_seq, leader_hwm_end, batches)
 *	  (prepared once per connection) over one libpq connection per peer
 *	  node; each follower's next read starts where its last one stopped
 *	  (FelixLogPos) rather than seeking through the index.  Connections are
 *	  non-blocking and in pipeline mode, so one peer has requests for many
 *	  shards in flight and all peers are served at once; the worker waits
 *	  on its latch (set by publishers after each append) and every socket
 *	  in one WaitEventSet.  One request per (shard, follower) is in flight
 *	  at a time, and the cursor moves only on the follower's answer:
 *	    stored(end)   acked_end = cursor = end
 *	    gap(tail)     cursor = tail - 1 (the follower lacks what came before,
 *	                  or the shipment began at its tail after a record of
 *	                  another generation: its last record is shipped
 *	                  again, to be compared)
 *	    conflict(seq) the follower halts: its log differs from ours
 *	    fenced(tail)  the follower halts: it is at a newer generation
 *	  A follower that has fallen behind is thereby caught up by its own
 *	  gap answer, with nothing kept on disk.
 *
 *	  A cursor is a belief about one leadership, so a new generation
 *	  starts every cursor afresh: one record below where the generation
 *	  began (the generation map), so the first shipment overlaps what the
 *	  follower already holds and the boundary is compared, not assumed.
 *
 *	  Quorum marks and replica reports are report.c's; this file calls
 *	  report_tick once per pass after the answers it received.
 *
 *	  Which slots a pass looks at: a pass woken by a publisher or by
 *	  answers looks only at the slots with new work -- those marked in
 *	  shared memory (repl_ship_due: new records, a new durable end, a new
 *	  leadership, a rebuild asked for) and those whose answers it applied
 *	  or whose follower state it changed.  A full pass, when one of the
 *	  worker's timers is due, a report request has ended, a peer
 *	  connection has opened, or a heartbeat interval has passed since the
 *	  last, adds every slot it ships from -- but a quiet one: every
 *	  follower had acknowledged the whole log and heard its mark, nothing
 *	  was in flight or waiting to be retried, no connection has opened or
 *	  closed nor node identity changed since, and report.c has nothing for
 *	  it but the periodic refresh of a quorum shard's report
 *	  (report_settled).  A new record, a new durable end or an answer
 *	  marks it again.  At thousands of idle shards, looking at each one
 *	  five times a second was most of what this worker cost; the sweeps
 *	  still look at it, so its report refresh comes at most a sweep late.
 *	  A sweep looks at every slot,
 *	  led here or not: the first pass, and every FELIX_SHIP_SWEEP_INTERVALS
 *	  intervals (a shard becomes led here only through lease.c, which marks
 *	  it; the sweep is the backstop).  At thousands of shards a sweep costs
 *	  milliseconds, and a busy worker used to make one per wake-up.
 *
 *	  Failures of peers (refused, slow, gone, erroring) are logged once and
 *	  retried with backoff; they never end the worker.  A local error
 *	  (reading the log) is caught, logged, and retried on a later pass.
 *
 * Locking rule: shard fields are read under the shard's spinlock, follower
 * state under its entry's spinlock (state.h), never both at once; the log
 * is read without a lock below the written end taken from shared state
 * (see log.h).  Connections and in-flight requests are this process's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "control/conninfo.h"
#include "control/nodes.h"
#include "base/wake.h"
#include "felix.h"
#include "base/isolate.h"
#include "libpq-fe.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "base/privilege.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/lease.h"
#include "replication/report.h"
#include "replication/rules.h"
#include "replication/ship.h"
#include "replication/state.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/log.h"
#include "storage/shard.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* felix.ship_max_bytes: the most one request carries (whole batches). */
#define FELIX_SHIP_MAX_BYTES		(1024 * 1024)
/* Bytes a peer may have in flight before more are held back. */
#define FELIX_SHIP_PEER_MAX_BYTES	(8 * FELIX_SHIP_MAX_BYTES)
/* A request unanswered this long means the peer is stuck: reconnect. */
#define FELIX_SHIP_ANSWER_TIMEOUT_MS	10000
/* After an error answer, wait this long before shipping to it again ... */
#define FELIX_SHIP_RETRY_MS			500
/*
 * ... but only this long when the follower has yet to learn our generation,
 * twice as long after each such refusal in a row, and never longer than a
 * heartbeat interval: it learns within one heartbeat, and a failover that
 * moves hundreds of shards at once does not make their followers refuse
 * (and log) thousands of shipments a second.
 */
#define FELIX_SHIP_RETRY_SOON_MS	20
/* Every slot is looked at, led here or not, every this many intervals. */
#define FELIX_SHIP_SWEEP_INTERVALS	10
/* The rebuild policy runs at most this often (and only while wanted). */
#define FELIX_REBUILD_POLICY_MS		50
/* Close a peer connection no shard has shipped to, idle or not, for this long. */
#define FELIX_SHIP_IDLE_CLOSE_MS	60000

/* Prepared once per connection: the follower parses and plans it once. */
static const char *const replicate_sql =
"SELECT status, seq FROM felix.replicate($1, $2, $3, $4, $5, $6, $7, $8, $9)";
static const char *const replicate_stmt = "felix_replicate";
#define REPLICATE_NPARAMS	9
static const Oid replicate_types[REPLICATE_NPARAMS] = {TEXTOID, INT4OID, INT8OID, TEXTOID,
TEXTOID, TEXTOID, INT8OID, INT8OID, BYTEAOID};

/* One request in a peer's pipeline, oldest first. */
typedef struct ShipRequest
{
	bool		prepare;		/* preparing replicate_stmt, not a shipment */
	int			slot;
	FelixShardKey key;
	uint64		generation;
	int			fidx;			/* follower index in the entry */
	char		follower[NAMEDATALEN];
	ReplicateOp op;
	bool		probe;			/* an empty shipment: does it take this generation? */
	uint64		from_seq;
	uint64		sent_end;		/* end of the batches sent */
	uint64		hwm_sent;		/* leader_hwm_end sent with it */
	uint64		serial;			/* the connection it was sent on */
	Size		bytes;
	int64		sent_ns;
	/* the answer, as it arrives */
	bool		have_answer;
	bool		failed;
	char		status[16];
	uint64		seq;
	char		error[FELIX_REPL_ERROR_LEN];
	char		sqlstate[6];	/* of an error answer, "" if none */
	char		detail[256];	/* ... and its detail and hint, "" if none */
	char		hint[256];
} ShipRequest;

typedef struct Peer
{
	bool		used;
	char		name[NAMEDATALEN];
	FelixAsyncConn ac;
	uint64		prepared_serial;	/* ac.serial replicate_stmt was prepared on */
	ShipRequest *reqs;			/* FIFO: [head, nreqs) */
	int			head;
	int			nreqs;
	int			cap;
	Size		bytes_in_flight;
	int64		last_needed_ns;
} Peer;

/* Per slot: what the worker itself remembers besides the shared entry. */
typedef struct ShipSlot
{
	bool		active;
	FelixShardKey key;
	uint64		generation;
	bool		in_flight[FELIX_MAX_REPLICAS];
	uint64		in_flight_end[FELIX_MAX_REPLICAS];	/* what it carries, and */
	int64		in_flight_ns[FELIX_MAX_REPLICAS];	/* when it left */
	int64		retry_at_ns[FELIX_MAX_REPLICAS];
	int			unknown_in_row[FELIX_MAX_REPLICAS]; /* refusals: generation
													 * not learned yet */
	uint64		hwm_sent[FELIX_MAX_REPLICAS];
	uint64		conn_serial[FELIX_MAX_REPLICAS];	/* connection the mark was
													 * taken on (0: none) */
	uint64		answered_serial[FELIX_MAX_REPLICAS];	/* connection of its
														 * last believed answer */
	bool		discarded[FELIX_MAX_REPLICAS];	/* REBUILDING: the follower
												 * answered 'rebuilt' */
	bool		probed[FELIX_MAX_REPLICAS]; /* the follower took a shipment of
											 * this generation (see ship_follower) */
	uint64		ident_seen[FELIX_MAX_REPLICAS]; /* felix_nodes_identities()
												 * when its incarnation and
												 * address were looked up
												 * (0: to look up) */
	Peer	   *peer[FELIX_MAX_REPLICAS];	/* its connection, last looked up
											 * (checked by name before use) */
	FelixLogPos read_pos[FELIX_MAX_REPLICAS];	/* where the last read stopped */
	uint64		generation_start;	/* first seq of this leadership */
	bool		problem_logged;
	/*
	 * Quiet: at its last look every follower had acknowledged the whole
	 * log and heard its mark, with nothing in flight or to retry, under
	 * these connections (async epoch) and node identities.  See the
	 * header's "Which slots a pass looks at".
	 */
	bool		quiet;
	uint64		quiet_epoch;
	uint64		quiet_identities;
} ShipSlot;

/* A shard as the worker sees it this pass (read under its spinlock). */
typedef struct ShardSnap
{
	FelixShardKey key;
	char		stream_name[NAMEDATALEN];
	uint64		generation;
	uint64		start_seq;
	uint64		written_end;
	uint64		hwm_end;
	int			nfollowers;
	char		followers[FELIX_MAX_REPLICAS][NAMEDATALEN];
} ShardSnap;

static Peer peers[FELIX_MAX_NODES];
static ShipSlot *ship_slots = NULL;
static int	ship_nslots = 0;
static MemoryContext pass_cxt = NULL;

/* The next pass's slots with new work, each once (see the header). */
static int *due_slots = NULL;
static int *due_taken = NULL;	/* repl_ship_take_due's answer */
static bool *due_listed = NULL;
static int	ndue = 0;
static bool full_wanted = false;	/* the next pass is a full one */
static int64 last_full_ns = 0;
static bool sweep_wanted = true;	/* the next pass is a sweep */
/* rebuild_policy has followers to look at (see there) */
static bool policy_wanted = true;
static int64 last_sweep_ns = 0;
static int64 timers_ns = 0;		/* the earliest timer at the last wait */

/*
 * No slot's retry_at_ns is earlier than this, unless it has passed: every
 * retry is set through set_retry, which lowers it; wait_timeout looks at
 * every slot again only once it has passed.  (A retry cleared before its
 * time leaves it early: one wake-up too many, never one too few.)  Under
 * load the worker waits after almost every publish, and a look at every
 * slot's retries each time was most of its CPU at 3,000 shards.
 */
static int64 retry_min_ns = PG_INT64_MAX;

static void
set_retry(ShipSlot *ss, int fidx, int64 at_ns)
{
	ss->retry_at_ns[fidx] = at_ns;
	retry_min_ns = Min(retry_min_ns, at_ns);
}

/*
 * The wait set outlives a pass: it is rebuilt only when the sockets or
 * the events wanted on them change.  felix_async_epoch() moves whenever a
 * connection opens or closes (a new socket may reuse an old number).
 */
typedef struct WaitSpec
{
	pgsocket	sock;
	uint32		events;
	void	   *tag;
} WaitSpec;

static WaitEventSet *wait_set = NULL;
static WaitSpec wait_specs[FELIX_MAX_NODES + 1];
static int	nwait_specs = 0;
static uint64 wait_set_epoch = 0;

/* Look at this slot in the next pass, full or not. */
static void
note_due(int slot)
{
	if (slot < 0 || slot >= ship_nslots || due_listed[slot])
		return;
	due_listed[slot] = true;
	due_slots[ndue++] = slot;
}

/* ---------------------------------------------------------------------
 * Peers
 * ---------------------------------------------------------------------
 */
static bool
key_equal(const FelixShardKey *a, const FelixShardKey *b)
{
	return a->dboid == b->dboid && a->relid == b->relid && a->shard == b->shard;
}

/* The slot's worker-local state, if it still describes key at generation. */
static ShipSlot *
ship_slot_for(int slot, const FelixShardKey *key, uint64 generation)
{
	ShipSlot   *ss;

	if (slot < 0 || slot >= ship_nslots)
		return NULL;
	ss = &ship_slots[slot];
	if (!ss->active || ss->generation != generation || !key_equal(&ss->key, key))
		return NULL;
	return ss;
}

int64
ship_in_flight_since(int slot, const FelixShardKey *key, uint64 generation,
					 int fidx, uint64 end, bool *carries)
{
	ShipSlot   *ss = ship_slot_for(slot, key, generation);

	*carries = false;
	if (ss == NULL || fidx < 0 || fidx >= FELIX_MAX_REPLICAS ||
		!ss->in_flight[fidx])
		return 0;
	*carries = ss->in_flight_end[fidx] >= end;
	return ss->in_flight_ns[fidx];
}

/* Forget every request of the peer: the connection they rode is gone. */
static void
peer_drop_requests(Peer *p)
{
	for (int i = p->head; i < p->nreqs; i++)
	{
		ShipRequest *r = &p->reqs[i];
		ShipSlot   *ss = ship_slot_for(r->slot, &r->key, r->generation);

		if (ss != NULL)
			ss->in_flight[r->fidx] = false;
	}
	p->head = p->nreqs = 0;
	p->bytes_in_flight = 0;
}

static void
peer_fail(Peer *p, const char *problem, int64 now_ns)
{
	peer_drop_requests(p);
	async_fail(&p->ac, problem, now_ns);
}

static void
peer_close(Peer *p)
{
	peer_drop_requests(p);
	async_close(&p->ac);
}

/*
 * The peer for node `name`, with its conninfo refreshed from the node
 * directory (a changed conninfo means a new connection).  NULL when the
 * directory does not know the node yet or every peer slot is taken.
 */
static Peer *
peer_get(const char *name, int64 now_ns)
{
	char		address[FELIX_ASYNC_CONNINFO_LEN];
	char		conninfo[FELIX_ASYNC_CONNINFO_LEN];
	Peer	   *p = NULL;
	Peer	   *free_peer = NULL;

	if (!felix_node_conninfo_of(name, address, sizeof(address)))
		return NULL;
	/* the peer's address, this node's own credentials (conninfo.c) */
	strlcpy(conninfo, felix_peer_conninfo(address), sizeof(conninfo));
	for (int i = 0; i < FELIX_MAX_NODES; i++)
	{
		if (peers[i].used && strcmp(peers[i].name, name) == 0)
		{
			p = &peers[i];
			break;
		}
		if (!peers[i].used && free_peer == NULL)
			free_peer = &peers[i];
	}
	if (p == NULL)
	{
		char		what[NAMEDATALEN + 32];

		if (free_peer == NULL)
			return NULL;
		p = free_peer;
		memset(p, 0, sizeof(Peer));
		p->used = true;
		strlcpy(p->name, name, NAMEDATALEN);
		snprintf(what, sizeof(what), "node \"%s\"", name);
		async_init(&p->ac, what, true);
	}
	if (strcmp(p->ac.conninfo, conninfo) != 0)
	{
		if (p->ac.state != FELIX_ASYNC_DOWN)
			peer_close(p);
		strlcpy(p->ac.conninfo, conninfo, sizeof(p->ac.conninfo));
		p->ac.next_attempt_ns = 0;
		p->ac.backoff_ms = FELIX_ASYNC_BACKOFF_MIN_MS;
	}
	p->last_needed_ns = now_ns;
	async_begin(&p->ac, now_ns);
	return p;
}

static ShipRequest *
peer_push(Peer *p)
{
	if (p->head > 0 && p->head == p->nreqs)
		p->head = p->nreqs = 0;
	if (p->nreqs == p->cap)
	{
		if (p->head > 0)
		{
			memmove(p->reqs, p->reqs + p->head,
					(p->nreqs - p->head) * sizeof(ShipRequest));
			p->nreqs -= p->head;
			p->head = 0;
		}
		if (p->nreqs == p->cap)
		{
			p->cap = p->cap == 0 ? 16 : p->cap * 2;
			p->reqs = p->reqs == NULL ?
				MemoryContextAlloc(TopMemoryContext, p->cap * sizeof(ShipRequest)) :
				repalloc(p->reqs, p->cap * sizeof(ShipRequest));
		}
	}
	memset(&p->reqs[p->nreqs], 0, sizeof(ShipRequest));
	return &p->reqs[p->nreqs++];
}

/* ---------------------------------------------------------------------
 * Local reads, each inside a transaction so that an error is contained
 * ---------------------------------------------------------------------
 */

/*
 * Run fn(arg) inside a transaction; on error, log nothing, put the
 * message into err and abort, leaving the worker ready for the next call.
 */
static bool
ship_local(void (*fn) (void *), void *arg, char *err, Size errlen)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool ok = true;

	if (!IsTransactionState())
		StartTransactionCommand();
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		fn(arg);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortOutOfAnyTransaction();
		MemoryContextSwitchTo(cxt);
		strlcpy(err, edata->message, errlen);
		FreeErrorData(edata);
		RESUME_INTERRUPTS();
		ok = false;
	}
	PG_END_TRY();
	return ok;
}

typedef struct FreshCursorArg
{
	const char *dir;
	const char *what;
	uint64		generation;
	uint64		cursor;
	uint64		start;			/* where the generation began (0: unknown) */
} FreshCursorArg;

/*
 * Where shipping starts at a generation: the batch holding the record just
 * below the generation's first (from the generation map), so the first
 * shipment overlaps what the follower should already hold; 0 without an
 * entry for the generation (slow, not wrong: the whole log is compared).
 */
static void
fresh_cursor_fn(void *varg)
{
	FreshCursorArg *a = (FreshCursorArg *) varg;
	FelixGenEntry *entries;
	int			n = genmap_load(a->dir, a->what, &entries);

	a->cursor = a->start = 0;
	for (int i = n - 1; i >= 0; i--)
	{
		if (entries[i].generation == a->generation)
		{
			a->start = entries[i].first_seq;
			a->cursor = entries[i].first_seq > 0 ? entries[i].first_seq - 1 : 0;
			break;
		}
	}
	pfree(entries);
}

typedef struct ReadArg
{
	const char *dir;
	const char *what;
	uint64		from;
	uint64		end;
	Size		max_bytes;
	StringInfo	out;
	FelixLogPos *pos;
	uint64		next;
} ReadArg;

static void
read_fn(void *varg)
{
	ReadArg    *a = (ReadArg *) varg;

	a->next = log_read_range(a->dir, a->what, a->from, a->end,
							 a->max_bytes, a->out, a->pos);
}

/* ---------------------------------------------------------------------
 * Shipping
 * ---------------------------------------------------------------------
 */

/* Read the shard (one snapshot); false unless it is led here with followers. */
static bool
shard_snapshot(FelixShard *s, ShardSnap *snap)
{
	FelixShardPositions pos;
	FelixShardView v;

	/* the few fields first: most slots are not led here with followers */
	shard_read_positions(s, &pos);
	if (!pos.in_use || pos.phase != FELIX_SHARD_OPEN || pos.role != FELIX_ROLE_LEADER ||
		pos.replication_factor <= 1)
		return false;
	shard_read(s, &v);
	if (!v.in_use || v.phase != FELIX_SHARD_OPEN || v.role != FELIX_ROLE_LEADER ||
		v.replication_factor <= 1 || !v.clustered)
		return false;
	snap->key = v.key;
	strlcpy(snap->stream_name, v.stream_name, NAMEDATALEN);
	snap->generation = v.generation;
	snap->start_seq = v.start_seq;
	snap->written_end = v.written_end;
	snap->hwm_end = v.hwm_end;
	snap->nfollowers = 0;
	for (int i = 0; i < Min(v.nreplicas, FELIX_MAX_REPLICAS); i++)
	{
		if (v.replicas[i][0] == '\0' || felix_is_this_node(v.replicas[i]))
			continue;
		strlcpy(snap->followers[snap->nfollowers++], v.replicas[i], NAMEDATALEN);
	}
	return snap->nfollowers > 0;
}

static bool
same_followers(const FelixReplShard *e, const ShardSnap *snap)
{
	if (e->nfollowers != snap->nfollowers)
		return false;
	for (int i = 0; i < e->nfollowers; i++)
		if (strcmp(e->followers[i].name, snap->followers[i]) != 0)
			return false;
	return true;
}

static void
follower_note_error(int slot, int fidx, FelixFollower *f, const char *msg,
					const ShardSnap *snap, bool quiet, const ShipRequest *answer)
{
	/* a follower's own refusal keeps its SQLSTATE, detail and hint */
	bool		remote = answer != NULL && answer->sqlstate[0] != '\0';

	if (!quiet && strcmp(f->last_error, msg) != 0)
		ereport(WARNING,
				(remote ? errcode(MAKE_SQLSTATE(answer->sqlstate[0], answer->sqlstate[1],
												answer->sqlstate[2], answer->sqlstate[3],
												answer->sqlstate[4])) : 0,
				 errmsg("felix ship: stream \"%s\" shard %d: shipping to follower \"%s\" failed: %s",
						snap->stream_name, snap->key.shard, f->name, msg),
				 remote && answer->detail[0] ? errdetail_internal("%s", answer->detail) : 0,
				 remote && answer->hint[0] ? errhint("%s", answer->hint)
				 : errhint("The leader retries; felix_replication shows the follower's state.")));
	strlcpy(f->last_error, msg, sizeof(f->last_error));
	repl_state_put_follower(slot, fidx, f);
}

/* Bytes of the batches in buf (whole batches, as read) that begin below seq. */
static uint64
bytes_below(const StringInfo buf, uint64 seq)
{
	uint64		n = 0;
	int			off = 0;

	while (off + (int) sizeof(FelixBatchHeader) <= buf->len)
	{
		FelixBatchHeader h;

		memcpy(&h, buf->data + off, sizeof(h));
		if (h.base_seq >= seq)
			break;
		n += batch_stored_len(&h);
		off += (int) batch_stored_len(&h);
	}
	return n;
}

/*
 * A follower being rebuilt is shipped to at felix.rebuild_bytes_per_sec
 * (0: unlimited) over the rebuild so far.  Returns the most the next
 * request may carry, or 0 (and sets its retry time) when it must wait.
 */
static Size
rebuild_allowance(ShipSlot *ss, int fidx, const FelixFollower *f, int64 now_ns)
{
	double		rate = (double) felix_rebuild_bytes_per_sec;
	double		elapsed_s;
	double		budget;

	if (f->state != FELIX_FOLLOWER_REBUILDING || rate <= 0)
		return FELIX_SHIP_MAX_BYTES;
	elapsed_s = (double) Max(GetCurrentTimestamp() - f->rebuild_started_at, 0) / 1e6;
	budget = rate * elapsed_s - (double) f->rebuild_bytes;
	if (budget <= 0)
	{
		set_retry(ss, fidx, now_ns + (int64) (-budget / rate * 1e9) + NS_PER_MS);
		return 0;
	}
	/* small requests, so the pace holds over short spans too */
	return (Size) Max(Min(budget, Min(rate / 8, (double) FELIX_SHIP_MAX_BYTES)), 1.0);
}

/*
 * Is there anything to send the follower on connection p?  Records it
 * lacks, a high-water mark it has not heard (on this connection: a
 * follower that restarted has forgotten what it was told), no answer yet
 * at this generation (its position is unknown: even an empty shipment
 * tells us where it stands), the first shipment of the generation, or a
 * copy to begin afresh.
 */
static bool
has_work(const ShipSlot *ss, int fidx, const FelixFollower *f, const ShardSnap *snap,
		 const Peer *p, ReplicateOp op, bool probe)
{
	return op != REPLICATE_SHIP || probe ||
		f->cursor < snap->written_end || snap->hwm_end > ss->hwm_sent[fidx] ||
		ss->conn_serial[fidx] != p->ac.serial || !f->answered;
}

/*
 * Send one follower of one shard what it lacks, if anything and if
 * possible.  True when there was nothing to send: no records it lacks, no
 * mark it has not heard, an answer on its current connection.
 */
static bool
ship_follower(int slot, ShipSlot *ss, const ShardSnap *snap, int fidx,
			  FelixFollower *f, int64 now_ns)
{
	Peer	   *p;
	StringInfoData buf;
	ReadArg		ra;
	char		err[FELIX_REPL_ERROR_LEN];
	char		dir[MAXPGPATH];
	char		incarnation[FELIX_INCARNATION_LEN];
	char	   *what;
	ReplicateOp op = REPLICATE_SHIP;
	bool		probe;
	uint64		identities;
	uint64		from_seq;
	uint64		sent_end;
	uint64		hwm_param;
	Size		max_bytes;
	char		shard_s[16],
				gen_s[24],
				from_s[24],
				hwm_s[24];
	const char *values[REPLICATE_NPARAMS];
	int			lengths[REPLICATE_NPARAMS];
	int			formats[REPLICATE_NPARAMS] = {0, 0, 0, 0, 0, 0, 0, 0, 1};
	ShipRequest *r;

	if (f->state == FELIX_FOLLOWER_HALTED)
		return false;
	p = ss->peer[fidx];
	if (p != NULL && (!p->used || strcmp(p->name, f->name) != 0))
		p = ss->peer[fidx] = NULL;

	/*
	 * What a follower answered is believed while the connection it answered
	 * on lasts.  A lost connection may be a restarted follower -- one whose
	 * felix directory may even have been put back from an older copy --
	 * and neither the quorum mark nor a report may rest on what it held
	 * before: it counts again once it answers a shipment (reports leave it
	 * out meanwhile, which the control plane takes for "not caught up").
	 */
	if (f->answered && (p == NULL || p->ac.state != FELIX_ASYNC_READY ||
						p->ac.serial != ss->answered_serial[fidx]))
	{
		f->answered = false;
		repl_state_put_follower(slot, fidx, f);
	}
	if (ss->in_flight[fidx] || now_ns < ss->retry_at_ns[fidx])
		return false;

	/*
	 * Nothing to do, the cheap way first (this runs for every follower at
	 * every pass): no records it lacks, no mark it has not heard on its
	 * current connection, an answer at this generation, and no bootstrap,
	 * rebuild or first shipment of the generation to send.
	 */
	if (f->state == FELIX_FOLLOWER_BOOTSTRAP)
		op = REPLICATE_BOOTSTRAP;
	else if (f->state == FELIX_FOLLOWER_REBUILDING && !ss->discarded[fidx])
		op = REPLICATE_REBUILD;
	probe = op == REPLICATE_SHIP && !ss->probed[fidx];
	identities = felix_nodes_identities();
	if (p != NULL && ss->ident_seen[fidx] == identities &&
		!has_work(ss, fidx, f, snap, p, op, probe))
	{
		/*
		 * Idle, the connection is still this follower's: closed after a
		 * minute, it would count the follower out (above) and have every
		 * shard shipping to it reported twice a minute.
		 */
		p->last_needed_ns = now_ns;
		return true;
	}

	/*
	 * The copy we ship to is the one its node's incarnation holds: a node
	 * whose data directory was replaced since is a new, empty replica, and
	 * nothing it acknowledged before counts.  (Looked up again when the
	 * node directory's addresses or incarnations changed, or when there is
	 * work; the count is read before the lookups, so a change made during
	 * them is looked up again at the next pass.)
	 */
	ss->ident_seen[fidx] = identities;
	if (!felix_node_incarnation_of(f->name, incarnation))
	{
		follower_note_error(slot, fidx, f,
							"its incarnation is not known yet (the node directory learns it from the control plane)",
							snap, true, NULL);
		set_retry(ss, fidx, now_ns + FELIX_SHIP_RETRY_MS * NS_PER_MS);
		ss->ident_seen[fidx] = 0;
		return false;
	}
	if (strcmp(f->incarnation, incarnation) != 0)
	{
		if (f->incarnation[0] != '\0')
			ereport(LOG,
					(errmsg("felix ship: stream \"%s\" shard %d: follower \"%s\" has a new felix data directory (incarnation %s); shipping to it starts over",
							snap->stream_name, snap->key.shard, f->name, incarnation)));
		strlcpy(f->incarnation, incarnation, FELIX_INCARNATION_LEN);
		f->acked_end = 0;
		f->answered = false;
		if (f->state == FELIX_FOLLOWER_REBUILDING)
			felix_count(FELIX_CTR_REBUILDS_REFUSED, 1);
		f->state = FELIX_FOLLOWER_SHIPPING;
		repl_state_put_follower(slot, fidx, f);
	}

	p = ss->peer[fidx] = peer_get(f->name, now_ns);
	if (p == NULL)
	{
		follower_note_error(slot, fidx, f,
							"no conninfo is known for this node yet (the node directory learns it from the control plane)",
							snap, true, NULL);
		set_retry(ss, fidx, now_ns + FELIX_SHIP_RETRY_MS * NS_PER_MS);
		ss->ident_seen[fidx] = 0;
		return false;
	}
	if (p->ac.state != FELIX_ASYNC_READY)
	{
		/* the connection's trouble was logged once; show it on the follower */
		if (p->ac.problem[0] != '\0' && strcmp(f->last_error, p->ac.problem) != 0)
		{
			strlcpy(f->last_error, p->ac.problem, sizeof(f->last_error));
			repl_state_put_follower(slot, fidx, f);
		}
		return false;
	}
	if (p->bytes_in_flight >= FELIX_SHIP_PEER_MAX_BYTES)
	{
		full_wanted = true;		/* held back: look again as answers drain it */
		return false;
	}

	if (!has_work(ss, fidx, f, snap, p, op, probe))
		return false;
	max_bytes = rebuild_allowance(ss, fidx, f, now_ns);
	if (max_bytes == 0)
		return false;

	/*
	 * (probe) The first shipment of a generation to a follower carries no
	 * batch: a follower that has not heard of the generation yet refuses
	 * it (55F04), and what it would have refused is not read, sent and
	 * sent again.  Once it answered, the batches follow from the cursor.
	 */

	felix_shard_dir(&snap->key, dir);
	what = psprintf("stream \"%s\" shard %d", snap->stream_name, snap->key.shard);
	initStringInfo(&buf);
	from_seq = sent_end = op == REPLICATE_SHIP ? f->cursor : snap->start_seq;
	if (op == REPLICATE_SHIP && !probe && f->cursor < snap->written_end)
	{
		ra.dir = dir;
		ra.what = what;
		ra.from = f->cursor;
		ra.end = snap->written_end;
		ra.max_bytes = max_bytes;
		ra.out = &buf;
		ra.pos = &ss->read_pos[fidx];
		if (!ship_local(read_fn, &ra, err, sizeof(err)))
		{
			follower_note_error(slot, fidx, f, err, snap, false, NULL);
			set_retry(ss, fidx, now_ns + FELIX_SHIP_RETRY_MS * NS_PER_MS);
			return false;
		}
		if (buf.len >= (int) sizeof(FelixBatchHeader))
		{
			FelixBatchHeader h;

			memcpy(&h, buf.data, sizeof(h));
			from_seq = h.base_seq;
			sent_end = ra.next;
		}
	}

	/*
	 * The follower may show its readers only what a majority holds and
	 * what this shipment lets it check: records of its own above the
	 * shipped end may be another leadership's proposals.  A probe checks
	 * nothing: the cursor it is sent at is where the generation began,
	 * and the follower's records below it may be an earlier leader's
	 * (they are compared by the first batches, after it answers).
	 */
	hwm_param = probe ? 0 : Min(snap->hwm_end, sent_end);

	snprintf(shard_s, sizeof(shard_s), "%d", snap->key.shard);
	snprintf(gen_s, sizeof(gen_s), UINT64_FORMAT, snap->generation);
	snprintf(from_s, sizeof(from_s), UINT64_FORMAT, from_seq);
	snprintf(hwm_s, sizeof(hwm_s), UINT64_FORMAT, hwm_param);
	values[0] = snap->stream_name;
	values[1] = shard_s;
	values[2] = gen_s;
	values[3] = f->name;
	values[4] = f->incarnation;
	values[5] = op == REPLICATE_SHIP ? "ship" : op == REPLICATE_BOOTSTRAP ? "bootstrap" : "rebuild";
	values[6] = from_s;
	values[7] = hwm_s;
	values[8] = buf.data;
	for (int i = 0; i < REPLICATE_NPARAMS - 1; i++)
		lengths[i] = 0;
	lengths[REPLICATE_NPARAMS - 1] = buf.len;

	if (p->prepared_serial != p->ac.serial)
	{
		/* first shipment on this connection: prepare, in the same pipeline */
		if (PQsendPrepare(p->ac.conn, replicate_stmt, replicate_sql, REPLICATE_NPARAMS,
						  replicate_types) != 1 ||
			PQpipelineSync(p->ac.conn) != 1)
		{
			peer_fail(p, PQerrorMessage(p->ac.conn), now_ns);
			return false;
		}
		r = peer_push(p);
		r->prepare = true;
		r->slot = -1;
		r->sent_ns = now_ns;
		p->prepared_serial = p->ac.serial;
	}
	if (PQsendQueryPrepared(p->ac.conn, replicate_stmt, REPLICATE_NPARAMS, values, lengths,
							formats, 0) != 1 ||
		PQpipelineSync(p->ac.conn) != 1)
	{
		peer_fail(p, PQerrorMessage(p->ac.conn), now_ns);
		return false;
	}

	r = peer_push(p);
	r->slot = slot;
	r->key = snap->key;
	r->generation = snap->generation;
	r->fidx = fidx;
	strlcpy(r->follower, f->name, NAMEDATALEN);
	r->op = op;
	r->probe = probe;
	r->from_seq = from_seq;
	r->sent_end = sent_end;
	r->hwm_sent = hwm_param;
	r->serial = p->ac.serial;
	r->bytes = buf.len;
	r->sent_ns = now_ns;
	p->bytes_in_flight += buf.len;
	ss->in_flight[fidx] = true;
	ss->in_flight_end[fidx] = sent_end;
	ss->in_flight_ns[fidx] = now_ns;
	ss->conn_serial[fidx] = p->ac.serial;
	felix_count(FELIX_CTR_BYTES_SHIPPED, buf.len);
	/* what a follower is sent of the log before this leadership began */
	if (ss->generation_start > 0 && from_seq < ss->generation_start)
		felix_count(FELIX_CTR_CATCHUP_BYTES, bytes_below(&buf, ss->generation_start));
	if (f->state == FELIX_FOLLOWER_REBUILDING && buf.len > 0)
	{
		f->rebuild_bytes += buf.len;
		felix_count(FELIX_CTR_REBUILD_BYTES, buf.len);
		repl_state_put_follower(slot, fidx, f);
	}
	/* libpq holds its own copy now */
	pfree(buf.data);
	pfree(what);

	(void) async_flush(&p->ac, now_ns);
	if (p->ac.state != FELIX_ASYNC_READY)
		peer_drop_requests(p);
	return false;
}

/*
 * The rebuild policy, once per pass over every shard led here: a rebuild
 * that has brought its follower level with the log is complete (its slot
 * is free again); then halted followers (of the slots the first pass found
 * them in: at thousands of shards, two whole passes every 50 ms were a
 * tenth of what an idle node spent) are rebuilt while fewer than the
 * cap are -- automatically, for a diverged or needs_bootstrap halt, while
 * felix.rebuild_max_concurrent > 0; when asked (felix_rebuild), under the
 * same cap but at least one at a time, and a protocol halt too.  A fenced
 * halt is never rebuilt: this node no longer leads, and nothing it ships
 * is authoritative.  The count is node-wide, as a leader sees only its own
 * followers.
 *
 * A pass that finds no follower halted or rebuilding leaves the policy
 * idle (policy_wanted) until a follower halts, a slot is marked (a
 * felix_rebuild call marks its slot) or a sweep comes: on an idle node of
 * thousands of shards, a walk of every entry twenty times a second was the
 * ship worker's largest cost.
 */
static void
rebuild_policy(void)
{
	FelixReplShard *e = palloc(sizeof(FelixReplShard));
	int			nslots = Min(shard_count_slots(), ship_nslots);
	int			rebuilding = 0;
	int			cap_auto = felix_rebuild_max_concurrent;
	int			cap_asked = Max(cap_auto, 1);
	/* the slots with a halted follower, found by the first pass */
	int		   *halted = palloc(sizeof(int) * (nslots + 1));
	int			nhalted = 0;

	for (int pass = 0; pass < 2; pass++)
	{
		for (int k = 0; k < (pass == 0 ? nslots : nhalted); k++)
		{
			int			slot = pass == 0 ? k : halted[k];
			ShipSlot   *ss = &ship_slots[slot];
			FelixShardPositions v;
			bool		have_v = false;

			if (!ss->active)
				continue;
			repl_state_copy(slot, e);
			if (!e->valid || e->generation != ss->generation || !key_equal(&e->key, &ss->key))
				continue;
			for (int i = 0; i < e->nfollowers; i++)
			{
				FelixFollower f = e->followers[i];
				bool		asked = f.rebuild_requested;
				bool		rebuildable;

				/* the shard's positions, read once, only for a follower that needs them */
				if (!have_v && (f.state == FELIX_FOLLOWER_REBUILDING ||
								(pass == 1 && f.state == FELIX_FOLLOWER_HALTED)))
				{
					shard_read_positions(shard_slot(slot), &v);
					have_v = true;
				}
				if (pass == 0)
				{
					if (f.state == FELIX_FOLLOWER_HALTED &&
						(nhalted == 0 || halted[nhalted - 1] != slot))
						halted[nhalted++] = slot;
					if (f.state != FELIX_FOLLOWER_REBUILDING)
						continue;
					if (ss->discarded[i] && f.answered && f.acked_end >= v.written_end)
					{
						f.state = FELIX_FOLLOWER_SHIPPING;
						f.halt = FELIX_HALT_NONE;
						repl_state_put_follower(slot, i, &f);
						note_due(slot);
						felix_count(FELIX_CTR_REBUILDS_COMPLETED, 1);
						ereport(LOG,
								(errmsg("felix ship: stream \"%s\" shard %d: follower \"%s\" rebuilt: it holds seqs [" UINT64_FORMAT ", " UINT64_FORMAT ") after " UINT64_FORMAT " bytes",
										e->stream_name, e->key.shard, f.name, v.start_seq,
										f.acked_end, f.rebuild_bytes)));
					}
					else
						rebuilding++;
					continue;
				}

				if (f.state != FELIX_FOLLOWER_HALTED)
					continue;
				rebuildable = f.halt == FELIX_HALT_DIVERGED ||
					f.halt == FELIX_HALT_NEEDS_BOOTSTRAP ||
					(asked && f.halt == FELIX_HALT_PROTOCOL);
				if (!rebuildable)
				{
					if (asked)
						(void) repl_state_take_rebuild_request(slot, i);
					continue;
				}
				if (asked ? rebuilding >= cap_asked : (cap_auto <= 0 || rebuilding >= cap_auto))
					continue;
				if (asked)
					(void) repl_state_take_rebuild_request(slot, i);
				ereport(LOG,
						(errmsg("felix ship: stream \"%s\" shard %d: rebuilding follower \"%s\" (halted %s) from seq " UINT64_FORMAT "%s",
								e->stream_name, e->key.shard, f.name, felix_halt_name(f.halt),
								v.start_seq, asked ? ", as asked" : "")));
				/* (the halt it repairs stays, should the follower refuse) */
				f.state = FELIX_FOLLOWER_REBUILDING;
				f.answered = false;
				f.acked_end = 0;
				f.rebuild_started_at = GetCurrentTimestamp();
				f.rebuild_bytes = 0;
				f.last_error[0] = '\0';
				repl_state_put_follower(slot, i, &f);
				ss->discarded[i] = false;
				ss->retry_at_ns[i] = 0;
				note_due(slot);
				rebuilding++;
				felix_count(FELIX_CTR_REBUILDS_STARTED, 1);
			}
		}
	}
	policy_wanted = nhalted > 0 || rebuilding > 0;
	pfree(halted);
	pfree(e);
}

/*
 * One pass over the slots (every slot when slots is NULL, else slots[0..n)):
 * keep entries in step with the shards, ship.
 */
static void
ship_scan(int64 now_ns, const int *slots, int n)
{
	ShardSnap	snap;
	FelixReplShard *e = palloc(sizeof(FelixReplShard));
	int			nslots = Min(shard_count_slots(), ship_nslots);

	for (int k = 0; k < (slots ? n : nslots); k++)
	{
		int			slot = slots ? slots[k] : k;
		FelixShard *s;
		ShipSlot   *ss = &ship_slots[slot];

		CHECK_FOR_INTERRUPTS();
		if (slot >= nslots)
			continue;
		s = shard_slot(slot);
		if (!shard_snapshot(s, &snap))
		{
			if (ss->active)
			{
				repl_state_clear(slot);
				memset(ss, 0, sizeof(ShipSlot));
			}
			continue;
		}

		repl_state_copy(slot, e);
		if (!e->valid || !key_equal(&e->key, &snap.key) ||
			e->generation != snap.generation || !same_followers(e, &snap) ||
			!ss->active || ss->generation != snap.generation ||
			!key_equal(&ss->key, &snap.key))
		{
			FreshCursorArg fa;
			char		dir[MAXPGPATH];
			char		err[FELIX_REPL_ERROR_LEN];

			felix_shard_dir(&snap.key, dir);
			fa.dir = dir;
			fa.what = psprintf("stream \"%s\" shard %d", snap.stream_name, snap.key.shard);
			fa.generation = snap.generation;
			if (!ship_local(fresh_cursor_fn, &fa, err, sizeof(err)))
			{
				if (!ss->problem_logged)
					ereport(WARNING,
							(errmsg("felix ship: %s: cannot read the generation map to start shipping: %s",
									fa.what, err),
							 errhint("Shipping starts once the map can be read; check the shard's files.")));
				ss->problem_logged = true;
				continue;
			}
			repl_state_reset(slot, &snap.key, snap.stream_name, snap.generation,
							 snap.followers, snap.nfollowers, fa.cursor);
			memset(ss, 0, sizeof(ShipSlot));
			ss->active = true;
			ss->key = snap.key;
			ss->generation = snap.generation;
			ss->generation_start = fa.start;
			repl_state_copy(slot, e);
		}

		ss->quiet = snap.hwm_end == snap.written_end;
		for (int fidx = 0; fidx < e->nfollowers; fidx++)
		{
			FelixFollower f = e->followers[fidx];

			if (!ship_follower(slot, ss, &snap, fidx, &f, now_ns) ||
				f.acked_end != snap.written_end)
				ss->quiet = false;
		}
		ss->quiet_epoch = felix_async_epoch();
		ss->quiet_identities = felix_nodes_identities();
	}
	pfree(e);
}

/*
 * Can the answer be true of the request it answers?  To a shipment:
 * 'stored' names exactly the end of what was sent (the follower compared
 * or wrote all of it); 'gap' a tail before that end; 'conflict' the first
 * seq of a batch that was sent; 'fenced' and 'needs_bootstrap' any tail.
 * To a bootstrap or a rebuild: 'bootstrapped' or 'rebuilt' at exactly the
 * seq offered, 'needs_bootstrap' or 'fenced'.  Anything else is a protocol
 * error.
 */
static bool
answer_believable(const ShipRequest *r)
{
	bool		ship = r->op == REPLICATE_SHIP;

	if (strcmp(r->status, "stored") == 0)
		return ship && r->seq == r->sent_end;
	if (strcmp(r->status, "gap") == 0)
		return ship && r->seq < r->sent_end;
	if (strcmp(r->status, "conflict") == 0)
		return ship && r->seq >= r->from_seq && r->seq < r->sent_end;
	if (strcmp(r->status, "bootstrapped") == 0)
		return r->op == REPLICATE_BOOTSTRAP && r->seq == r->from_seq;
	if (strcmp(r->status, "rebuilt") == 0)
		return r->op == REPLICATE_REBUILD && r->seq == r->from_seq;
	return strcmp(r->status, "fenced") == 0 || strcmp(r->status, "needs_bootstrap") == 0;
}

/* Halt follower f for `halt`, saying why (its entry is written by the caller). */
static void
follower_halt(FelixFollower *f, FelixHalt halt, uint64 position, uint64 generation,
			  const ShardSnap *snap, const char *detail, const char *hint)
{
	if (f->state == FELIX_FOLLOWER_REBUILDING)
		felix_count(FELIX_CTR_REBUILDS_REFUSED, 1);
	f->state = FELIX_FOLLOWER_HALTED;
	policy_wanted = true;
	f->halt = halt;
	f->halt_position = position;
	f->halted_at = GetCurrentTimestamp();
	ereport(WARNING,
			(errcode(halt == FELIX_HALT_PROTOCOL ? ERRCODE_PROTOCOL_VIOLATION :
					 ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("felix ship: stream \"%s\" shard %d: follower \"%s\" halted (%s) at generation " UINT64_FORMAT ": %s",
					snap->stream_name, snap->key.shard, f->name, felix_halt_name(halt),
					generation, f->last_error),
			 detail ? errdetail("%s", detail) : 0,
			 errhint("%s", hint)));
}

/* Apply a finished request's answer to its follower's entry. */
static void
apply_answer(ShipRequest *r, int64 now_ns)
{
	ShipSlot   *ss = ship_slot_for(r->slot, &r->key, r->generation);
	FelixReplShard *e;
	FelixFollower f;
	ShardSnap	snap;
	FelixShardPositions v;

	if (ss == NULL)
		return;					/* the shard moved on since it was sent */
	ss->in_flight[r->fidx] = false;
	note_due(r->slot);			/* what it answered may let more go */

	e = palloc(sizeof(FelixReplShard));
	repl_state_copy(r->slot, e);
	if (!e->valid || e->generation != r->generation || !key_equal(&e->key, &r->key) ||
		r->fidx >= e->nfollowers || strcmp(e->followers[r->fidx].name, r->follower) != 0)
	{
		pfree(e);
		return;
	}
	f = e->followers[r->fidx];
	memset(&snap, 0, sizeof(snap));
	snap.key = e->key;
	strlcpy(snap.stream_name, e->stream_name, NAMEDATALEN);
	pfree(e);
	shard_read_positions(shard_slot(r->slot), &v);

	if (r->failed || !r->have_answer)
	{
		/*
		 * A follower that has not yet heard of this generation (the grant
		 * is newer than its last heartbeat) will have within one heartbeat:
		 * retry soon and say nothing.  A refused rebuild gives its slot back.
		 */
		bool		unknown = strcmp(r->sqlstate, "55F04") == 0;

		if (r->op == REPLICATE_REBUILD && !unknown && f.state == FELIX_FOLLOWER_REBUILDING)
		{
			felix_count(FELIX_CTR_REBUILDS_REFUSED, 1);
			f.state = FELIX_FOLLOWER_HALTED;
			policy_wanted = true;
		}
		follower_note_error(r->slot, r->fidx, &f,
							r->failed ? r->error : "the follower returned no answer", &snap,
							unknown, r->failed ? r : NULL);

		/*
		 * It took nothing of this shipment, mark included: it has not heard
		 * us on this connection, so the retry ships again even when no
		 * record arrives (on an idle shard nothing else would, and a
		 * restarted follower would never be confirmed or found stale).
		 */
		ss->conn_serial[r->fidx] = 0;
		if (unknown)
		{
			int			n = ss->unknown_in_row[r->fidx];

			if (n < 10)
				ss->unknown_in_row[r->fidx]++;
			set_retry(ss, r->fidx, now_ns +
				Min((int64) FELIX_SHIP_RETRY_SOON_MS << n, felix_heartbeat_interval) * NS_PER_MS);
		}
		else
		{
			ss->unknown_in_row[r->fidx] = 0;
			set_retry(ss, r->fidx, now_ns + FELIX_SHIP_RETRY_MS * NS_PER_MS);
		}
		return;
	}
	ss->unknown_in_row[r->fidx] = 0;

	f.last_answer_at = GetCurrentTimestamp();
	if (!answer_believable(r))
	{
		/*
		 * A follower's word is checked against what was sent to it: an
		 * acknowledgement past the shipment would let one lying or broken
		 * follower complete a quorum alone.  It is out of every quorum
		 * from here (a halted follower counts for nothing, report.c).
		 */
		snprintf(f.last_error, sizeof(f.last_error),
				 "it answered %s " UINT64_FORMAT " to a %s of seqs [" UINT64_FORMAT ", " UINT64_FORMAT ")",
				 r->status, r->seq, r->op == REPLICATE_SHIP ? "shipment" : "bootstrap or rebuild",
				 r->from_seq, r->sent_end);
		follower_halt(&f, FELIX_HALT_PROTOCOL, r->seq, r->generation, &snap,
					  "A follower answers with the end of what it was sent, or a position inside it; this answer cannot be true.",
					  "The follower is out of every quorum; check that node's felix version, then rebuild it with felix_rebuild.");
	}
	else if (r->probe && strcmp(r->status, "stored") == 0)
	{
		/* it takes this generation; it holds the cursor's position: ship */
		ss->probed[r->fidx] = true;
		f.last_error[0] = '\0';
	}
	else if (strcmp(r->status, "stored") == 0)
	{
		/* durable there up to the end of what we sent */
		f.acked_end = r->seq;
		f.cursor = r->seq;
		f.answered = true;
		ss->answered_serial[r->fidx] = r->serial;
		f.last_error[0] = '\0';
		ss->hwm_sent[r->fidx] = r->hwm_sent;
	}
	else if (strcmp(r->status, "gap") == 0)
	{
		GapResume	g = gap_resume(r->seq, r->from_seq, v.start_seq, &f.cursor);

		ss->probed[r->fidx] = true;
		/* until an answer covers it, it counts for no more than the records before it */
		f.acked_end = Min(f.acked_end, f.cursor);
		f.last_error[0] = '\0';
		if (g != GAP_SHIP)
		{
			f.state = FELIX_FOLLOWER_BOOTSTRAP;
			if (g == GAP_BOOTSTRAP_LACKS)
				snprintf(f.last_error, sizeof(f.last_error),
						 "its log ends at seq " UINT64_FORMAT ", before this leader's oldest record " UINT64_FORMAT ": offering it a copy beginning there",
						 r->seq, v.start_seq);
			else
				snprintf(f.last_error, sizeof(f.last_error),
						 "its last record, at seq " UINT64_FORMAT ", cannot be compared: this leader's oldest record is " UINT64_FORMAT ": offering it a copy beginning there",
						 r->seq - 1, v.start_seq);
		}
	}
	else if (strcmp(r->status, "bootstrapped") == 0 || strcmp(r->status, "rebuilt") == 0)
	{
		/* an empty copy beginning at our oldest record: ship from there */
		f.cursor = f.acked_end = r->seq;
		f.answered = true;
		ss->answered_serial[r->fidx] = r->serial;
		f.last_error[0] = '\0';
		if (f.state == FELIX_FOLLOWER_BOOTSTRAP)
			f.state = FELIX_FOLLOWER_SHIPPING;
		else
			ss->discarded[r->fidx] = true;
		ss->read_pos[r->fidx].seq = 0;
	}
	else if (strcmp(r->status, "needs_bootstrap") == 0)
	{
		if (r->op == REPLICATE_SHIP)
			snprintf(f.last_error, sizeof(f.last_error),
					 "its copy predates its node's current incarnation (its log ends at seq " UINT64_FORMAT ")",
					 r->seq);
		else
			snprintf(f.last_error, sizeof(f.last_error),
					 "its log ends at seq " UINT64_FORMAT " and this leader's begins at seq " UINT64_FORMAT ": it holds records of its own that cannot be compared",
					 r->seq, r->from_seq);
		follower_halt(&f, FELIX_HALT_NEEDS_BOOTSTRAP, r->seq, r->generation, &snap,
					  "A copy placed over records of its own would hide a hole nothing downstream could detect.",
					  "The follower is out of every quorum until it is rebuilt: automatically under felix.rebuild_max_concurrent, or with felix_rebuild.");
	}
	else if (strcmp(r->status, "conflict") == 0)
	{
		snprintf(f.last_error, sizeof(f.last_error),
				 "its log differs from this leader's at the batch starting at seq " UINT64_FORMAT,
				 r->seq);
		follower_halt(&f, FELIX_HALT_DIVERGED, r->seq, r->generation, &snap,
					  "The two logs disagree about records both hold, where the follower's generation history cannot show they are an earlier leader's unadopted tail; retrying cannot converge.",
					  "The follower serves nothing from that seq on and is out of every quorum until it is rebuilt: automatically under felix.rebuild_max_concurrent, or with felix_rebuild.");
	}
	else
	{
		Assert(strcmp(r->status, "fenced") == 0);
		snprintf(f.last_error, sizeof(f.last_error),
				 "it is at a newer generation than " UINT64_FORMAT " (its log ends at seq " UINT64_FORMAT ")",
				 r->generation, r->seq);
		follower_halt(&f, FELIX_HALT_FENCED, r->seq, r->generation, &snap,
					  "This node is no longer the shard's leader; it steps down now and learns the new leader from the control plane.",
					  "Nothing to do: the next heartbeat hands the shard to its new leader.");
		repl_state_put_follower(r->slot, r->fidx, &f);
		/* deposition is immediate: nothing more is acknowledged at r->generation */
		(void) lease_step_down(shard_slot(r->slot), r->generation + 1,
							   psprintf("follower \"%s\" is at a newer generation", f.name));
		return;
	}
	repl_state_put_follower(r->slot, r->fidx, &f);
}

/* Keep the first result of the head request. */
static void
take_result(ShipRequest *r, PGresult *res)
{
	switch (PQresultStatus(res))
	{
		case PGRES_TUPLES_OK:
			if (PQntuples(res) == 1 && PQnfields(res) == 2 &&
				!PQgetisnull(res, 0, 0) && !PQgetisnull(res, 0, 1))
			{
				strlcpy(r->status, PQgetvalue(res, 0, 0), sizeof(r->status));
				r->seq = strtou64(PQgetvalue(res, 0, 1), NULL, 10);
				r->have_answer = true;
			}
			else
			{
				r->failed = true;
				strlcpy(r->error, "malformed answer", sizeof(r->error));
			}
			break;
		case PGRES_PIPELINE_ABORTED:
			r->failed = true;
			strlcpy(r->error, "the request was aborted with its pipeline", sizeof(r->error));
			break;
		default:
			{
				const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
				const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
				int			len;

				if (msg == NULL || msg[0] == '\0')
					msg = PQresultErrorMessage(res);
				r->failed = true;
				snprintf(r->error, sizeof(r->error), "%s%s%s",
						 msg && msg[0] ? msg : PQresStatus(PQresultStatus(res)),
						 state ? " SQLSTATE " : "", state ? state : "");
				strlcpy(r->sqlstate, state ? state : "", sizeof(r->sqlstate));
				strlcpy(r->detail, PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) ?
						PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : "", sizeof(r->detail));
				strlcpy(r->hint, PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) ?
						PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) : "", sizeof(r->hint));
				len = strlen(r->error);
				while (len > 0 && r->error[len - 1] == '\n')
					r->error[--len] = '\0';
			}
			break;
	}
}

/* Read what the peer sent and finish every request whose answer is whole. */
static void
peer_read(Peer *p, int64 now_ns)
{
	int			nulls = 0;

	if (!PQconsumeInput(p->ac.conn))
	{
		peer_fail(p, PQerrorMessage(p->ac.conn), now_ns);
		return;
	}
	while (p->head < p->nreqs && !PQisBusy(p->ac.conn))
	{
		ShipRequest *r = &p->reqs[p->head];
		PGresult   *res = PQgetResult(p->ac.conn);

		if (res == NULL)
		{
			/* end of one query's results; its sync follows */
			if (++nulls > 1)
				break;
			continue;
		}
		nulls = 0;
		if (PQresultStatus(res) == PGRES_PIPELINE_SYNC)
		{
			PQclear(res);
			p->bytes_in_flight -= Min(p->bytes_in_flight, r->bytes);
			p->head++;
			if (!r->prepare)
				apply_answer(r, now_ns);
			else if (r->failed)
			{
				/* what rode behind it failed too; start over on a new connection */
				peer_fail(p, psprintf("preparing felix.replicate failed: %s", r->error),
						  now_ns);
				return;
			}
			continue;
		}
		if (r->prepare && PQresultStatus(res) == PGRES_COMMAND_OK)
			;					/* prepared */
		else if (!r->have_answer && !r->failed)
			take_result(r, res);
		PQclear(res);
	}
	if (p->head == p->nreqs)
		p->head = p->nreqs = 0;
	if (PQstatus(p->ac.conn) == CONNECTION_BAD)
		peer_fail(p, PQerrorMessage(p->ac.conn), now_ns);
}

/* Time-outs of connections and of answers; idle peers closed. */
static void
peers_check(int64 now_ns)
{
	for (int i = 0; i < FELIX_MAX_NODES; i++)
	{
		Peer	   *p = &peers[i];

		if (!p->used)
			continue;
		if (p->ac.state == FELIX_ASYNC_CONNECTING)
			async_check_timeout(&p->ac, now_ns);
		else if (p->ac.state == FELIX_ASYNC_READY && p->head < p->nreqs &&
				 now_ns - p->reqs[p->head].sent_ns > FELIX_SHIP_ANSWER_TIMEOUT_MS * NS_PER_MS)
			peer_fail(p, psprintf("no answer within %d ms", FELIX_SHIP_ANSWER_TIMEOUT_MS), now_ns);
		else if ((p->ac.state == FELIX_ASYNC_DOWN ||
				  (p->ac.state == FELIX_ASYNC_READY && p->head == p->nreqs)) &&
				 now_ns - p->last_needed_ns > FELIX_SHIP_IDLE_CLOSE_MS * NS_PER_MS)
		{
			/* no shard has needed this node for a while: let it go */
			peer_close(p);
			if (p->reqs != NULL)
				pfree(p->reqs);
			p->reqs = NULL;
			p->cap = 0;
			p->used = false;
		}
	}
}

static void
close_everything(int64 now_ns)
{
	for (int i = 0; i < FELIX_MAX_NODES; i++)
		if (peers[i].used)
			peer_close(&peers[i]);
	report_close("the ship worker is recovering from an error", now_ns);
}

/* ---------------------------------------------------------------------
 * The worker
 * ---------------------------------------------------------------------
 */
void
felix_ship_worker_register(void)
{
	felix_register_worker("felix_ship_worker_main", "felix ship", 1);
}

static void
ship_worker_exit(int code, Datum arg)
{
	for (int i = 0; i < FELIX_MAX_NODES; i++)
		if (peers[i].used && peers[i].ac.conn != NULL)
		{
			PQfinish(peers[i].ac.conn);
			peers[i].ac.conn = NULL;
		}
	report_close("the ship worker is exiting", felix_monotonic_ns());
}

/* The events a connection needs waited for, if any. */
static void
conn_wait_spec(FelixAsyncConn *c, void *tag, WaitSpec *specs, int *n,
			   bool *connecting)
{
	uint32		events = 0;

	if (c->conn == NULL || c->state == FELIX_ASYNC_DOWN ||
		PQsocket(c->conn) == PGINVALID_SOCKET)
		return;
	if (c->state == FELIX_ASYNC_READY)
		events = WL_SOCKET_READABLE | (c->want_write ? WL_SOCKET_WRITEABLE : 0);
	else
	{
		/* libpq may swap sockets while connecting: never trust the old set */
		*connecting = true;
		events = (c->want_read ? WL_SOCKET_READABLE : 0) |
			(c->want_write ? WL_SOCKET_WRITEABLE : 0);
	}
	if (events == 0)
		return;
	specs[*n].sock = PQsocket(c->conn);
	specs[*n].events = events;
	specs[*n].tag = tag;
	(*n)++;
}

/* Have wait_set wait on the latch, postmaster death and every connection. */
static void
prepare_wait_set(MemoryContext cxt)
{
	WaitSpec	specs[FELIX_MAX_NODES + 1];
	int			n = 0;
	bool		connecting = false;

	memset(specs, 0, sizeof(specs));
	for (int i = 0; i < FELIX_MAX_NODES; i++)
		if (peers[i].used)
			conn_wait_spec(&peers[i].ac, &peers[i], specs, &n, &connecting);
	conn_wait_spec(report_conn(), report_conn(), specs, &n, &connecting);

	if (wait_set != NULL && !connecting && wait_set_epoch == felix_async_epoch() &&
		n == nwait_specs && memcmp(specs, wait_specs, n * sizeof(WaitSpec)) == 0)
		return;
	if (wait_set != NULL)
		FreeWaitEventSet(wait_set);
	wait_set = CreateWaitEventSet(cxt, n + 2);
	AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	for (int i = 0; i < n; i++)
		AddWaitEventToSet(wait_set, specs[i].events, specs[i].sock, NULL, specs[i].tag);
	memcpy(wait_specs, specs, sizeof(wait_specs));
	nwait_specs = n;
	wait_set_epoch = felix_async_epoch();
}

/*
 * Milliseconds until the earliest deadline, capped by the heartbeat; sets
 * timers_ns to the earliest of the worker's own timers (the next full
 * pass is due then).
 */
static long
wait_timeout(int64 now_ns)
{
	int64		deadline = PG_INT64_MAX;

	for (int i = 0; i < FELIX_MAX_NODES; i++)
	{
		Peer	   *p = &peers[i];

		if (!p->used)
			continue;
		deadline = Min(deadline, async_deadline(&p->ac));
		if (p->head < p->nreqs)
			deadline = Min(deadline, p->reqs[p->head].sent_ns +
						   FELIX_SHIP_ANSWER_TIMEOUT_MS * NS_PER_MS);
	}
	if (retry_min_ns <= now_ns)
	{
		retry_min_ns = PG_INT64_MAX;
		for (int slot = 0; slot < Min(shard_count_slots(), ship_nslots); slot++)
		{
			ShipSlot   *ss = &ship_slots[slot];

			if (!ss->active)
				continue;
			for (int f = 0; f < FELIX_MAX_REPLICAS; f++)
				if (ss->retry_at_ns[f] > now_ns)
					retry_min_ns = Min(retry_min_ns, ss->retry_at_ns[f]);
		}
	}
	deadline = Min(deadline, retry_min_ns);
	deadline = Min(deadline, report_timer(now_ns));
	timers_ns = deadline;
	deadline = Min(deadline, last_full_ns + (int64) felix_heartbeat_interval * NS_PER_MS);
	deadline = Min(deadline, report_deadline(now_ns));
	if (deadline <= now_ns)
		return 0;
	return (long) ((deadline - now_ns + NS_PER_MS - 1) / NS_PER_MS);
}

void
felix_ship_worker_main(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;
	MemoryContext worker_cxt;
	volatile bool first = true;
	volatile int64 next_policy_ns = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(felix_database, NULL, 0);
	felix_worker_pin_search_path();

	worker_cxt = AllocSetContextCreate(TopMemoryContext, "felix ship",
									   ALLOCSET_DEFAULT_SIZES);
	pass_cxt = AllocSetContextCreate(worker_cxt, "felix ship pass",
									 ALLOCSET_DEFAULT_SIZES);
	ship_nslots = felix_max_shards;
	ship_slots = MemoryContextAllocZero(worker_cxt, sizeof(ShipSlot) * ship_nslots);
	due_slots = MemoryContextAlloc(worker_cxt, sizeof(int) * ship_nslots);
	due_taken = MemoryContextAlloc(worker_cxt, sizeof(int) * ship_nslots);
	due_listed = MemoryContextAllocZero(worker_cxt, sizeof(bool) * ship_nslots);
	memset(peers, 0, sizeof(peers));
	report_init();

	before_shmem_exit(ship_worker_exit, (Datum) 0);
	felix_wake_register(FELIX_WORKER_SHIP);
	ereport(LOG,
			(errmsg("felix ship worker started as node \"%s\"", felix_node_name_resolved())));

	/*
	 * A local error escaping a pass (shared state, memory) is logged and
	 * the pass retried after a pause, with every connection started
	 * afresh: never a reason to leave the worker down.
	 */
	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
	{
		error_context_stack = NULL;
		HOLD_INTERRUPTS();
		EmitErrorReport();
		AbortOutOfAnyTransaction();
		if (wait_set != NULL)
		{
			FreeWaitEventSet(wait_set);
			wait_set = NULL;
		}
		MemoryContextSwitchTo(worker_cxt);
		FlushErrorState();
		MemoryContextReset(pass_cxt);
		close_everything(felix_monotonic_ns());
		memset(ship_slots, 0, sizeof(ShipSlot) * ship_nslots);
		memset(due_listed, 0, sizeof(bool) * ship_nslots);
		ndue = 0;
		sweep_wanted = true;
		policy_wanted = true;
		RESUME_INTERRUPTS();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1000, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		int64		now_ns;
		long		timeout;
		WaitEvent	events[FELIX_MAX_NODES + 3];
		int			nevents = 0;

		MemoryContextSwitchTo(pass_cxt);
		MemoryContextReset(pass_cxt);

		if (!first)
		{
			now_ns = felix_monotonic_ns();
			timeout = wait_timeout(now_ns);
			prepare_wait_set(worker_cxt);
			pgstat_report_activity(STATE_IDLE, NULL);
			nevents = WaitEventSetWait(wait_set, timeout, events, lengthof(events),
									   PG_WAIT_EXTENSION);
		}
		first = false;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		now_ns = felix_monotonic_ns();
		for (int i = 0; i < nevents; i++)
		{
			WaitEvent  *ev = &events[i];

			if (ev->events & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				continue;
			}
			if (ev->user_data == NULL)
				continue;
			if (ev->user_data == (void *) report_conn())
			{
				report_on_event(now_ns, ev->events);
				continue;
			}
			{
				Peer	   *p = (Peer *) ev->user_data;

				if (p->ac.state == FELIX_ASYNC_CONNECTING)
				{
					async_connect_poll(&p->ac, now_ns);
					/* open: every shard waiting for it ships now */
					if (p->ac.state == FELIX_ASYNC_READY)
						full_wanted = true;
				}
				else if (p->ac.state == FELIX_ASYNC_READY)
				{
					if (ev->events & WL_SOCKET_WRITEABLE)
					{
						if (!async_flush(&p->ac, now_ns))
						{
							peer_drop_requests(p);
							continue;
						}
					}
					if (ev->events & WL_SOCKET_READABLE)
						peer_read(p, now_ns);
				}
			}
		}

		pgstat_report_activity(STATE_RUNNING, "felix: shipping to followers");
		peers_check(now_ns);
		report_check(now_ns);	/* time-outs of the control-plane request */
		/* the policy looks at every shard: not at every pass of a busy worker */
		if (policy_wanted && now_ns >= next_policy_ns)
		{
			rebuild_policy();
			next_policy_ns = now_ns + FELIX_REBUILD_POLICY_MS * NS_PER_MS;
		}
		{
			int64		interval_ns = (int64) felix_heartbeat_interval * NS_PER_MS;
			bool		sweep = sweep_wanted ||
				now_ns >= last_sweep_ns + FELIX_SHIP_SWEEP_INTERVALS * interval_ns;
			bool		full = sweep || full_wanted || now_ns >= timers_ns ||
				now_ns >= last_full_ns + interval_ns || report_wants_all();
			int			nmarked;

			/* taken before the shards are read: a mark set later is seen next pass */
			nmarked = repl_ship_take_due(due_taken, ship_nslots);
			for (int i = 0; i < nmarked; i++)
				note_due(due_taken[i]);
			if (nmarked > 0 || sweep)
				policy_wanted = true;
			if (full)
			{
				full_wanted = false;
				last_full_ns = now_ns;
				if (sweep)
				{
					sweep_wanted = false;
					last_sweep_ns = now_ns;
				}
				else
				{
					/*
					 * A shard led here shipped from before, or marked as
					 * it was taken; but not a quiet one that the report
					 * side has settled too: it gets looked at when marked,
					 * and at the next sweep.
					 */
					uint64		epoch = felix_async_epoch();
					uint64		identities = felix_nodes_identities();

					for (int slot = 0; slot < Min(shard_count_slots(), ship_nslots); slot++)
					{
						ShipSlot   *ss = &ship_slots[slot];

						if (ss->active &&
							!(ss->quiet && ss->quiet_epoch == epoch &&
							  ss->quiet_identities == identities && report_settled(slot)))
							note_due(slot);
					}
				}
			}
			ship_scan(now_ns, sweep ? NULL : due_slots, ndue);
			report_tick(felix_monotonic_ns(), sweep ? NULL : due_slots, ndue, full);
			for (int i = 0; i < ndue; i++)
				due_listed[due_slots[i]] = false;
			ndue = 0;
		}
		if (IsTransactionState())
			CommitTransactionCommand();
	}
}
