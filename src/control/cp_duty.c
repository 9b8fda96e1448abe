/*-------------------------------------------------------------------------
 *
 * cp_duty.c
 *	  The control-plane duties: failure detection and promotion, run by
 *	  exactly one node at a time, chosen through the store.
 *
 *	  The duty key.  The holder rewrites `duty` at every tick (its revision
 *	  changes); a node that sees the key unchanged for felix.lease_duration
 *	  on its own clock takes it over with a compare-and-set on the revision
 *	  it saw.  Every promotion the holder writes compares the duty key's
 *	  revision with the one its last refresh produced, so a holder that
 *	  was stopped (SIGSTOP, a long pause) and resumes after another took
 *	  over grants nothing: its transactions fail.  It also stops counting
 *	  itself the holder once its last successful refresh is older than
 *	  felix.lease_duration by its own clock, until a refresh comparing
 *	  that revision lands (nobody took over; it keeps what it observed).
 *	  A tick whose reads ran long refreshes the key again before it
 *	  writes its grants, so that they get a whole half lease.
 *
 *	  Knowing nothing.  A new holder keeps no memory from anyone: every
 *	  observation below starts at the moment it took over.  So it grants
 *	  no next generation before lease_ms + lease_margin have passed on its
 *	  own clock since then, and safety never compares two hosts' clocks.
 *
 *	  The lease rule, the holder's half (the node's half is in
 *	  cp_heartbeat.c).  For each shard the holder remembers when it first
 *	  saw the current leader's record claim the shard's current generation
 *	  (claim_seen_ns, its own monotonic clock; at takeover or at a new
 *	  generation, the moment it first looked).  The claim was written after
 *	  the leader's send instant s, and the leader writes only until s +
 *	  lease_ms - lease_epsilon by its clock; the holder promotes only once
 *	  now > claim_seen_ns + lease_ms + lease_margin, and only in a
 *	  transaction comparing the shard's assignment and the old leader's
 *	  node record as read -- a newer claim changes that record and fails
 *	  the promotion.  The old leader has therefore stopped before a
 *	  successor exists, whatever the two wall clocks say, as long as the
 *	  clocks' rates differ by less than the margin over one lease.
 *
 *	  Who is promoted, and only them: the last leader, if it is heard from
 *	  again after the lapse (at the incarnation granted, able to serve it:
 *	  it holds every record of its generation; if it was started again
 *	  since it took the generation, every other replica has shown it so);
 *	  else a member of the replica set that its leader reported caught up
 *	  (bound zero) in the newest generation that reported, alive at the
 *	  incarnation the report names, heard from lately, able to
 *	  serve the shard -- and, on a leader-consistency stream, whose report
 *	  was made no more than (node_expiry + heartbeat_interval) worth of the
 *	  leader's heartbeats before its last claim, since such a leader
 *	  acknowledges without reporting.  Larger acked_end first; the
 *	  placement score breaks ties.
 *	  Else, on a quorum stream, promotion by log (copies_candidate): the
 *	  newest log among at least n - n/2 copies whose token shows they
 *	  kept their log since the newest generation that was taken (one
 *	  granted since and never taken wrote nothing).
 *	  Nobody qualifies: the shard is unplaced, with a reason.
 *
 *	  The walk.  Nothing is decided for a shard before its lease lapses,
 *	  and a shard's lapse only ever moves later while nothing but its
 *	  leader's heartbeats changes (each a new claim).  So the holder walks
 *	  every shard only at the earliest lapse its last walk found, or when
 *	  a shard, stream or node's claims changed since, and at every tick
 *	  while a shard it walked had lapsed.  A claim is dated by when the
 *	  holder first read the leader's record at that revision (node_seen,
 *	  at every tick), not by the walk that looks at it: a walk that waited
 *	  dates it as one at every tick would have.
 *
 *	  Alive.  The holder keeps the `alive` key: the nodes whose records it
 *	  saw change within felix.node_expiry.  Everyone else reads it (stream
 *	  placement, felix_nodes).  A new holder leaves it as it found it until
 *	  it has watched for node_expiry.
 *
 * Locking rule: none in shared memory.  The observations live in the
 * memory of the process running the duties (the duty worker,
 * worker/duties.c, with etcd; with the embedded store, the control-plane
 * backend serving that worker's connection -- a new connection is a new
 * holder that knows nothing).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/metrics.h"
#include "common/hashfn.h"
#include "control/cp.h"
#include "felix.h"
#include "mb/pg_wchar.h"
#include "nodes/value.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

/* FELIX_REASON_LEN (storage/shard.h): an unplaced reason fits a shard slot */
#define CP_REASON_LEN	400

typedef struct ShardObs
{
	char		key[NAMEDATALEN + 16];	/* stream/shard */
	int64		generation;
	char		leader[NAMEDATALEN];
	int64		claim_rev;		/* the leader's record revision last seen claiming */
	int64		claim_seen_ns;
	int			lease_ms;
	int64		claim_beat;		/* the leader's beat in that record */
	/*
	 * What the leader's claims key said of this generation at claims_rev
	 * (a lookup per shard per tick was most of an idle holder's tick; the
	 * key changes only when the node's claims do).
	 */
	bool		claims_known;
	int64		claims_rev;
	bool		claims_hold;
	int			claims_lease_ms;
} ShardObs;

/*
 * How many of a node's heartbeat counts the holder keeps: ends_read_after
 * looks three back, so a restarted leader's replicas need that many more
 * heartbeats after the lapse (consider waits a little longer for them).
 */
#define HB_BEATS_KEPT 4

typedef struct NodeObs
{
	char		name[NAMEDATALEN];
	int64		rev;
	int64		changed_seen_ns;
	bool		changed;		/* seen to change since first seen */

	/*
	 * The last HB_BEATS_KEPT counts of the node's heartbeats that gave log
	 * ends (ends_beat) in its boot that our reads found, newest first (0:
	 * none), and the time taken just before the latest read that found
	 * each: ends_read_after says from them when the log ends in its record
	 * were read.
	 */
	char		boot[NAMEDATALEN];
	int64		beats[HB_BEATS_KEPT];
	int64		read_ns[HB_BEATS_KEPT];
} NodeObs;

static bool holding = false;
static int64 duty_rev = 0;		/* our last refresh's revision */
static int64 duty_beat = 0;		/* its beat */
static int64 duty_since_ms = 0; /* since when we hold the duties */
static int64 refreshed_ns = 0;	/* when it was confirmed */
static int64 took_over_ns = 0;
static int64 duty_seen_rev = 0; /* another holder's key, as we last saw it */
static int64 duty_seen_ns = 0;
static HTAB *shard_obs = NULL;
static HTAB *node_obs = NULL;
/* this tick: the earliest lease lapse still to come (0: none) */
static int64 next_lapse_ns = 0;
/* ... and whether a shard walked had lapsed */
static bool walk_lapsed = false;
/* The last walk of every shard: when the next is due (0: at the next
 * tick), the state's revision and its count of shards then. */
static int64 walk_due_ns = 0;
static int64 walked_rev = 0;
static int	walked_nshards = -1;

static void
forget_everything(void)
{
	HASHCTL		ctl;

	if (shard_obs)
		hash_destroy(shard_obs);
	if (node_obs)
		hash_destroy(node_obs);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = NAMEDATALEN + 16;
	ctl.entrysize = sizeof(ShardObs);
	ctl.hcxt = TopMemoryContext;
	shard_obs = hash_create("felix duty: shards", 256, &ctl,
							HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(NodeObs);
	node_obs = hash_create("felix duty: nodes", 64, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	walk_due_ns = 0;
	walked_nshards = -1;
}

int32
cp_score(const char *node, const char *stream, int shard)
{
	char	   *s = psprintf("%s/%s/%d", node, stream, shard);

	return (int32) hash_bytes((const unsigned char *) s, strlen(s));
}

/* ---------------------------------------------------------------------
 * The duty key
 * ---------------------------------------------------------------------
 */

/*
 * Write the duty key naming node (its boot) at beat, comparing expect_rev
 * (0: the key must not exist); on success it is ours at duty_rev.
 */
static bool
write_duty(const char *node, const char *boot, int64 beat, int64 since_ms, int64 expect_rev)
{
	CpDuty		d;
	FelixStoreCmp cmp = {CP_KEY_DUTY, expect_rev};
	FelixStoreOp op;
	int64		rev;
	int64		sent = felix_monotonic_ns();

	memset(&d, 0, sizeof(d));
	d.node = (char *) node;
	d.boot = (char *) boot;
	d.beat = beat;
	d.since_ms = since_ms;
	op.key = CP_KEY_DUTY;
	op.value = cp_duty_write(&d);
	if (felix_store_txn(&cmp, 1, &op, 1, &rev, LOG) != FELIX_STORE_OK)
		return false;
	duty_rev = rev;
	duty_beat = beat;
	duty_since_ms = since_ms;
	/* counted from when the refresh was sent: it may have landed then */
	refreshed_ns = sent;
	return true;
}

/*
 * The holder refreshes the duty key, comparing the revision its last
 * refresh produced: it lands only if nobody took the duties over since.
 * Unconfirmed, the holder steps down -- another node may hold the duties
 * by the time it knows.  True while this node holds them.
 */
static bool
refresh_duty(const char *node, const char *boot)
{
	if (!write_duty(node, boot, duty_beat + 1, duty_since_ms, duty_rev))
	{
		holding = false;
		ereport(LOG,
				(errmsg("felix: node \"%s\" stops running the control-plane duties: its refresh was not confirmed",
						node)));
	}
	return holding;
}

static void
take_over(const CpSnapshot *snap, const char *node, const char *boot)
{
	if (!write_duty(node, boot, 1, cp_now_ms(), snap->have_duty ? snap->duty.rev : 0))
		return;
	holding = true;
	took_over_ns = felix_monotonic_ns();
	forget_everything();
	ereport(LOG,
			(errmsg("felix: node \"%s\" runs the control-plane duties%s%s",
					node, snap->have_duty ? ", taking over from node " : "",
					snap->have_duty ? snap->duty.node : ""),
			 errdetail("It grants no new generation for the next lease and margin (%d ms), knowing nothing of the leases granted before.",
					   felix_lease_duration + felix_lease_margin)));
}

/* Hold, keep or campaign for the duty; true while this node holds it. */
static bool
hold_duty(const CpSnapshot *snap, const char *node, const char *boot)
{
	int64		now = felix_monotonic_ns();
	bool		mine = snap->have_duty && strcmp(snap->duty.node, node) == 0 &&
		strcmp(snap->duty.boot, boot) == 0;

	/*
	 * Our own clock says another node may have taken the duties over: act
	 * on nothing until a refresh lands.  One that compares the revision
	 * our last refresh produced lands only if nobody took over meanwhile
	 * (a takeover rewrites the key); then this holder carries on with what
	 * it observed -- observations are of the store's records, and stay
	 * true whoever held the duties -- rather than starting afresh and
	 * waiting out a lease and margin again.  A holder whose ticks run
	 * late under load (a failover of a thousand shards) kept doing that.
	 */
	if (holding && now - refreshed_ns > (int64) felix_lease_duration * NS_PER_MS)
	{
		int			late_ms = (int) ((now - refreshed_ns) / NS_PER_MS) - felix_lease_duration;

		holding = false;
		if (mine && snap->duty.rev == duty_rev &&
			write_duty(node, boot, duty_beat + 1, duty_since_ms, duty_rev))
		{
			holding = true;
			ereport(DEBUG1,
					(errmsg_internal("felix: node \"%s\" refreshed the duty key %d ms late; nobody took it over",
									 node, late_ms)));
			return true;
		}
		ereport(LOG,
				(errmsg("felix: node \"%s\" stops running the control-plane duties: its last refresh is %d ms old or more",
						node, felix_lease_duration)));
	}
	if (holding && mine && snap->duty.rev == duty_rev)
		return refresh_duty(node, boot);
	if (holding)
	{
		holding = false;
		ereport(LOG,
				(errmsg("felix: node \"%s\" no longer runs the control-plane duties (node \"%s\" does)",
						node, snap->have_duty ? snap->duty.node : "(none)")));
	}
	if (!snap->have_duty || mine || strcmp(snap->duty.node, node) == 0)
	{
		/*
		 * Nobody, or this node without memory of it: a new connection, or a
		 * new start of this server (whose old processes are gone -- and had
		 * one survived, the duty key it compares has changed under it).
		 * Start afresh.
		 */
		take_over(snap, node, boot);
		return holding;
	}
	if (snap->duty.rev != duty_seen_rev)
	{
		duty_seen_rev = snap->duty.rev;
		duty_seen_ns = now;
		return false;
	}
	if (now - duty_seen_ns > (int64) felix_lease_duration * NS_PER_MS)
		take_over(snap, node, boot);
	return holding;
}

/* ---------------------------------------------------------------------
 * Observations
 * ---------------------------------------------------------------------
 */

/* n's record, as a read begun at read_ns found it, looked at at now */
static NodeObs *
node_seen(const CpNode *n, int64 read_ns, int64 now)
{
	bool		found;
	NodeObs    *o = hash_search(node_obs, n->name, HASH_ENTER, &found);

	if (!found || o->rev != n->rev)
	{
		o->changed = found;
		o->rev = n->rev;
		o->changed_seen_ns = now;
	}
	if (!found || strcmp(o->boot, n->boot) != 0 || n->ends_beat < o->beats[0])
	{
		strlcpy(o->boot, n->boot, sizeof(o->boot));
		memset(o->beats, 0, sizeof(o->beats));
		memset(o->read_ns, 0, sizeof(o->read_ns));
	}
	else if (n->ends_beat != o->beats[0])
	{
		memmove(&o->beats[1], &o->beats[0], sizeof(int64) * (HB_BEATS_KEPT - 1));
		memmove(&o->read_ns[1], &o->read_ns[0], sizeof(int64) * (HB_BEATS_KEPT - 1));
	}
	o->beats[0] = n->ends_beat;
	o->read_ns[0] = read_ns;
	return o;
}

/*
 * A time after which the log ends in the node's current record were read
 * (0: none known).  Only the node's heartbeat worker gives log ends; its
 * heartbeats run one after another, each reads the ends before it sends,
 * and the store numbers those that commit with ends (ends_beat), within a
 * boot, in commit order (a heartbeat made by a backend gives none and
 * counts for nothing).  An attempt that completes commits before the next
 * begins.  One the worker gave up on can still commit late, but not two
 * of a row: with etcd each sends one transaction that compares the node's
 * record as it read it, and any later commit changes it; the embedded
 * store refuses a call whose connection has closed (cp_sql.c).  A retry
 * after a conflict reuses the ends it was given.  So heartbeat c read its
 * ends after heartbeat c-2 committed, which is after any read of ours
 * that still found ends_beat c-3 or earlier.
 */
static int64
ends_read_after(const NodeObs *o)
{
	for (int i = 1; i < HB_BEATS_KEPT; i++)
		if (o->beats[i] > 0 && o->beats[i] <= o->beats[0] - 3)
			return o->read_ns[i];
	return 0;
}

static ShardObs *
shard_seen(const CpSnapshot *snap, const CpShard *s, int64 now)
{
	char		key[NAMEDATALEN + 16];
	bool		found;
	ShardObs   *o;
	CpNode	   *leader = cp_snapshot_node(snap, s->leader);

	snprintf(key, sizeof(key), "%s/%d", s->stream, s->shard);
	o = hash_search(shard_obs, key, HASH_ENTER, &found);
	if (!found || o->generation != s->generation ||
		strcmp(o->leader, s->leader ? s->leader : "") != 0)
	{
		/* a new generation gets a full lease to be claimed in */
		o->generation = s->generation;
		strlcpy(o->leader, s->leader ? s->leader : "", NAMEDATALEN);
		o->claim_rev = 0;
		o->claim_seen_ns = now;
		o->lease_ms = felix_lease_duration;
		o->claim_beat = -1;
		o->claims_known = false;
	}
	if (leader && (!o->claims_known || o->claims_rev != leader->claims_rev))
	{
		const CpClaim *c = cp_node_claim(leader, s->stream, s->shard);

		o->claims_known = true;
		o->claims_rev = leader->claims_rev;
		o->claims_hold = c != NULL && c->generation == s->generation;
		o->claims_lease_ms = c != NULL ? c->lease_ms : 0;
	}
	if (leader && o->claims_hold && s->leader_incarnation &&
		strcmp(leader->incarnation, s->leader_incarnation) == 0 &&
		leader->rev != o->claim_rev)
	{
		NodeObs    *no = hash_search(node_obs, leader->name, HASH_FIND, NULL);

		o->claim_rev = leader->rev;
		/* first read at this revision no later than then ("The walk") */
		o->claim_seen_ns = no && no->rev == leader->rev ? no->changed_seen_ns : now;
		o->lease_ms = o->claims_lease_ms;
		o->claim_beat = leader->beat;
	}
	else if (o->claim_beat < 0 && leader && s->taken_generation == s->generation &&
			 s->taken_boot && leader->prev_boot && strcmp(s->taken_boot, leader->prev_boot) == 0)
	{
		/*
		 * The boot that took this generation has ended before this holder
		 * saw it claim (the holder started, or took the duties over, since):
		 * its last claim was made at or before its last heartbeat.  Without
		 * this, a leader-stream shard whose leader came back with a lost or
		 * restored copy waited for a claim that never comes, and stayed
		 * unplaced for good (the fault harness, seed 3012 on etcd).
		 */
		o->claim_beat = leader->prev_beat;
	}
	return o;
}

/* disqualified's reason for a follower alive but not heard from lately */
static const char not_heard_lately[] = "not heard from lately";

/*
 * Was o's node heard from recently enough to be worth a grant?  Within
 * lease_duration - heartbeat_interval (at least two intervals): a node that
 * died together with a leader was last heard about when the leader's last
 * claim was, give or take a tick, and a lease and its margin have passed
 * since then by the time the leader's shards are promoted, so it is passed
 * over (were it not, the grant would only cost a lease).  A node alive is
 * heard about every interval plus a heartbeat's round trip, and a loaded
 * store makes that round trip a few tenths of a second: a bound of two
 * intervals passed over a loaded survivor at a whole tick, and a failover
 * of a thousand shards went to the one other survivor entirely.
 */
static bool
heard_lately(const NodeObs *o, int64 now)
{
	int64		bound_ms = Max(2 * felix_heartbeat_interval,
							   felix_lease_duration - felix_heartbeat_interval);

	return o != NULL && now - o->changed_seen_ns <= bound_ms * NS_PER_MS;
}

static bool
is_alive(const CpNode *n, int64 now)
{
	NodeObs    *o = hash_search(node_obs, n->name, HASH_FIND, NULL);

	return o && now - o->changed_seen_ns <= (int64) felix_node_expiry * NS_PER_MS;
}

/* Keep the alive key: the nodes heard from within node_expiry. */
static void
keep_alive_list(const CpSnapshot *snap, int64 now)
{
	CpAlive		a;
	bool		same;
	FelixStoreCmp cmps[2];
	FelixStoreOp op;
	int64		rev;

	bool		watched = now - took_over_ns >= (int64) felix_node_expiry * NS_PER_MS;

	memset(&a, 0, sizeof(a));
	a.nodes = palloc0(sizeof(char *) * (snap->nnodes + 1));
	for (int i = 0; i < snap->nnodes; i++)
	{
		const CpNode *n = &snap->nodes[i];
		NodeObs    *o = hash_search(node_obs, n->name, HASH_FIND, NULL);

		/*
		 * Until it has watched for node_expiry a new holder cannot tell a
		 * dead node from a quiet one: it keeps the list it found, adding
		 * only the nodes it has seen heartbeat.
		 */
		if (watched ? is_alive(n, now)
			: ((o && o->changed) || (snap->have_alive && cp_alive_has(&snap->alive, n->name))))
			a.nodes[a.n++] = n->name;
	}
	same = snap->have_alive && snap->alive.n == a.n;
	for (int i = 0; same && i < a.n; i++)
		same = strcmp(snap->alive.nodes[i], a.nodes[i]) == 0;
	if (same)
		return;
	cmps[0].key = CP_KEY_DUTY;
	cmps[0].mod_revision = duty_rev;
	cmps[1].key = CP_KEY_ALIVE;
	cmps[1].mod_revision = snap->have_alive ? snap->alive.rev : 0;
	op.key = CP_KEY_ALIVE;
	op.value = cp_alive_write(&a);
	(void) felix_store_txn(cmps, 2, &op, 1, &rev, LOG);
}

/* ---------------------------------------------------------------------
 * Promotion
 * ---------------------------------------------------------------------
 */

typedef struct Candidate
{
	const CpNode *node;
	bool		is_leader;
	int64		acked_end;
} Candidate;

static int64
newest_reported_generation(const CpReports *r)
{
	int64		g = 0;

	for (int i = 0; r && i < r->n; i++)
		g = Max(g, r->rows[i].generation);
	return g;
}

/* The largest acknowledged end the newest generation's reports give. */
static int64
newest_reported_end(const CpSnapshot *snap, const CpShard *s)
{
	const CpReports *r = cp_snapshot_reports(snap, s->stream, s->shard);
	int64		newest = newest_reported_generation(r);
	int64		reported = 0;

	for (int i = 0; r && i < r->n; i++)
		if (r->rows[i].generation == newest)
			reported = Max(reported, r->rows[i].acked_end);
	return reported;
}

/*
 * Does the lapsed leader of s still hold what it had?  A leader whose log,
 * as it gave it in this boot, ends before what it is known to have
 * acknowledged is a copy restored from a backup (or otherwise older than
 * itself) and must not lead: it would serve, and ship over, a log missing
 * acknowledged records.  What it acknowledged is bounded from below by:
 *   - the shard's acked_floor, set when it was made leader (a leader that
 *     fell just after its promotion may have reported its followers before
 *     they answered it: the fault harness found a copy re-promoted so);
 *   - the largest acknowledged end in the newest generation's reports
 *     (report before mark);
 *   - the log of every follower reported caught up, alive at the copy the
 *     report names: the mark moves without a report only while each such
 *     follower holds every record below it (report_still_true in
 *     report.c), so the reported positions alone can lag the mark.
 * With none of them there is nothing to compare (a single replica).
 */
static bool
leader_holds_reported(const CpSnapshot *snap, const CpShard *s, const CpNode *leader,
					  int64 now)
{
	int64		reported = Max(s->acked_floor, newest_reported_end(snap, s));
	int64		end = cp_node_end(leader, s->stream, s->shard);
	const CpReports *r = cp_snapshot_reports(snap, s->stream, s->shard);
	int64		newest = newest_reported_generation(r);

	if (reported > 0 && end < reported)
		return false;
	for (int i = 0; r && i < r->n; i++)
	{
		const CpReport *row = &r->rows[i];
		CpNode	   *f;

		if (row->generation != newest || !row->caught_up)
			continue;
		f = cp_snapshot_node(snap, row->follower);
		if (f == NULL || !is_alive(f, now) || strcmp(f->incarnation, row->incarnation) != 0)
			continue;
		if (end < cp_node_end(f, s->stream, s->shard))
			return false;
	}
	return true;
}

/*
 * Does a lapsed leader that was started again since it took its generation
 * still hold every acknowledged record?  Its log may be a copy put back
 * from a backup, and what leader_holds_reported compares it with can all
 * trail the acknowledged end: the reported ends lag the mark, no row may
 * say caught up (a follower's restart leaves it out of its leader's
 * reports), a caught-up follower may not be alive to the holder while it
 * still answered its leader, or its end may be from a heartbeat made
 * before it stored what the mark then passed (docs/formal, finding 6).
 * So such a leader qualifies only if every other replica of the shard is
 * alive and gave, in a heartbeat that read its log after the lapse, a log
 * end its own reaches.  Each acknowledged record is on a follower, which
 * stored it before the leader, whose lease has lapsed, acknowledged it.
 *
 * A leader in the boot that took its generation (it lapsed paused or cut
 * off) has the log it acknowledged from and is not held back: a log put
 * back from a copy starts a new boot.  One that never took its generation
 * counts as started again; it can still make the generation's first claim
 * while the grant stands (cp_heartbeat.c).
 *
 * Availability: a leader that restarted while a replica is down waits for
 * it, unless a caught-up follower is promoted meanwhile.
 */
typedef enum RestartCheck
{
	RESTART_HOLDS,				/* not started again, or shown to hold it all */
	RESTART_PENDING,			/* every replica alive, log ends to come */
	RESTART_WAITS,				/* a replica is not alive */
	RESTART_SHORT				/* a replica's log ends after the leader's */
} RestartCheck;

static RestartCheck
restarted_leader_check(const CpSnapshot *snap, const CpShard *s, const CpNode *leader,
					   int64 lapse_ns, int64 now, char **why)
{
	int64		end = cp_node_end(leader, s->stream, s->shard);
	RestartCheck result = RESTART_HOLDS;

	*why = NULL;
	if (s->taken_generation == s->generation && s->taken_boot &&
		strcmp(s->taken_boot, leader->boot) == 0)
		return RESTART_HOLDS;
	if (end < 0)
	{
		result = RESTART_PENDING;
		*why = psprintf("%s has not given its log end since it started", leader->name);
	}
	for (int i = 0; i < s->nreplicas; i++)
	{
		CpNode	   *f;
		NodeObs    *no;
		int64		f_end;

		if (strcmp(s->replicas[i], leader->name) == 0)
			continue;
		f = cp_snapshot_node(snap, s->replicas[i]);
		no = f ? hash_search(node_obs, f->name, HASH_FIND, NULL) : NULL;
		f_end = f ? cp_node_end(f, s->stream, s->shard) : -1;
		if (f == NULL || !is_alive(f, now))
		{
			if (result < RESTART_WAITS)
			{
				result = RESTART_WAITS;
				*why = psprintf("%s is not alive", s->replicas[i]);
			}
		}
		else if (no == NULL || ends_read_after(no) <= lapse_ns || f_end < 0)
		{
			if (result < RESTART_PENDING)
			{
				result = RESTART_PENDING;
				*why = psprintf("%s has not given its log end since the lapse", f->name);
			}
		}
		else if (end >= 0 && f_end > end)
		{
			*why = psprintf("its log ends at " INT64_FORMAT ", before %s's at " INT64_FORMAT " (restored from a backup?)",
							end, f->name, f_end);
			return RESTART_SHORT;
		}
	}
	return result;
}

/*
 * Has the lapsed leader of s lost its generation's records for good?  It
 * is alive at another incarnation (its felix directory was replaced), or
 * its log, as this boot gave it, ends before what it is known to have
 * acknowledged, or -- started again -- before another replica's (put
 * back from an older copy).  A log does not grow back without a leader:
 * waiting for this one recovers nothing.
 */
static bool
leader_copy_gone(const CpSnapshot *snap, const CpShard *s, const CpNode *leader,
				 int64 lapse_ns, int64 now)
{
	char	   *why;

	if (leader == NULL || !is_alive(leader, now) || s->leader_incarnation == NULL)
		return false;
	if (strcmp(leader->incarnation, s->leader_incarnation) != 0)
		return strcmp(s->leader_incarnation, CP_INCARNATION_UNKNOWN) != 0;
	return cp_node_end(leader, s->stream, s->shard) >= 0 &&
		(!leader_holds_reported(snap, s, leader, now) ||
		 restarted_leader_check(snap, s, leader, lapse_ns, now, &why) == RESTART_SHORT);
}

/* Why a follower of s does not qualify (NULL: it does). */
static const char *
disqualified(const CpSnapshot *snap, const CpShard *s, const CpStream *st,
			 const ShardObs *obs, const char *follower, bool leader_gone,
			 int64 lapse_ns, int64 now, int64 *acked_end)
{
	const CpReports *r = cp_snapshot_reports(snap, s->stream, s->shard);
	int64		newest = newest_reported_generation(r);
	CpNode	   *n = cp_snapshot_node(snap, follower);
	const CpReport *row = NULL;
	NodeObs    *no;
	int64		end;

	for (int i = 0; r && i < r->n; i++)
		if (strcmp(r->rows[i].follower, follower) == 0)
			row = &r->rows[i];
	if (n == NULL || !is_alive(n, now))
		return "not alive";
	if (row == NULL)
		return "no report";
	if (row->generation < newest)
		return "report of an older generation";
	if (strcmp(row->incarnation, n->incarnation) != 0)
		return "new data directory";

	/*
	 * Its log, as its heartbeat gave it in this boot, must still hold what
	 * the report says it acknowledged: a felix directory put back from an
	 * older copy keeps its identity but not its records.
	 */
	end = cp_node_end(n, s->stream, s->shard);
	if (end >= 0 && end < row->acked_end)
		return "its log ends before what it was reported to hold (restored from a copy?)";
	if (row->halted)
		return psprintf("halted %s", row->halted);

	/*
	 * Quorum: only a follower holding every acknowledged record may lead
	 * (report before mark makes "caught up" true of every acknowledged
	 * record).  Leader consistency acknowledges without the followers, so
	 * under steady publishing no follower is ever level with the leader:
	 * requiring it would leave the shard unplaced for good once its
	 * leader's disk is lost.  There the most advanced follower recently
	 * reported is promoted, and what is lost is at most its lag -- the
	 * stream's documented loss window (docs/replication.md).
	 */
	if (!row->caught_up && strcmp(st->consistency, "quorum") == 0)
		return "behind";
	if (cp_node_unable(n, s->stream, s->shard))
		return "cannot serve it";
	/*
	 * Heard from lately (heard_lately): is_alive allows node_expiry, and
	 * one that died with its leader may look alive that long.  This decides
	 * who is worth a grant, not whether a grant is safe (the report and the
	 * first claim's checks do): a grantee that died since is passed over
	 * one lease later.  Not "heard since the lapse", which cost every
	 * failover up to two more heartbeat intervals (a follower's beat after
	 * the lapse, then our next tick).
	 */
	no = hash_search(node_obs, n->name, HASH_FIND, NULL);
	if (!heard_lately(no, now))
		return not_heard_lately;
	if (strcmp(st->consistency, "quorum") != 0 && !leader_gone)
	{
		/*
		 * A leader-consistency leader acknowledges without reporting until its
		 * lease ends: its report must be recent relative to its last claim,
		 * or more than the loss window could go.  Unless the leader's copy
		 * is gone: then what it acknowledged beyond its followers is lost
		 * whatever the holder waits for, and waiting would leave the shard
		 * unplaced for good (the fault harness, seed 4050 embedded).
		 */
		int64		window = (felix_node_expiry + felix_heartbeat_interval +
							  felix_heartbeat_interval - 1) / felix_heartbeat_interval;

		if (row->generation != s->taken_generation || obs->claim_beat < 0 ||
			row->leader_beat + window < obs->claim_beat)
			return "report too old";
	}
	*acked_end = row->acked_end;
	return NULL;
}

/*
 * Promotion by log: the copy that holds every acknowledged record, found
 * without a report (issue 20; docs/control-plane.md, "Promotion by log").
 * A quorum shard's leader lapsed at generation G, and no report names a
 * follower caught up (a new leader that had not reported yet, a report
 * doubted by a restart, a leader back from an older copy).  Each copy's
 * heartbeat gives its log end and the generation of its last record;
 * copies agree up to any record they share a generation and seq of (the
 * repair rules keep it), so of two copies the one whose last record is of
 * a newer generation, or of the same one and further, holds all of the
 * other.  Then:
 *
 *   - every record acknowledged before G is in the leader's log when it
 *     took G (every promotion makes it so), recorded then as taken_end in
 *     taken_last_generation: a copy at or past that (in the order above)
 *     holds them all;
 *   - every record acknowledged at G was stored, before its
 *     acknowledgement, by a majority of the replicas; a copy whose token
 *     (boot and copy epoch, cp_node_copy) is the one it had when G was
 *     taken has lost nothing it stored since -- a restart, a copy put back
 *     from a backup, a discard each change the token -- and one whose end
 *     was read after the lapse holds everything it ever will at G (the
 *     mark moves only under a live lease).  A replica that had given no
 *     token when G was taken (a new stream's copies come after its first
 *     claim) was recorded by its boot: it counts with the first epoch of
 *     its copy in that boot, which stored every record of G the replica
 *     ever stored and lost none (cp_copy_kept).  So n - n/2 such copies
 *     include one of that majority, and the newest of them holds every
 *     record it holds.
 *
 * The newest of at least n - n/2 copies kept since G was taken, read after
 * the lapse, at or past the leader's log at G, holds every acknowledged
 * record.  G is the newest generation taken (taken_generation), also when
 * generations were granted after it and never taken: a generation's first
 * write follows the claim that takes it, so those wrote and acknowledged
 * nothing, and a grant keeps what G's claim recorded.  (The leader of G
 * lapsed before the first of them was granted, so an end read after the
 * current lapse was read after G's too.)  A copy reported halted, or
 * unable to serve, is not counted: its log may differ from its leader's.
 * Not during a replica move.
 * Returns the node (NULL: none; *why says why when it could apply).
 */
static const CpNode *
copies_candidate(const CpSnapshot *snap, const CpShard *s, const CpStream *st,
				 int64 lapse_ns, int64 now, CpCopy *chosen, char **why)
{
	int			need = s->nreplicas - s->nreplicas / 2;
	int			counted = 0;
	const CpNode *best = NULL;
	const CpReports *r = cp_snapshot_reports(snap, s->stream, s->shard);

	*why = NULL;
	memset(chosen, 0, sizeof(*chosen));
	if (strcmp(st->consistency, "quorum") != 0 || s->nreplicas < 2 || s->joining)
		return NULL;
	if (s->taken_generation <= 0 || s->taken_end < 0 || s->taken_last_generation < 0)
	{
		*why = s->taken_generation <= 0 ?
			psprintf("no log by which to promote: no generation of it was ever taken") :
			psprintf("no log by which to promote: generation " INT64_FORMAT " was not taken with the leader's log given",
					 s->taken_generation);
		return NULL;
	}
	for (int i = 0; i < s->nreplicas; i++)
	{
		const char *name = s->replicas[i];
		const char *token = NULL;
		CpNode	   *n = cp_snapshot_node(snap, name);
		NodeObs    *no = hash_search(node_obs, name, HASH_FIND, NULL);
		CpCopy		copy;
		bool		halted = false;

		for (int k = 0; k < s->ntaken_copies; k++)
			if (strcmp(s->taken_copy_node[k], name) == 0)
				token = s->taken_copy_token[k];
		for (int k = 0; r && k < r->n; k++)
			if (strcmp(r->rows[k].follower, name) == 0 && r->rows[k].halted)
				halted = true;
		if (token == NULL || n == NULL || !is_alive(n, now) || halted ||
			cp_node_unable(n, s->stream, s->shard) ||
			!cp_node_copy(n, s->stream, s->shard, &copy) ||
			!cp_copy_kept(&copy, token) ||
			no == NULL || ends_read_after(no) <= lapse_ns)
			continue;
		counted++;
		if (best == NULL || copy.last_generation > chosen->last_generation ||
			(copy.last_generation == chosen->last_generation &&
			 (copy.end > chosen->end ||
			  (copy.end == chosen->end &&
			   cp_score(name, s->stream, s->shard) > cp_score(best->name, s->stream, s->shard)))))
		{
			best = n;
			*chosen = copy;
		}
	}
	if (counted < need)
	{
		*why = psprintf("%d of its %d copies are known to have kept their log since generation " INT64_FORMAT " was taken and have given it since the lapse; promotion by log needs %d",
						counted, s->nreplicas, s->taken_generation, need);
		return NULL;
	}
	if (chosen->last_generation < s->taken_last_generation ||
		(chosen->last_generation == s->taken_last_generation && chosen->end < s->taken_end))
	{
		*why = psprintf("the newest of those logs (%s's, ending at " INT64_FORMAT " in generation " INT64_FORMAT ") is older than the leader's when it took generation " INT64_FORMAT " (ending at " INT64_FORMAT " in generation " INT64_FORMAT ")",
						best->name, chosen->end, chosen->last_generation, s->taken_generation,
						s->taken_end, s->taken_last_generation);
		return NULL;
	}
	return best;
}

static bool
better(const Candidate *a, const Candidate *b, const CpShard *s)
{
	int32		sa,
				sb;

	if (b->node == NULL)
		return true;
	if (a->is_leader != b->is_leader)
		return a->is_leader;
	if (a->acked_end != b->acked_end)
		return a->acked_end > b->acked_end;
	sa = cp_score(a->node->name, s->stream, s->shard);
	sb = cp_score(b->node->name, s->stream, s->shard);
	if (sa != sb)
		return sa > sb;
	return strcmp(a->node->name, b->node->name) < 0;
}

static char *
unplaced_reason(const CpSnapshot *snap, const CpShard *s, const CpStream *st,
				const ShardObs *obs, int64 lapse_ns, int64 now, const char *log_why)
{
	const char *how = s->taken_generation == s->generation ? "lost its lease" : "never took its lease";
	const CpNode *leader = s->leader ? cp_snapshot_node(snap, s->leader) : NULL;
	char	   *main;
	StringInfoData details;
	char	   *full;
	bool		gone = leader_copy_gone(snap, s, leader, lapse_ns, now);
	char	   *short_why = NULL;

	if (s->leader == NULL)
		main = psprintf("no replica was reported caught up at generation " INT64_FORMAT " and no leader is known",
						s->generation);
	else if (leader && is_alive(leader, now) && !leader_holds_reported(snap, s, leader, now))
		main = psprintf("no replica was reported caught up at generation " INT64_FORMAT ", and leader %s %s and is back with a log that ends before what it reported its followers to hold, or before a caught-up follower's (restored from a backup?)",
						s->generation, s->leader, how);
	else if (leader && is_alive(leader, now) &&
			 restarted_leader_check(snap, s, leader, lapse_ns, now, &short_why) != RESTART_HOLDS)
		main = psprintf("no replica was reported caught up at generation " INT64_FORMAT ", and leader %s %s and has been started again since it took it (or never took it), so it leads again only once every other replica has given a log end, read since the lapse, that its log reaches: %s",
						s->generation, s->leader, how, short_why);
	else if (s->nreplicas == 1)
		main = psprintf("the only copy is on %s, which %s at generation " INT64_FORMAT " and is not alive",
						s->leader, how, s->generation);
	else
		main = psprintf("no replica was reported caught up at generation " INT64_FORMAT ", and leader %s %s and is not alive",
						s->generation, s->leader, how);
	initStringInfo(&details);
	for (int i = 0; i < s->nreplicas; i++)
	{
		int64		acked;
		const char *why;

		if (s->leader && strcmp(s->replicas[i], s->leader) == 0)
			continue;
		why = disqualified(snap, s, st, obs, s->replicas[i], gone, lapse_ns, now, &acked);
		appendStringInfo(&details, "%s%s: %s", details.len ? "; " : "", s->replicas[i],
						 why ? why : "report too old");
	}
	if (log_why)
		appendStringInfo(&details, "%s%s", details.len ? "; " : "", log_why);
	full = details.len ? psprintf("%s (%s)", main, details.data) : main;
	return full;
}

/* A reason as a shard slot holds it (FELIX_REASON_LEN): the log says it all. */
static char *
clip_reason(const char *reason)
{
	int			len = strlen(reason);

	if (len < CP_REASON_LEN)
		return (char *) reason;
	len = pg_mbcliplen(reason, len, CP_REASON_LEN - 4);
	return psprintf("%.*s...", len, reason);
}

/* One shard: promote it if its lease lapsed and someone qualifies. */
/*
 * What a pass of the duties decided for one shard: a new generation for a
 * node, or a new reason it is unplaced.  The pass writes its decisions
 * together (write_grants), not one round trip per shard: when a node that
 * led a thousand shards dies, all of them get a leader in one pass.
 */
typedef struct Grant
{
	const CpShard *s;			/* the assignment as read (compared) */
	char	   *value;			/* the assignment to write */
	const char *leads;			/* the node whose leads/<node> to rewrite, or NULL */
	const CpNode *candidate;	/* a node record compared too, or NULL */
	char	   *log;			/* said once written */
	const char *grantee;		/* the node given a new generation, or NULL */
} Grant;

/* Shards per store transaction: well within etcd's --max-txn-ops (docs/configuration.md). */
#define GRANTS_PER_TXN	100

static bool
consider(const CpSnapshot *snap, CpShard *s, int64 now, Grant *g)
{
	CpStream   *st = cp_snapshot_stream(snap, s->stream);
	ShardObs   *obs;
	int64		lapse_ns;
	CpNode	   *leader;
	Candidate	best = {NULL, false, 0};
	bool		gone;
	bool		by_log = false;
	bool		unheard = false;
	char	   *log_why = NULL;

	if (st == NULL)
		return false;
	obs = shard_seen(snap, s, now);
	lapse_ns = obs->claim_seen_ns + (int64) (obs->lease_ms + felix_lease_margin) * NS_PER_MS;

	/*
	 * The safety interval.  The leader claimed this lease no later than
	 * claim_seen_ns and stops writing lease_epsilon before its send instant
	 * plus lease_ms, by its own clock.  Waiting until lease_ms + margin have
	 * passed since then by ours means it has stopped before a successor can
	 * exist.  Promoting any earlier could give the generation two writers.
	 */
	if (!(now > lapse_ns))
	{
		if (next_lapse_ns == 0 || lapse_ns < next_lapse_ns)
			next_lapse_ns = lapse_ns;
		return false;
	}
	walk_lapsed = true;

	leader = cp_snapshot_node(snap, s->leader);
	if (leader && is_alive(leader, now) &&
		(s->nreplicas == 1 ||
		 (s->leader_incarnation &&
		  (strcmp(leader->incarnation, s->leader_incarnation) == 0 ||
		   strcmp(s->leader_incarnation, CP_INCARNATION_UNKNOWN) == 0))) &&
		!cp_node_unable(leader, s->stream, s->shard) &&
		leader_holds_reported(snap, s, leader, now))
	{
		NodeObs    *no = hash_search(node_obs, leader->name, HASH_FIND, NULL);
		char	   *why;
		RestartCheck restart = restarted_leader_check(snap, s, leader, lapse_ns, now, &why);

		if (restart == RESTART_HOLDS)
		{
			/* heard from again after the lapse: it holds every record of its generation */
			if (no && no->changed_seen_ns > lapse_ns)
			{
				best.node = leader;
				best.is_leader = true;
			}
		}

		/*
		 * Started again, with every replica alive but their log ends since
		 * the lapse still to come (HB_BEATS_KEPT - 1 heartbeats of each,
		 * after a read of ours): wait for them rather than promote around
		 * it -- a `leader` stream's follower lacks what its leader
		 * acknowledged alone.  For twice that at most: a replica alive but
		 * not heartbeating (cut off from the store) would hold the shard.
		 */
		else if (restart == RESTART_PENDING &&
				 now <= lapse_ns + (int64) (2 * HB_BEATS_KEPT) * felix_heartbeat_interval * NS_PER_MS)
			return false;
	}
	gone = leader_copy_gone(snap, s, leader, lapse_ns, now);
	for (int i = 0; i < s->nreplicas && !best.is_leader; i++)
	{
		Candidate	c = {NULL, false, 0};
		const char *dq;

		if (s->leader && strcmp(s->replicas[i], s->leader) == 0)
			continue;
		dq = disqualified(snap, s, st, obs, s->replicas[i], gone, lapse_ns, now, &c.acked_end);
		if (dq == not_heard_lately)
			unheard = true;
		if (dq != NULL)
			continue;
		c.node = cp_snapshot_node(snap, s->replicas[i]);
		if (better(&c, &best, s))
			best = c;
	}

	if (best.node == NULL)
	{
		CpCopy		copy;

		best.node = copies_candidate(snap, s, st, lapse_ns, now, &copy, &log_why);
		best.acked_end = s->acked_floor;
		by_log = best.node != NULL;
	}

	memset(g, 0, sizeof(*g));
	g->s = s;
	if (best.node)
	{
		CpShard		next = *s;

		next.generation = s->generation + 1;
		next.leader = best.node->name;
		next.leader_incarnation = best.node->incarnation;
		next.unplaced_reason = NULL;
		next.assigned_ms = cp_now_ms();
		next.grant_end = Max(0, cp_node_end(best.node, s->stream, s->shard));
		next.grant_last_generation = cp_node_last_generation(best.node, s->stream, s->shard);
		/*
		 * What every later leader must hold: a returning leader held the
		 * floor and what it reported; a promoted follower holds what its
		 * report says (on a leader stream, records beyond it are the loss
		 * window and are gone).
		 */
		next.acked_floor = best.is_leader ?
			Max(s->acked_floor, newest_reported_end(snap, s)) :
			(strcmp(st->consistency, "quorum") == 0 ?
			 Max(s->acked_floor, best.acked_end) : best.acked_end);
		g->value = cp_shard_write(&next);
		g->leads = s->leader ? s->leader : best.node->name;
		/*
		 * A returning leader qualified on its boot and heartbeat count
		 * (restarted_leader_check): its record is compared, so a restart
		 * since this read fails the grant.  A follower's record is not: a
		 * grant names its incarnation, and the first claim checks that
		 * the claiming boot can serve the shard and holds grant_end and
		 * acked_floor (cp_heartbeat.c) -- what the read found, checked
		 * again at the claim.  Comparing it would fail every grant to a
		 * node that heartbeat since the read, which at a thousand shards
		 * is most of them.
		 */
		g->candidate = best.is_leader ? best.node : NULL;
		g->grantee = best.node->name;
		g->log = psprintf("felix: stream \"%s\" shard %d: %s leads generation " INT64_FORMAT " (was %s at generation " INT64_FORMAT ")%s",
						  s->stream, s->shard, best.node->name, next.generation,
						  s->leader ? s->leader : "nobody", s->generation,
						  by_log ? ", promoted by its log: the newest of the copies kept since the last generation taken" : "");
		return true;
	}
	else if (unheard && now - lapse_ns < (int64) felix_lease_duration * NS_PER_MS)
	{
		/*
		 * A follower that would qualify but was not heard from lately is
		 * most likely a survivor whose heartbeat the store is slow to
		 * commit: the next tick may grant to it, so this one writes no
		 * reason, for a lease after the lapse.  Writing a thousand of them
		 * (a failover on a loaded etcd, both survivors late at one tick)
		 * cost three seconds before the grants.
		 */
		return false;
	}
	else
	{
		/*
		 * Nobody qualifies: the shard stays unplaced.  Handing it to a node
		 * that does not hold the log would serve an empty shard at a newer
		 * generation -- data loss nobody sees; unavailable is visible.
		 */
		char	   *reason = unplaced_reason(snap, s, st, obs, lapse_ns, now, log_why);
		CpShard		next = *s;

		next.unplaced_reason = clip_reason(reason);
		if (s->unplaced_reason && strcmp(s->unplaced_reason, next.unplaced_reason) == 0)
			return false;
		g->value = cp_shard_write(&next);
		g->log = psprintf("felix: stream \"%s\" shard %d is unplaced: %s",
						  s->stream, s->shard, reason);
		return true;
	}
}

/* Add a compare of key at rev unless one is there; puts likewise (value). */
static void
add_cmp(FelixStoreCmp *cmps, int *n, char *key, int64 rev)
{
	for (int i = 0; i < *n; i++)
		if (strcmp(cmps[i].key, key) == 0)
			return;
	cmps[*n].key = key;
	cmps[(*n)++].mod_revision = rev;
}

static void
add_op(FelixStoreOp *ops, int *n, char *key, const char *value)
{
	for (int i = 0; i < *n; i++)
		if (strcmp(ops[i].key, key) == 0)
			return;
	ops[*n].key = key;
	ops[(*n)++].value = value;
}

/*
 * Write grants g[0..n) in one transaction: every assignment as read, the
 * node record of each shard's leader as read (a claim made since we
 * looked changes it, and fails the grant -- the lease rule's half that is
 * the holder's), each compared candidate's, and the duty key as our last
 * refresh left it.  Returns the store's answer.
 */
static FelixStoreStatus
write_together(const CpSnapshot *snap, Grant *g, int n)
{
	FelixStoreCmp *cmps = palloc(sizeof(FelixStoreCmp) * (3 * n + 1));
	FelixStoreOp *ops = palloc(sizeof(FelixStoreOp) * (2 * n + 1));
	int			ncmps = 0;
	int			nops = 0;
	int64		rev;

	add_cmp(cmps, &ncmps, CP_KEY_DUTY, duty_rev);
	for (int i = 0; i < n; i++)
	{
		const CpShard *s = g[i].s;

		add_cmp(cmps, &ncmps, cp_key_shard(s->stream, s->shard), s->rev);
		if (s->leader)
		{
			CpNode	   *leader = cp_snapshot_node(snap, s->leader);

			add_cmp(cmps, &ncmps, cp_key_node(s->leader), leader ? leader->rev : 0);
		}
		if (g[i].candidate)
			add_cmp(cmps, &ncmps, cp_key_node(g[i].candidate->name), g[i].candidate->rev);
		add_op(ops, &nops, cp_key_shard(s->stream, s->shard), g[i].value);
		if (g[i].leads)
			add_op(ops, &nops, cp_key_leads(g[i].leads), cp_leads_value());
	}
	return felix_store_txn(cmps, ncmps, ops, nops, &rev, LOG);
}

/*
 * Write a pass's grants, GRANTS_PER_TXN to a transaction.  A transaction
 * that loses a compare (a shard or a leader changed since the read) is
 * written again one grant at a time, so one changed shard holds up no
 * other.  Counts in *tick the shards given a new generation, and names
 * their grantees once each.
 */
static void
write_grants(const CpSnapshot *snap, Grant *g, int n, CpTick *tick,
			 const char *node, const char *boot)
{
	/*
	 * Grants are written for at most half a lease after the duty's last
	 * refresh: a holder whose tick runs past a lease steps down
	 * (hold_duty), and at thousands of shards a batch that loses its
	 * compares is written again one grant at a time -- a round trip each.
	 * With grants left at that point the holder refreshes the duty and
	 * goes on, for a lease in all; what is left then is the next tick's
	 * (not writing a grant is always safe).  A failover of a thousand
	 * shards on a loaded etcd wrote 600 grants in the first half lease,
	 * and the rest a tick later, 0.7 s after the first ones.  Each grant
	 * stays safe to write late: it compares the leader's record as read,
	 * so a claim made since fails it, and the duty key as the last refresh
	 * left it.
	 */
	int64		lease_ns = (int64) felix_lease_duration * NS_PER_MS;
	int64		stop = felix_monotonic_ns() + lease_ns;
	int64		deadline = refreshed_ns + lease_ns / 2;

	for (int from = 0; from < n; from += GRANTS_PER_TXN)
	{
		int			k = Min(GRANTS_PER_TXN, n - from);
		FelixStoreStatus st;

		if (felix_monotonic_ns() >= deadline)
		{
			if (felix_monotonic_ns() >= stop || !refresh_duty(node, boot))
				break;
			deadline = refreshed_ns + lease_ns / 2;
		}
		st = write_together(snap, &g[from], k);
		if (st != FELIX_STORE_OK && st != FELIX_STORE_CONFLICT)
			break;				/* the store is not answering: the next pass */
		for (int i = from; i < from + k; i++)
		{
			if (st == FELIX_STORE_CONFLICT &&
				(k == 1 || felix_monotonic_ns() >= deadline ||
				 write_together(snap, &g[i], 1) != FELIX_STORE_OK))
				continue;
			ereport(LOG, (errmsg_internal("%s", g[i].log)));
			if (g[i].grantee)
			{
				tick->promoted++;
				if (!list_member(tick->grantees, makeString((char *) g[i].grantee)))
					tick->grantees = lappend(tick->grantees, makeString(pstrdup(g[i].grantee)));
			}
		}
	}
}

/* Must this tick walk every shard?  (See "The walk" above.) */
static bool
walk_wanted(const CpSnapshot *snap, int64 now)
{
	int			changed;

	if (walk_due_ns == 0 || now >= walk_due_ns || snap->nshards != walked_nshards)
		return true;
	(void) cp_snapshot_shards_since(snap, walked_rev, &changed);
	if (changed > 0)
		return true;
	for (int i = 0; i < snap->nstreams; i++)
		if (snap->streams[i].rev > walked_rev)
			return true;
	for (int i = 0; i < snap->nnodes; i++)
		if (snap->nodes[i].claims_rev > walked_rev)
			return true;
	return false;
}

/*
 * The guard against keys changed outside felix: every
 * felix.store_guard_interval the holder reads the whole state again, a
 * page per tick (cpstate.c), and when its copy had missed keys written or
 * deleted without felix's marks, it writes the deletions key, so that
 * every other process, which reads only what changed, reads the whole
 * state again.
 */
static void
guard_store(void)
{
	int			drift = cp_snapshot_guard(LOG);
	FelixStoreOp op = {FELIX_STORE_KEY_DELETIONS, "{}"};
	int64		revision;

	if (drift == 0)
		return;
	ereport(WARNING,
			(errmsg("felix: %d control-plane keys were changed outside felix (without their marks)", drift),
			 errdetail("The duty holder's periodic read of the whole state (felix.store_guard_interval) found them; the reads of what changed did not."),
			 errhint("Every node now reads the whole state again.  Change the control-plane store only through felix's functions.")));
	(void) felix_store_txn(NULL, 0, &op, 1, &revision, LOG);
}

/*
 * One tick of the duties for node (its boot), into *tick: how many shards
 * were given a new generation (-1: not the holder, or the store did not
 * answer) and to which nodes, whose next heartbeat claims them -- the
 * caller wakes them; and when a lease watched now lapses first, from now
 * (-1: none), when the caller ticks again rather than at its next
 * interval.  Neither wake waits for anything.
 */
void
cp_duty_tick(const char *node, const char *boot, CpTick *tick)
{
	CpSnapshot	snap;
	int64		read_ns;
	int64		now;
	Grant	   *grants;
	int			ngrants = 0;

	/*
	 * Who holds the duty, from its key alone: a node that does not hold it
	 * reads nothing more, so the duties cost one small read per tick on
	 * every node but the holder, however many shards there are.
	 */
	tick->promoted = -1;
	tick->lapse_in_ms = -1;
	tick->grantees = NIL;
	felix_store_serialize();
	if (!cp_snapshot_read_parts(&snap, (const char *[]) {CP_KEY_DUTY}, 1, LOG))
		return;
	if (!hold_duty(&snap, node, boot))
		return;
	guard_store();

	/*
	 * The whole state, read after this tick's refresh of the duty key and
	 * after this node's heartbeat: a snapshot taken before that heartbeat
	 * would hold an older revision of this node's own record, and every
	 * promotion of this node would fail its compare.
	 */
	read_ns = felix_monotonic_ns();
	if (!cp_snapshot_read(&snap, false, LOG))
		return;
	if (node_obs == NULL)
		forget_everything();
	now = felix_monotonic_ns();
	for (int i = 0; i < snap.nnodes; i++)
		(void) node_seen(&snap.nodes[i], read_ns, now);
	keep_alive_list(&snap, now);
	grants = palloc(sizeof(Grant) * (snap.nshards + 1));
	if (walk_wanted(&snap, now))
	{
		next_lapse_ns = 0;
		walk_lapsed = false;
		for (int i = 0; i < snap.nshards; i++)
			if (consider(&snap, &snap.shards[i], now, &grants[ngrants]))
				ngrants++;
		walk_due_ns = walk_lapsed ? 0 : next_lapse_ns;
		felix_count(FELIX_CTR_DUTY_WALKS, 1);
		walked_rev = snap.revision;
		walked_nshards = snap.nshards;
	}
	else
		next_lapse_ns = walk_due_ns;
	if (next_lapse_ns > 0)
		tick->lapse_in_ms = (int) ((next_lapse_ns - now) / NS_PER_MS) + 1;
	tick->promoted = 0;

	/*
	 * A tick whose reads ran long (a state of thousands of shards, a
	 * loaded store) would have little or none of its half lease left to
	 * write grants in.  It refreshes the duty key first: the grants it
	 * computed stay safe to write -- each compares the duty key at the
	 * refresh's revision and the records it was decided from -- and it
	 * gets a whole half lease for them.
	 */
	if (ngrants > 0 && now - refreshed_ns >= (int64) felix_lease_duration * NS_PER_MS / 4 &&
		!refresh_duty(node, boot))
		return;
	write_grants(&snap, grants, ngrants, tick, node, boot);
}
