/*-------------------------------------------------------------------------
 *
 * operations.c
 *	  What an operator runs on a cluster:
 *	  - rebuilding halted followers (felix_rebuild, felix_rebuild_halted,
 *		schedulable with pg_cron) and the halted listing (felix_halted).  A
 *		rebuild is the ship worker's, under felix.rebuild_max_concurrent
 *		(replication/ship.c): the call only asks for it;
 *	  - planned moves.  felix_transfer_leadership, on the shard's leader:
 *		admit nothing more (lease_hand_off_begin), wait until the target
 *		holds every record written and every waiting write is acknowledged,
 *		give the lease up (lease_hand_off_release: nothing more is written
 *		at this generation), ask the control plane to grant the next
 *		generation to the target at once (felix.cp_transfer -- safe
 *		without waiting out a lease, because this leader has already
 *		stopped), and wake the target's heartbeat so it takes its lease now.
 *		A failure before the grant gives the leadership back.
 *		felix_drain_node moves every leadership off this node that way.
 *		felix_move_replica asks the control plane to replace one replica of
 *		a shard by another node: the new one is shipped the log (a
 *		bootstrap if retention trimmed it) and counted in the quorum
 *		alongside the old set until it is caught up, then the old one
 *		leaves (felix.cp_move_replica, cp_report).
 *
 *	  Who may: the owner of a stream's table (or a superuser) may rebuild
 *	  its followers and move its shards; draining a node moves every
 *	  stream's shards and is a superuser's.  felix_halted shows each reader
 *	  the streams it may SELECT, like the other views.
 *
 * Locking rule: reads shard state through shard_read and follower state
 * under its entry's spinlock (state.h); holds nothing across a wait, and
 * waits on its latch with a deadline.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "core/catalog.h"
#include "control/conninfo.h"
#include "control/client.h"
#include "control/cpcall.h"
#include "control/halts.h"
#include "control/nodes.h"
#include "base/metrics.h"
#include "base/wake.h"
#include "felix.h"
#include "base/isolate.h"
#include "base/privilege.h"
#include "replication/lease.h"
#include "replication/quorum.h"
#include "replication/state.h"
#include "storage/shard.h"

/* How long felix_rebuild waits to see its rebuild begin. */
#define REBUILD_START_WAIT_MS	2000
/* How long a transfer waits for this node to hear of the new leader. */
#define TRANSFER_TAKE_WAIT_MS	5000

/* The shard, which must be led here; else 55F02 naming its leader. */
static FelixShard *
led_here(const FelixStream *stream, int shard, FelixShardView *v, const char *action)
{
	FelixShard *s = felix_stream_shard(stream, shard);

	shard_read(s, v);
	if (v->role != FELIX_ROLE_LEADER)
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_NOT_LEADER),
				 errmsg("stream \"%s\" shard %d is not led by this node, and only its leader can %s",
						stream->name, shard, action),
				 v->leader[0] ?
				 errhint("Run it on node \"%s\" (%s), which leads the shard.",
						 v->leader, felix_conninfo_mask(v->leader_conninfo)) :
				 errhint("felix_shards shows the shard's leader once it has one.")));
	return s;
}

/* The follower's state right now, or false if it is not one of the shard's. */
static bool
follower_state(int slot, uint64 generation, const char *node, FelixFollower *out)
{
	FelixReplShard *e = palloc(sizeof(FelixReplShard));
	bool		found = false;

	repl_state_copy(slot, e);
	if (e->valid && e->generation == generation)
		for (int i = 0; i < e->nfollowers; i++)
			if (strcmp(e->followers[i].name, node) == 0)
			{
				*out = e->followers[i];
				found = true;
			}
	pfree(e);
	return found;
}

PG_FUNCTION_INFO_V1(felix_rebuild);
Datum
felix_rebuild(PG_FUNCTION_ARGS)
{
	FelixStream stream;
	int32		shard;
	char	   *node;
	FelixShard *s;
	FelixShardView v;
	FelixFollower f;
	FelixHalt	halt;
	TimestampTz deadline;

	felix_require_preload();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix_rebuild: stream, shard and node must not be NULL"),
				 errhint("felix_halted lists the halted followers and what to run for each.")));
	stream = *felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	shard = PG_GETARG_INT32(1);
	node = text_to_cstring(PG_GETARG_TEXT_PP(2));
	felix_check_shard(&stream, shard);
	felix_check_stream_owner(stream.relid, stream.name, "rebuild a follower of");
	s = led_here(&stream, shard, &v, "rebuild its followers");

	if (!follower_state(shard_slot_index(s), v.generation, node, &f))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" shard %d has no follower \"%s\" at generation " UINT64_FORMAT,
						stream.name, shard, node, v.generation),
				 errhint("felix_replication lists the shard's followers on this node.")));
	halt = repl_request_rebuild(shard_slot_index(s), v.generation, node);
	if (halt == FELIX_HALT_NONE || halt == FELIX_HALT_FENCED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("follower \"%s\" of stream \"%s\" shard %d is not halted for a reason a rebuild repairs (it is %s)",
						node, stream.name, shard,
						f.state == FELIX_FOLLOWER_HALTED ? psprintf("halted %s", felix_halt_name(f.halt)) :
						felix_follower_state_name(f.state)),
				 errhint("Only a follower halted diverged, needs_bootstrap or protocol is rebuilt; felix_halted lists them.")));

	/* Wait a little to say whether it began or waits for a free slot. */
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), REBUILD_START_WAIT_MS);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (!follower_state(shard_slot_index(s), v.generation, node, &f))
			PG_RETURN_TEXT_P(cstring_to_text("abandoned: the shard's leadership moved"));
		if (f.state != FELIX_FOLLOWER_HALTED)
			PG_RETURN_TEXT_P(cstring_to_text("started"));
		if (GetCurrentTimestamp() >= deadline)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 20, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	PG_RETURN_TEXT_P(cstring_to_text(f.rebuild_requested ?
									 "queued: it begins when a rebuild slot is free (felix.rebuild_max_concurrent)" :
									 "not started"));
}

PG_FUNCTION_INFO_V1(felix_rebuild_halted);
Datum
felix_rebuild_halted(PG_FUNCTION_ARGS)
{
	FelixReplShard *e = palloc(sizeof(FelixReplShard));
	int			nslots;
	int32		asked = 0;

	felix_require_preload();
	nslots = shard_count_slots();
	for (int slot = 0; slot < nslots; slot++)
	{
		FelixShardView v;
		const FelixStream *stream;

		repl_state_copy(slot, e);
		if (!e->valid || e->key.dboid != MyDatabaseId)
			continue;
		shard_read(shard_slot(slot), &v);
		if (!v.in_use || v.role != FELIX_ROLE_LEADER || v.generation != e->generation)
			continue;
		/* only the streams the caller could rebuild one by one */
		stream = felix_stream_by_relid(e->key.relid);
		if (stream == NULL ||
			(!superuser() && felix_relation_owner(stream->relid) != GetUserId()))
			continue;
		for (int i = 0; i < e->nfollowers; i++)
		{
			FelixFollower *f = &e->followers[i];

			if (f->state == FELIX_FOLLOWER_HALTED && !f->rebuild_requested &&
				(f->halt == FELIX_HALT_DIVERGED || f->halt == FELIX_HALT_NEEDS_BOOTSTRAP) &&
				repl_request_rebuild(slot, e->generation, f->name) != FELIX_HALT_NONE)
				asked++;
		}
	}
	pfree(e);
	PG_RETURN_INT32(asked);
}

/* What to run about a halt, for felix_halted.action. */
static char *
halt_action(const FelixHaltInfo *h)
{
	char	   *call = psprintf("SELECT felix_rebuild(%s, %d, %s)",
								quote_literal_cstr(h->stream), h->shard,
								quote_literal_cstr(h->node));

	if (strcmp(h->reason, "diverged") == 0 || strcmp(h->reason, "needs_bootstrap") == 0)
		return psprintf("rebuilt by its leader \"%s\" when a rebuild slot is free (felix.rebuild_max_concurrent there); to rebuild it now run on \"%s\": %s",
						h->leader, h->leader, call);
	if (strcmp(h->reason, "protocol") == 0)
		return psprintf("check felix's version and log on \"%s\", then run on \"%s\": %s",
						h->node, h->leader, call);
	if (strcmp(h->reason, "fenced") == 0)
		return psprintf("none: \"%s\" no longer leads the shard, and the next heartbeat moves it to its new leader",
						h->leader);
	return pstrdup("see the log of the shard's leader");
}

PG_FUNCTION_INFO_V1(felix_halted_view);
Datum
felix_halted_view(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	FelixHaltInfo *halts;
	int			n;

	felix_require_preload();
	InitMaterializedSRF(fcinfo, 0);
	n = felix_halts_list(&halts);
	for (int i = 0; i < n; i++)
	{
		FelixHaltInfo *h = &halts[i];
		const FelixStream *stream = felix_stream_lookup_name(h->stream);
		Datum		values[8];
		bool		nulls[8] = {0};

		if (stream == NULL || !felix_sees_stream(stream->relid))
			continue;
		values[0] = CStringGetTextDatum(h->stream);
		values[1] = Int32GetDatum(h->shard);
		values[2] = CStringGetTextDatum(h->node);
		values[3] = Int64GetDatum((int64) h->generation);
		if (h->has_position)
			values[4] = Int64GetDatum((int64) h->position);
		else
			nulls[4] = true;
		values[5] = CStringGetTextDatum(h->reason);
		if (h->since != 0)
			values[6] = TimestampTzGetDatum(h->since);
		else
			nulls[6] = true;
		values[7] = CStringGetTextDatum(halt_action(h));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * Hand shard `shard` of `stream`, led here, to `target`; returns the
 * generation the target leads.  The caller checked privileges.
 */
static uint64
transfer_one(const FelixStream *stream, int shard, const char *target)
{
	FelixShardView v;
	FelixShard *s = led_here(stream, shard, &v, "hand its leadership over");
	FelixFollower f;
	uint64		generation;
	uint64		written_end;
	volatile uint64 next = 0;
	TimestampTz deadline;
	MemoryContext cxt = CurrentMemoryContext;
	FelixCpSession cp;
	PGconn	   *volatile peer = NULL;

	if (felix_is_this_node(target))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d is already led by node \"%s\"",
						stream->name, shard, target),
				 errhint("Name another member of the shard's replica set.")));
	if (v.replication_factor <= 1 ||
		!follower_state(shard_slot_index(s), v.generation, target, &f))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\" is not a follower of stream \"%s\" shard %d",
						target, stream->name, shard),
				 errhint("felix_replication on this node lists the shard's followers.")));
	if (f.state != FELIX_FOLLOWER_SHIPPING)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("follower \"%s\" of stream \"%s\" shard %d is %s and cannot take the shard over",
						target, stream->name, shard,
						f.state == FELIX_FOLLOWER_HALTED ? psprintf("halted %s", felix_halt_name(f.halt)) :
						felix_follower_state_name(f.state)),
				 errhint("felix_replication shows its state; pick a follower that is shipping.")));

	/*
	 * 0. the connections the hand-over needs, made before anything stops:
	 * their setup is not part of the time writes are refused
	 */
	(void) felix_cp_open(&cp, "felix", FELIX_CP_CALL_TIMEOUT_MS, ERROR);
	peer = felix_node_connect(target, "felix transfer", 1000);

	/* 1. admit nothing more; every write admitted so far has its seqs */
	PG_TRY();
	{
		generation = lease_hand_off_begin(s, target, &written_end);
	}
	PG_CATCH();
	{
		felix_conn_close(peer);
		felix_cp_close(&cp);
		PG_RE_THROW();
	}
	PG_END_TRY();
	PG_TRY();
	{
		/*
		 * 2. the target holds everything written, and every write admitted
		 * before has been acknowledged (its waiter released at this
		 * generation), within felix.quorum_timeout
		 */
		deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), felix_quorum_timeout);
		for (;;)
		{
			FelixShardView now;

			felix_wake(FELIX_WORKER_SHIP);
			shard_read(s, &now);
			if (now.role != FELIX_ROLE_LEADER || now.generation != generation)
				ereport(ERROR,
						(errcode(FELIX_ERRCODE_NOT_LEADER),
						 errmsg("stream \"%s\" shard %d: this node stopped leading generation " UINT64_FORMAT " during the transfer",
								stream->name, shard, generation),
						 errhint("felix_shards shows the shard's leader now.")));
			if (!follower_state(shard_slot_index(s), generation, target, &f) ||
				f.state != FELIX_FOLLOWER_SHIPPING)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("stream \"%s\" shard %d: follower \"%s\" stopped shipping during the transfer",
								stream->name, shard, target),
						 errhint("felix_replication shows why; the shard stays led here.")));
			/*
			 * Every write admitted is acknowledged: on a quorum shard, the
			 * mark passed it at this generation -- or it lies below a mark
			 * this leadership inherited and has not moved since (an idle
			 * shard: a new stream, or any shard after a failover).  A
			 * record admitted at this generation lies at or past the log's
			 * end when the generation began, so it is below the mark only
			 * once this generation moved the mark past it.
			 */
			if (f.answered && f.acked_end >= written_end &&
				(quorum_acks_on_flush(now.consistency, now.replication_factor) ?
				 now.flushed_end >= written_end :
				 ((now.acked_generation == generation && now.acked_end >= written_end) ||
				  now.hwm_end >= written_end)))
				break;
			if (GetCurrentTimestamp() >= deadline)
				ereport(ERROR,
						(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
						 errmsg("stream \"%s\" shard %d: node \"%s\" did not catch up within felix.quorum_timeout (%d ms)",
								stream->name, shard, target, felix_quorum_timeout),
						 errdetail("It holds seqs below " UINT64_FORMAT "; the log ends at " UINT64_FORMAT ".",
								   f.acked_end, written_end),
						 errhint("The shard stays led here; try again, or pick another follower.")));
			felix_nap(1);
		}

		/* 3. stop writing at this generation, then 4. hand the next one over */
		lease_hand_off_release(s, generation);
		next = felix_cp_transfer(&cp, stream->name, shard, generation, target);

		/* 5. the target takes its lease now, not at its next interval (a failure only delays it one) */
		felix_node_wake_heartbeat(peer, 1000);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		felix_conn_close(peer);
		felix_cp_close(&cp);
		/* not granted: lead on (the next heartbeat renews a released lease) */
		if (next == 0)
			lease_hand_off_cancel(s);
		felix_wake(FELIX_WORKER_HEARTBEAT);
		PG_RE_THROW();
	}
	PG_END_TRY();
	felix_conn_close(peer);
	felix_cp_close(&cp);
	felix_wake(FELIX_WORKER_HEARTBEAT);
	felix_count(FELIX_CTR_PLANNED_MOVES, 1);
	ereport(LOG,
			(errmsg("stream \"%s\" shard %d: leadership handed to node \"%s\" at generation " UINT64_FORMAT,
					stream->name, shard, target, next)));

	/* return once this node has heard it, so what the caller reads next agrees */
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), TRANSFER_TAKE_WAIT_MS);
	for (;;)
	{
		FelixShardView now;

		shard_read(s, &now);
		if (now.generation >= next || GetCurrentTimestamp() >= deadline)
			break;
		felix_nap(5);
	}
	return next;
}

PG_FUNCTION_INFO_V1(felix_transfer_leadership);
Datum
felix_transfer_leadership(PG_FUNCTION_ARGS)
{
	FelixStream stream;
	int32		shard;
	char	   *target;
	uint64		next;

	felix_require_preload();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix_transfer_leadership: stream, shard and node must not be NULL"),
				 errhint("Name the stream, the shard and the follower that is to lead it.")));
	stream = *felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	shard = PG_GETARG_INT32(1);
	target = text_to_cstring(PG_GETARG_TEXT_PP(2));
	felix_check_shard(&stream, shard);
	felix_check_stream_owner(stream.relid, stream.name, "move the leadership of");
	next = transfer_one(&stream, shard, target);
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("node \"%s\" leads generation " UINT64_FORMAT,
											  target, next)));
}

/* The follower of the shard in `slot` best placed to lead it, or NULL. */
static char *
best_successor(int slot, uint64 generation)
{
	FelixReplShard *e = palloc(sizeof(FelixReplShard));
	char	   *best = NULL;
	uint64		best_end = 0;

	repl_state_copy(slot, e);
	if (e->valid && e->generation == generation)
		for (int i = 0; i < e->nfollowers; i++)
		{
			FelixFollower *f = &e->followers[i];

			if (f->state == FELIX_FOLLOWER_SHIPPING && f->answered &&
				(best == NULL || f->acked_end > best_end))
			{
				best = pstrdup(f->name);
				best_end = f->acked_end;
			}
		}
	pfree(e);
	return best;
}

typedef struct DrainArg
{
	const FelixStream *stream;
	int			shard;
	const char *target;
} DrainArg;

static void
drain_guts(void *varg)
{
	DrainArg   *a = (DrainArg *) varg;

	(void) transfer_one(a->stream, a->shard, a->target);
}

/* One shard of a drain, in a subtransaction: a failure is a WARNING. */
static bool
drain_one(const FelixStream *stream, int shard, const char *target)
{
	DrainArg	a = {stream, shard, target};
	ErrorData  *edata = felix_run_isolated(drain_guts, &a);

	if (edata == NULL)
		return true;
	ereport(WARNING,
			(errmsg("stream \"%s\" shard %d stays led here: %s", stream->name, shard,
					edata->message),
			 edata->hint ? errhint("%s", edata->hint) : 0));
	FreeErrorData(edata);
	return false;
}

PG_FUNCTION_INFO_V1(felix_drain_node);
Datum
felix_drain_node(PG_FUNCTION_ARGS)
{
	char	   *node;
	int			nslots;
	volatile int32 moved = 0;
	volatile int failed = 0;

	felix_require_preload();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix_drain_node: node must not be NULL"),
				 errhint("Name the node to move every leadership off.")));
	node = text_to_cstring(PG_GETARG_TEXT_PP(0));
	felix_require_superuser("felix_drain_node");
	if (!felix_is_this_node(node))
	{
		char		address[FELIX_NODE_CONNINFO_LEN];

		(void) felix_node_conninfo_of(node, address, sizeof(address));
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("felix_drain_node must run on the node it drains; this is node \"%s\", not \"%s\"",
						felix_node_name_resolved(), node),
				 address[0] ? errhint("Run it on node \"%s\" (%s).", node, felix_conninfo_mask(address)) :
				 errhint("Run it on node \"%s\"; felix_nodes lists the nodes.", node)));
	}

	nslots = shard_count_slots();
	for (int slot = 0; slot < nslots; slot++)
	{
		FelixShardView v;
		const FelixStream *found;
		FelixStream stream;
		char	   *target;

		shard_read(shard_slot(slot), &v);
		if (!v.in_use || v.key.dboid != MyDatabaseId || v.role != FELIX_ROLE_LEADER)
			continue;
		found = felix_stream_by_relid(v.key.relid);
		if (found == NULL)
			continue;
		stream = *found;
		if (v.replication_factor <= 1)
		{
			ereport(NOTICE,
					(errmsg("stream \"%s\" shard %d stays on node \"%s\": it has no other copy",
							stream.name, v.key.shard, node),
					 errhint("With replication_factor 1 its only copy is here: there is no follower to hand it to.")));
			failed++;
			continue;
		}
		target = best_successor(slot, v.generation);
		if (target == NULL)
		{
			ereport(WARNING,
					(errmsg("stream \"%s\" shard %d stays led here: no follower is shipping",
							stream.name, v.key.shard),
					 errhint("felix_replication shows its followers; run felix_drain_node again once one is.")));
			failed++;
			continue;
		}
		if (drain_one(&stream, v.key.shard, target))
			moved++;
		else
			failed++;
	}
	if (failed > 0)
		ereport(NOTICE,
				(errmsg("%d shard%s still led by node \"%s\"", failed, failed == 1 ? " is" : "s are", node),
				 errhint("Run felix_drain_node again once their followers are shipping.")));
	PG_RETURN_INT32(moved);
}

PG_FUNCTION_INFO_V1(felix_move_replica);
Datum
felix_move_replica(PG_FUNCTION_ARGS)
{
	FelixStream stream;
	int32		shard;
	char	   *from_node;
	char	   *to_node;
	char	   *replicas;

	felix_require_preload();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix_move_replica: stream, shard, from_node and to_node must not be NULL"),
				 errhint("Name the replica that goes and the node that replaces it.")));
	stream = *felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	shard = PG_GETARG_INT32(1);
	from_node = text_to_cstring(PG_GETARG_TEXT_PP(2));
	to_node = text_to_cstring(PG_GETARG_TEXT_PP(3));
	felix_check_shard(&stream, shard);
	felix_check_stream_owner(stream.relid, stream.name, "move a replica of");
	replicas = felix_cp_move_replica(stream.name, shard, from_node, to_node);
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("node \"%s\" joins (replica set %s); node \"%s\" leaves once \"%s\" has caught up",
											  to_node, replicas, from_node, to_node)));
}

/*
 * felix_remove_node(node): forget a node for good (a dead machine that will
 * not return).  Superusers only; the control plane refuses while the node
 * is alive or still holds a replica (move its replicas first).
 */
PG_FUNCTION_INFO_V1(felix_remove_node);
Datum
felix_remove_node(PG_FUNCTION_ARGS)
{
	char	   *node;

	felix_require_preload();
	felix_require_superuser("felix_remove_node");
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix_remove_node: node must not be NULL"),
				 errhint("Name the node to forget; felix_nodes lists them.")));
	node = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (felix_is_this_node(node))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\" is this node", node),
				 errhint("Run felix_remove_node on another node of the cluster, once this one is stopped for good.")));
	felix_cp_remove_node(node);
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("node \"%s\" removed", node)));
}

/*
 * felix_promote_copy(stream, shard, node): make the copy on node lead a
 * shard the control plane left unplaced, accepting that what only other
 * copies hold may be lost (a WARNING says what).  Superusers only; the
 * control plane refuses while an alive replica's copy may hold more
 * (cp_promote.c).
 */
PG_FUNCTION_INFO_V1(felix_promote_copy);
Datum
felix_promote_copy(PG_FUNCTION_ARGS)
{
	FelixStream stream;
	int32		shard;
	char	   *node;
	CpPromoted	p;

	felix_require_preload();
	felix_require_superuser("felix_promote_copy");
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("felix_promote_copy: stream, shard and node must not be NULL"),
				 errhint("Name the unplaced shard (felix_shards.unplaced_reason) and the node whose copy is to lead it.")));
	stream = *felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	shard = PG_GETARG_INT32(1);
	node = text_to_cstring(PG_GETARG_TEXT_PP(2));
	felix_check_shard(&stream, shard);
	p = felix_cp_promote_copy(stream.name, shard, node);
	if (p.may_lose)
		ereport(WARNING,
				(errmsg("stream \"%s\" shard %d: records may be lost by promoting the copy on node \"%s\"",
						stream.name, shard, node),
				 errdetail("What may be lost: %s.", p.may_lose),
				 errhint("Those records can no longer be read from the stream; a copy that held them is rebuilt from the new leader when it returns.")));
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("node \"%s\" leads generation " INT64_FORMAT " of stream \"%s\" shard %d from its copy ending at seq " INT64_FORMAT,
											  node, p.generation, stream.name, shard, p.copy_end)));
}
