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
 *	  durable end (quorum_mark).
 *
 *	  The control plane promotes only a follower reported caught up, so
 *	  the invariant kept here is: a mark moves only when every follower the
 *	  control plane may take for caught up holds every record below the new
 *	  mark.  A report row per follower {stream, shard, generation, follower,
 *	  acked_end, caught_up} says caught_up when acked_end >= the mark the
 *	  report justifies (read after the acknowledgements it is compared
 *	  with).  Then:
 *	    - if the standing report is still true of the new mark (each
 *	      follower it may have named caught up has acknowledged past it),
 *	      the mark moves at once, with no report (report_still_true);
 *	    - otherwise a report counting the lagging followers out is sent,
 *	      and only once it has landed -- felix.cp_report answered and wrote
 *	      every row -- does quorum_release release the publishers.  A report
 *	      that did not land leaves the mark where it was.  When the lagging
 *	      followers are about to answer (a shipment to each is in flight),
 *	      they first get about as long as a report takes to land, per
 *	      answer still to come (answers_due_by).
 *	  "May take for caught up" counts every report sent and not yet seen
 *	  to land (ReportSlot.doubtful): in flight, or failed in a way that may
 *	  still commit.  Requests carry increasing tokens and the control plane
 *	  never lets an older one overwrite a newer, so a landed request settles
 *	  what it believes.
 *
 *	  Reports are group-committed: every report queued while no request is
 *	  in flight goes in one request (up to REPORT_MAX_SHARDS shards); what
 *	  becomes due meanwhile waits for the next.  Besides marks that need one, a shard is reported when a
 *	  follower appears, goes, halts or is caught up again (or, on a
 *	  leader-consistency shard, falls behind).  A leader-consistency shard
 *	  is also reported every felix.heartbeat_interval and right after every
 *	  lease renewal, so that its reports -- which count for promotion only
 *	  when made shortly before the leader's last claim -- stay fresh; its
 *	  mark moves with the leader's flush (quorum.c).  A quorum shard's
 *	  report stays true until something in it changes, and is refreshed
 *	  only once per QUORUM_REFRESH_INTERVALS intervals, every shard in
 *	  the same period.
 *
 *	  A halted follower is reported with caught_up = false: it has stopped,
 *	  and a caught-up report it made earlier must not be what the control
 *	  plane promotes on.
 *
 * Locking rule: follower state is copied under its entry's spinlock, then
 * the shard's fields (shard_read) (in that order, so the
 * written end is never older than the acknowledgements); nothing is held
 * across a call.  The connection and the queue are this process's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/catalog.h"
#include "catalog/pg_type.h"
#include "control/conninfo.h"
#include "control/cpcall.h"
#include "control/store.h"
#include "replication/report_queue.h"
#include "felix.h"
#include "libpq-fe.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "replication/quorum.h"
#include "replication/report.h"
#include "replication/rules.h"
#include "replication/ship.h"
#include "replication/state.h"
#include "storage/latch.h"
#include "storage/shard.h"
#include "utils/json.h"
#include "utils/memutils.h"

/* A report request unanswered this long: drop the connection. */
#define FELIX_REPORT_TIMEOUT_MS		5000
/* After a failed report, wait at least this long before the next. */
#define FELIX_REPORT_RETRY_MS		50

/*
 * How long a mark held only by followers whose answers are on the way
 * waits for them before a report that counts them out is sent instead:
 * about as long as a report takes to land (its recent average), at least
 * FELIX_REPORT_GRACE_MIN_US and at most FELIX_REPORT_GRACE_MAX_US.  Two
 * followers sharing a disk answer a few tenths of a millisecond apart; a
 * report to say the later one is behind costs more than that (a Raft
 * commit, with etcd), and is wrong a moment after it lands.
 */
#define FELIX_REPORT_GRACE_MIN_US	1000
#define FELIX_REPORT_GRACE_MAX_US	10000
static int64 report_latency_us = FELIX_REPORT_GRACE_MIN_US;	/* moving average */

/* The reporter names itself and the incarnation it leads as. */
static const char *const report_sql = FELIX_CP_REPORT_SQL;

/* What was last reported for one follower. */
typedef struct Reported
{
	char		name[NAMEDATALEN];
	char		incarnation[FELIX_INCARNATION_LEN];	/* the copy it speaks of */
	bool		present;		/* a row was sent */
	uint64		acked_end;
	bool		caught_up;
	FelixHalt	halt;			/* FELIX_HALT_NONE unless halted */
	uint64		position;		/* where a halted follower stood */
} Reported;

/*
 * Per shard slot: what the control plane was last told, and when.
 *
 * What the control plane may believe of follower i is last[i] (the rows of
 * the last request that landed) unless doubtful[i]: a request sent since
 * then said i was caught up and has not been seen to land -- it is in
 * flight, or failed in a way that may still let it commit.  A landed
 * request is the newest (requests carry increasing tokens, and the control
 * plane never lets an older one overwrite a newer), so landing clears
 * doubt.  confirmed: a request of this process naming this shard's
 * followers has landed at this generation; before that, rows an earlier
 * ship worker (or generation) sent may still stand there, and only a
 * landed report may move the mark.
 */
/* A quorum shard's report is sent again after this many heartbeat intervals at most. */
#define QUORUM_REFRESH_INTERVALS	25

/*
 * The most shards one request reports; the others due wait for the next
 * request, as they would while one is in flight.  The control plane writes
 * a request in one transaction, which compares two keys per shard and
 * writes one or two: etcd takes at most --max-txn-ops of each (at least
 * 256, docs/configuration.md) and 1.5 MiB by default.  A leader of
 * thousands of shards whose followers all changed at once (one restarted,
 * or a failover's new leads) would otherwise send a request that never
 * lands -- and, report before mark, acknowledge nothing (a failover of a
 * thousand shards at --max-txn-ops 259, with 500 here).
 */
#define REPORT_MAX_SHARDS	100

typedef struct ReportSlot
{
	bool		active;
	FelixShardKey key;
	uint64		generation;
	bool		confirmed;
	int64		last_report_ns;
	int64		lease_expiry_ns;	/* the lease the last report followed */
	int			nfollowers;
	Reported	last[FELIX_MAX_REPLICAS];
	bool		doubtful[FELIX_MAX_REPLICAS];
	bool		settled;		/* report_settled */
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
static int64 last_token = 0;	/* the token of the last request sent */
static int	sent_rows = 0;
static PendingShard *pending = NULL;
static int	npending = 0;
static bool answer_ok = false;
static int64 answer_accepted = -1;
static char answer_error[256];

static int64 next_due_ns = PG_INT64_MAX;	/* earliest periodic report */
static bool mark_held = false;	/* a mark waits for the leader's flush */
static bool work_waiting = false;	/* reports due, connection not ready */
static bool request_done = false;	/* a request ended since the last full tick */
static int64 retry_after_ns = 0;
static char last_complaint[256];

void
report_init(void)
{
	async_init(&cp, "the control plane", false);
	strlcpy(cp.conninfo, felix_cp_conninfo(), sizeof(cp.conninfo));
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
				 felix_store_is_etcd() ?
				 errhint("Check that the etcd members in felix.etcd_endpoints are reachable and that this node's etcd user may write the reports keys under felix.etcd_prefix.") :
				 errhint("Check that the control plane (felix.control_conninfo) is reachable and that this node's role may execute felix.cp_report there.")));
		strlcpy(last_complaint, msg, sizeof(last_complaint));
	}
}

/* The request in flight is over (answered, failed or abandoned). */
static void
finish_request(bool landed, int64 now_ns)
{
	in_flight = false;
	request_done = true;
	if (!landed)
	{
		npending = 0;
		retry_after_ns = now_ns + FELIX_REPORT_RETRY_MS * NS_PER_MS;
		return;
	}

	felix_count(FELIX_CTR_REPORT_REQUESTS, 1);
	felix_count(FELIX_CTR_REPLICA_REPORTS, sent_rows);
	/* how long reports take to land: the grace answers get (answers_due_by) */
	report_latency_us += ((now_ns - sent_ns) / 1000 - report_latency_us) / 8;
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
			FelixShardView v;

			shard_read(s, &v);
			if (v.in_use && key_equal(&v.key, &ps->key))
				(void) quorum_release(s, ps->generation, ps->mark);
		}
		if (rs->active && key_equal(&rs->key, &ps->key) &&
			rs->generation == ps->generation)
		{
			rs->confirmed = true;
			rs->last_report_ns = sent_ns;
			rs->lease_expiry_ns = ps->lease_expiry_ns;
			rs->nfollowers = ps->nfollowers;
			memcpy(rs->last, ps->rows, sizeof(rs->last));
			memset(rs->doubtful, 0, sizeof(rs->doubtful));
		}
	}
	npending = 0;
}

/* May the control plane take follower i for caught up (see ReportSlot)? */
static bool
may_believe_caught_up(const ReportSlot *rs, int i)
{
	return rs->doubtful[i] || (rs->last[i].present && rs->last[i].caught_up);
}

/*
 * Is what the control plane may believe of this shard still true once the
 * mark is at `mark`?  It is if every follower it may take for caught up
 * has acknowledged everything below the mark: then a promotion on the
 * standing report loses no acknowledged record, and the mark can move
 * without a new one.  A follower the control plane may think caught up
 * that lacks part of it needs a report saying so first -- the case of a
 * leader that reported two followers level and then acknowledged a record
 * only one of them holds.
 */
static bool
report_still_true(const ReportSlot *rs, const FelixReplShard *e, uint64 mark)
{
	if (!rs->confirmed || rs->nfollowers != e->nfollowers)
		return false;
	for (int i = 0; i < e->nfollowers; i++)
	{
		const FelixFollower *f = &e->followers[i];

		if (!may_believe_caught_up(rs, i))
			continue;
		if (strcmp(rs->last[i].name, f->name) != 0 || !f->answered ||
			f->acked_end < mark)
			return false;
	}
	return true;
}

/*
 * The mark cannot move on the standing report: are the followers holding
 * it back -- those the control plane may take for caught up that have not
 * acknowledged below `mark` -- all about to answer for it?  Then until
 * the returned instant the mark waits for their answers rather than for a
 * report that counts them out; 0 when some of them has nothing on the way.
 *
 * A follower is about to answer for the mark when the shipment in flight
 * to it carries the mark's records (one answer away: the grace), or when
 * it carries older ones -- one shipment at a time goes to a follower, so
 * the rest leaves the moment it is answered (two answers away: twice the
 * grace).  Under load the two followers of a shard are answered out of
 * step, and the mark the quicker one justifies is usually past what is in
 * flight to the other; reporting the other out each time would make a
 * control-plane round trip of most marks.  Waiting never moves a mark the
 * standing report does not allow, so this decides only speed.
 */
static int64
answers_due_by(int slot, const ReportSlot *rs, const FelixReplShard *e,
			   uint64 mark)
{
	int64		until = 0;
	int64		grace = Min(Max(report_latency_us, FELIX_REPORT_GRACE_MIN_US),
							FELIX_REPORT_GRACE_MAX_US) * 1000;

	if (!rs->confirmed || rs->nfollowers != e->nfollowers)
		return 0;
	for (int i = 0; i < e->nfollowers; i++)
	{
		const FelixFollower *f = &e->followers[i];
		int64		since;
		bool		carries;

		if (!may_believe_caught_up(rs, i))
			continue;
		if (f->answered && f->acked_end >= mark)
			continue;
		since = ship_in_flight_since(slot, &e->key, e->generation, i, mark, &carries);
		if (since == 0)
			return 0;
		until = Max(until, since + (carries ? grace : 2 * grace));
	}
	return until;
}

/*
 * Consider one slot: is it led here with followers?  Move its quorum mark
 * now if the standing report allows; else, and whenever a report is due
 * and may_queue, append its rows to json and its part to pending.
 */
static void
consider_slot(int slot, FelixReplShard *e, StringInfo json, int *nrows,
			  bool may_queue, int64 now_ns)
{
	FelixShard *s = shard_slot(slot);
	ReportSlot *rs = &report_slots[slot];
	FelixShardPositions v;
	bool		leads;
	FelixShardKey key;
	uint64		hwm_end;
	bool		quorum;
	uint64		mark = 0;
	uint64		caught_up_at;
	bool		mark_needs_report = false;
	bool		due;
	int64		interval_ns;
	int64		refresh_ns;
	int			nnamed;
	PendingShard ps;
	QuorumMember acks[FELIX_MAX_REPLICAS + 1];
	int			nacks = 0;
	bool		deferred = false;

	rs->settled = false;
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
	shard_read_positions(s, &v);
	leads = v.in_use && v.role == FELIX_ROLE_LEADER && v.generation == e->generation;
	key = v.key;
	hwm_end = v.hwm_end;
	if (!leads || !key_equal(&key, &e->key))
		return;

	/*
	 * Only a leader holding its lease speaks for the shard.  A server
	 * started again leads its generation without a lease (the claim was
	 * its earlier boot's), and if its felix directory was put back from an
	 * older copy, its followers answer its shorter log: reports of those
	 * answers would lower the positions the control plane compares a
	 * returning leader's log with (leader_holds_reported), and let the
	 * copy lead again.  No mark moves without a lease either (may_release).
	 */
	if (v.lease_expiry_ns == 0 || now_ns >= v.lease_expiry_ns)
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
	ps.lease_expiry_ns = v.lease_expiry_ns;
	ps.nfollowers = e->nfollowers;
	for (int i = 0; i < e->nfollowers; i++)
	{
		FelixFollower *f = &e->followers[i];
		Reported   *row = &ps.rows[i];

		strlcpy(row->name, f->name, NAMEDATALEN);
		strlcpy(row->incarnation, f->incarnation, FELIX_INCARNATION_LEN);
		if ((!f->answered && f->state != FELIX_FOLLOWER_HALTED) || f->incarnation[0] == '\0')
			continue;			/* nothing known of it at this generation */
		row->present = true;
		row->acked_end = f->acked_end;
		if (f->state != FELIX_FOLLOWER_HALTED)
		{
			/* during a replica move: in the old set unless joining, the new unless leaving */
			acks[nacks].end = f->acked_end;
			acks[nacks].in_old = strcmp(f->name, v.joining) != 0;
			acks[nacks].in_new = strcmp(f->name, v.leaving) != 0;
			nacks++;
		}
		else
		{
			/* halted: counts for nothing, and is not promotable */
			row->caught_up = false;
			row->halt = f->halt;
			row->position = f->halt_position;
		}
	}

	quorum = !quorum_acks_on_flush(v.consistency, v.replication_factor);
	if (quorum)
	{
		bool		held_by_flush;
		int			size = Max(v.replication_factor, v.nreplicas);
		bool		moving = v.joining[0] != '\0';

		acks[nacks].end = v.flushed_end;
		acks[nacks].in_old = acks[nacks].in_new = true;
		nacks++;
		mark = quorum_mark_joint(acks, nacks, moving ? size - 1 : size, moving ? size - 1 : size,
								 v.flushed_end, &held_by_flush);
		if (held_by_flush)
			mark_held = true;
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

		if (row->present && e->followers[i].state != FELIX_FOLLOWER_HALTED)
			row->caught_up = row->acked_end >= caught_up_at;
	}

	if (quorum && mark > hwm_end && report_still_true(rs, e, mark) &&
		quorum_release(s, e->generation, mark))
	{
		felix_count(FELIX_CTR_MARKS_ON_STANDING_REPORT, 1);
		hwm_end = mark;
	}
	if (!may_queue)
		return;

	/*
	 * A report is due when the mark cannot move without one (and the
	 * followers holding it back are not about to answer); when a follower
	 * appears, goes, or halts, or -- on a shard whose mark does not wait
	 * for reports -- falls behind; and when a follower is caught up again
	 * (at most once a heartbeat interval).
	 *
	 * Besides, a leader-consistency shard is reported every heartbeat
	 * interval and right after each lease renewal: its leader acknowledges
	 * without its followers, and the control plane promotes a follower
	 * only on a report made within a few heartbeats of the leader's last
	 * claim (disqualified in cp_duty.c), so the freshest report must
	 * follow the freshest grant closely.  A quorum shard's report stays
	 * true until something in it changes -- its mark waits for a report
	 * whenever the standing one would stop being true -- so it is
	 * refreshed only once per QUORUM_REFRESH_INTERVALS heartbeat
	 * intervals, which bounds how long the control plane can miss a
	 * follower whose restart voided what it knew of it.  Re-reporting every shard every
	 * interval was most of an idle cluster's control-plane load.
	 */
	if (quorum && mark > hwm_end)
	{
		int64		until = answers_due_by(slot, rs, e, mark);

		mark_needs_report = until <= now_ns;
		if (!mark_needs_report)
			next_due_ns = Min(next_due_ns, until);
	}
	interval_ns = (int64) felix_heartbeat_interval * NS_PER_MS;
	if (quorum)
	{
		/*
		 * Refreshed once per period of the monotonic clock, every shard in
		 * the same period: one request carries them all, rather than one
		 * request per shard as their last reports drift apart.  So a
		 * refresh comes at most two periods after the last report.
		 */
		int64		period = QUORUM_REFRESH_INTERVALS * interval_ns;

		refresh_ns = (now_ns / period + 1) * period - rs->last_report_ns;
		due = now_ns / period != rs->last_report_ns / period;
	}
	else
	{
		refresh_ns = interval_ns;
		due = now_ns - rs->last_report_ns >= refresh_ns ||
			v.lease_expiry_ns != rs->lease_expiry_ns;
	}
	due = due || mark_needs_report || rs->nfollowers != ps.nfollowers;
	for (int i = 0; !due && i < ps.nfollowers; i++)
	{
		Reported   *a = &ps.rows[i];
		Reported   *b = &rs->last[i];
		bool		fell_behind = b->caught_up && !a->caught_up &&
			(!quorum || e->followers[i].state == FELIX_FOLLOWER_HALTED);
		bool		caught_up_again = a->caught_up && !b->caught_up;

		if (a->present != b->present || fell_behind || a->halt != b->halt ||
			strcmp(a->name, b->name) != 0 || strcmp(a->incarnation, b->incarnation) != 0)
			due = true;
		else if (caught_up_again)
		{
			if (now_ns - rs->last_report_ns >= interval_ns)
				due = true;
			else
			{
				refresh_ns = Min(refresh_ns, interval_ns);
				deferred = true;
			}
		}
	}
	if (!due)
	{
		next_due_ns = Min(next_due_ns, rs->last_report_ns + refresh_ns);
		/* nothing to send before the period's refresh, nor a mark waiting */
		rs->settled = quorum && mark <= hwm_end && !deferred;
		return;
	}

	ps.mark = (quorum && mark > hwm_end) ? mark : 0;
	nnamed = 0;
	for (int i = 0; i < ps.nfollowers; i++)
	{
		Reported   *row = &ps.rows[i];

		if (!row->present)
			continue;
		nnamed++;
		appendStringInfoString(json, *nrows == 0 ? "[" : ",");
		appendStringInfoString(json, "{\"stream\":");
		escape_json(json, e->stream_name);
		appendStringInfo(json, ",\"shard\":%d,\"generation\":" UINT64_FORMAT ",\"follower\":",
						 key.shard, e->generation);
		escape_json(json, row->name);
		appendStringInfoString(json, ",\"incarnation\":");
		escape_json(json, row->incarnation);
		appendStringInfo(json, ",\"acked_end\":" UINT64_FORMAT ",\"caught_up\":%s",
						 row->acked_end, row->caught_up ? "true" : "false");
		if (row->halt != FELIX_HALT_NONE)
			appendStringInfo(json, ",\"halted\":\"%s\",\"position\":" UINT64_FORMAT,
							 felix_halt_name(row->halt), row->position);
		appendStringInfoChar(json, '}');
		(*nrows)++;
		/* from now on the control plane may believe it, landed or not */
		if (row->caught_up)
			rs->doubtful[i] = true;
	}

	/*
	 * A part naming no follower tells the control plane nothing: it keeps
	 * the rows it has (of an older generation, say, calling a follower
	 * caught up).  Were its landing taken for a report, the standing
	 * report would name nobody, and every mark would move on it while the
	 * control plane could still promote that follower without the records
	 * (the model checker found it: docs/formal, finding 5).  Such a shard
	 * waits for a report that names its followers.
	 */
	if (nnamed > 0)
		pending[npending++] = ps;
}

/*
 * etcd: the report worker (worker/reporter.c, through report_queue.c) runs the rule, and the ship
 * loop goes on meanwhile; report_check collects the outcome.  A report it
 * could not hand over did not leave.
 */
static uint64 reporter_seq = 0;

static void
report_now(StringInfo json, int nrows, int64 now_ns)
{
	last_token = Max(felix_monotonic_ns(), last_token + 1);
	reporter_seq = report_queue_submit(json->data, last_token);
	pfree(json->data);
	if (reporter_seq == 0)
	{
		/* still busy with a request given up on, or not running: later */
		npending = 0;
		if (!report_queue_busy())
			complain("the report worker is not running, or the report is too large for its slot");
		retry_after_ns = now_ns + FELIX_REPORT_RETRY_MS * NS_PER_MS;
		return;
	}
	in_flight = true;
	sent_ns = now_ns;
	sent_rows = nrows;
}

/* etcd: has the report worker finished our request? */
static void
reporter_check(int64 now_ns)
{
	int			accepted;
	char		error[256];

	if (!in_flight || reporter_seq == 0 ||
		!report_queue_outcome(reporter_seq, &accepted, error, sizeof(error)))
		return;
	if (accepted < 0)
		complain(psprintf("the control-plane store refused the call or did not answer: %s", error));
	else if (accepted != sent_rows)
		complain(psprintf("the control plane accepted %d of %d reports (the leadership of some shard moved on)",
						  accepted, sent_rows));
	finish_request(accepted == sent_rows, now_ns);
}

void
report_tick(int64 now_ns, const int *slots, int n, bool all)
{
	StringInfoData json;
	FelixReplShard *e;
	int			nrows = 0;
	int			nslots;
	const char *values[4];
	Oid			types[4] = {TEXTOID, JSONBOID, INT8OID, TEXTOID};
	char		incarnation[FELIX_INCARNATION_LEN];
	char		token[32];

	bool		may_queue = !in_flight && now_ns >= retry_after_ns;

	/*
	 * A tick over some slots keeps what the last full one learnt of the
	 * others (its times only make the next full tick come early).
	 */
	if (all)
	{
		next_due_ns = PG_INT64_MAX;
		mark_held = false;
		work_waiting = false;
		request_done = false;
	}

	if (may_queue)
		npending = 0;
	initStringInfo(&json);
	e = palloc(sizeof(FelixReplShard));
	nslots = Min(shard_count_slots(), report_nslots);
	for (int k = 0; k < (slots ? n : nslots); k++)
	{
		if (slots && slots[k] >= nslots)
			continue;
		consider_slot(slots ? slots[k] : k, e, &json, &nrows,
					  may_queue && npending < REPORT_MAX_SHARDS, now_ns);
	}
	pfree(e);
	if (may_queue && npending >= REPORT_MAX_SHARDS)
		next_due_ns = now_ns;	/* the rest go in the next request */
	if (!may_queue)
	{
		pfree(json.data);
		return;
	}

	if (nrows == 0)
	{
		/* marks with nothing to report cannot exist: every mark needs rows */
		npending = 0;
		pfree(json.data);
		return;
	}
	appendStringInfoChar(&json, ']');

	if (felix_store_is_etcd())
	{
		report_now(&json, nrows, now_ns);
		return;
	}
	if (cp.state != FELIX_ASYNC_READY)
	{
		/* queued reports are rebuilt from the state once connected */
		npending = 0;
		work_waiting = true;
		async_begin(&cp, now_ns);
		pfree(json.data);
		return;
	}

	last_token = Max(felix_monotonic_ns(), last_token + 1);
	snprintf(token, sizeof(token), INT64_FORMAT, last_token);
	values[0] = felix_node_name_resolved();
	values[1] = json.data;
	values[2] = token;
	felix_incarnation(incarnation, NULL);
	values[3] = incarnation;
	if (PQsendQueryParams(cp.conn, report_sql, 4, types, values, NULL, NULL, 0) != 1)
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
			/*
			 * The control plane's refusal, with its own SQLSTATE, detail and
			 * hint, once per kind of failure (complain dedups on the text).
			 */
			if (strcmp(answer_error, last_complaint) != 0)
			{
				strlcpy(last_complaint, answer_error, sizeof(last_complaint));
				felix_conn_report_result(WARNING, res, cp.conn, "felix.cp_report");
				continue;
			}
		}
		PQclear(res);
	}
}

void
report_check(int64 now_ns)
{
	if (felix_store_is_etcd())
	{
		reporter_check(now_ns);
		if (in_flight && now_ns - sent_ns > FELIX_REPORT_TIMEOUT_MS * NS_PER_MS)
		{
			/* it may still commit: counted as not landed, its rows as doubtful */
			complain(psprintf("no answer to a replica report within %d ms", FELIX_REPORT_TIMEOUT_MS));
			finish_request(false, now_ns);
		}
		return;
	}
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
	int64		deadline = report_timer(now_ns);

	if (mark_held)
		deadline = Min(deadline, now_ns + NS_PER_MS);
	return deadline;
}

bool
report_settled(int slot)
{
	return slot < report_nslots && report_slots[slot].active && report_slots[slot].settled;
}

bool
report_wants_all(void)
{
	return request_done;
}

int64
report_timer(int64 now_ns)
{
	int64		deadline = next_due_ns;

	if (in_flight)
		deadline = Min(deadline, sent_ns + FELIX_REPORT_TIMEOUT_MS * NS_PER_MS);
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
