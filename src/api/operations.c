/*-------------------------------------------------------------------------
 *
 * operations.c
 *	  What an operator runs on a cluster: rebuilding halted followers
 *	  (felix_rebuild, felix_rebuild_halted, schedulable with pg_cron) and
 *	  the halted listing itself (felix_halted).  Each acts on this node's
 *	  own state and asks the worker that owns the work to do it: a rebuild
 *	  is the ship worker's, under felix.rebuild_max_concurrent (replication
 *	  /ship.c), so a call never blocks on the network.
 *
 *	  Who may: the owner of a stream's table (or a superuser) may rebuild
 *	  its followers; felix_halted shows each reader the streams it may
 *	  SELECT, like the other views.
 *
 * Locking rule: reads shard state through shard_read and follower state
 * under its entry's spinlock (state.h); holds nothing across a wait.
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

#include "api/catalog.h"
#include "control/conninfo.h"
#include "control/halts.h"
#include "felix.h"
#include "privilege.h"
#include "replication/lease.h"
#include "replication/state.h"
#include "storage/shard.h"

/* How long felix_rebuild waits to see its rebuild begin. */
#define REBUILD_START_WAIT_MS	2000

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
