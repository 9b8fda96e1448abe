/*-------------------------------------------------------------------------
 *
 * cp_heartbeat.c
 *	  A node's heartbeat at the control plane: register the node, claim the
 *	  leases it is due, and tell it what changed in the assignments.
 *
 *	  The lease rule.  A node holds the lease of shard S at generation G
 *	  from the instant s it sent a heartbeat until s + lease_ms -
 *	  felix.lease_epsilon by its own monotonic clock, provided that
 *	  heartbeat's transaction committed a write of the node's record while
 *	  its claims (claims/<node>, written or compared in the same
 *	  transaction) held (S, G), and S's assignment named it, at its
 *	  incarnation, leader of G.  The
 *	  transaction compares the node's own record and its leads/<node> key,
 *	  which every change of a shard's leader away from it bumps
 *	  (cp_duty.c, cp_streams.c): so a promotion that commits first makes
 *	  this heartbeat read again and claim nothing, and one that commits
 *	  later compared the node record this heartbeat changed and fails.
 *	  The duty holder promotes only after observing no new claim for
 *	  lease_ms + lease_margin on its own clock (cp_duty.c); observing
 *	  happens after the write, the write after s, so the old leader has
 *	  stopped before a successor exists.
 *
 *	  Who may claim: the leader named by the assignment, at the incarnation
 *	  the generation was granted to, able to serve the shard, and -- once
 *	  the generation's lease was first taken -- only the same boot of it.
 *	  A restarted server knows nothing of what it claimed before, so it
 *	  does not resume a generation: its lease lapses and the duty holder
 *	  grants the next generation (to it, if it is still the best holder of
 *	  the log).  The first claim of a generation records the taking boot
 *	  in the assignment, compared like the rest.
 *
 *	  Identity: a node known under the same incarnation with more starts,
 *	  or as many from another boot, is an older copy of itself (55F06); a
 *	  node known alive under another incarnation is another server with
 *	  the same name (42710); a new incarnation of a node declared dead
 *	  voids every report about the node as a follower, a new boot marks
 *	  them not caught up until its leaders confirm them.
 *
 *	  What the answer holds.  A node keeps the assignments it was told and
 *	  says which state it holds (known_state) and which answer told it its
 *	  leases (known_commit).  The answer is every assignment (full) when
 *	  the node holds none, or may hold one that is gone or stale in a way a
 *	  row would not show: another store, another incarnation or boot, a
 *	  shard taken from it (leads/<node>), a deletion, an address changed,
 *	  or claims written by a heartbeat whose answer it did not take.
 *	  Otherwise it is the assignments written after known_state (their
 *	  shard or their stream), and those whose lease this call claims, or
 *	  stops claiming, unlike claims/<node> as the answer at known_commit
 *	  left it -- which is what the node holds as its leases.  So every
 *	  lease the node holds and finds no row about was claimed again by
 *	  this call, and a node that lost an answer gets a full one.
 *
 * Locking rule: none; compare-and-set in the store.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/conninfo.h"
#include "control/cp.h"
#include "felix.h"
#include "storage/incarnation.h"

/*
 * The most shard and report records one heartbeat's transaction rewrites:
 * its first claims, the unplaced reasons it clears, the reports it voids.
 * With the node's own keys and the marks of the sections written
 * (store.c), its operations and its compares stay below 257, the least
 * --max-txn-ops docs/configuration.md asks of etcd: a transaction past
 * that is refused at every heartbeat, and the node loses every lease (TAP
 * 157).  What is left waits for the next beat.
 */
#define CP_MAX_REWRITES_PER_BEAT	200
/*
 * The most reports a transaction of a heartbeat rewrites about its node
 * (void_reports_ahead): well within etcd's request size (1.5 MiB by
 * default), and no more than the rewrites of a beat.
 */
#define CP_VOIDS_PER_TXN		100

/* Did boot take a generation that is still its shard's current one? */
static bool
took_current(const CpSnapshot *snap, const char *boot)
{
	for (int i = 0; i < snap->nshards; i++)
	{
		const CpShard *s = &snap->shards[i];

		if (s->taken_generation == s->generation && s->taken_boot &&
			strcmp(s->taken_boot, boot) == 0)
			return true;
	}
	return false;
}

void
cp_check_node_name(const char *node)
{
	if (node == NULL || node[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a node name must not be NULL or empty"),
				 errhint("A node's name is its felix.node_name (node_<port> when that is empty).")));
	if (strlen(node) > FELIX_MAX_NODE_NAME_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("node name \"%s\" is too long", node),
				 errhint("A node name has at most %d bytes, so that felix_node_<name> is a valid role name.",
						 FELIX_MAX_NODE_NAME_LEN)));
}

bool
cp_is_uuid(const char *s)
{
	static const char form[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";

	if (s == NULL || strlen(s) != sizeof(form) - 1)
		return false;
	for (int i = 0; form[i]; i++)
	{
		if (form[i] == '-' ? s[i] != '-' : !((s[i] >= '0' && s[i] <= '9') ||
											 (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return true;
}

static void
validate(const CpHeartbeatArgs *a)
{
	cp_check_node_name(a->node);
	if (a->conninfo == NULL || a->incarnation == NULL || a->boot == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("node \"%s\": conninfo, incarnation, starts and boot must not be NULL", a->node),
				 errhint("Pass the conninfo peers use to reach the node (felix.node_conninfo) and the identity of its felix data directory.")));
	if (!cp_is_uuid(a->incarnation) || !cp_is_uuid(a->boot) || a->starts <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\": incarnation %s / starts " INT64_FORMAT " is not an identity felix made",
						a->node, a->incarnation, a->starts),
				 errhint("This is felix's internal protocol; node and control plane may run different felix versions.")));
	if (a->lease_ms <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\": a lease of %d ms is not one", a->node, a->lease_ms),
				 errhint("felix.lease_duration is at least 100 ms.")));
}

/*
 * Does the claiming node's log still end in the generation it ended in
 * when the grant was made (grant_last_generation)?  The end alone can be
 * met by a copy put back from before a repair cut an unadopted tail.
 * Unknown on either side (not given: records not yet durable), it holds.
 */
static bool
holds_granted_generation(const CpNode *me, const CpShard *s)
{
	CpCopy		copy;

	if (s->grant_last_generation < 0 || !cp_node_copy(me, s->stream, s->shard, &copy))
		return true;
	return copy.last_generation >= s->grant_last_generation;
}

/*
 * What the claim that takes a generation records for promotion by log
 * (copies_candidate in cp_duty.c): the leader's log as this heartbeat
 * gave it, and the token of each replica's copy as the state read here
 * holds it.  Every record of the generation is written after this claim
 * commits (the lease starts with it), so a copy whose token is the same
 * later has kept every record of the generation it stored.  A replica
 * that gave no token (no copy yet, as in a new stream; records not yet
 * durable) is recorded as "<its boot>#0": it counts later only as the
 * first epoch of its copy in that same boot -- every record of the
 * generation it stored, it stored in that boot, after this claim, and a
 * copy that never began again in the boot lost none of them.  Without
 * the leader's own log nothing is recorded, and the generation is
 * promoted on reports alone -- unless it is a new shard's first (no grant
 * end, no acknowledged floor): nothing was written before it.
 */
static void
note_taken_copies(const CpSnapshot *snap, const CpNode *me, CpShard *taken)
{
	CpCopy		copy;

	taken->ntaken_copies = 0;
	taken->taken_end = taken->taken_last_generation = -1;
	if (cp_node_copy(me, taken->stream, taken->shard, &copy))
	{
		taken->taken_end = copy.end;
		taken->taken_last_generation = copy.last_generation;
	}
	else if (taken->generation == 1 && taken->grant_end <= 0 && taken->acked_floor <= 0)
		taken->taken_end = taken->taken_last_generation = 0;
	else
		return;
	for (int i = 0; i < taken->nreplicas; i++)
	{
		const CpNode *r = strcmp(taken->replicas[i], me->name) == 0 ? me :
			cp_snapshot_node(snap, taken->replicas[i]);

		if (r == NULL)
			continue;
		taken->taken_copy_node[taken->ntaken_copies] = taken->replicas[i];
		taken->taken_copy_token[taken->ntaken_copies++] =
			cp_node_copy(r, taken->stream, taken->shard, &copy) ? copy.token :
			cp_first_copy_token(r);
	}
}

/*
 * Will this heartbeat take a generation -- a lead granted to the node's
 * incarnation that no claim has taken yet?  Only then does the rule need
 * the other nodes' log ends (note_taken_copies records their copies'
 * tokens), which a heartbeat otherwise leaves unread.
 */
static bool
takes_due(const CpSnapshot *snap, const CpHeartbeatArgs *a)
{
	int			nled;
	const int  *led = cp_snapshot_led_by(snap, a->node, &nled);

	for (int k = 0; k < nled; k++)
	{
		const CpShard *s = &snap->shards[led[k]];

		if (s->taken_generation != s->generation && s->leader_incarnation != NULL &&
			strcmp(s->leader_incarnation, a->incarnation) == 0)
			return true;
	}
	return false;
}

/*
 * Reports about `node` as a follower: dropped (new incarnation) or doubted
 * (new boot), at most `most` report keys of them.  Returns whether more
 * were left.
 */
static bool
void_reports(const CpSnapshot *snap, const char *node, bool drop, int most,
			 FelixStoreCmp *cmps, int *ncmps, FelixStoreOp *ops, int *nops)
{
	int			written = 0;

	for (int i = 0; i < snap->nreports; i++)
	{
		const CpReports *r = snap->reports[i];
		CpReports	out;
		bool		changed = false;

		out = *r;
		out.n = 0;
		for (int j = 0; j < r->n; j++)
		{
			CpReport	row = r->rows[j];

			if (strcmp(row.follower, node) == 0)
			{
				if (drop)
				{
					changed = true;
					continue;
				}
				if (row.caught_up)
				{
					row.caught_up = false;
					changed = true;
				}
			}
			out.rows[out.n++] = row;
		}
		if (!changed)
			continue;
		if (written++ == most)
			return true;
		cmps[*ncmps].key = cp_key_reports(snap->report_stream[i], snap->report_shard[i]);
		cmps[*ncmps].mod_revision = r->rev;
		(*ncmps)++;
		ops[*nops].key = cmps[*ncmps - 1].key;
		ops[*nops].value = cp_reports_write(&out);
		(*nops)++;
	}
	return false;
}

/* Does this heartbeat come from a new felix data directory, or a new boot of it? */
static bool
new_incarnation(const CpHeartbeatArgs *a, const CpNode *prev)
{
	return prev != NULL && strcmp(prev->incarnation, a->incarnation) != 0;
}

static bool
new_boot(const CpHeartbeatArgs *a, const CpNode *prev)
{
	return prev != NULL && strcmp(prev->boot, a->boot) != 0;
}

/* A heartbeat transaction whose outcome the store did not say. */
static void unconfirmed(const char *node) pg_attribute_noreturn();

static void
unconfirmed(const char *node)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("node \"%s\": the control-plane store did not confirm the heartbeat", node),
			 errhint("Its outcome is unknown; the next heartbeat settles it.")));
}

/*
 * A node started again, or with a new data directory, has its reports as a
 * follower doubted or dropped by the heartbeat that registers it (below).
 * A node that follows thousands of shards has thousands of them: in one
 * transaction that was more than etcd takes ("request is too large"), so
 * no heartbeat of the node ever went through again and, after a restart
 * of every node, no shard was placed.  Those past the first
 * CP_VOIDS_PER_TXN are rewritten first, in transactions of their own that
 * change nothing else.  Doubting or dropping a report early only makes a
 * copy less promotable; and the registering heartbeat voids again every
 * report that says otherwise by then, in its own transaction, as before.
 * Returns true when it wrote (or lost a batch to another writer): the
 * caller reads the state again.
 */
static bool
void_reports_ahead(const CpHeartbeatArgs *a, const CpSnapshot *snap, const CpNode *prev)
{
	FelixStoreCmp *cmps;
	FelixStoreOp *ops;
	int			ncmps = 0;
	int			nops = 0;
	int64		rev;
	FelixStoreStatus st;

	if (!new_incarnation(a, prev) && !new_boot(a, prev))
		return false;
	cmps = palloc0(sizeof(FelixStoreCmp) * (CP_VOIDS_PER_TXN + 1));
	ops = palloc0(sizeof(FelixStoreOp) * (CP_VOIDS_PER_TXN + 1));
	if (!void_reports(snap, a->node, new_incarnation(a, prev), CP_VOIDS_PER_TXN,
					  cmps, &ncmps, ops, &nops))
		return false;			/* they fit the heartbeat's own transaction */
	st = felix_store_txn(cmps, ncmps, ops, nops, &rev, ERROR);
	if (st != FELIX_STORE_OK && st != FELIX_STORE_CONFLICT)
		unconfirmed(a->node);
	return true;
}

/*
 * The record of the node a refused heartbeat names, as this process last
 * saw it, and since when (its monotonic clock) it has not changed.
 */
static struct
{
	char		node[NAMEDATALEN];
	int64		rev;
	int64		since_ns;
}			holder_seen;

/*
 * Has node `holder` written nothing for felix.node_expiry (at least two
 * leases and a margin), as this process saw its record?  The alive list is the duty holder's, and duties that do
 * not run (held, or run by the very node whose directory was wiped) never
 * declare a silent node dead; a node heartbeats every interval, so a
 * record unchanged that long is one no server is heartbeating for, and a
 * new incarnation may take the name.
 */
static bool
holder_silent(const CpNode *holder)
{
	int64		now = felix_monotonic_ns();

	if (strcmp(holder_seen.node, holder->name) != 0 || holder_seen.rev != holder->rev)
	{
		strlcpy(holder_seen.node, holder->name, NAMEDATALEN);
		holder_seen.rev = holder->rev;
		holder_seen.since_ns = now;
		return false;
	}
	/*
	 * At least two leases and a margin, whatever felix.node_expiry this
	 * server was given: a pause of the holder shorter than that never
	 * gives its name away.
	 */
	return now - holder_seen.since_ns >=
		(int64) Max(felix_node_expiry, 2 * felix_lease_duration + felix_lease_margin) * 1000000;
}

/*
 * Does the lease claimed at the node's last answer (claims/<node> as prev
 * holds it) say the node holds s at its generation, with this lease?
 */
static bool
claimed_before(const CpNode *prev, const CpShard *s, int lease_ms)
{
	const CpClaim *c = prev ? cp_node_claim(prev, s->stream, s->shard) : NULL;

	return c != NULL && c->generation == s->generation && c->lease_ms == lease_ms;
}

/*
 * A node's worker may say its log ends are those it gave at the heartbeat
 * whose answer it took last (known_commit), rather than give them again:
 * true if ends/<node> still holds those -- not written since, in this
 * boot.
 */
static bool
ends_unchanged_holds(const CpHeartbeatArgs *a, const CpNode *prev)
{
	return a->ends_unchanged && !a->ends_given && a->known_commit > 0 && prev != NULL &&
		strcmp(prev->boot, a->boot) == 0 && strcmp(prev->incarnation, a->incarnation) == 0 &&
		prev->ends_rev > 0 && prev->ends_rev <= a->known_commit;
}

/*
 * Which shards' assignments the answer holds, by place (see "What the
 * answer holds" above): every one in a full answer; else those written
 * after known_state (the shard, or its stream), and those whose lease this
 * call claims or stops claiming unlike the answer at known_commit left
 * it.  When the claims written are those claims/<node> held (claims_same)
 * there is no such lease, so an idle heartbeat looks at what changed only.
 */
static bool *
answered_shards(const CpHeartbeatArgs *a, const CpSnapshot *snap, const CpNode *prev,
				bool full, bool claims_same, const bool *granted, const int *led, int nled)
{
	bool	   *answer = palloc0(sizeof(bool) * (snap->nshards + 1));
	const int  *since;
	int			nsince;

	if (full)
	{
		memset(answer, true, sizeof(bool) * snap->nshards);
		return answer;
	}
	since = cp_snapshot_shards_since(snap, a->known_state, &nsince);
	for (int k = 0; k < nsince; k++)
		answer[since[k]] = true;
	for (int j = 0; j < snap->nstreams; j++)
	{
		if (snap->streams[j].rev <= a->known_state)
			continue;
		for (int i = 0; i < snap->nshards; i++)
			if (cp_snapshot_stream_at(snap, i) == &snap->streams[j])
				answer[i] = true;
	}
	if (claims_same)
		return answer;
	/* a lease claimed now, not at the last answer */
	for (int k = 0; k < nled; k++)
		if (granted[led[k]] && !claimed_before(prev, &snap->shards[led[k]], a->lease_ms))
			answer[led[k]] = true;
	/* ... and one claimed then, not now: only a shard in claims/<node> */
	for (int k = 0; prev && k < prev->nclaims; k++)
	{
		const CpShard *s = cp_snapshot_shard(snap, prev->claims[k].stream, prev->claims[k].shard);

		if (s != NULL && !granted[s - snap->shards] && claimed_before(prev, s, a->lease_ms))
			answer[s - snap->shards] = true;
	}
	return answer;
}

/* Must the answer be every assignment?  (See "What the answer holds" above.) */
static bool
full_answer(const CpHeartbeatArgs *a, const CpSnapshot *snap, const CpNode *prev)
{
	return a->known_state <= 0 || a->known_commit <= 0 ||
		a->known_state > snap->revision || prev == NULL ||
		strcmp(prev->incarnation, a->incarnation) != 0 || strcmp(prev->boot, a->boot) != 0 ||
		a->seen_store_id == NULL || snap->store_id == NULL ||
		strcmp(a->seen_store_id, snap->store_id) != 0 ||
		prev->claims_rev > a->known_commit ||
		cp_snapshot_leads_rev(snap, a->node) > a->known_commit ||
		snap->deletions_rev > a->known_state ||
		snap->addresses_rev > a->known_state;
}

/*
 * May this heartbeat speak for node a->node, as the state in snap knows
 * it?  Refused (ERROR) when it comes from an older copy of the node's data
 * directory, from a second server given the same name, or from an address
 * another alive node registered.
 */
static void
check_identity(const CpHeartbeatArgs *a, const CpSnapshot *snap, const CpNode *prev,
			   const char *masked)
{
	if (prev && strcmp(prev->incarnation, a->incarnation) == 0 &&
		(a->starts < prev->starts ||
		 (a->starts == prev->starts && strcmp(a->boot, prev->boot) != 0)))
		ereport(ERROR,
				(errcode(MAKE_SQLSTATE('5', '5', 'F', '0', '6')),
				 errmsg("node \"%s\": its felix data directory is an older copy of incarnation %s (start " INT64_FORMAT " after start " INT64_FORMAT ")",
						a->node, a->incarnation, a->starts, prev->starts),
				 errdetail("Records acknowledged since that copy was taken may be missing from it."),
				 errhint("The node gives its data directory a new incarnation and registers again; its copies are rebuilt from their leaders.")));

	/*
	 * One name, one server.  A node is its felix data directory (the
	 * incarnation), not its name: a heartbeat naming a node that the
	 * control plane knows, alive, under another incarnation comes from
	 * a second server given the same felix.node_name.  Taking it would
	 * make the two register in turn, each void the other's copies and
	 * lose every lease.  It is refused until the known one is declared
	 * dead, or has not heartbeaten for felix.node_expiry (at least two
	 * leases and a margin) as this process saw it -- which is also how
	 * a node whose directory was wiped comes back: its old incarnation
	 * stops heartbeating first.
	 */
	if (prev && strcmp(prev->incarnation, a->incarnation) != 0 &&
		!(snap->have_alive && !cp_alive_has(&snap->alive, prev->name)) &&
		!holder_silent(prev))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("node name \"%s\" is in use by another server, at \"%s\"",
						a->node, prev->conninfo),
				 errdetail("The control plane knows node \"%s\" as felix data directory incarnation %s, alive; this server, at \"%s\", is incarnation %s.",
						   a->node, prev->incarnation, masked, a->incarnation),
				 errhint("Give each server its own felix.node_name.  If this server replaces that one, stop the other server: this one registers once the control plane declares it dead (felix.node_expiry).")));

	/* One address, one node: shipments meant for one must not reach another. */
	for (int i = 0; i < snap->nnodes; i++)
	{
		CpNode	   *o = &snap->nodes[i];

		if (strcmp(o->name, a->node) != 0 && strcmp(o->conninfo, masked) == 0 &&
			snap->have_alive && cp_alive_has(&snap->alive, o->name))
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("node \"%s\": conninfo \"%s\" is already the address of node \"%s\"",
							a->node, masked, o->name),
					 errdetail("Node \"%s\" registered that conninfo and is alive.", o->name),
					 errhint("Set felix.node_conninfo on node \"%s\" to the address of that server itself.",
							 a->node)));
	}
}

void
cp_heartbeat(const CpHeartbeatArgs *a, CpHeartbeatResult *out)
{
	char	   *masked;

	validate(a);
	masked = felix_conninfo_mask(a->conninfo);

	for (int attempt = 0, batches = 0; attempt < CP_MAX_ATTEMPTS; attempt++)
	{
		CpSnapshot	snap;
		CpNode	   *prev;
		CpNode		me;
		FelixStoreCmp *cmps;
		FelixStoreOp *ops;
		int			ncmps = 0;
		int			nops = 0;
		int			rewrites;
		bool	   *granted;
		bool	   *answer;
		bool		claims_same;
		const int  *led;
		int			nled;
		int64		rev;
		FelixStoreStatus st;
		int			room;

		cp_serialize();
		(void) cp_snapshot_read_for_heartbeat(&snap, a->node, ERROR);
		if (takes_due(&snap, a))
			(void) cp_snapshot_read(&snap, false, ERROR);
		prev = cp_snapshot_node(&snap, a->node);
		room = snap.nreports + snap.nshards + 5;

		/*
		 * A store behind what the node has seen of it was put back from an
		 * older copy (a backup, a standby that was behind): it would grant
		 * generations that were granted already, and send leases and
		 * leaders back in time.  It serves nobody who saw it later; a node
		 * that never did (a new one) learns nothing it could act on, as
		 * every node that knows better is refused.
		 */
		if (a->seen_store_id && snap.store_id &&
			strcmp(a->seen_store_id, snap.store_id) == 0 &&
			a->seen_revision > snap.revision)
		{
			/*
			 * Revisions drawn from the older copy's sequence name other
			 * writes than the same revisions of the latest state did:
			 * once that is back, a read of what changed since would miss
			 * some.  So the next read reads everything.
			 */
			cp_snapshot_forget();
			ereport(ERROR,
					(errcode(MAKE_SQLSTATE('5', '5', 'F', '0', '7')),
					 errmsg("the control-plane store is older than what node \"%s\" has seen of it: it is at revision " INT64_FORMAT ", and the node saw revision " INT64_FORMAT,
							a->node, snap.revision, a->seen_revision),
					 errdetail("The store %s was put back from an older copy (a backup, or a standby that was behind); serving it would hand out generations and leases that were handed out already.",
							   snap.store_id),
					 errhint("Bring back the store's latest state: its synchronous standby, or the etcd members' data.  If that is lost for good, see \"The control-plane store went back in time\" in docs/operations.md.")));
		}
		check_identity(a, &snap, prev, masked);
		if (void_reports_ahead(a, &snap, prev))
		{
			/* a batch is no attempt, as long as batches make way */
			if (batches++ <= snap.nreports / CP_VOIDS_PER_TXN)
				attempt--;
			continue;
		}

		cmps = palloc0(sizeof(FelixStoreCmp) * (room + 3));
		ops = palloc0(sizeof(FelixStoreOp) * (room + 3));
		granted = palloc0(sizeof(bool) * (snap.nshards + 1));

		memset(&me, 0, sizeof(me));
		me.name = pstrdup(a->node);
		me.conninfo = masked;
		me.incarnation = pstrdup(a->incarnation);
		me.starts = a->starts;
		me.boot = pstrdup(a->boot);
		me.beat = (prev && strcmp(prev->boot, a->boot) == 0) ? prev->beat + 1 : 1;
		if (prev && strcmp(prev->boot, a->boot) != 0 && took_current(&snap, prev->boot))
		{
			/*
			 * The boot that ended took a generation still current, and will
			 * never claim it again: a duty holder that did not see its
			 * claims bounds the last of them by its last heartbeat count
			 * (shard_seen in cp_duty.c).
			 */
			me.prev_boot = prev->boot;
			me.prev_beat = prev->beat;
		}
		else if (prev)
		{
			me.prev_boot = prev->prev_boot;
			me.prev_beat = prev->prev_beat;
		}
		me.registered_ms = prev ? prev->registered_ms : cp_now_ms();
		me.heartbeat_ms = cp_now_ms();
		me.peers = a->peers ? pstrdup(a->peers) : (prev ? prev->peers : pstrdup("{}"));
		if (a->unable_given)
		{
			me.nunable = a->nunable;
			me.unable = a->unable;
		}
		else if (prev)
		{
			me.nunable = prev->nunable;
			me.unable = prev->unable;
		}
		/*
		 * A log end is good for the boot that gave it only.  ends_beat
		 * counts the heartbeats that gave ends: only the node's heartbeat
		 * worker reads them, one heartbeat after another, so the duty
		 * holder can tell from it when they were read (ends_read_after in
		 * cp_duty.c).  Heartbeats made by backends give none.
		 */
		if (a->ends_given)
		{
			me.nends = a->nends;
			me.ends = a->ends;
			me.ends_beat = (prev && strcmp(prev->boot, a->boot) == 0) ? prev->ends_beat + 1 : 1;
		}
		else if (ends_unchanged_holds(a, prev))
		{
			/* read again by the worker, and what it gave last time */
			me.nends = prev->nends;
			me.ends = prev->ends;
			me.ends_beat = prev->ends_beat + 1;
		}
		else if (prev && strcmp(prev->boot, a->boot) == 0)
		{
			me.nends = prev->nends;
			me.ends = prev->ends;
			me.ends_beat = prev->ends_beat;
		}
		led = cp_snapshot_led_by(&snap, a->node, &nled);
		me.claims = palloc0(sizeof(CpClaim) * (nled + 1));

		cmps[ncmps].key = cp_key_node(a->node);
		cmps[ncmps++].mod_revision = prev ? prev->rev : 0;
		cmps[ncmps].key = cp_key_leads(a->node);
		cmps[ncmps++].mod_revision = cp_snapshot_leads_rev(&snap, a->node);

		if (new_incarnation(a, prev))
		{
			/* a new data directory holds nothing the old one did */
			(void) void_reports(&snap, a->node, true, PG_INT32_MAX, cmps, &ncmps, ops, &nops);
			ereport(LOG,
					(errmsg("felix: node \"%s\" has a new felix data directory (incarnation %s replaces %s); it is an empty replica of every shard",
							a->node, a->incarnation, prev->incarnation)));
		}
		else if (new_boot(a, prev))
		{
			/*
			 * Started again: what it holds is its leaders' to confirm anew (a
			 * copy restored and started more often than the original escapes
			 * the count above), so it is not promotable until they have.
			 */
			(void) void_reports(&snap, a->node, false, PG_INT32_MAX, cmps, &ncmps, ops, &nops);
		}

		rewrites = nops;		/* the reports voided */
		for (int k = 0; k < nled; k++)
		{
			int			i = led[k];
			CpShard    *s = &snap.shards[i];
			CpShard		taken;
			CpClaim    *c;

			if (cp_snapshot_stream_at(&snap, i) == NULL)
				continue;
			/* only the incarnation granted, and only while it can serve it */
			if (s->leader_incarnation == NULL ||
				strcmp(s->leader_incarnation, a->incarnation) != 0 ||
				cp_node_unable(&me, s->stream, s->shard))
				continue;
			if (s->taken_generation == s->generation)
			{
				/* a generation resumes only in the boot that took it */
				if (s->taken_boot == NULL || strcmp(s->taken_boot, a->boot) != 0)
					continue;
				if (s->unplaced_reason != NULL && rewrites < CP_MAX_REWRITES_PER_BEAT)
				{
					rewrites++;
					taken = *s;
					taken.unplaced_reason = NULL;
					cmps[ncmps].key = cp_key_shard(s->stream, s->shard);
					cmps[ncmps++].mod_revision = s->rev;
					ops[nops].key = cmps[ncmps - 1].key;
					ops[nops++].value = cp_shard_write(&taken);
				}
			}
			else
			{
				int64		need = Max(s->acked_floor, s->grant_end);

				/* the first claim of a fresh generation takes it */
				if (rewrites >= CP_MAX_REWRITES_PER_BEAT)
					continue;

				/*
				 * ... with a log, as this boot gave it, that holds the
				 * acknowledged floor the grant was based on, and is no
				 * shorter than the grantee's log was at the grant.  The
				 * grant compared the log of an earlier heartbeat: a felix
				 * directory put back from an older copy since then must
				 * not take the generation.  The floor alone can trail
				 * what was acknowledged (marks move between reports), so
				 * the end at the grant is compared too (docs/formal,
				 * finding 6d).  Unclaimed, the grant lapses and the duty
				 * holder looks again.
				 */
				if (need > 0 && cp_node_end(&me, s->stream, s->shard) < need)
					continue;
				if (!holds_granted_generation(&me, s))
					continue;
				rewrites++;
				taken = *s;
				taken.taken_generation = s->generation;
				taken.taken_boot = pstrdup(a->boot);
				note_taken_copies(&snap, &me, &taken);
				taken.unplaced_reason = NULL;
				cmps[ncmps].key = cp_key_shard(s->stream, s->shard);
				cmps[ncmps++].mod_revision = s->rev;
				ops[nops].key = cmps[ncmps - 1].key;
				ops[nops++].value = cp_shard_write(&taken);
				s->taken_generation = taken.taken_generation;
				s->taken_boot = taken.taken_boot;
				s->unplaced_reason = NULL;
			}
			s->unplaced_reason = NULL;
			c = &me.claims[me.nclaims++];
			c->stream = s->stream;
			c->shard = s->shard;
			c->generation = s->generation;
			c->lease_ms = a->lease_ms;
			granted[i] = true;
		}

		ops[nops].key = cp_key_node(a->node);
		ops[nops++].value = cp_node_write(&me);
		if (prev == NULL || strcmp(prev->conninfo, me.conninfo) != 0)
		{
			/* the addresses in every node's assignments change */
			ops[nops].key = CP_KEY_ADDRESSES;
			ops[nops++].value = cp_leads_value();
		}

		/*
		 * Ends and claims have keys of their own, written only when they
		 * change: the node's record, written at every heartbeat, stays
		 * small, and so does what every reader of the state reads again.
		 * Their values at commit are this heartbeat's, as they were read
		 * and compared or written here; and only this node's heartbeats
		 * write them, each comparing the node's record.  So the lease
		 * rule above holds of claims/<node> as it did of claims in the
		 * record: a write of the record renews what claims/<node> holds.
		 */
		if (prev == NULL || prev->ends_rev == 0 || strcmp(prev->boot, a->boot) != 0 ||
			(a->ends_given && !cp_ends_equal(me.ends, me.nends, prev->ends, prev->nends)))
		{
			/* a new boot's ends are none until it gives some */
			cmps[ncmps].key = cp_key_ends(a->node);
			cmps[ncmps++].mod_revision = prev ? prev->ends_rev : 0;
			ops[nops].key = cmps[ncmps - 1].key;
			ops[nops++].value = cp_ends_write(a->boot, me.ends, me.nends);
		}
		cmps[ncmps].key = cp_key_claims(a->node);
		cmps[ncmps++].mod_revision = prev ? prev->claims_rev : 0;
		claims_same = prev != NULL && prev->claims_rev != 0 &&
			cp_claims_equal(me.claims, me.nclaims, prev->claims, prev->nclaims);
		if (!claims_same)
		{
			ops[nops].key = cmps[ncmps - 1].key;
			ops[nops++].value = cp_claims_write(me.claims, me.nclaims);
		}
		if (snap.store_id == NULL)
		{
			/* the store's identity, made by the first heartbeat it serves */
			snap.store_id = cp_new_uuid();
			cmps[ncmps].key = CP_KEY_STORE_ID;
			cmps[ncmps++].mod_revision = 0;
			ops[nops].key = CP_KEY_STORE_ID;
			ops[nops++].value = cp_store_id_write(snap.store_id);
		}

		st = felix_store_txn(cmps, ncmps, ops, nops, &rev, ERROR);
		if (st == FELIX_STORE_CONFLICT)
		{
			/* someone wrote meanwhile: read again */
			cp_backoff(attempt);
			continue;
		}
		if (st != FELIX_STORE_OK)
			unconfirmed(a->node);

		out->store_id = snap.store_id;
		out->revision = rev;
		out->state_revision = snap.revision;
		/* a node whose unchanged ends were not taken gives them next time */
		out->full = full_answer(a, &snap, prev) ||
			(a->ends_unchanged && !ends_unchanged_holds(a, prev));
		out->n = 0;
		out->snap = palloc(sizeof(CpSnapshot));
		*out->snap = snap;
		answer = answered_shards(a, &snap, prev, out->full, claims_same, granted, led, nled);
		out->rows = palloc0(sizeof(CpAssignment) * (snap.nshards + 1));
		for (int i = 0; i < snap.nshards; i++)
		{
			CpShard    *s = &snap.shards[i];
			CpStream   *st2;
			CpNode	   *leader;
			CpAssignment *r;

			if (!answer[i] || (st2 = cp_snapshot_stream_at(&snap, i)) == NULL)
				continue;
			leader = cp_snapshot_node(&snap, s->leader);
			r = &out->rows[out->n++];
			r->shard = s;
			r->stream = st2;
			r->leader_conninfo = leader ? leader->conninfo : NULL;
			r->lease_granted = granted[i];
			r->lease_ms = a->lease_ms;
		}
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("node \"%s\": the heartbeat lost to other control-plane writers %d times in a row",
					a->node, CP_MAX_ATTEMPTS),
			 errhint("The next heartbeat tries again.")));
}

void
cp_name_clash(const char *node, const char *incarnation, const char *conninfo)
{
	CpSnapshot	snap;
	CpNode	   *holder;
	CpClash		c;
	FelixStoreOp op;
	int64		rev;

	cp_check_node_name(node);
	if (incarnation == NULL || !cp_is_uuid(incarnation) || conninfo == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\": a name clash names the refused server's incarnation and address", node),
				 errhint("This is felix's internal protocol; node and control plane may run different felix versions.")));
	cp_serialize();
	(void) cp_snapshot_read(&snap, false, ERROR);
	holder = cp_snapshot_node(&snap, node);
	if (holder == NULL || strcmp(holder->incarnation, incarnation) == 0 ||
		!snap.have_alive || !cp_alive_has(&snap.alive, node))
		return;
	c.node = (char *) node;
	c.incarnation = (char *) incarnation;
	c.conninfo = felix_conninfo_mask(felix_conninfo_address(conninfo));
	c.at_ms = cp_now_ms();
	op.key = cp_key_clash(node);
	op.value = cp_clash_write(&c);
	(void) felix_store_txn(NULL, 0, &op, 1, &rev, ERROR);
}
