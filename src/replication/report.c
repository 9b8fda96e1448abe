/*-------------------------------------------------------------------------
 *
 * report.c
 *	  Quorum marks and replica reports, run by the ship worker once per
 *	  pass of its loop.
 *
 *	  The quorum mark of a shard led here (consistency quorum, more than
 *	  one replica) is the majority-th largest of {the leader's durable end}
 *	  and {each follower's acknowledged end}: it moves as soon as a
 *	  majority of the replica set holds the records, the leader counting as
 *	  one member, not when the slowest follower does.  A halted follower
 *	  counts for nothing.  The mark is also never past the leader's own
 *	  durable end (shard_set_hwm insists).
 *
 *	  Before a mark moves, the control plane is told who holds what: a
 *	  report row per follower {stream, shard, generation, follower,
 *	  acked_end, caught_up}, caught_up meaning that the follower holds every
 *	  acknowledged record: acked_end >= the high-water mark the report
 *	  justifies (the new quorum mark, or the leader's flushed mark), read
 *	  after the acknowledgements it is compared with.
 *	  Only once that report has landed -- felix.cp_report answered and
 *	  accepted every row -- does shard_set_hwm release the publishers.  A
 *	  report that did not land leaves every mark it carried where it was:
 *	  otherwise a leader could promise a client a record the control plane
 *	  cannot find at failover.
 *
 *	  Reports are group-committed: every report queued while no request is
 *	  in flight goes in one request; what becomes due meanwhile waits for
 *	  the next.  Besides mark moves, a shard is reported when a follower's
 *	  standing changes (caught up or not, halted, answering), and at least
 *	  every felix.heartbeat_interval and right after every lease renewal,
 *	  so the control plane's reports -- which expire, and count only when
 *	  made after the lease last granted -- stay fresh enough to promote on.
 *	  Leader-consistency shards are reported the same way (so their
 *	  followers are promotable), but their mark moves with the leader's
 *	  flush, in shard.c.
 *
 *	  A halted follower is reported with caught_up = false: it has stopped,
 *	  and a caught-up report it made earlier must not be what the control
 *	  plane promotes on.
 *
 * Locking rule: follower state is copied under its entry's spinlock, then
 * the shard's fields under the shard's spinlock (in that order, so the
 * written end is never older than the acknowledgements); nothing is held
 * across a call.  The connection and the queue are this process's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "api/catalog.h"
#include "catalog/pg_type.h"
#include "felix.h"
#include "libpq-fe.h"
#include "metrics.h"
#include "miscadmin.h"
#include "replication/report.h"
#include "replication/ship.h"
#include "replication/state.h"
#include "storage/latch.h"
#include "storage/shard.h"
#include "storage/spin.h"
#include "utils/json.h"
#include "utils/memutils.h"

#define NS_PER_MS	INT64CONST(1000000)

/* A report request unanswered this long: drop the connection. */
#define FELIX_REPORT_TIMEOUT_MS		5000
/* After a failed report, wait at least this long before the next. */
#define FELIX_REPORT_RETRY_MS		50

static const char *const report_sql = "SELECT felix.cp_report($1, $2)";

/* What was last reported for one follower. */
typedef struct Reported
{
	char		name[NAMEDATALEN];
	bool		present;		/* a row was sent */
	uint64		acked_end;
	bool		caught_up;
} Reported;

/* Per shard slot: what the control plane was last told, and when. */
typedef struct ReportSlot
{
	bool		active;
	FelixShardKey key;
	uint64		generation;
	int64		last_report_ns;
	int64		lease_expiry_ns;	/* the lease the last report followed */
	int			nfollowers;
	Reported	last[FELIX_MAX_REPLICAS];
} ReportSlot;

/* One shard's part of the request in flight. */
typedef struct PendingShard
{
	int			slot;
	FelixShardKey key;
	uint64		generation;
	uint64		mark;			/* 0: no mark rides on this report */
	int64		lease_expiry_ns;
	int			nfollowers;
	Reported	rows[FELIX_MAX_REPLICAS];
} PendingShard;

static FelixAsyncConn cp;
static ReportSlot *report_slots = NULL;
static int	report_nslots = 0;

static bool in_flight = false;
static int64 sent_ns = 0;
static int	sent_rows = 0;
static PendingShard *pending = NULL;
static int	npending = 0;
static bool answer_ok = false;
static int64 answer_accepted = -1;
static char answer_error[256];

static int64 next_due_ns = PG_INT64_MAX;	/* earliest periodic report */
static bool mark_held = false;	/* a mark waits for the leader's flush */
static bool work_waiting = false;	/* reports due, connection not ready */
static int64 retry_after_ns = 0;
static char last_complaint[256];

void
report_init(void)
{
	async_init(&cp, "the control plane", false);
	strlcpy(cp.conninfo, felix_cp_conninfo_resolved(), sizeof(cp.conninfo));
	report_nslots = felix_max_shards;
	report_slots = MemoryContextAllocZero(TopMemoryContext,
										  sizeof(ReportSlot) * report_nslots);
	pending = MemoryContextAlloc(TopMemoryContext,
								 sizeof(PendingShard) * report_nslots);
	in_flight = false;
	npending = 0;
}

FelixAsyncConn *
report_conn(void)
{
	return &cp;
}

static bool
key_equal(const FelixShardKey *a, const FelixShardKey *b)
{
	return a->dboid == b->dboid && a->relid == b->relid && a->shard == b->shard;
}

static void
complain(const char *msg)
{
	if (strcmp(msg, last_complaint) != 0)
	{
		ereport(WARNING,
				(errmsg("felix ship: replica report to the control plane failed: %s", msg),
				 errdetail("Quorum marks stay where they were until a report lands."),
				 errhint("Check that the control plane is reachable and runs felix.cp_report.")));
		strlcpy(last_complaint, msg, sizeof(last_complaint));
	}
}

/* The request in flight is over (answered, failed or abandoned). */
static void
finish_request(bool landed, int64 now_ns)
{
	in_flight = false;
	if (!landed)
	{
		npending = 0;
		retry_after_ns = now_ns + FELIX_REPORT_RETRY_MS * NS_PER_MS;
		return;
	}

	felix_count(FELIX_CTR_REPORT_REQUESTS, 1);
	felix_count(FELIX_CTR_REPLICA_REPORTS, sent_rows);
	if (last_complaint[0] != '\0')
	{
		ereport(LOG, (errmsg("felix ship: replica reports reach the control plane again")));
		last_complaint[0] = '\0';
	}

	for (int i = 0; i < npending; i++)
	{
		PendingShard *ps = &pending[i];
		ReportSlot *rs = &report_slots[ps->slot];

		/*
		 * The control plane now knows who holds the records up to the
		 * mark: only now may the publishers waiting on it be released.
		 */
		if (ps->mark > 0)
		{
			FelixShard *s = shard_slot(ps->slot);
			bool		same;

			SpinLockAcquire(&s->mutex);
			same = s->in_use && key_equal(&s->key, &ps->key);
			SpinLockRelease(&s->mutex);
			if (same)
				shard_set_hwm(s, ps->generation, ps->mark);
		}
		if (rs->active && key_equal(&rs->key, &ps->key) &&
			rs->generation == ps->generation)
		{
			rs->last_report_ns = sent_ns;
			rs->lease_expiry_ns = ps->lease_expiry_ns;
			rs->nfollowers = ps->nfollowers;
			memcpy(rs->last, ps->rows, sizeof(rs->last));
		}
	}
	npending = 0;
}

static int
cmp_desc(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? 1 : (x > y ? -1 : 0);
}

/*
 * Consider one slot: is it led here with followers, and is a report due?
 * If so, append its rows to json and its part to pending.
 */
static void
consider_slot(int slot, FelixReplShard *e, StringInfo json, int *nrows,
			  int64 now_ns)
{
	FelixShard *s = shard_slot(slot);
	ReportSlot *rs = &report_slots[slot];
	bool		leads;
	FelixShardKey key;
	int			consistency;
	int			rf;
	int			nreplicas;
	uint64		flushed_end;
	uint64		hwm_end;
	int64		lease_expiry_ns;
	bool		quorum;
	uint64		mark = 0;
	uint64		caught_up_at;
	bool		due;
	PendingShard ps;
	uint64		acks[FELIX_MAX_REPLICAS + 1];
	int			nacks = 0;

	/* a shard not shipped from here has nothing to report (a cheap peek) */
	if (!repl_state_entry(slot)->valid)
	{
		rs->active = false;
		return;
	}
	/* acknowledgements first ... */
	repl_state_copy(slot, e);
	if (!e->valid)
	{
		rs->active = false;
		return;
	}
	/* ... then the leader's positions, never older than them */
	SpinLockAcquire(&s->mutex);
	leads = s->in_use && s->role == FELIX_ROLE_LEADER &&
		s->generation == e->generation;
	key = s->key;
	consistency = s->consistency;
	rf = s->replication_factor;
	nreplicas = s->nreplicas;
	flushed_end = s->flushed_end;
	hwm_end = s->hwm_end;
	lease_expiry_ns = s->lease_expiry_ns;
	SpinLockRelease(&s->mutex);
	if (!leads || !key_equal(&key, &e->key))
		return;

	if (!rs->active || !key_equal(&rs->key, &key) || rs->generation != e->generation)
	{
		memset(rs, 0, sizeof(ReportSlot));
		rs->active = true;
		rs->key = key;
		rs->generation = e->generation;
	}

	memset(&ps, 0, sizeof(ps));
	ps.slot = slot;
	ps.key = key;
	ps.generation = e->generation;
	ps.lease_expiry_ns = lease_expiry_ns;
	ps.nfollowers = e->nfollowers;
	for (int i = 0; i < e->nfollowers; i++)
	{
		FelixFollower *f = &e->followers[i];
		Reported   *row = &ps.rows[i];

		strlcpy(row->name, f->name, NAMEDATALEN);
		if (!f->answered)
			continue;			/* nothing known of it at this generation */
		row->present = true;
		if (f->state == FELIX_FOLLOWER_SHIPPING)
		{
			row->acked_end = f->acked_end;
			acks[nacks++] = f->acked_end;
		}
		else
		{
			/* halted: counts for nothing, and is not promotable */
			row->acked_end = f->acked_end;
			row->caught_up = false;
		}
	}

	quorum = consistency == FELIX_CONSISTENCY_QUORUM && rf > 1;
	if (quorum)
	{
		int			majority = Max(rf, nreplicas) / 2 + 1;

		acks[nacks++] = flushed_end;
		if (nacks >= majority)
		{
			qsort(acks, nacks, sizeof(uint64), cmp_desc);
			mark = acks[majority - 1];
			if (mark > flushed_end)
			{
				/* the leader's own flush is the last to come: wait for it */
				mark_held = true;
				mark = flushed_end;
			}
		}
	}

	/*
	 * Caught up: holds every record acknowledged at the moment this report
	 * lands -- everything below the high-water mark it justifies (quorum)
	 * or below the leader's flushed mark (leader), read after the
	 * acknowledgements.  Records above it were acknowledged to nobody: a
	 * follower missing only those loses nothing a client was promised by
	 * being promoted, and under a steady stream of publishes the leader's
	 * written end is almost never level with any follower.
	 */
	caught_up_at = Max(hwm_end, mark);
	for (int i = 0; i < ps.nfollowers; i++)
	{
		Reported   *row = &ps.rows[i];

		if (row->present && e->followers[i].state == FELIX_FOLLOWER_SHIPPING)
			row->caught_up = row->acked_end >= caught_up_at;
	}

	/*
	 * Also due right after each lease renewal: the control plane promotes
	 * only on reports made after the lease it last granted, so the freshest
	 * report must follow the freshest grant as closely as possible.
	 */
	due = (quorum && mark > hwm_end) ||
		now_ns - rs->last_report_ns >= (int64) felix_heartbeat_interval * NS_PER_MS ||
		lease_expiry_ns != rs->lease_expiry_ns ||
		rs->nfollowers != ps.nfollowers;
	for (int i = 0; !due && i < ps.nfollowers; i++)
	{
		Reported   *a = &ps.rows[i];
		Reported   *b = &rs->last[i];

		if (a->present != b->present || a->caught_up != b->caught_up ||
			strcmp(a->name, b->name) != 0)
			due = true;
	}
	if (!due)
	{
		next_due_ns = Min(next_due_ns, rs->last_report_ns +
						  (int64) felix_heartbeat_interval * NS_PER_MS);
		return;
	}

	ps.mark = (quorum && mark > hwm_end) ? mark : 0;
	for (int i = 0; i < ps.nfollowers; i++)
	{
		Reported   *row = &ps.rows[i];

		if (!row->present)
			continue;
		appendStringInfoString(json, *nrows == 0 ? "[" : ",");
		appendStringInfoString(json, "{\"stream\":");
		escape_json(json, e->stream_name);
		appendStringInfo(json, ",\"shard\":%d,\"generation\":" UINT64_FORMAT ",\"follower\":",
						 key.shard, e->generation);
		escape_json(json, row->name);
		appendStringInfo(json, ",\"acked_end\":" UINT64_FORMAT ",\"caught_up\":%s}",
						 row->acked_end, row->caught_up ? "true" : "false");
		(*nrows)++;
	}
	pending[npending++] = ps;
}

void
report_tick(int64 now_ns)
{
	StringInfoData json;
	FelixReplShard *e;
	int			nrows = 0;
	int			nslots;
	const char *values[2];
	Oid			types[2] = {TEXTOID, JSONBOID};

	next_due_ns = PG_INT64_MAX;
	mark_held = false;
	work_waiting = false;
	if (in_flight || now_ns < retry_after_ns)
		return;

	npending = 0;
	initStringInfo(&json);
	e = palloc(sizeof(FelixReplShard));
	nslots = Min(shard_count_slots(), report_nslots);
	for (int slot = 0; slot < nslots; slot++)
		consider_slot(slot, e, &json, &nrows, now_ns);
	pfree(e);

	if (nrows == 0)
	{
		/* marks with nothing to report cannot exist: every mark needs rows */
		npending = 0;
		pfree(json.data);
		return;
	}
	appendStringInfoChar(&json, ']');

	if (cp.state != FELIX_ASYNC_READY)
	{
		/* queued reports are rebuilt from the state once connected */
		npending = 0;
		work_waiting = true;
		async_begin(&cp, now_ns);
		pfree(json.data);
		return;
	}

	values[0] = felix_node_name_resolved();
	values[1] = json.data;
	if (PQsendQueryParams(cp.conn, report_sql, 2, types, values, NULL, NULL, 0) != 1)
	{
		npending = 0;
		async_fail(&cp, PQerrorMessage(cp.conn), now_ns);
		pfree(json.data);
		return;
	}
	in_flight = true;
	sent_ns = now_ns;
	sent_rows = nrows;
	answer_ok = false;
	answer_accepted = -1;
	answer_error[0] = '\0';
	pfree(json.data);
	if (!async_flush(&cp, now_ns))
		finish_request(false, now_ns);
}

void
report_on_event(int64 now_ns, uint32 events)
{
	if (cp.state == FELIX_ASYNC_CONNECTING)
	{
		async_connect_poll(&cp, now_ns);
		return;
	}
	if (cp.state != FELIX_ASYNC_READY)
	{
		if (in_flight)
			finish_request(false, now_ns);
		return;
	}
	if ((events & WL_SOCKET_WRITEABLE) && cp.want_write &&
		!async_flush(&cp, now_ns))
	{
		if (in_flight)
			finish_request(false, now_ns);
		return;
	}
	if (!(events & WL_SOCKET_READABLE))
		return;
	if (!PQconsumeInput(cp.conn))
	{
		async_fail(&cp, PQerrorMessage(cp.conn), now_ns);
		if (in_flight)
			finish_request(false, now_ns);
		return;
	}
	while (in_flight && !PQisBusy(cp.conn))
	{
		PGresult   *res = PQgetResult(cp.conn);

		if (res == NULL)
		{
			bool		landed = answer_ok && answer_accepted == sent_rows;

			if (answer_ok && !landed)
				complain(psprintf("the control plane accepted " INT64_FORMAT " of %d reports (the leadership of some shard moved on)",
								  answer_accepted, sent_rows));
			else if (!answer_ok)
				complain(answer_error[0] ? answer_error : "no answer");
			finish_request(landed, now_ns);
			break;
		}
		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
			!PQgetisnull(res, 0, 0))
		{
			answer_ok = true;
			answer_accepted = strtoi64(PQgetvalue(res, 0, 0), NULL, 10);
		}
		else
		{
			const char *msg = PQresultErrorMessage(res);
			int			len;

			answer_ok = false;
			strlcpy(answer_error, msg && msg[0] ? msg : PQresStatus(PQresultStatus(res)),
					sizeof(answer_error));
			len = strlen(answer_error);
			while (len > 0 && answer_error[len - 1] == '\n')
				answer_error[--len] = '\0';
		}
		PQclear(res);
	}
}

void
report_check(int64 now_ns)
{
	async_check_timeout(&cp, now_ns);
	if (in_flight && cp.state != FELIX_ASYNC_READY)
		finish_request(false, now_ns);
	if (in_flight && now_ns - sent_ns > FELIX_REPORT_TIMEOUT_MS * NS_PER_MS)
	{
		async_fail(&cp, psprintf("no answer to a replica report within %d ms",
								 FELIX_REPORT_TIMEOUT_MS), now_ns);
		finish_request(false, now_ns);
	}
}

int64
report_deadline(int64 now_ns)
{
	int64		deadline = next_due_ns;

	if (in_flight)
		deadline = Min(deadline, sent_ns + FELIX_REPORT_TIMEOUT_MS * NS_PER_MS);
	if (mark_held)
		deadline = Min(deadline, now_ns + NS_PER_MS);
	if (work_waiting || cp.state == FELIX_ASYNC_CONNECTING)
		deadline = Min(deadline, async_deadline(&cp));
	if (retry_after_ns > now_ns)
		deadline = Min(deadline, retry_after_ns);
	return deadline;
}

void
report_close(const char *why, int64 now_ns)
{
	async_close(&cp);
	in_flight = false;
	npending = 0;
}
