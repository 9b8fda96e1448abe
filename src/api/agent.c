/*-------------------------------------------------------------------------
 *
 * agent.c
 *	  The node agent's work on the control plane's word, as a heartbeat
 *	  brings it: each assignment row applied to its local shard, in its own
 *	  subtransaction (one bad shard cannot stop the rest) -- the stream
 *	  looked up, the shard acquired and lease_apply_assignment() told what
 *	  the control plane said, with the lease anchored at the heartbeat's
 *	  send time; the tables of streams the control plane lists but this
 *	  node lacks created (felix_stream_create_local), after the leases of
 *	  existing streams were applied and with lock_timeout set, so a user's
 *	  long transaction can delay a new stream's table but never a lease
 *	  renewal; a table of an older creation of a stream's name dropped and
 *	  the new one created; and what it found kept for the next heartbeat:
 *	  the shards this node cannot serve, and the log ends of the shards it
 *	  holds a copy of.
 *
 *	  The heartbeat worker (worker/heartbeat.c) calls it after each
 *	  heartbeat; a backend that just created a stream calls it for that
 *	  stream alone (agent_apply_stream), so the stream is led when the
 *	  call returns.  The worker's answers hold only what changed
 *	  (control/cp_heartbeat.c): the agent keeps every assignment told so
 *	  far, applies those an answer brings or whose shard is no longer as
 *	  they left it, and renews the other leases on the spot
 *	  (lease_reassert); and it gives its log ends again only when they
 *	  changed.
 *
 * Locking rule: holds AccessShareLock on a stream's table while applying
 * an assignment to one of its shards, taken conditionally: a stream being
 * dropped or altered is skipped until the next heartbeat rather than
 * waited for.  The shard's own locks are taken inside shard.c; the node
 * directory's inside nodes.c.  Never waits on the network inside a
 * transaction.  Its other state is process-local.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "api/agent.h"
#include "api/stream.h"
#include "base/isolate.h"
#include "common/hashfn.h"
#include "control/cpcall.h"
#include "control/nodes.h"
#include "core/catalog.h"
#include "felix.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/lease.h"
#include "storage/lmgr.h"
#include "storage/shard.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

/* At most one line per this interval for a row's repeating failure. */
#define AGENT_LOG_INTERVAL_NS	(INT64CONST(5) * 1000000000)
/* A stream's creation may fail quietly for this long (a race, see below). */
#define AGENT_CREATE_GRACE_NS	(INT64CONST(2) * 1000000000)

/* Errors logged per stream and shard, and when (the worker's). */
static HTAB *row_errors = NULL;
/* Shards whose assignment could not be applied here, and since when. */
static HTAB *unserved = NULL;
static HTAB *known_rows = NULL;
static MemoryContext known_cxt = NULL;
static FelixCpAnswer known_answer;
static bool have_known = false;
/* The log ends given at the heartbeat of known_answer (NULL: not known). */
static char **ends_given = NULL;
static int	nends_given = 0;
/*
 * The shards the control plane last named this node a replica of (leader
 * or follower), whose log ends the next heartbeat gives (agent_held_ends); NULL:
 * none known yet.
 */
typedef struct HeldShard
{
	char		stream[NAMEDATALEN];
	int			shard;
	int			slot;
	FelixShardKey key;
	FelixShardEnds seen;		/* as last read, when text is not NULL */
	char	   *text;			/* ... and given as this (in held_cxt) */
} HeldShard;
static HeldShard *held = NULL;
static int	nheld = 0;
static MemoryContext held_cxt = NULL;
/* held is to be made again: the rows held, or what became of them, changed */
static bool held_stale = true;
/* ... and was, since agent_held_ends last looked */
static bool held_remade = false;
/*
 * agent_held_ends' last answer (in held_cxt), the shard_changes() count
 * read before it was made (PG_UINT64_MAX: none since held was made), and
 * the number of answers made so far.
 */
static char **held_out = NULL;
static int	nheld_out = 0;
static uint64 held_out_changes = PG_UINT64_MAX;
static uint64 held_out_made = 0;
/* the held_out_made of the answer ends_given was copied from (0: another) */
static uint64 ends_given_made = 0;
/*
 * shard_streams_changes() just before this heartbeat's rows were asked
 * for.  A stream drop commits its control-plane change first and its local
 * one second, and a creation that rolls back undoes its control-plane
 * registration as it aborts, so rows fetched before either finished may
 * still list a stream that has gone here: a missing stream is created only
 * if no stream has gone since the rows were fetched.  Likewise a stream
 * created here registers at the control plane before its table commits,
 * so rows fetched before it may name an older creation of that name: a
 * stream here is taken for one the control plane replaced only if no
 * stream has come or gone since the rows were fetched.
 */
static uint64 changes_before_rows = 0;
/* shard_changes() before agent_take_answer last renewed the leases */
static uint64 renewed_changes = PG_UINT64_MAX;


typedef struct RowErrorKey
{
	char		stream[NAMEDATALEN];
	int32		shard;			/* -1: the stream as a whole */
} RowErrorKey;

typedef struct RowErrorEntry
{
	RowErrorKey key;
	int64		last_ns;
	uint32		msg_hash;
} RowErrorEntry;

typedef struct UnservedEntry
{
	RowErrorKey key;
	int64		since_ns;
} UnservedEntry;

/*
 * The assignments this node holds: every row of the heartbeats' answers,
 * merged (a full answer replaces them all), and what became of each here;
 * known_answer says what they are as of (have_known false: nothing).
 * Strings of rows live in known_cxt.
 */
typedef struct KnownRow
{
	RowErrorKey id;				/* hash key */
	FelixCpShard row;
	bool		applied;		/* reached the local shard as told */
	int			slot;			/* the local shard's slot (-1: none), as
								 * the last row applied left it */
	FelixShardKey key;
	bool		holds;			/* ... that row named this node a replica */
	bool		in_answer;		/* (while a full answer is taken in) */
	bool		names_other;	/* the row names another node the leader */
	bool		quiet;			/* ... and the local shard was as it left it
								 * at the last renewal (see agent_take_answer) */
} KnownRow;

/*
 * The known rows that its last pass over all of them left not quiet (in
 * known_cxt; NULL: to be made by the next such pass): a heartbeat that
 * brings no row, after which no slot changed, looks at these alone.
 */
static KnownRow **unquiet = NULL;
static int	nunquiet = 0;
static void forget_unquiet(void);

static void
row_error_key(RowErrorKey *key, const char *stream, int shard)
{
	memset(key, 0, sizeof(RowErrorKey));
	strlcpy(key->stream, stream, NAMEDATALEN);
	key->shard = shard;
}

/*
 * Log a shard's (or stream's) error unless the same one was logged for it
 * within the last few seconds: the same failure repeats every heartbeat.
 *
 * A stream's creation (shard -1) is allowed to fail once quietly: this
 * node may race the backend that created the stream here through
 * felix_create_stream (its table is uncommitted, or committed a moment
 * after we looked), which resolves by the next heartbeat.  A failure that
 * persists is logged.
 */
static void
report_row_error(const char *stream, int shard, ErrorData *edata, const char *what)
{
	RowErrorKey key;
	RowErrorEntry *e;
	bool		found;
	uint32		h = hash_bytes((const unsigned char *) (edata->message ? edata->message : ""),
							   edata->message ? strlen(edata->message) : 0);
	int64		now = felix_monotonic_ns();

	row_error_key(&key, stream, shard);
	e = hash_search(row_errors, &key, HASH_ENTER, &found);
	if (!found && shard < 0)
	{
		/* First failure of a creation: remember it, say nothing yet. */
		e->msg_hash = 0;
		e->last_ns = now - AGENT_LOG_INTERVAL_NS + AGENT_CREATE_GRACE_NS;
		ereport(DEBUG1,
				(errmsg_internal("felix heartbeat: %s: %s", what,
								 edata->message ? edata->message : "")));
		return;
	}
	if (found && (e->msg_hash == h || e->msg_hash == 0) &&
		now - e->last_ns < AGENT_LOG_INTERVAL_NS)
		return;
	e->msg_hash = h;
	e->last_ns = now;

	edata->elevel = LOG;
	edata->context = edata->context ?
		psprintf("%s\n%s", edata->context, what) : pstrdup(what);
	ThrowErrorData(edata);
}

static void
row_error_cleared(const char *stream, int shard)
{
	RowErrorKey key;

	row_error_key(&key, stream, shard);
	(void) hash_search(row_errors, &key, HASH_REMOVE, NULL);
}

void
agent_init(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(RowErrorKey);
	ctl.entrysize = sizeof(RowErrorEntry);
	row_errors = hash_create("felix heartbeat: reported errors", 64, &ctl,
							 HASH_ELEM | HASH_BLOBS);
	ctl.entrysize = sizeof(UnservedEntry);
	unserved = hash_create("felix heartbeat: shards not served", 64, &ctl,
						   HASH_ELEM | HASH_BLOBS);
	known_cxt = AllocSetContextCreate(TopMemoryContext, "felix heartbeat: assignments held",
									  ALLOCSET_DEFAULT_SIZES);
	ctl.entrysize = sizeof(KnownRow);
	known_rows = hash_create("felix heartbeat: assignments held", 256, &ctl,
							 HASH_ELEM | HASH_BLOBS);
	held_cxt = AllocSetContextCreate(TopMemoryContext, "felix heartbeat: log ends given",
									 ALLOCSET_DEFAULT_SIZES);
}

void
agent_rows_asked(void)
{
	changes_before_rows = shard_streams_changes();
}

/* ---------------------------------------------------------------------
 * Applying rows
 * ---------------------------------------------------------------------
 */

/* Refuse a consistency this node does not know: never default it. */
static FelixConsistency
row_consistency(const AgentRow *r)
{
	if (strcmp(r->c.consistency, "leader") == 0)
		return FELIX_CONSISTENCY_LEADER;
	if (strcmp(r->c.consistency, "quorum") == 0)
		return FELIX_CONSISTENCY_QUORUM;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("stream \"%s\": the control plane sent consistency \"%s\", which this node does not recognise",
					r->c.stream, r->c.consistency),
			 errdetail("The stream is not served here rather than served at a weaker guarantee."),
			 errhint("Run the same felix version on every node and on the control plane.")));
	return FELIX_CONSISTENCY_LEADER;	/* keep compiler quiet */
}

static void
refuse_bad_row(const AgentRow *r)
{
	if (r->c.bad != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("stream \"%s\" shard %d: unusable assignment from the control plane: %s",
						r->c.stream, r->c.shard, r->c.bad),
				 errhint("Run the same felix version on every node and on the control plane.")));
}

/* Is this node in the assignment's replica set (or joining it)? */
static bool
holds_copy(const FelixAssignment *a)
{
	if (felix_is_this_node(a->leader) ||
		(a->joining[0] != '\0' && felix_is_this_node(a->joining)))
		return true;
	for (int i = 0; i < a->nreplicas; i++)
		if (felix_is_this_node(a->replicas[i]))
			return true;
	return false;
}

/* Apply one assignment to its local shard (inside a subtransaction). */
static void
apply_row_guts(void *arg)
{
	AgentRow	   *r = arg;
	const FelixStream *found;
	FelixStream stream;
	FelixConsistency consistency;
	FelixShard *s;

	refuse_bad_row(r);
	consistency = row_consistency(r);
	found = felix_stream_by_name(r->c.stream);
	stream = *found;

	if (strcmp(stream.creation_id, r->c.creation_id) != 0)
	{
		/* an older creation: replaced with the streams to create */
		r->superseded = true;
		return;
	}
	if (stream.shards != r->c.shards ||
		stream.replication_factor != r->c.replication_factor ||
		stream.consistency != consistency)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" here differs from the control plane's: "
						"%d shards, replication_factor %d, consistency %s here; "
						"%d, %d, %s there",
						r->c.stream, stream.shards, stream.replication_factor,
						stream.consistency == FELIX_CONSISTENCY_QUORUM ? "quorum" : "leader",
						r->c.shards, r->c.replication_factor, r->c.consistency),
				 errdetail("The local stream was not created through the control plane."),
				 errhint("Drop the local stream \"%s\" (felix_drop_stream) to let this node "
						 "recreate it as the cluster defines it, or rename one of the two.",
						 r->c.stream)));

	/* Never wait for a user's lock: the next heartbeat comes soon. */
	if (!ConditionalLockRelationOid(stream.relid, AccessShareLock))
	{
		ereport(DEBUG1,
				(errmsg_internal("felix heartbeat: stream \"%s\" is locked; shard %d skipped this time",
								 r->c.stream, r->c.shard)));
		return;
	}
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(stream.relid)))
		return;					/* dropped meanwhile */

	if (r->defer_costly)
	{
		/*
		 * Only if its shard is open here, and it takes no new lead.  A
		 * slot another process is still opening (a leader's first
		 * shipment often comes before the assignment) is not open: its
		 * opener holds the tail through every sync, and waiting for it is
		 * the very cost the budget defers.
		 */
		FelixShardKey key;
		FelixShard *open;
		FelixShardPositions pos;

		memset(&key, 0, sizeof(key));
		key.dboid = MyDatabaseId;
		key.relid = stream.relid;
		key.shard = r->c.shard;
		open = shard_lookup(&key);
		if (open != NULL)
			shard_read_positions(open, &pos);
		if (open == NULL || !pos.in_use || pos.phase != FELIX_SHARD_OPEN ||
			lease_assignment_takes_lead(open, &r->c.a))
		{
			r->deferred = true;
			return;
		}
	}
	s = felix_stream_shard(&stream, r->c.shard);
	lease_apply_assignment(s, &r->c.a);
	r->applied = true;
	r->slot = shard_slot_index(s);
	r->key = s->key;
	r->holds = holds_copy(&r->c.a);
}

/* Note each shard's leader and its address in the node directory. */
void
agent_note_leaders(AgentRow *rows, int nrows)
{
	for (int i = 0; i < nrows; i++)
	{
		AgentRow	   *r = &rows[i];

		if (r->c.bad == NULL && r->c.a.leader[0] != '\0' && r->c.leader_conninfo[0] != '\0')
			felix_node_note(r->c.a.leader, r->c.leader_conninfo);
	}
}

/* The heartbeat's shards as rows to apply. */
AgentRow *
agent_rows(FelixCpShard *shards, int n)
{
	AgentRow	   *rows = palloc0(sizeof(AgentRow) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		rows[i].c = shards[i];
		rows[i].slot = -1;
	}
	return rows;
}

const FelixCpAnswer *
agent_known(void)
{
	return have_known ? &known_answer : NULL;
}

static void
known_row_free(KnownRow *k)
{
	if (k->row.leader_conninfo)
		pfree(k->row.leader_conninfo);
	if (k->row.bad)
		pfree(k->row.bad);
}

static void
forget_ends_given(void)
{
	for (int i = 0; i < nends_given; i++)
		pfree(ends_given[i]);
	if (ends_given)
		pfree(ends_given);
	ends_given = NULL;
	nends_given = 0;
	ends_given_made = 0;
}

bool
agent_ends_unchanged(char **ends, int n)
{
	if (!have_known || ends == NULL || ends_given == NULL || n != nends_given)
		return false;
	/* the very answer they were copied from: the same texts */
	if (ends == held_out && ends_given_made == held_out_made)
		return true;
	for (int i = 0; i < n; i++)
		if (strcmp(ends[i], ends_given[i]) != 0)
			return false;
	return true;
}

void
agent_ends_sent(char **ends, int n, bool unchanged, const FelixCpAnswer *answer)
{
	if (unchanged && !answer->full)
		return;					/* the control plane took them as they were */
	forget_ends_given();
	if (unchanged || ends == NULL)
		return;					/* maybe not taken: given again next time */
	ends_given = MemoryContextAlloc(known_cxt, sizeof(char *) * (n + 1));
	for (int i = 0; i < n; i++)
		ends_given[i] = MemoryContextStrdup(known_cxt, ends[i]);
	nends_given = n;
	ends_given_made = ends == held_out ? held_out_made : 0;
}

void
agent_forget(void)
{
	HASH_SEQ_STATUS seq;
	KnownRow   *k;

	hash_seq_init(&seq, known_rows);
	while ((k = hash_seq_search(&seq)) != NULL)
	{
		known_row_free(k);
		(void) hash_search(known_rows, k, HASH_REMOVE, NULL);
	}
	have_known = false;
	held_stale = true;
	forget_ends_given();
	forget_unquiet();
}

static void
forget_unquiet(void)
{
	if (unquiet)
		pfree(unquiet);
	unquiet = NULL;
	nunquiet = 0;
}

AgentRow *
agent_take_answer(FelixCpShard *shards, int n, const FelixCpAnswer *answer, int64 t_send,
				  int *nrows)
{
	HASH_SEQ_STATUS seq;
	KnownRow   *k;
	AgentRow   *rows;
	int			room;
	MemoryContext caller = CurrentMemoryContext;
	uint64		changes;
	bool		slots_same;
	bool		all;
	int			next = 0;
	char		incarnation[FELIX_INCARNATION_LEN];

	if (answer->full)
	{
		hash_seq_init(&seq, known_rows);
		while ((k = hash_seq_search(&seq)) != NULL)
			k->in_answer = false;
	}
	if (n > 0 || answer->full)
		held_stale = true;
	MemoryContextSwitchTo(known_cxt);
	for (int i = 0; i < n; i++)
	{
		RowErrorKey key;
		bool		found;

		row_error_key(&key, shards[i].stream, shards[i].shard);
		k = hash_search(known_rows, &key, HASH_ENTER, &found);
		if (found)
			known_row_free(k);
		else
		{
			k->slot = -1;
			memset(&k->key, 0, sizeof(k->key));
			k->holds = false;
		}
		k->row = shards[i];
		k->row.leader_conninfo = shards[i].leader_conninfo ? pstrdup(shards[i].leader_conninfo) : NULL;
		k->row.bad = shards[i].bad ? pstrdup(shards[i].bad) : NULL;
		/* to apply; the copy it found (slot, holds) is the one until then */
		k->applied = false;
		k->in_answer = true;
		k->names_other = k->row.a.leader[0] == '\0' || !felix_is_this_node(k->row.a.leader);
		k->quiet = false;
	}
	MemoryContextSwitchTo(caller);
	if (answer->full)
	{
		/* what a full answer leaves out is no more */
		hash_seq_init(&seq, known_rows);
		while ((k = hash_seq_search(&seq)) != NULL)
			if (!k->in_answer)
			{
				known_row_free(k);
				(void) hash_search(known_rows, k, HASH_REMOVE, NULL);
			}
	}
	known_answer = *answer;
	have_known = true;

	/*
	 * This answer claimed again every lease held that it says nothing
	 * about (cp_heartbeat.c, "What the answer holds"): each is as of
	 * t_send, renewed on the spot where the local shard is as the row
	 * left it, else applied anew with the rest.
	 */
	/* grown as needed: most heartbeats renew every lease on the spot */
	room = 16;
	rows = palloc0(sizeof(AgentRow) * room);
	*nrows = 0;
	changes = shard_changes();
	slots_same = changes == renewed_changes;
	renewed_changes = changes;
	felix_incarnation(incarnation, NULL);

	/*
	 * A row naming another leader renews nothing here: it only checks the
	 * local shard is as the row left it.  No slot changed since that check
	 * found it so (quiet): it still is, and unless rows came, only the
	 * others are looked at.  A lease this node holds is renewed every time.
	 */
	all = !slots_same || n > 0 || answer->full || unquiet == NULL;
	if (all)
	{
		forget_unquiet();
		unquiet = MemoryContextAlloc(known_cxt,
									 sizeof(KnownRow *) * (hash_get_num_entries(known_rows) + 1));
		hash_seq_init(&seq, known_rows);
	}
	while ((k = all ? hash_seq_search(&seq) : (next < nunquiet ? unquiet[next++] : NULL)) != NULL)
	{
		AgentRow   *r;

		if (k->quiet && slots_same)
			continue;
		k->row.a.sent_at_ns = t_send;
		if (k->applied && k->slot >= 0 && k->row.bad == NULL &&
			lease_reassert(k->slot, &k->key, &k->row.a, incarnation))
		{
			k->quiet = k->names_other;
			if (all && !k->quiet)
				unquiet[nunquiet++] = k;
			continue;
		}
		k->quiet = false;
		if (all)
			unquiet[nunquiet++] = k;
		if (*nrows == room)
		{
			rows = repalloc(rows, sizeof(AgentRow) * room * 2);
			memset(rows + room, 0, sizeof(AgentRow) * room);
			room *= 2;
		}
		r = &rows[(*nrows)++];
		r->c = k->row;
		r->c.leader_conninfo = k->row.leader_conninfo ? pstrdup(k->row.leader_conninfo) : pstrdup("");
		r->c.bad = k->row.bad ? pstrdup(k->row.bad) : NULL;
		r->slot = -1;
	}
	return rows;
}

typedef struct ApplyStream
{
	FelixCpSession *s;
	const char *stream;
} ApplyStream;

/* One heartbeat of the calling backend's own, applying the rows of arg's stream. */
static void
apply_stream_now(void *arg)
{
	ApplyStream *a = arg;
	FelixCpShard *shards;
	int			n;
	int64		t_send;
	AgentRow   *rows;
	FelixCpAnswer answer;

	/*
	 * Only the stream's rows come back: a backend keeps no assignments
	 * (agent_rows), so the others would only be sent and decoded.
	 */
	(void) felix_cp_heartbeat(a->s, NULL, 0, NULL, 0, false, NULL, NULL, a->stream,
							  &t_send, &shards, &n, &answer, ERROR);
	rows = agent_rows(shards, n);
	agent_note_leaders(rows, n);

	/*
	 * Every shard of the stream, not only those led here: a shard another
	 * node leads takes a publish made here (forwarded to its leader) once
	 * its assignment is applied here, and the caller may publish to any of
	 * them as soon as the call returns (TAP 127 runs the README's tour so).
	 */
	for (int i = 0; i < n; i++)
		apply_row_guts(&rows[i]);
}

/*
 * The creating backend's half of felix_create_stream: one heartbeat of its
 * own, whose rows for the new stream are applied at once, so the stream is
 * led (and, on this node, writable) when the call returns rather than at
 * the worker's next heartbeat.  The lease is anchored at this heartbeat's
 * send time, exactly as the worker anchors its own; the worker's later
 * renewals only ever extend it.
 *
 * By now the control plane lists the stream and this node has its table:
 * the work is done.  A heartbeat that fails here (the store busy with
 * other writers, or unreachable) must not make the call report a failure
 * it would then have to undo -- an undo that can fail the same way, and
 * leave a stream that exists behind an error.  So the failure is a
 * WARNING, and the heartbeat worker applies the stream at its next beat.
 */
void
agent_apply_stream(FelixCpSession *s, const char *stream)
{
	ApplyStream a = {s, stream};
	ErrorData  *err = felix_run_isolated(apply_stream_now, &a);

	if (err != NULL)
		ereport(WARNING,
				(errmsg("stream \"%s\" is created, but this node has not taken its leases yet", stream),
				 errdetail("The heartbeat that takes them failed: %s", err->message),
				 errhint("The node's heartbeat worker takes them once the control plane answers; until then the stream's shards led here refuse writes.")));
}

/* An empty set of stream names, in the current context. */
static HTAB *
name_set(const char *what, long size)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = NAMEDATALEN;
	ctl.hcxt = CurrentMemoryContext;
	return hash_create(what, size, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/* Names of the streams this database has (a set, in the current context). */
static HTAB *
local_stream_names(void)
{
	HTAB	   *names = name_set("felix heartbeat: local streams", 64);
	ListCell   *lc;

	/* Each call reads with a fresh snapshot. */
	foreach(lc, felix_stream_list())
		(void) hash_search(names, ((FelixStream *) lfirst(lc))->name, HASH_ENTER, NULL);
	return names;
}

static bool
name_in(HTAB *names, const char *name)
{
	char		key[NAMEDATALEN];

	memset(key, 0, sizeof(key));
	strlcpy(key, name, NAMEDATALEN);
	return hash_search(names, key, HASH_FIND, NULL) != NULL;
}

static void create_stream_guts(void *arg);

/*
 * The control plane lists another creation of a stream this node has: the
 * one here was dropped elsewhere and its name used again.  It goes here
 * too, with its records, as it went everywhere else, and the new one is
 * created in its place (inside a subtransaction).  Not while someone
 * holds the name, nor on rows that may predate a stream made here.
 */
static void
replace_stream_guts(void *arg)
{
	AgentRow	   *r = arg;
	const FelixStream *found;

	if (shard_streams_changes() != changes_before_rows ||
		!felix_stream_lock_name(r->c.stream, false))
		return;
	found = felix_stream_by_name(r->c.stream);
	if (strcmp(found->creation_id, r->c.creation_id) == 0)
		return;
	ereport(LOG,
			(errmsg("felix heartbeat: dropping stream \"%s\" here: it was dropped elsewhere and created again",
					r->c.stream),
			 errdetail("Its creation id is %s here and %s at the control plane.",
					   found->creation_id, r->c.creation_id)));
	felix_stream_drop_superseded(found);
	create_stream_guts(r);
}

/* Create a stream the control plane lists (inside a subtransaction). */
static void
create_stream_guts(void *arg)
{
	AgentRow	   *r = arg;

	/*
	 * A backend creating or dropping this very stream holds the name until
	 * it commits or aborts: the backend makes (or removed) the table.
	 * Holding the name ourselves, the facts below cannot change under us:
	 * the table is looked for with a fresh snapshot, and a stream gone
	 * since the rows were fetched means they may be stale (the next
	 * heartbeat's rows will say).
	 */
	if (!felix_stream_lock_name(r->c.stream, false))
		return;
	if (shard_streams_changes() != changes_before_rows ||
		name_in(local_stream_names(), r->c.stream))
		return;
	refuse_bad_row(r);
	(void) row_consistency(r);
	{
		FelixStreamSettings st;

		memset(&st, 0, sizeof(st));
		st.shards = r->c.shards;
		st.replication_factor = r->c.replication_factor;
		st.consistency = r->c.consistency;
		st.storage = "local";
		st.retention_bytes = Max(r->c.retention_bytes, 0);
		st.retention = r->c.has_retention ? &r->c.retention : NULL;
		(void) felix_stream_create_local(r->c.stream, r->c.schema, r->c.creation_id,
										 r->c.payload_type, &st);
	}
	ereport(LOG,
			(errmsg("felix heartbeat: created stream \"%s\" (%d shards, replication_factor %d, %s) as the control plane defines it",
					r->c.stream, r->c.shards, r->c.replication_factor, r->c.consistency)));
}

/*
 * Run fn(r) in a subtransaction: an error is logged (rate-limited per
 * stream and shard) and rolled back, and the caller goes on.
 */
static bool
run_isolated(void (*fn) (void *), AgentRow *r, int key_shard, const char *what)
{
	ErrorData  *edata = felix_run_isolated(fn, r);

	if (edata != NULL)
	{
		report_row_error(r->c.stream, key_shard, edata, what);
		FreeErrorData(edata);
		return false;
	}
	row_error_cleared(r->c.stream, key_shard);
	return true;
}

static MemoryContext work_caller_cxt = NULL;

static void
begin_work(const char *activity)
{
	work_caller_cxt = CurrentMemoryContext;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

static void
end_work(void)
{
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(work_caller_cxt);
}

/* Is the heartbeat's budget for costly rows spent?  (0: no budget) */
static bool
past(int64 deadline_ns)
{
	return deadline_ns > 0 && felix_monotonic_ns() >= deadline_ns;
}

/*
 * Apply every row: first the shards of streams that exist here (lease
 * renewals must not wait behind a table creation), then create the missing
 * streams, then apply their rows, each step in its own transaction.  Once
 * deadline_ns is past, rows that would open a shard, take a lead or create
 * a stream are marked deferred and left as they were: the next heartbeat
 * brings them again (their known rows stay unapplied).
 */
void
agent_apply(AgentRow *rows, int nrows, int64 deadline_ns)
{
	int			nmissing = 0;
	int			ncreated = 0;

	if (nrows == 0)
		return;					/* every lease renewed in place: no transaction */
	begin_work("felix: applying the control plane's assignments");
	{
		HTAB	   *local = local_stream_names();

		for (int i = 0; i < nrows; i++)
		{
			AgentRow	   *r = &rows[i];

			CHECK_FOR_INTERRUPTS();
			if (r->c.bad == NULL && !name_in(local, r->c.stream))
			{
				r->missing = true;
				nmissing++;
				continue;
			}
			r->defer_costly = past(deadline_ns);
			(void) run_isolated(apply_row_guts, r, r->c.shard,
								psprintf("applying the control plane's assignment of stream \"%s\" shard %d",
										 r->c.stream, r->c.shard));
			if (r->superseded)
			{
				r->missing = true;
				nmissing++;
			}
		}
	}
	end_work();

	/* a stream's creation is costly: the next heartbeat's, if late */
	if (nmissing == 0 || past(deadline_ns))
	{
		for (int i = 0; i < nrows; i++)
			if (rows[i].missing)
				rows[i].deferred = true;
		return;
	}

	begin_work("felix: creating streams defined at the control plane");
	{
		char		timeout[32];
		HTAB	   *tried;

		/* A user's lock on the schema delays a creation, not the worker. */
		snprintf(timeout, sizeof(timeout), "%d", Max(felix_heartbeat_interval, 100));
		(void) set_config_option("lock_timeout", timeout, PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);

		tried = name_set("felix heartbeat: created streams", 16);

		for (int i = 0; i < nrows; i++)
		{
			AgentRow	   *r = &rows[i];
			char		key[NAMEDATALEN];
			bool		found;

			if (!r->missing)
				continue;
			CHECK_FOR_INTERRUPTS();
			memset(key, 0, sizeof(key));
			strlcpy(key, r->c.stream, NAMEDATALEN);
			(void) hash_search(tried, key, HASH_ENTER, &found);
			if (found)
				continue;
			if (run_isolated(r->superseded ? replace_stream_guts : create_stream_guts, r, -1,
							 psprintf("creating stream \"%s\" as the control plane defines it",
									  r->c.stream)))
			{
				ncreated++;
				for (int k = i; k < nrows; k++)
					if (rows[k].missing && strcmp(rows[k].c.stream, r->c.stream) == 0)
						rows[k].created = true;
			}
		}
	}
	end_work();

	if (ncreated == 0)
		return;

	begin_work("felix: applying the control plane's assignments");
	for (int i = 0; i < nrows; i++)
	{
		AgentRow	   *r = &rows[i];

		if (!r->created)
			continue;
		CHECK_FOR_INTERRUPTS();
		r->defer_costly = past(deadline_ns);
		(void) run_isolated(apply_row_guts, r, r->c.shard,
							psprintf("applying the control plane's assignment of stream \"%s\" shard %d",
									 r->c.stream, r->c.shard));
	}
	end_work();
}

/*
 * Remember which shards' assignments reached their local shard this time
 * (see agent_unable_list).  Rows of streams this node has no table for, or that
 * it cannot read, say nothing about serving.
 */
void
agent_note_served(AgentRow *rows, int nrows)
{
	int64		now = felix_monotonic_ns();

	for (int i = 0; i < nrows; i++)
	{
		AgentRow	   *r = &rows[i];
		RowErrorKey key;
		UnservedEntry *e;
		bool		found;

		if (r->c.bad != NULL || (r->missing && !r->created) || r->deferred)
			continue;
		row_error_key(&key, r->c.stream, r->c.shard);
		if (r->applied)
		{
			(void) hash_search(unserved, &key, HASH_REMOVE, NULL);
			continue;
		}
		e = hash_search(unserved, &key, HASH_ENTER, &found);
		if (!found)
			e->since_ns = now;
	}
}

/*
 * Remember what became of the rows applied, in the rows held, and the
 * shards the rows held name this node a replica of.
 */
void
agent_note_held(AgentRow *rows, int nrows)
{
	HASH_SEQ_STATUS seq;
	KnownRow   *k;

	for (int i = 0; i < nrows; i++)
	{
		RowErrorKey key;

		if (rows[i].deferred)
			continue;			/* still to apply; its copy is as it was */
		row_error_key(&key, rows[i].c.stream, rows[i].c.shard);
		k = hash_search(known_rows, &key, HASH_FIND, NULL);
		if (k == NULL)
			continue;
		k->applied = rows[i].applied;
		k->slot = rows[i].applied ? rows[i].slot : -1;
		k->key = rows[i].key;
		k->holds = rows[i].applied && rows[i].holds;
		k->quiet = false;
		held_stale = true;
	}

	/*
	 * Made again only when a row held, or what became of one, changed:
	 * most beats renew every lease on the spot and change nothing, and a
	 * walk of every row at every beat cost as much as the leases.
	 */
	if (!held_stale)
		return;
	held_stale = false;
	held_remade = true;
	MemoryContextReset(held_cxt);
	held_out = NULL;
	held_out_changes = PG_UINT64_MAX;
	held = MemoryContextAllocZero(held_cxt,
								  sizeof(HeldShard) * (hash_get_num_entries(known_rows) + 1));
	nheld = 0;
	hash_seq_init(&seq, known_rows);
	while ((k = hash_seq_search(&seq)) != NULL)
	{
		if (!k->holds || k->slot < 0)
			continue;
		strlcpy(held[nheld].stream, k->row.stream, NAMEDATALEN);
		held[nheld].shard = k->row.shard;
		held[nheld].slot = k->slot;
		held[nheld].key = k->key;
		nheld++;
	}
}

/*
 * The durable log ends, now, of the shards this node was last named a
 * replica of ("stream/shard=end[:last_generation:copy_epoch:first]", first
 * 1 while the copy's epoch is its first in this server start), for the
 * heartbeat to give; NULL before
 * the first heartbeat of this boot has named any.  The duty holder gives
 * a lapsed leader its shard back, and promotes a follower, only if its log
 * still ends at or after what the reports say it held: a node whose felix
 * directory was put back from an older copy (same identity, fewer records)
 * does not lead.
 *
 * The answer lives until held is made again; the caller must not change it.
 */
char **
agent_held_ends(int *n, bool *moved)
{
	uint64		changes = shard_changes();

	*n = 0;
	*moved = held_remade;
	held_remade = false;
	if (held == NULL)
		return NULL;

	/*
	 * A copy's ends move only with a change the slots count: none since
	 * the last answer was read, that answer stands.  So an idle node reads
	 * none of its thousands of slots at a beat.
	 */
	if (held_out != NULL && changes == held_out_changes)
	{
		*n = nheld_out;
		return held_out;
	}
	if (held_out == NULL)
		held_out = MemoryContextAllocZero(held_cxt, sizeof(char *) * (nheld + 1));
	held_out_changes = changes;
	held_out_made++;
	for (int i = 0; i < nheld; i++)
	{
		HeldShard  *h = &held[i];
		FelixShardEnds pos;
		MemoryContext old;

		/* read whenever a slot changed: a copy truncated in a repair must say so */
		shard_read_ends(shard_slot(h->slot), &pos);
		if (!pos.in_use || memcmp(&pos.key, &h->key, sizeof(FelixShardKey)) != 0)
			continue;			/* forgotten or reused since */
		if (pos.phase != FELIX_SHARD_OPEN)
			continue;			/* its positions are not its disk's (a failed discard) */
		if (h->text == NULL || memcmp(&pos, &h->seen, sizeof(pos)) != 0)
		{
			*moved = true;
			if (h->text)
				pfree(h->text);
			h->seen = pos;

			/*
			 * With the generation of its last record and its copy epoch
			 * when every record written is durable (then last_generation
			 * is the durable log's): the duty holder may then promote the
			 * copy with the newest log without a report (cp_duty.c,
			 * copies_candidate).
			 */
			old = MemoryContextSwitchTo(held_cxt);
			if (pos.written_end == pos.flushed_end)
				h->text = psprintf("%s/%d=" UINT64_FORMAT ":" UINT64_FORMAT ":" UINT64_FORMAT ":%d",
								   h->stream, h->shard, pos.flushed_end,
								   pos.last_generation, pos.copy_epoch, pos.copy_first ? 1 : 0);
			else
				h->text = psprintf("%s/%d=" UINT64_FORMAT, h->stream, h->shard, pos.flushed_end);
			MemoryContextSwitchTo(old);
		}
		held_out[(*n)++] = h->text;
	}
	nheld_out = *n;
	return held_out;
}

/*
 * The shards this node cannot serve ("stream/shard")
 * for felix.cp_heartbeat: those whose assignment has failed to reach the
 * local shard (damaged, the table locked, ...) for a whole lease.  The
 * control plane renews no lease of theirs here and counts this node out
 * of their promotions, so a shard this node leads but cannot serve fails
 * over instead of holding a lease nobody can use.
 */
char **
agent_unable_list(int *n)
{
	HASH_SEQ_STATUS seq;
	UnservedEntry *e;
	int64		now = felix_monotonic_ns();
	char	  **out = palloc0(sizeof(char *) * (hash_get_num_entries(unserved) + 1));

	*n = 0;
	hash_seq_init(&seq, unserved);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (now - e->since_ns < (int64) felix_lease_duration * 1000000)
			continue;
		out[(*n)++] = psprintf("%s/%d", e->key.stream, e->key.shard);
	}
	return out;
}

