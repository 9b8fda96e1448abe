/*-------------------------------------------------------------------------
 *
 * views.c
 *	  The functions behind felix_shards, felix_metrics and felix_nodes.
 *
 *	  The views are readable the way pg_stat_replication is: everyone sees
 *	  the streams they may SELECT, members of pg_read_all_stats see all
 *	  (privilege.c), and reading a view does nothing but read: no shard is
 *	  opened (the node worker opens every shard after a start, and a shard
 *	  not opened yet shows as 'closed') and no connection is made
 *	  (felix_nodes shows the node list the heartbeat worker keeps in shared
 *	  memory).
 *
 * Locking rule: reads the shard mirrors under each shard's spinlock; the
 * rows of one shard are consistent with each other, rows of different
 * shards may come from slightly different instants.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "core/catalog.h"
#include "control/conninfo.h"
#include "control/json.h"
#include "control/nodes.h"
#include "felix.h"
#include "base/metrics.h"
#include "base/privilege.h"
#include "replication/lease.h"
#include "replication/state.h"
#include "storage/incarnation.h"
#include "storage/shard.h"
#include "control/store_view.h"

static const char *
phase_name(FelixShardPhase phase)
{
	switch (phase)
	{
		case FELIX_SHARD_OPEN:
			return "open";
		case FELIX_SHARD_FAILED:
			return "failed";
		case FELIX_SHARD_CLOSED:
			break;
	}
	return "closed";
}

PG_FUNCTION_INFO_V1(felix_shard_states);
Datum
felix_shard_states(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *streams;
	ListCell   *lc;

	felix_require_preload();
	InitMaterializedSRF(fcinfo, 0);

	streams = felix_stream_list();
	foreach(lc, streams)
	{
		FelixStream copy = *(FelixStream *) lfirst(lc);

		if (!felix_sees_stream(copy.relid))
			continue;
		for (int sh = 0; sh < copy.shards; sh++)
		{
			Datum		values[14];
			bool		nulls[14] = {0};
			char	   *error = NULL;
			FelixShard *s;
			FelixShardKey key = {MyDatabaseId, copy.relid, sh};

			CHECK_FOR_INTERRUPTS();
			s = shard_lookup(&key);

			values[0] = CStringGetTextDatum(copy.name);
			values[1] = Int32GetDatum(sh);
			if (s == NULL)
			{
				for (int c = 2; c < 8; c++)
					nulls[c] = true;
				values[8] = CStringGetTextDatum("closed");
				for (int c = 10; c < 14; c++)
					nulls[c] = true;
			}
			else
			{
				FelixShardView v;
				FelixShardPhase phase;
				uint64		start, hwm;
				Datum		replicas[FELIX_MAX_REPLICAS];
				int64		expiry;

				shard_read(s, &v);
				phase = v.phase;
				start = v.start_seq;
				hwm = v.hwm_end;
				for (int i = 0; i < v.nreplicas; i++)
					replicas[i] = PointerGetDatum(cstring_to_text(v.replicas[i]));
				expiry = v.role == FELIX_ROLE_LEADER ? v.lease_expiry_ns : 0;

				if (phase == FELIX_SHARD_OPEN)
				{
					values[2] = CStringGetTextDatum(v.role == FELIX_ROLE_LEADER ? "leader" : "follower");
					values[3] = Int64GetDatum((int64) v.generation);
					values[4] = Int64GetDatum((int64) start);
					values[5] = Int64GetDatum((int64) v.written_end);
					/* hwm is the highest visible seq; none yet is NULL */
					if (hwm > start)
						values[6] = Int64GetDatum((int64) hwm - 1);
					else
						nulls[6] = true;
					values[7] = Int64GetDatum((int64) v.total_bytes);
				}
				else
				{
					for (int c = 2; c < 8; c++)
						nulls[c] = true;
				}
				values[8] = CStringGetTextDatum(phase_name(phase));
				if (phase == FELIX_SHARD_FAILED)
					error = pstrdup(v.error);
				else if (phase == FELIX_SHARD_OPEN && v.role == FELIX_ROLE_LEADER &&
						 felix_monotonic_ns() >= expiry)
					/* leader by the last word of the control plane, but unable to act on it */
					error = pstrdup(expiry == 0 ?
									"this node holds no lease on the shard (released for a hand-over, or not "
									"granted yet): it acknowledges no publish until the control plane grants one" :
									"this node's lease on the shard has lapsed: it acknowledges no publish "
									"until the control plane renews it (felix_nodes shows this node's "
									"view of the control plane)");

				/* Leadership as the control plane last described it. */
				if (v.leader[0])
					values[10] = CStringGetTextDatum(v.leader);
				else
					nulls[10] = true;
				if (v.nreplicas > 0)
					values[11] = PointerGetDatum(construct_array(replicas, v.nreplicas, TEXTOID,
																 -1, false, TYPALIGN_INT));
				else
					nulls[11] = true;
				/* Remaining lease by this node's monotonic clock (leaders only). */
				if (expiry == 0)
					nulls[12] = true;
				else
					values[12] = Int64GetDatum(Max((int64) 0, (expiry - felix_monotonic_ns()) / 1000000));
				if (v.unplaced_reason[0])
					values[13] = CStringGetTextDatum(v.unplaced_reason);
				else
					nulls[13] = true;
			}
			if (error != NULL)
				values[9] = CStringGetTextDatum(error);
			else
				nulls[9] = true;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}

/* One felix_metrics row. */
static void
put_metric(ReturnSetInfo *rsinfo, const char *name, double value)
{
	Datum		values[2];
	bool		nulls[2] = {false, false};

	values[0] = CStringGetTextDatum(name);
	values[1] = Float8GetDatum(value);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

PG_FUNCTION_INFO_V1(felix_metrics);
Datum
felix_metrics(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			open = 0;
	int			failed = 0;
	int			nslots;
	FelixReplGauges g;

	felix_require_preload();
	InitMaterializedSRF(fcinfo, 0);

	for (int c = 0; c < FELIX_NUM_COUNTERS; c++)
		put_metric(rsinfo, felix_counter_names[c], (double) felix_counter_value(c));

	nslots = shard_count_slots();
	for (int i = 0; i < nslots; i++)
	{
		FelixShardView v;

		shard_read(shard_slot(i), &v);
		if (v.in_use && v.phase == FELIX_SHARD_OPEN)
			open++;
		else if (v.in_use && v.phase == FELIX_SHARD_FAILED)
			failed++;
	}
	put_metric(rsinfo, "shards_open", open);
	put_metric(rsinfo, "shards_failed", failed);

	/* The leader loss window and replication health, see replication.md. */
	felix_replication_gauges(&g);
	put_metric(rsinfo, "replication_lag_records", (double) g.lag_records);
	put_metric(rsinfo, "halted_followers", (double) g.halted);
	for (int h = FELIX_HALT_DIVERGED; h <= FELIX_HALT_PROTOCOL; h++)
		put_metric(rsinfo, psprintf("halted_%s", felix_halt_name((FelixHalt) h)),
				   (double) g.halted_by[h]);
	put_metric(rsinfo, "rebuilds_in_flight", (double) g.rebuilding);
	put_metric(rsinfo, "replica_reports_per_request", g.reports_per_request);
	return (Datum) 0;
}

/*
 * Why peers cannot reach node `name`, from what every other node reported
 * of its probes ("node2: <why>; ..."), or NULL if none says so.
 */
static char *
unreachable_reason(const FelixNodeInfo *nodes, int n, const char *name)
{
	StringInfoData b;

	initStringInfo(&b);
	for (int j = 0; j < n; j++)
	{
		char		err[64];
		JsonbContainer *peers;
		char	   *why = NULL;

		if (strcmp(nodes[j].name, name) == 0 || !nodes[j].alive)
			continue;
		peers = felix_json_parse(nodes[j].peers, strlen(nodes[j].peers), err, sizeof(err));
		if (peers && felix_json_string(peers, name, &why) && why[0] != '\0')
			appendStringInfo(&b, "%s%s: %s", b.len ? "; " : "", nodes[j].name, why);
	}
	return b.len ? b.data : NULL;
}

/*
 * What felix_nodes says of the rows it lists, given this node's own view of
 * the control-plane store: the control plane's list is only as fresh as
 * this node's last heartbeat that the store took.
 */
/* How long felix_nodes shows that another server was refused a node's name. */
#define NODES_CLASH_SHOWN_MS	(10 * 60 * 1000)

typedef struct NodesTruth
{
	char		own_incarnation[FELIX_INCARNATION_LEN];
	bool		stale;			/* no heartbeat taken for a lease or longer */
	char	   *since;			/* ... since when (text) */
	bool		name_taken;		/* another server holds this node's name */
} NodesTruth;

PG_FUNCTION_INFO_V1(felix_nodes_view);
Datum
felix_nodes_view(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	FelixNodeInfo *nodes;
	int			n;
	bool		all = felix_sees_all_streams();
	FelixStoreView store;
	NodesTruth	t;
	bool		listed_self = false;

	felix_require_preload();
	InitMaterializedSRF(fcinfo, 0);
	n = felix_nodes_list(&nodes);
	felix_store_view(&store);
	memset(&t, 0, sizeof(t));
	felix_incarnation(t.own_incarnation, NULL);
	/* no heartbeat taken for a lease: whatever the last call said (a worker stuck, or gone) */
	t.stale = (store.ok_at != 0 || store.failing_since != 0) &&
		TimestampDifferenceExceeds(store.ok_at != 0 ? store.ok_at : store.failing_since,
								   GetCurrentTimestamp(), felix_lease_duration);
	if (t.stale)
		t.since = store.ok_at != 0 ? pstrdup(timestamptz_to_str(store.ok_at)) :
			psprintf("it started (%s)", timestamptz_to_str(store.failing_since));
	for (int i = 0; i < n; i++)
	{
		Datum		values[9];
		bool		nulls[9];
		char	   *why = nodes[i].alive ? unreachable_reason(nodes, n, nodes[i].name) : NULL;
		const char *state = !nodes[i].alive ? "dead" : why ? "unreachable" : "alive";
		bool		alive = nodes[i].alive;

		/*
		 * A node is its data directory: a row under this node's name but of
		 * another incarnation is another server, which the control plane
		 * took for this node (this one's heartbeats are refused, 42710).
		 */
		bool		self = felix_is_this_node(nodes[i].name) &&
			(nodes[i].incarnation[0] == '\0' || t.own_incarnation[0] == '\0' ||
			 strcmp(nodes[i].incarnation, t.own_incarnation) == 0);

		if (felix_is_this_node(nodes[i].name) && !self)
		{
			t.name_taken = true;
			why = psprintf("another server, felix data directory incarnation %s, holds this node's name; "
						   "this server (incarnation %s) is refused",
						   nodes[i].incarnation, t.own_incarnation);
		}
		else if (self && t.stale)
		{
			/* what this node can do now: nothing a lease allows */
			alive = false;
			state = "cut off";
			why = psprintf("the control-plane store has not taken a heartbeat of this node since %s (%s); "
						   "its leases have lapsed: it leads nothing and acknowledges nothing until the store answers",
						   t.since, store.error[0] ? store.error : "no answer");
		}
		else if (t.stale)
		{
			state = "unknown";
			why = psprintf("as the control plane last listed it, before this node lost the control-plane store (since %s)",
						   t.since);
		}

		/* a second server refused this node's name lately */
		if (nodes[i].clash_incarnation[0] != '\0' &&
			!TimestampDifferenceExceeds(nodes[i].clash_at, GetCurrentTimestamp(),
										NODES_CLASH_SHOWN_MS))
		{
			char	   *clash = psprintf("another server%s%s%s, felix data directory incarnation %s, "
										 "was refused this node's name at %s",
										 all ? ", at \"" : "", all ? nodes[i].clash_conninfo : "",
										 all ? "\"" : "", nodes[i].clash_incarnation,
										 timestamptz_to_str(nodes[i].clash_at));

			why = why ? psprintf("%s; %s", why, clash) : clash;
		}

		memset(nulls, 0, sizeof(nulls));
		values[0] = CStringGetTextDatum(nodes[i].name);
		/* addresses are for pg_read_all_stats, masked even then */
		if (all)
			values[1] = CStringGetTextDatum(felix_conninfo_mask(nodes[i].conninfo));
		else
			nulls[1] = true;
		values[2] = BoolGetDatum(alive);
		values[3] = TimestampTzGetDatum(nodes[i].last_heartbeat);
		values[4] = BoolGetDatum(nodes[i].duty);
		/* alive, but its peers cannot log in to it: not serving as a replica */
		values[5] = CStringGetTextDatum(state);
		nulls[6] = why == NULL;
		values[6] = why ? CStringGetTextDatum(why) : (Datum) 0;
		/* this node's own view of the control-plane store */
		if (self && store.store[0] != '\0' && all)
		{
			values[7] = CStringGetTextDatum(store.store);
			nulls[8] = store.error[0] == '\0';
			values[8] = CStringGetTextDatum(store.error);
		}
		else
			nulls[7] = nulls[8] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		if (self)
			listed_self = true;
	}

	/*
	 * This node, not (yet) in the control plane's list -- it cannot reach
	 * the store, say, or is refused: its row is what shows why.
	 */
	if (!listed_self)
	{
		Datum		values[9];
		bool		nulls[9];

		memset(nulls, 0, sizeof(nulls));
		values[0] = CStringGetTextDatum(felix_node_name_resolved());
		nulls[1] = true;
		values[2] = BoolGetDatum(false);
		nulls[3] = true;
		values[4] = BoolGetDatum(false);
		/* refused: another server holds the name, or this one's address (42710) */
		values[5] = CStringGetTextDatum(t.name_taken || strcmp(store.sqlstate, "42710") == 0 ?
										"refused" : "unknown");
		values[6] = CStringGetTextDatum(store.error[0] != '\0' ?
										psprintf("not listed by the control plane: %s", store.error) :
										"not listed by the control plane yet");
		nulls[7] = nulls[8] = true;
		if (all && store.store[0] != '\0')
		{
			nulls[7] = false;
			values[7] = CStringGetTextDatum(store.store);
			nulls[8] = store.error[0] == '\0';
			values[8] = CStringGetTextDatum(store.error);
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
