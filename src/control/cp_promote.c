/*-------------------------------------------------------------------------
 *
 * cp_promote.c
 *	  An operator's promotion of a chosen copy of an unplaced shard
 *	  (felix_promote_copy): the one grant the duty holder's rules do not
 *	  make, because it may lose acknowledged records.
 *
 *	  The duty holder leaves a shard unplaced when no copy is known to
 *	  hold every acknowledged record (cp_duty.c): its leader is gone or
 *	  disqualified, and no follower was reported caught up.  An operator
 *	  who knows better -- or accepts a loss -- names the copy to lead.  The
 *	  rule refuses while a copy that may hold more is alive (another
 *	  replica alive whose log ends later, or that has not said where its
 *	  log ends), and otherwise grants the next generation to the chosen
 *	  node and says what may be lost: acknowledged records beyond its
 *	  copy (the shard's acknowledged floor and its newest reports), and
 *	  whatever only a replica that is not alive holds.
 *
 *	  Safe against a leader still writing: a shard is unplaced only after
 *	  its lease lapsed (the holder wrote the reason comparing the leader's
 *	  record), and any claim since clears the reason (cp_heartbeat.c); the
 *	  grant compares the assignment with its reason as read.  The chosen
 *	  node's first claim checks again that its log reaches the grant's end.
 *
 * Locking rule: none; compare-and-set in the store.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/cp.h"
#include "felix.h"
#include "lib/stringinfo.h"

/* The largest acknowledged end the newest generation's reports give. */
static int64
reported_end(const CpSnapshot *snap, const CpShard *s)
{
	const CpReports *r = cp_snapshot_reports(snap, s->stream, s->shard);
	int64		newest = 0;
	int64		end = 0;

	for (int i = 0; r && i < r->n; i++)
		newest = Max(newest, r->rows[i].generation);
	for (int i = 0; r && i < r->n; i++)
		if (r->rows[i].generation == newest)
			end = Max(end, r->rows[i].acked_end);
	return end;
}

static bool
alive(const CpSnapshot *snap, const char *node)
{
	return snap->have_alive && cp_alive_has(&snap->alive, node);
}

static void refuse(const char *stream, int shard, const char *node, const char *detail,
				   const char *hint) pg_attribute_noreturn();

static void
refuse(const char *stream, int shard, const char *node, const char *detail, const char *hint)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("stream \"%s\" shard %d: the copy on node \"%s\" cannot be promoted",
					stream, shard, node),
			 errdetail_internal("%s", detail),
			 errhint("%s", hint)));
	pg_unreachable();
}

CpPromoted
cp_promote_copy(const char *stream, int shard, const char *node)
{
	for (int attempt = 0; attempt < CP_MAX_ATTEMPTS; attempt++)
	{
		CpSnapshot	snap;
		CpShard    *s;
		CpNode	   *n;
		CpNode	   *old;
		CpShard		next;
		CpPromoted	out;
		StringInfoData lose;
		FelixStoreCmp *cmps;
		FelixStoreOp ops[2];
		int			ncmps = 0;
		int64		end;
		int64		known;
		int64		rev;
		FelixStoreStatus rc;

		cp_snapshot_read_attempt(&snap, attempt);
		s = cp_snapshot_shard(&snap, stream, shard);
		if (s == NULL || cp_snapshot_stream(&snap, stream) == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("stream \"%s\" has no shard %d at the control plane", stream, shard),
					 errhint("felix.assignments lists every shard the control plane knows.")));
		if (s->unplaced_reason == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("stream \"%s\" shard %d is not unplaced: node \"%s\" leads generation " INT64_FORMAT,
							stream, shard, s->leader ? s->leader : "(none)", s->generation),
					 errhint("felix_promote_copy is for a shard the control plane left without a leader (felix_shards.unplaced_reason); felix_transfer_leadership moves a shard that is led.")));
		if (!cp_shard_has_replica(s, node))
		{
			StringInfoData set;

			initStringInfo(&set);
			for (int i = 0; i < s->nreplicas; i++)
				appendStringInfo(&set, "%s%s", i ? ", " : "", s->replicas[i]);
			refuse(stream, shard, node, "It is not in the shard's replica set.",
				   psprintf("Choose one of %s.", set.data));
		}
		n = cp_snapshot_node(&snap, node);
		if (n == NULL || !alive(&snap, node))
			refuse(stream, shard, node, "The node is not alive.",
				   "Start it, or choose an alive replica; felix_nodes shows which nodes are alive.");
		if (cp_node_unable(n, stream, shard))
			refuse(stream, shard, node, "The node reports that it cannot serve the shard.",
				   "Its server log says why; choose another replica.");
		end = cp_node_end(n, stream, shard);
		if (end < 0)
			refuse(stream, shard, node,
				   "Its heartbeats since it last started have not said where its copy ends.",
				   "Wait a few heartbeats and call again.");

		cmps = palloc0(sizeof(FelixStoreCmp) * (s->nreplicas + 3));
		cmps[ncmps].key = cp_key_shard(stream, shard);
		cmps[ncmps++].mod_revision = s->rev;
		cmps[ncmps].key = cp_key_node(node);
		cmps[ncmps++].mod_revision = n->rev;
		initStringInfo(&lose);

		/* a copy that may hold more, alive, wins: the operator must choose it */
		for (int i = 0; i < s->nreplicas; i++)
		{
			const char *r = s->replicas[i];
			CpNode	   *rn = cp_snapshot_node(&snap, r);
			int64		e;

			if (strcmp(r, node) == 0)
				continue;
			e = rn ? cp_node_end(rn, stream, shard) : -1;
			if (rn == NULL || !alive(&snap, r))
			{
				appendStringInfo(&lose, "%swhatever only node \"%s\" holds (it is not alive",
								 lose.len ? "; " : "", r);
				if (e > end)
					appendStringInfo(&lose, "; its copy ended at seq " INT64_FORMAT " when it was last heard from", e);
				appendStringInfoChar(&lose, ')');
				continue;
			}
			if (e < 0)
				refuse(stream, shard, node,
					   psprintf("Node \"%s\" is alive and has not said where its copy ends: it may hold more.", r),
						 "Wait a few heartbeats and call again.");
			if (e > end)
				refuse(stream, shard, node,
					   psprintf("Node \"%s\" is alive and its copy ends at seq " INT64_FORMAT ", after this one's (" INT64_FORMAT ").",
								r, e, end),
					   psprintf("Promote the copy on node \"%s\" instead.", r));
			cmps[ncmps].key = cp_key_node(r);
			cmps[ncmps++].mod_revision = rn->rev;
		}
		known = Max(s->acked_floor, reported_end(&snap, s));
		if (known > end)
			appendStringInfo(&lose, "%sthe acknowledged records from seq " INT64_FORMAT " to " INT64_FORMAT,
							 lose.len ? "; " : "", end, known - 1);

		next = *s;
		next.generation = s->generation + 1;
		next.leader = n->name;
		next.leader_incarnation = n->incarnation;
		next.unplaced_reason = NULL;
		next.assigned_ms = cp_now_ms();
		/*
		 * The copy's end becomes what every later leader must hold: the
		 * operator accepted that what lies beyond it is gone.
		 */
		next.grant_end = end;
		next.grant_last_generation = cp_node_last_generation(n, stream, shard);
		next.acked_floor = end;
		old = cp_snapshot_node(&snap, s->leader);
		if (s->leader && strcmp(s->leader, node) != 0)
		{
			cmps[ncmps].key = cp_key_node(s->leader);
			cmps[ncmps++].mod_revision = old ? old->rev : 0;
		}
		ops[0].key = cp_key_shard(stream, shard);
		ops[0].value = cp_shard_write(&next);
		ops[1].key = cp_key_leads(s->leader ? s->leader : node);
		ops[1].value = cp_leads_value();
		rc = felix_store_txn(cmps, ncmps, ops, 2, &rev, ERROR);
		if (rc == FELIX_STORE_CONFLICT)
			continue;			/* a heartbeat or a report came between: look again */
		if (rc != FELIX_STORE_OK)
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("stream \"%s\" shard %d: the control-plane store did not confirm the promotion of node \"%s\"",
							stream, shard, node),
					 errhint("Its outcome is unknown: felix_shards shows whether the shard has a leader.")));
		out.generation = next.generation;
		out.copy_end = end;
		out.may_lose = lose.len ? lose.data : NULL;
		ereport(LOG,
				(errmsg("felix: stream \"%s\" shard %d: an operator promoted the copy on node \"%s\" (ending at seq " INT64_FORMAT ") to lead generation " INT64_FORMAT,
						stream, shard, node, end, next.generation),
				 out.may_lose ? errdetail("What may be lost: %s.", out.may_lose) : 0));
		return out;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("stream \"%s\" shard %d: the promotion of node \"%s\" lost to other control-plane writers %d times in a row",
					stream, shard, node, CP_MAX_ATTEMPTS),
			 errhint("Nothing was changed; call again.")));
	pg_unreachable();
}
