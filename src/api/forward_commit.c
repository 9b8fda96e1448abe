/*-------------------------------------------------------------------------
 *
 * forward_commit.c
 *	  A transactional INSERT or COPY on a node that does not lead every
 *	  shard it wrote to: the commit is staged at every leader and published
 *	  only once all of them have staged, so it keeps its all-or-nothing
 *	  rule across leaders as leader_commit keeps it across this node's
 *	  shards.  Both halves are here:
 *
 *	  - the asking side (forward_commit), called at pre-commit by
 *	    pending.c when some part goes to another leader.  When every part
 *	    goes to one other node, that leader stages and commits them in one
 *	    call outside a transaction block (commit_one_leader): all or
 *	    nothing holds there as for a commit made on it, and no gate waits
 *	    for a round trip.  Otherwise:
 *	      1. the parts are grouped by the leader the control plane names
 *	         (this node's own parts form one group);
 *	      2. each group is staged, in the order of the leaders' names: here
 *	         by leader_commit_stage, elsewhere by BEGIN and
 *	         felix.forward_stage on the node's own connection to the
 *	         leader.  Every commit that spans leaders takes their gates in
 *	         that one order -- node name, then slot on the node -- so two
 *	         of them never wait for each other in a cycle.  A leader that
 *	         refuses at admission (55F02, 55F03), that has not learned of
 *	         the stream yet (42P01) or that could not be reached (nothing
 *	         sent) makes the whole commit start over, every stage rolled
 *	         back, on the leaders the control plane names by then, until
 *	         felix.quorum_timeout; any other refusal rolls every stage back
 *	         and fails the commit with nothing published.  A leader whose
 *	         call broke mid-way, whose session ended after it staged, or
 *	         that does not confirm its rollback, may have crashed holding
 *	         its part -- a crashed leader keeps what it wrote -- so the
 *	         commit never starts over then: it fails with 55F01, naming
 *	         that leader;
 *	      3. once every group is staged, COMMIT is sent to every other
 *	         leader, this node's parts are published and acknowledged, and
 *	         then every leader's answer is collected.
 *	    The window this leaves: a leader whose COMMIT never arrives (its
 *	    connection broke between its stage and the commit) cuts its part
 *	    back while the other leaders publish theirs; the commit then fails
 *	    with 55F01, saying so.  It is the cross-node form of the crash
 *	    between pre-commit and the commit record (docs/sql-api.md).
 *	  - the answering side (felix.forward_stage), on a leader, inside the
 *	    asking node's transaction (or a statement of its own, for the one
 *	    call of a single leader): for a caller acting for the cluster, it
 *	    checks the inserting role's INSERT privilege and every batch as
 *	    felix.forward_publish does, the owners' byte caps, and stages the
 *	    parts (leader_commit_stage).  The transaction's COMMIT publishes
 *	    and acknowledges them (pre-commit); its end in any other way -- a
 *	    ROLLBACK, an error, the session ending -- cuts them back.  Row
 *	    security and INSERT triggers applied where the INSERT ran.  A
 *	    staged session left idle for felix.quorum_timeout is ended by the
 *	    server (idle_in_transaction_session_timeout), so an asking node
 *	    that stops cannot hold the shards' gates for longer.
 *
 * Locking rule: backend-local.  Staged parts hold their shards' commit
 * gates (storage/shard.c) from the stage to the commit or abort; the
 * heartbeat never waits for them (lease_apply_assignment).  The answering
 * side holds RowExclusiveLock on each stream's table until its
 * transaction ends.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "core/catalog.h"
#include "api/forward.h"
#include "api/publish.h"
#include "catalog/pg_type.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "base/wake.h"
#include "felix.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "base/privilege.h"
#include "replication/lease.h"
#include "storage/format.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

/* How long a leader may take to confirm it cut a staged part back. */
#define FORWARD_ROLLBACK_MS	2000

/* One leader's share of a commit, on the asking side. */
typedef struct CommitGroup
{
	char		leader[NAMEDATALEN];
	bool		here;			/* this node's own parts */
	FelixCommitPart *parts;
	const PublishCharge **charges;
	List	  **roles;			/* the roles that inserted each part's rows */
	int			nparts;
	bool		staged;
	PGconn	   *conn;			/* elsewhere, once BEGIN was sent */
} CommitGroup;

/* ---------------------------------------------------------------------
 * The asking side
 * ---------------------------------------------------------------------
 */

bool
forward_commit_wanted(const FelixCommitPart *parts, int nparts)
{
	for (int i = 0; i < nparts; i++)
		if (!parts[i].restore && forward_wanted(parts[i].s))
			return true;
	return false;
}

static int
cmp_group(const void *a, const void *b)
{
	return strcmp(((const CommitGroup *) a)->leader, ((const CommitGroup *) b)->leader);
}

/*
 * Group the parts by the leader the control plane names now, in the order
 * of the leaders' names.  Restored records are never forwarded: they stay
 * here, where their shard's admission refuses them if it is led elsewhere.
 */
static int
group_parts(FelixCommitPart *parts, const PublishCharge *charges, List *const *roles,
			int nparts, CommitGroup *groups)
{
	int			ngroups = 0;

	for (int i = 0; i < nparts; i++)
	{
		char		elsewhere[NAMEDATALEN];
		const char *leader = felix_node_name_resolved();
		bool		here = true;
		CommitGroup *g = NULL;

		if (!parts[i].restore && forward_leader(parts[i].s, elsewhere))
		{
			leader = pstrdup(elsewhere);
			here = false;
		}
		for (int k = 0; k < ngroups; k++)
			if (groups[k].here == here && strcmp(groups[k].leader, leader) == 0)
				g = &groups[k];
		if (g == NULL)
		{
			g = &groups[ngroups++];
			memset(g, 0, sizeof(CommitGroup));
			strlcpy(g->leader, leader, NAMEDATALEN);
			g->here = here;
			g->parts = palloc(sizeof(FelixCommitPart) * nparts);
			g->charges = palloc(sizeof(PublishCharge *) * nparts);
			g->roles = palloc(sizeof(List *) * nparts);
		}
		g->parts[g->nparts] = parts[i];
		g->charges[g->nparts] = &charges[i];
		g->roles[g->nparts] = roles[i];
		g->nparts++;
	}
	qsort(groups, ngroups, sizeof(CommitGroup), cmp_group);
	return ngroups;
}

/* An array literal element, quoted for array_in. */
static void
append_quoted(StringInfo buf, const char *value)
{
	appendStringInfoChar(buf, '"');
	for (const char *p = value; *p; p++)
	{
		if (*p == '"' || *p == '\\')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, *p);
	}
	appendStringInfoChar(buf, '"');
}

/*
 * felix.forward_stage's arguments for group g: the inserting roles, then
 * every batch of its parts, one array element per batch.
 */
static void
stage_args(CommitGroup *g, const char **values)
{
	StringInfoData inserters;
	StringInfoData streams;
	StringInfoData ids;
	StringInfoData shards;
	StringInfoData hex;
	bool		first = true;

	/* which role inserted into which stream: {{stream, role}, ...} */
	initStringInfo(&inserters);
	appendStringInfoChar(&inserters, '{');
	for (int i = 0; i < g->nparts; i++)
	{
		ListCell   *lc;

		foreach(lc, g->roles[i])
		{
			if (inserters.len > 1)
				appendStringInfoChar(&inserters, ',');
			appendStringInfoChar(&inserters, '{');
			append_quoted(&inserters, g->charges[i]->stream->name);
			appendStringInfoChar(&inserters, ',');
			append_quoted(&inserters, GetUserNameFromId(lfirst_oid(lc), false));
			appendStringInfoChar(&inserters, '}');
		}
	}
	appendStringInfoChar(&inserters, '}');

	initStringInfo(&streams);
	initStringInfo(&ids);
	initStringInfo(&shards);
	initStringInfo(&hex);
	appendStringInfoChar(&streams, '{');
	appendStringInfoChar(&ids, '{');
	appendStringInfoChar(&shards, '{');
	appendStringInfoString(&hex, "\\x");
	for (int i = 0; i < g->nparts; i++)
	{
		FelixCommitPart *p = &g->parts[i];
		const FelixStream *stream = g->charges[i]->stream;

		for (int b = 0; b < p->nbatches; b++)
		{
			StringInfo	batch = p->batches[b];

			if (!first)
			{
				appendStringInfoChar(&streams, ',');
				appendStringInfoChar(&ids, ',');
				appendStringInfoChar(&shards, ',');
			}
			first = false;
			append_quoted(&streams, stream->name);
			append_quoted(&ids, stream->creation_id);
			appendStringInfo(&shards, "%d", p->s->key.shard);
			enlargeStringInfo(&hex, batch->len * 2);
			hex.len += hex_encode(batch->data, batch->len, hex.data + hex.len);
			hex.data[hex.len] = '\0';
		}
	}
	appendStringInfoChar(&streams, '}');
	appendStringInfoChar(&ids, '}');
	appendStringInfoChar(&shards, '}');
	values[0] = inserters.data;
	values[1] = streams.data;
	values[2] = ids.data;
	values[3] = shards.data;
	values[4] = hex.data;
}

#define STAGE_SQL \
	"SELECT felix.forward_stage($1::pg_catalog.text[], $2::pg_catalog.text[], $3::pg_catalog.text[], " \
	"$4::pg_catalog.int4[], $5::pg_catalog.bytea)"

/* felix.forward_stage's answer: true if staged, false if refused at admission. */
static bool
stage_answer(PGresult *res, const char *leader)
{
	bool		staged;

	if (PQntuples(res) != 1 || PQnfields(res) != 1 ||
		(strcmp(PQgetvalue(res, 0, 0), "staged") != 0 &&
		 strcmp(PQgetvalue(res, 0, 0), "not_leader") != 0))
	{
		PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("node \"%s\" answered felix.forward_stage with something it never says", leader),
				 errhint("Run the same felix version on every node.")));
	}
	staged = strcmp(PQgetvalue(res, 0, 0), "staged") == 0;
	PQclear(res);
	return staged;
}

/*
 * Stage group g at its leader, inside a transaction opened there: BEGIN,
 * then felix.forward_stage.  A leader that refuses at admission is an
 * error the commit starts over on (55F02).
 */
static void
stage_elsewhere(CommitGroup *g, int64 deadline)
{
	const char *values[5];
	long		left_ms = (long) ((deadline - felix_monotonic_ns()) / 1000000);

	g->conn = forward_conn(g->leader);
	if (g->conn == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_DOES_NOT_EXIST),
				 errmsg("could not reach leader \"%s\": %s", g->leader, felix_conn_last_error())));
	stage_args(g, values);
	PQclear(felix_conn_exec(g->conn, "BEGIN", "BEGIN", 0, NULL, Max(left_ms, 1), ERROR));
	if (!stage_answer(felix_conn_exec(g->conn, "felix.forward_stage", STAGE_SQL,
									  5, values, Max(left_ms, 1), ERROR), g->leader))
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_NOT_LEADER),
				 errmsg("leader \"%s\" does not lead its shards of the commit any more", g->leader)));
	g->staged = true;
}

/*
 * Is a leader's session still inside the transaction that staged its
 * part?  Read what it sent meanwhile without waiting: a session the
 * leader ended (idle too long, terminated) has cut its part back.
 */
static bool
staged_alive(PGconn *conn)
{
	return PQconsumeInput(conn) == 1 && PQstatus(conn) == CONNECTION_OK &&
		PQtransactionStatus(conn) == PQTRANS_INTRANS && !PQisBusy(conn);
}

/*
 * Undo every stage: here cut back, elsewhere rolled back by the leader,
 * which answers only once its part is cut back.  Returns the name of a
 * leader whose staged part may survive -- its ROLLBACK got no answer (it
 * may have crashed holding the part, and kept it on recovery) -- or NULL.
 * The group `unsure` (or -1) is one whose call broke mid-way: its part is
 * in doubt whatever its session says now.
 */
static const char *
cancel_all(CommitGroup *groups, int ngroups, int unsure)
{
	const char *doubt = NULL;

	for (int k = 0; k < ngroups; k++)
	{
		CommitGroup *g = &groups[k];

		if (g->here && g->staged)
			leader_commit_cancel(g->parts, g->nparts);
		else if (!g->here && g->conn != NULL)
		{
			PGresult   *res = NULL;

			if (k != unsure)
				res = felix_conn_exec(g->conn, "ROLLBACK", "ROLLBACK", 0, NULL,
									  FORWARD_ROLLBACK_MS, DEBUG1);
			if (res == NULL)
			{
				forward_drop_conn(g->leader);
				if ((g->staged || k == unsure) && doubt == NULL)
					doubt = pstrdup(g->leader);
			}
			PQclear(res);
		}
		g->staged = false;
		g->conn = NULL;
	}
	return doubt;
}

/*
 * May the commit start over after this error?  Only on a live leader's
 * word that it staged nothing (it does not lead the shard, it does not
 * know the stream yet), or when nothing was sent (08003).  A call that
 * broke mid-way is not one: the leader may have staged the part and
 * crashed, and recovery keeps what it had written.
 */
static bool
stage_retryable(int sqlerrcode)
{
	return sqlerrcode == FELIX_ERRCODE_NOT_LEADER || sqlerrcode == FELIX_ERRCODE_LEASE_EXPIRED ||
		sqlerrcode == ERRCODE_UNDEFINED_TABLE || sqlerrcode == ERRCODE_CONNECTION_DOES_NOT_EXIST;
}

/* Stage every group, starting over while a leader moves. */
static int
stage_all(FelixCommitPart *parts, const PublishCharge *charges, List *const *roles,
		  int nparts, CommitGroup *groups)
{
	int64		deadline = felix_monotonic_ns() + (int64) felix_quorum_timeout * 1000000;
	MemoryContext cxt = CurrentMemoryContext;
	bool		woke = false;

	for (;;)
	{
		int			ngroups = group_parts(parts, charges, roles, nparts, groups);
		volatile bool retry = false;
		volatile int current = 0;

		PG_TRY();
		{
			for (int k = 0; k < ngroups; k++)
			{
				CommitGroup *g = &groups[k];

				current = k;
				if (g->here)
				{
					PublishCharge *mine = palloc(sizeof(PublishCharge) * g->nparts);

					for (int i = 0; i < g->nparts; i++)
						mine[i] = *g->charges[i];
					publish_check_bytes(mine, g->nparts);
					leader_commit_stage(g->parts, g->nparts);
					g->staged = true;
				}
				else
					stage_elsewhere(g, deadline);
			}
			/*
			 * A leader whose session went meanwhile has cut its part back
			 * -- or crashed holding it: its part is in doubt.
			 */
			for (int k = 0; k < ngroups; k++)
				if (!groups[k].here && !staged_alive(groups[k].conn))
				{
					current = k;
					ereport(ERROR,
							(errcode(ERRCODE_CONNECTION_FAILURE),
							 errmsg("the connection to leader \"%s\" ended after it staged its part",
									groups[k].leader)));
				}
		}
		PG_CATCH();
		{
			ErrorData  *e;
			CommitGroup *g = &groups[current];
			bool		broke;
			const char *doubt;

			MemoryContextSwitchTo(cxt);
			e = CopyErrorData();
			FlushErrorState();
			/* a leader's call that broke mid-way, or a session gone since */
			broke = !g->here && forward_outcome_unknown(e->sqlerrcode);
			doubt = cancel_all(groups, ngroups, broke ? current : -1);
			if (doubt != NULL)
				ereport(ERROR,
						(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
						 errmsg("leader \"%s\" went away while it held its part of the commit", doubt),
						 errdetail("%s", e->message ? e->message : "the call failed"),
						 errhint("The parts on the other leaders were cut back.  That leader may have kept its part if it crashed: read its shards to find out before inserting the records again.")));
			if (stage_retryable(e->sqlerrcode) && felix_monotonic_ns() < deadline)
				retry = true;
			else if (stage_retryable(e->sqlerrcode))
				ereport(ERROR,
						(errcode(FELIX_ERRCODE_NOT_LEADER),
						 errmsg("stream \"%s\" shard %d: no leader took its part of the commit within felix.quorum_timeout (%d ms)",
								g->charges[0]->stream->name, g->parts[0].s->key.shard,
								felix_quorum_timeout),
						 errdetail("Last, leader \"%s\": %s", g->leader, e->message),
						 errhint("Nothing of the transaction was published.  felix_shards shows each shard's leader; commit again once it has one.")));
			else
			{
				if (!g->here)
				{
					e->context = psprintf("commit part forwarded to leader \"%s\"", g->leader);
					if (e->hint == NULL)
						e->hint = pstrdup("Nothing of the transaction was published.");
				}
				ReThrowError(e);
			}
			FreeErrorData(e);
		}
		PG_END_TRY();

		if (!retry)
			return ngroups;
		if (!woke)
			felix_wake(FELIX_WORKER_HEARTBEAT);
		woke = true;
		felix_nap(FORWARD_RETRY_MS);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * A leader's COMMIT failed (e, its error) or never answered: say what
 * became of what.  Every other leader was sent its COMMIT.
 */
static void
report_commit_failure(CommitGroup *g, ErrorData *e)
{
	if (forward_outcome_unknown(e->sqlerrcode))
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
				 errmsg("stream \"%s\" shard %d: the commit of its part on leader \"%s\" got no answer",
						g->charges[0]->stream->name, g->parts[0].s->key.shard, g->leader),
				 errdetail("%s", e->message ? e->message : "the call failed"),
				 errhint("The transaction's records on the shards of the leaders that answered COMMIT were published; "
						 "those on node \"%s\"'s may or may not have been.  Read the shards to find out before inserting them again.",
						 g->leader)));
	e->elevel = ERROR;
	e->context = psprintf("commit of the part forwarded to leader \"%s\"; the transaction's records on the shards of the leaders that answered COMMIT were published",
						  g->leader);
	ReThrowError(e);
}

/*
 * Run step(g) for the remote group g; its error, if any, is kept (the
 * first).  Steps here only talk to a leader: no lock is held when one
 * fails.
 */
typedef void (*CommitStep) (CommitGroup *g, int64 deadline);

static void
commit_step(CommitStep step, CommitGroup *g, int64 deadline,
			ErrorData **first, CommitGroup **first_group)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		step(g, deadline);
	}
	PG_CATCH();
	{
		ErrorData  *e;

		MemoryContextSwitchTo(cxt);
		e = CopyErrorData();
		FlushErrorState();
		forward_drop_conn(g->leader);	/* mid-call: never reused */
		g->conn = NULL;
		if (*first == NULL)
		{
			*first = e;
			*first_group = g;
		}
	}
	PG_END_TRY();
}

static void
send_commit(CommitGroup *g, int64 deadline)
{
	felix_conn_send(g->conn, "COMMIT", "COMMIT", 0, NULL, deadline, ERROR);
}

static void
receive_commit(CommitGroup *g, int64 deadline)
{
	PGresult   *res;
	bool		committed;

	if (g->conn == NULL)
		return;					/* its COMMIT was never sent: kept already */
	res = felix_conn_receive(g->conn, "COMMIT", deadline, ERROR);
	/* a transaction the leader had aborted answers COMMIT with ROLLBACK */
	committed = strcmp(PQcmdStatus(res), "COMMIT") == 0;
	PQclear(res);
	if (!committed)
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_ROLLBACK),
				 errmsg("leader \"%s\" rolled its part of the commit back", g->leader),
				 errdetail("Its transaction had failed after its part was staged.")));
	felix_count(FELIX_CTR_PUBLISHES_FORWARDED, 1);
}

/*
 * A commit whose parts one other node leads, all of them: nothing to
 * stage here, so the leader stages and commits in one call, outside any
 * transaction block there (its statement's own commit publishes and
 * acknowledges), and no gate is held across a round trip.  Asked again,
 * of the next leader too, while the leader refuses at admission or does
 * not know the stream yet, until felix.quorum_timeout, as a forwarded
 * publish is; a call whose answer never came is not sent again (55F01).
 * Returns false, having done nothing, when the parts are not led by one
 * other node (any more).
 */
static bool
commit_one_leader(FelixCommitPart *parts, const PublishCharge *charges, List *const *roles,
				  int nparts, CommitGroup *groups)
{
	int64		deadline = felix_monotonic_ns() + (int64) felix_quorum_timeout * 1000000;
	MemoryContext cxt = CurrentMemoryContext;
	StringInfoData why;
	bool		woke = false;

	initStringInfo(&why);
	for (;;)
	{
		CommitGroup *g;
		const char *values[5];
		PGresult   *volatile res = NULL;
		volatile bool again = false;
		long		left_ms;

		CHECK_FOR_INTERRUPTS();
		if (group_parts(parts, charges, roles, nparts, groups) != 1 || groups[0].here)
			return false;
		g = &groups[0];
		left_ms = (long) ((deadline - felix_monotonic_ns()) / 1000000);
		if (left_ms <= 0)
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_NOT_LEADER),
					 errmsg("stream \"%s\" shard %d: no leader took the commit within felix.quorum_timeout (%d ms)",
							g->charges[0]->stream->name, g->parts[0].s->key.shard, felix_quorum_timeout),
					 why.len > 0 ? errdetail("Last: %s.", why.data) : 0,
					 errhint("Nothing of the transaction was published.  felix_shards shows each shard's leader; commit again once it has one.")));
		g->conn = forward_conn(g->leader);
		if (g->conn != NULL)
		{
			stage_args(g, values);
			PG_TRY();
			{
				res = felix_conn_exec(g->conn, "felix.forward_stage", STAGE_SQL, 5, values,
									  left_ms + felix_quorum_timeout, ERROR);
			}
			PG_CATCH();
			{
				ErrorData  *e;

				MemoryContextSwitchTo(cxt);
				e = CopyErrorData();
				FlushErrorState();
				forward_drop_conn(g->leader);	/* mid-call: never reused */
				if (forward_outcome_unknown(e->sqlerrcode))
					ereport(ERROR,
							(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
							 errmsg("stream \"%s\" shard %d: the commit forwarded to leader \"%s\" got no answer",
									g->charges[0]->stream->name, g->parts[0].s->key.shard, g->leader),
							 errdetail("%s", e->message ? e->message : "the call failed"),
							 errhint("Its records may or may not have been published; read the shards to find out before inserting them again.")));
				if (e->sqlerrcode != ERRCODE_UNDEFINED_TABLE)
				{
					e->elevel = ERROR;
					e->context = psprintf("commit forwarded to leader \"%s\"", g->leader);
					ReThrowError(e);
				}
				/* it has not learned of the stream yet: nothing was staged */
				resetStringInfo(&why);
				appendStringInfo(&why, "node \"%s\": %s", g->leader, e->message);
				FreeErrorData(e);
				again = true;
			}
			PG_END_TRY();
			if (!again)
			{
				if (stage_answer(res, g->leader))
				{
					felix_count(FELIX_CTR_PUBLISHES_FORWARDED, 1);
					return true;
				}
				resetStringInfo(&why);
				appendStringInfo(&why, "node \"%s\" does not lead it any more", g->leader);
			}
		}
		else
		{
			/* nothing was sent: asking again (or another leader) is safe */
			resetStringInfo(&why);
			appendStringInfo(&why, "node \"%s\": %s", g->leader, felix_conn_last_error());
		}
		if (!woke)
			felix_wake(FELIX_WORKER_HEARTBEAT);
		woke = true;
		felix_nap(FORWARD_RETRY_MS * 5);
	}
}

void
forward_commit(FelixCommitPart *parts, const PublishCharge *charges, List *const *roles,
			   int nparts)
{
	CommitGroup *groups = palloc0(sizeof(CommitGroup) * nparts);
	int			ngroups;
	int64		deadline;
	ErrorData  *first = NULL;
	CommitGroup *first_group = NULL;

	if (commit_one_leader(parts, charges, roles, nparts, groups))
		return;
	ngroups = stage_all(parts, charges, roles, nparts, groups);

	/*
	 * Every leader has staged: from here on nothing is cancelled, and a
	 * leader that fails does not stop the others.  Each leader's COMMIT
	 * acknowledges its parts before it answers; this node's own parts are
	 * published meanwhile, and acknowledged once every leader answered
	 * (an error of their acknowledgement goes on as it is).
	 */
	deadline = felix_monotonic_ns() +
		(int64) (2 * felix_quorum_timeout + 2 * felix_lease_duration + 1000) * 1000000;
	for (int k = 0; k < ngroups; k++)
		if (!groups[k].here)
			commit_step(send_commit, &groups[k], deadline, &first, &first_group);
	for (int k = 0; k < ngroups; k++)
		if (groups[k].here)
			leader_commit_publish(groups[k].parts, groups[k].nparts);
	for (int k = 0; k < ngroups; k++)
		if (!groups[k].here)
			commit_step(receive_commit, &groups[k], deadline, &first, &first_group);
	if (first != NULL)
		report_commit_failure(first_group, first);
	for (int k = 0; k < ngroups; k++)
		if (groups[k].here)
			leader_commit_acknowledge(groups[k].parts, groups[k].nparts);
}

/* ---------------------------------------------------------------------
 * The answering side
 * ---------------------------------------------------------------------
 */

/* What this backend's transaction staged for another node's commit. */
static FelixCommitPart *staged = NULL;
static int	nstaged = 0;

static void
forward_commit_xact_callback(XactEvent event, void *arg)
{
	FelixCommitPart *parts = staged;
	int			n = nstaged;

	if (parts == NULL)
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* from here an error aborts with the parts already published */
			staged = NULL;
			nstaged = 0;
			leader_commit_publish(parts, n);
			leader_commit_acknowledge(parts, n);
			break;
		case XACT_EVENT_PRE_PREPARE:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot PREPARE a transaction that staged a forwarded commit"),
					 errhint("This is felix's internal protocol; the asking node commits it.")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			staged = NULL;
			nstaged = 0;
			leader_commit_cancel(parts, n);
			break;
		default:
			break;
	}
}

void
forward_commit_init(void)
{
	RegisterXactCallback(forward_commit_xact_callback, NULL);
}

/* Text array argument i, checked: no NULLs, one dimension. */
static int
text_array_arg(FunctionCallInfo fcinfo, int i, const char *name, char ***out)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	deconstruct_array(PG_GETARG_ARRAYTYPE_P(i), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	*out = palloc(sizeof(char *) * Max(n, 1));
	for (int k = 0; k < n; k++)
	{
		if (nulls[k])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.forward_stage: %s must not hold NULLs", name),
					 errhint("This is felix's internal protocol; nodes call it to stage a commit on a shard's leader.")));
		(*out)[k] = TextDatumGetCString(elems[k]);
	}
	return n;
}

/*
 * The rights of every role that inserted rows into `stream` where the
 * transaction runs ({stream, role} pairs), here as there.  A stream no
 * pair names is refused: every row was inserted by someone.
 */
static void
check_inserters(const FelixStream *stream, char **pairs, int npairs)
{
	bool		named = false;

	for (int k = 0; k + 1 < npairs; k += 2)
	{
		Oid			role;

		if (strcmp(pairs[k], stream->name) != 0)
			continue;
		named = true;
		role = get_role_oid(pairs[k + 1], true);
		if (!OidIsValid(role))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("stream \"%s\": role \"%s\" does not exist on leader \"%s\"",
							stream->name, pairs[k + 1], felix_node_name_resolved()),
					 errhint("Roles are per server: create the role, with the same grants, on every node.")));
		publish_check_insert_as(stream, role);
	}
	if (!named)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.forward_stage: no inserting role is named for stream \"%s\"", stream->name),
				 errhint("This is felix's internal protocol; nodes call it to stage a commit on a shard's leader.")));
}

PG_FUNCTION_INFO_V1(felix_forward_stage);
Datum
felix_forward_stage(PG_FUNCTION_ARGS)
{
	const char *names[] = {"inserters", "streams", "creation_ids", "shards", "batches"};
	char	  **stream_names;
	char	  **creation_ids;
	Datum	   *shard_datums;
	bool	   *shard_nulls;
	int			n;
	int			nshards;
	char	  **inserters;
	int			ninserters;
	bytea	   *all;
	const char *data;
	Size		left;
	FelixCommitPart *parts;
	PublishCharge *charges;
	volatile int nparts = 0;
	List	   *checked = NIL;
	MemoryContext old;
	char		idle[32];

	felix_require_preload();
	felix_require_replication_role("felix.forward_stage");
	felix_require_nargs(fcinfo, 5, "felix.forward_stage");
	for (int i = 0; i < 5; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.forward_stage: %s must not be NULL", names[i]),
					 errhint("This is felix's internal protocol; nodes call it to stage a commit on a shard's leader.")));
	if (staged != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("felix.forward_stage was already called in this transaction"),
				 errhint("This is felix's internal protocol; a commit stages once per leader.")));

	ninserters = text_array_arg(fcinfo, 0, "inserters", &inserters);
	if (ninserters == 0 || ARR_NDIM(PG_GETARG_ARRAYTYPE_P(0)) != 2 ||
		ARR_DIMS(PG_GETARG_ARRAYTYPE_P(0))[1] != 2)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.forward_stage: inserters must be pairs {stream, role}, at least one"),
				 errhint("This is felix's internal protocol; nodes call it to stage a commit on a shard's leader.")));
	n = text_array_arg(fcinfo, 1, "streams", &stream_names);
	if (text_array_arg(fcinfo, 2, "creation_ids", &creation_ids) != n)
		n = -1;
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(3), INT4OID, 4, true, TYPALIGN_INT,
					  &shard_datums, &shard_nulls, &nshards);
	if (n <= 0 || nshards != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.forward_stage: streams, creation_ids and shards must name the same number of batches, at least one"),
				 errhint("This is felix's internal protocol; nodes call it to stage a commit on a shard's leader.")));

	/* what is staged lives until the transaction ends */
	old = MemoryContextSwitchTo(TopTransactionContext);
	parts = palloc0(sizeof(FelixCommitPart) * n);
	charges = palloc0(sizeof(PublishCharge) * n);
	all = PG_GETARG_BYTEA_PP(4);
	data = VARDATA_ANY(all);
	left = VARSIZE_ANY_EXHDR(all);
	for (int i = 0; i < n; i++)
	{
		const FelixStream *stream = forward_stream(stream_names[i], creation_ids[i]);
		int			shard;
		FelixBatchHeader h;
		Size		len;
		StringInfo	rebuilt = makeStringInfo();
		uint32		count;
		FelixShard *s;
		int			p;

		if (shard_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.forward_stage: shards must not hold NULLs"),
					 errhint("This is felix's internal protocol; nodes call it to stage a commit on a shard's leader.")));
		shard = DatumGetInt32(shard_datums[i]);
		felix_check_shard(stream, shard);
		if (!list_member_oid(checked, stream->relid))
		{
			check_inserters(stream, inserters, ninserters);
			checked = lappend_oid(checked, stream->relid);
		}

		/* this element's batch: a header, its body and its trailer */
		len = left;
		if (left >= sizeof(FelixBatchHeader))
		{
			memcpy(&h, data, sizeof(h));
			if (h.body_len <= FELIX_MAX_BATCH_BYTES)
				len = Min(left, sizeof(FelixBatchHeader) + (Size) h.body_len + sizeof(FelixBatchTrailer));
		}
		forward_check_batch(stream, shard, data, len, rebuilt, &count);
		data += len;
		left -= len;

		s = felix_stream_shard(stream, shard);
		for (p = 0; p < nparts; p++)
			if (parts[p].s == s)
				break;
		if (p == nparts)
		{
			parts[p].s = s;
			parts[p].batches = palloc(sizeof(StringInfo) * n);
			parts[p].counts = palloc(sizeof(uint32) * n);
			charges[p].stream = stream;
			nparts++;
		}
		parts[p].batches[parts[p].nbatches] = rebuilt;
		parts[p].counts[parts[p].nbatches] = count;
		parts[p].nbatches++;
		charges[p].bytes += rebuilt->len;
	}
	if (left != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("felix.forward_stage: %zu bytes follow the last batch", left),
				 errhint("This is felix's internal protocol; nothing of it was staged.")));
	publish_check_bytes(charges, nparts);

	/*
	 * Refused at admission, nothing is staged: the asking node may try the
	 * next leader.  Anything that fails later is an error of the commit.
	 */
	for (int p = 0; p < nparts; p++)
		if (forward_admit(parts[p].s) == 0)
		{
			MemoryContextSwitchTo(old);
			PG_RETURN_TEXT_P(cstring_to_text("not_leader"));
		}
	leader_commit_stage(parts, nparts);
	staged = parts;
	nstaged = nparts;
	MemoryContextSwitchTo(old);

	/*
	 * Inside the asking node's transaction block, its COMMIT publishes the
	 * parts; an asking node that goes quiet cannot hold the gates for
	 * long.  Outside one, this statement's own commit publishes them.
	 */
	snprintf(idle, sizeof(idle), "%dms", felix_quorum_timeout);
	(void) set_config_option("idle_in_transaction_session_timeout", idle,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	PG_RETURN_TEXT_P(cstring_to_text("staged"));
}
