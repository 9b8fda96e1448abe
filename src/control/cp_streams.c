/*-------------------------------------------------------------------------
 *
 * cp_streams.c
 *	  The control plane's stream and membership changes: create and drop a
 *	  stream, hand a shard's leadership over (planned), move a replica,
 *	  remove a node.  Each is one compare-and-set transaction over what it
 *	  read; a change that takes a shard from its leader also writes
 *	  leads/<leader>, which that leader's heartbeat compares (see
 *	  cp_heartbeat.c).
 *
 *	  Placement: each shard's replica set is the replication_factor alive
 *	  nodes scoring highest for it (cp_score: a hash of node, stream and
 *	  shard; ties by name), and the first of them leads generation 1 --
 *	  a pure function of the stream, the shard and the alive nodes.
 *	  Afterwards only a replica move changes it.
 *
 *	  A stream's creation writes its definition and every shard in one
 *	  transaction (etcd: --max-txn-ops must allow felix.max_shards_per_stream
 *	  + 1 operations; docs/control-plane.md).
 *
 * Locking rule: none; compare-and-set in the store.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/cp.h"
#include "felix.h"
#include "utils/timestamp.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

static void
store_failed(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("the control-plane store did not confirm %s", what),
			 errhint("Check the control-plane store (felix_nodes shows its health) and try again.")));
}

static bool
retention_positive(const CpCreateArgs *a)
{
	Interval	iv;
	Interval	zero;

	memset(&zero, 0, sizeof(zero));
	iv.month = a->retention_months;
	iv.day = a->retention_days;
	iv.time = a->retention_usec;
	return DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(&iv),
											 IntervalPGetDatum(&zero))) > 0;
}

static const char *
must(const char *v, const char *stream, const char *what)
{
	if (v == NULL || v[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("stream \"%s\": %s must not be NULL", stream, what),
				 errhint("Leave the argument out to use its default.")));
	return v;
}

void
cp_validate_create(const CpCreateArgs *a)
{
	if (a->name == NULL || a->name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL or empty"),
				 errhint("Pass the stream's name as the first argument.")));
	if (strlen(a->name) >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("stream name \"%s\" is too long", a->name),
				 errhint("A stream name has at most %d bytes.", NAMEDATALEN - 1)));
	(void) must(a->consistency, a->name, "consistency");
	(void) must(a->payload_type, a->name, "payload_type");
	(void) must(a->storage, a->name, "storage");
	(void) must(a->schema, a->name, "schema");
	if (a->shards <= 0 || a->shards > felix_max_shards_per_stream)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": shards must be between 1 and %d, not %d",
						a->name, felix_max_shards_per_stream, a->shards),
				 errhint("The upper bound is felix.max_shards_per_stream.")));
	if (a->shards > felix_max_shards)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("stream \"%s\": %d shards exceed felix.max_shards (%d)",
						a->name, a->shards, felix_max_shards),
				 errhint("Raise felix.max_shards and restart the server.")));
	if (a->replication_factor <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": replication_factor must be at least 1, not %d",
						a->name, a->replication_factor),
				 errhint("replication_factor counts the nodes holding each shard, the leader included.")));
	if (a->replication_factor > CP_MAX_REPLICAS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": replication_factor must be at most %d, not %d",
						a->name, CP_MAX_REPLICAS, a->replication_factor),
				 errhint("A shard has at most %d copies, the leader included.", CP_MAX_REPLICAS)));
	if (strcmp(a->consistency, "leader") != 0 && strcmp(a->consistency, "quorum") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": invalid consistency \"%s\"", a->name, a->consistency),
				 errhint("consistency must be leader or quorum.")));
	if (strcmp(a->payload_type, "jsonb") != 0 && strcmp(a->payload_type, "text") != 0 &&
		strcmp(a->payload_type, "bytea") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": invalid payload_type \"%s\"", a->name, a->payload_type),
				 errhint("payload_type must be one of jsonb, text, bytea.")));
	if (strcmp(a->storage, "local") != 0 && strcmp(a->storage, "object") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": invalid storage \"%s\"", a->name, a->storage),
				 errhint("storage must be local or object.")));
	if (a->has_retention_bytes && a->retention_bytes <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": retention_bytes must be positive, not " INT64_FORMAT,
						a->name, a->retention_bytes),
				 errhint("Leave retention_bytes NULL to keep every record.")));
	if (a->has_retention && !retention_positive(a))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\": retention must be a positive interval", a->name),
				 errhint("Leave retention NULL to keep records regardless of age.")));
	/* refused, never silently downgraded */
	if (strcmp(a->storage, "object") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("stream \"%s\": storage 'object' is not supported yet", a->name),
				 errdetail("This felix release keeps shards in local segment files only."),
				 errhint("Create the stream with storage => 'local'.")));
}

typedef struct Scored
{
	const char *node;
	int32		score;
} Scored;

static int
scored_cmp(const void *a, const void *b)
{
	const Scored *x = a;
	const Scored *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return strcmp(x->node, y->node);
}

char *
cp_create_stream(const CpCreateArgs *a)
{
	CpSnapshot	snap;
	const char **alive;
	int			nalive = 0;
	CpStream	st;
	FelixStoreCmp cmp;
	FelixStoreOp *ops;
	int64		rev;
	FelixStoreStatus rc;

	cp_validate_create(a);
	cp_serialize();
	/* what placement needs: the stream's key, the nodes, who is alive */
	(void) cp_snapshot_read_parts(&snap, (const char *[]) {cp_key_stream(a->name), "nodes/", CP_KEY_ALIVE},
								  3, ERROR);
	if (cp_snapshot_stream(&snap, a->name) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" already exists", a->name),
				 errhint("Choose another name, or drop the stream with felix_drop_stream('%s').", a->name)));

	/* the alive nodes, as the duty holder sees them, and the caller */
	alive = palloc0(sizeof(char *) * (snap.nnodes + 2));
	for (int i = 0; i < snap.nnodes; i++)
	{
		const char *n = snap.nodes[i].name;

		if ((snap.have_alive && cp_alive_has(&snap.alive, n)) ||
			(a->caller && strcmp(a->caller, n) == 0))
			alive[nalive++] = n;
	}
	if (nalive < a->replication_factor)
	{
		StringInfoData names;

		initStringInfo(&names);
		for (int i = 0; i < nalive; i++)
			appendStringInfo(&names, "%s%s", i ? ", " : "", alive[i]);
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("stream \"%s\": replication_factor %d needs %d alive nodes, but %s",
						a->name, a->replication_factor, a->replication_factor,
						nalive == 0 ? "no node is alive" :
						nalive == 1 ? "only 1 node is alive" :
						psprintf("only %d nodes are alive", nalive)),
				 nalive == 0
				 ? errdetail("No node has heartbeated to the control plane in the last %d ms (felix.node_expiry).", felix_node_expiry)
				 : errdetail("Alive nodes (heartbeat within %d ms): %s.", felix_node_expiry, names.data),
				 a->lead_caller
				 ? errhint("The stream's label (its settings in the dump) asks for %d replicas: restore into a felix cluster with at least %d alive nodes, or edit replication_factor in the dump's SECURITY LABEL FOR felix; felix_nodes lists the nodes.",
						   a->replication_factor, a->replication_factor)
				 : errhint("Start more felix nodes that heartbeat to this control plane, or use a smaller replication_factor; felix_nodes lists the nodes.")));
	}

	memset(&st, 0, sizeof(st));
	st.name = (char *) a->name;
	st.schema = (char *) a->schema;
	st.creation_id = cp_new_uuid();
	st.shards = a->shards;
	st.replication_factor = a->replication_factor;
	st.consistency = (char *) a->consistency;
	st.payload_type = (char *) a->payload_type;
	st.storage = (char *) a->storage;
	st.retention_bytes = a->has_retention_bytes ? a->retention_bytes : -1;
	st.has_retention = a->has_retention;
	st.retention_months = a->retention_months;
	st.retention_days = a->retention_days;
	st.retention_usec = a->retention_usec;
	st.created_ms = cp_now_ms();

	ops = palloc0(sizeof(FelixStoreOp) * (a->shards + 1));
	ops[0].key = cp_key_stream(a->name);
	ops[0].value = cp_stream_write(&st);
	for (int k = 0; k < a->shards; k++)
	{
		Scored	   *sc = palloc(sizeof(Scored) * nalive);
		CpShard		sh;
		CpNode	   *first;

		for (int i = 0; i < nalive; i++)
		{
			sc[i].node = alive[i];
			sc[i].score = cp_score(alive[i], a->name, k);
		}
		qsort(sc, nalive, sizeof(Scored), scored_cmp);
		/* a restore's node first: it writes every shard's records */
		for (int i = 1; a->lead_caller && a->caller != NULL && i < nalive; i++)
		{
			if (strcmp(sc[i].node, a->caller) == 0)
			{
				Scored		caller = sc[i];

				memmove(&sc[1], &sc[0], sizeof(Scored) * i);
				sc[0] = caller;
				break;
			}
		}
		memset(&sh, 0, sizeof(sh));
		sh.stream = (char *) a->name;
		sh.shard = k;
		sh.generation = 1;
		sh.nreplicas = a->replication_factor;
		for (int i = 0; i < sh.nreplicas; i++)
			sh.replicas[i] = (char *) sc[i].node;
		sh.leader = sh.replicas[0];
		first = cp_snapshot_node(&snap, sh.leader);
		sh.leader_incarnation = first ? first->incarnation : NULL;
		sh.assigned_ms = st.created_ms;
		sh.grant_last_generation = -1;
		ops[k + 1].key = cp_key_shard(a->name, k);
		ops[k + 1].value = cp_shard_write(&sh);
	}
	cmp.key = cp_key_stream(a->name);
	cmp.mod_revision = 0;
	rc = felix_store_txn(&cmp, 1, ops, a->shards + 1, &rev, ERROR);
	if (rc == FELIX_STORE_CONFLICT)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" already exists", a->name),
				 errhint("Choose another name, or drop the stream with felix_drop_stream('%s').", a->name)));
	if (rc != FELIX_STORE_OK)
		store_failed(psprintf("the creation of stream \"%s\"", a->name));
	return st.creation_id;
}

/* Does one of ops[0..nops) already name key? */
static bool
ops_name(const FelixStoreOp *ops, int nops, const char *key)
{
	for (int i = 0; i < nops; i++)
		if (strcmp(ops[i].key, key) == 0)
			return true;
	return false;
}

void
cp_drop_stream(const char *name, const char *creation_id, bool missing_ok)
{
	for (int attempt = 0; attempt < CP_MAX_ATTEMPTS; attempt++)
	{
		CpSnapshot	snap;
		CpStream   *st;
		FelixStoreCmp cmp;
		FelixStoreOp *ops;
		int			nops = 0;
		int64		rev;
		FelixStoreStatus rc;

		if (name == NULL || creation_id == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("a stream name and creation id must not be NULL"),
					 errhint("Pass the name and creation_id of the stream to drop.")));
		cp_serialize();
		(void) cp_snapshot_read(&snap, false, ERROR);
		st = cp_snapshot_stream(&snap, name);
		if (st == NULL || strcmp(st->creation_id, creation_id) != 0)
		{
			if (missing_ok)
				return;
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("stream \"%s\" does not exist at the control plane with that creation id", name),
					 errdetail("No stream \"%s\" was registered with creation id %s.", name, creation_id),
					 errhint("The control plane knows no such stream; felix.store_read('streams/') lists the ones it knows.")));
		}
		ops = palloc0(sizeof(FelixStoreOp) * (2 * snap.nshards + snap.nreports + 2));
		ops[nops].key = cp_key_stream(name);
		ops[nops++].value = NULL;
		for (int i = 0; i < snap.nshards; i++)
		{
			CpShard    *s = &snap.shards[i];

			if (strcmp(s->stream, name) != 0)
				continue;
			ops[nops].key = cp_key_shard(name, s->shard);
			ops[nops++].value = NULL;
			/* once per leader: etcd refuses a transaction naming a key twice */
			if (s->leader && !ops_name(ops, nops, cp_key_leads(s->leader)))
			{
				ops[nops].key = cp_key_leads(s->leader);
				ops[nops++].value = cp_leads_value();
			}
		}
		for (int i = 0; i < snap.nreports; i++)
			if (strcmp(snap.report_stream[i], name) == 0)
			{
				ops[nops].key = cp_key_reports(name, snap.report_shard[i]);
				ops[nops++].value = NULL;
			}
		cmp.key = cp_key_stream(name);
		cmp.mod_revision = st->rev;
		rc = felix_store_txn(&cmp, 1, ops, nops, &rev, ERROR);
		if (rc == FELIX_STORE_OK)
			return;
		if (rc != FELIX_STORE_CONFLICT)
			store_failed(psprintf("the drop of stream \"%s\"", name));
		cp_backoff(attempt);
	}
	store_failed(psprintf("the drop of stream \"%s\" (it kept changing)", name));
}

int64
cp_transfer(const char *stream, int shard, int64 generation, const char *from_node,
			const char *to_node)
{
	for (int attempt = 0; attempt < CP_MAX_ATTEMPTS; attempt++)
	{
		CpSnapshot	snap;
		CpShard    *s;
		CpNode	   *to;
		CpNode	   *from;
		CpShard		next;
		FelixStoreCmp cmps[2];
		FelixStoreOp ops[2];
		int64		rev;
		FelixStoreStatus rc;

		cp_snapshot_read_attempt(&snap, attempt);
		s = cp_snapshot_shard(&snap, stream, shard);
		if (s == NULL || s->generation != generation || s->leader == NULL ||
			strcmp(s->leader, from_node) != 0)
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_NOT_LEADER),
					 errmsg("stream \"%s\" shard %d: node \"%s\" does not lead generation " INT64_FORMAT,
							stream, shard, from_node, generation),
					 errhint("The shard moved on meanwhile; felix_shards shows its leader.")));
		to = cp_snapshot_node(&snap, to_node);
		if (to == NULL || !cp_shard_has_replica(s, to_node) || strcmp(to_node, from_node) == 0 ||
			!snap.have_alive || !cp_alive_has(&snap.alive, to_node) ||
			cp_node_unable(to, stream, shard))
		{
			StringInfoData set;

			initStringInfo(&set);
			for (int i = 0; i < s->nreplicas; i++)
				appendStringInfo(&set, "%s%s", i ? ", " : "", s->replicas[i]);
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("stream \"%s\" shard %d: node \"%s\" cannot take the shard over",
							stream, shard, to_node),
					 errdetail("It must be another alive member of the replica set that can serve the shard."),
					 errhint("The replica set is %s; felix_nodes shows which nodes are alive.", set.data)));
		}
		/*
		 * The caller vouches that it stopped writing at `generation` and
		 * gave up its lease: the interval a promotion waits out is already
		 * over.
		 */
		next = *s;
		next.generation = generation + 1;
		next.leader = to->name;
		next.leader_incarnation = to->incarnation;
		next.unplaced_reason = NULL;
		next.assigned_ms = cp_now_ms();
		/*
		 * The target caught up with the old leader's log before the call;
		 * the log ends their heartbeats gave are the best the control plane
		 * has of it.
		 */
		from = cp_snapshot_node(&snap, from_node);
		next.grant_end = Max(0, Max(cp_node_end(to, stream, shard),
									from ? cp_node_end(from, stream, shard) : -1));
		/* the target's own may trail the old leader's: not compared */
		next.grant_last_generation = -1;
		cmps[0].key = cp_key_shard(stream, shard);
		cmps[0].mod_revision = s->rev;
		cmps[1].key = cp_key_node(to_node);
		cmps[1].mod_revision = to->rev;
		ops[0].key = cmps[0].key;
		ops[0].value = cp_shard_write(&next);
		ops[1].key = cp_key_leads(from_node);
		ops[1].value = cp_leads_value();
		rc = felix_store_txn(cmps, 2, ops, 2, &rev, ERROR);
		if (rc == FELIX_STORE_OK)
		{
			ereport(LOG,
					(errmsg("felix: stream \"%s\" shard %d: \"%s\" hands generation " INT64_FORMAT " to \"%s\"",
							stream, shard, from_node, generation + 1, to_node)));
			return generation + 1;
		}
		if (rc != FELIX_STORE_CONFLICT)
			store_failed(psprintf("the transfer of stream \"%s\" shard %d", stream, shard));

		/*
		 * The shard or the target's record changed since the read: a
		 * heartbeat rewrites its node's record every time, and a leader's
		 * first claim of its generation rewrites the shard.  Read again:
		 * only a shard that moved on refuses the transfer.
		 */
	}
	store_failed(psprintf("the transfer of stream \"%s\" shard %d (it kept changing)", stream, shard));
	pg_unreachable();
}

char *
cp_move_replica(const char *stream, int shard, const char *from_node, const char *to_node)
{
	CpSnapshot	snap;
	CpShard    *s;
	CpShard		next;
	FelixStoreCmp cmp;
	FelixStoreOp op;
	int64		rev;
	FelixStoreStatus rc;
	StringInfoData set;

	if (from_node == NULL || to_node == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("stream \"%s\" shard %d: from_node and to_node must not be NULL", stream, shard),
				 errhint("Name the replica that goes and the node that replaces it.")));
	cp_serialize();
	(void) cp_snapshot_read(&snap, false, ERROR);
	s = cp_snapshot_shard(&snap, stream, shard);
	if (s == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" has no shard %d", stream, shard),
				 errhint("felix_shards lists the shards and their replica sets.")));
	initStringInfo(&set);
	for (int i = 0; i < s->nreplicas; i++)
		appendStringInfo(&set, "%s%s", i ? ", " : "", s->replicas[i]);
	if (s->joining)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" is already replacing node \"%s\"",
						stream, shard, s->joining, s->leaving),
				 errhint("Wait until that move completes (felix_shards shows the replica set).")));
	if (!cp_shard_has_replica(s, from_node))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" is not one of its replicas (%s)",
						stream, shard, from_node, set.data),
				 errhint("Name a member of the replica set as from_node.")));
	if (cp_shard_has_replica(s, to_node))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" is already one of its replicas",
						stream, shard, to_node),
				 errhint("Name a node outside the replica set as to_node.")));
	if (s->leader && strcmp(s->leader, from_node) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" leads it and cannot be moved",
						stream, shard, from_node),
				 errhint("Move the leadership first: SELECT felix_transfer_leadership('%s', %d, <node>) on node \"%s\".",
						 stream, shard, s->leader)));
	if (cp_snapshot_node(&snap, to_node) == NULL || !snap.have_alive ||
		!cp_alive_has(&snap.alive, to_node))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" shard %d: node \"%s\" is not alive", stream, shard, to_node),
				 errhint("felix_nodes lists the nodes and whether they are alive.")));
	if (s->nreplicas >= CP_MAX_REPLICAS)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("stream \"%s\" shard %d: a replica set cannot grow past %d nodes",
						stream, shard, CP_MAX_REPLICAS),
				 errhint("Remove a replica some other way first.")));
	next = *s;
	next.replicas[next.nreplicas++] = (char *) to_node;
	next.joining = (char *) to_node;
	next.leaving = (char *) from_node;
	cmp.key = cp_key_shard(stream, shard);
	cmp.mod_revision = s->rev;
	op.key = cmp.key;
	op.value = cp_shard_write(&next);
	rc = felix_store_txn(&cmp, 1, &op, 1, &rev, ERROR);
	if (rc == FELIX_STORE_CONFLICT)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("stream \"%s\" shard %d changed while the move was being made", stream, shard),
				 errhint("Run the move again.")));
	if (rc != FELIX_STORE_OK)
		store_failed(psprintf("the replica move of stream \"%s\" shard %d", stream, shard));
	ereport(LOG,
			(errmsg("felix: stream \"%s\" shard %d: node \"%s\" joins to replace node \"%s\"",
					stream, shard, to_node, from_node)));
	appendStringInfo(&set, ", %s", to_node);
	return set.data;
}

/*
 * Forget a node: refused while it is alive or belongs to any replica set
 * (move its replicas first), since a shard must never name a node the
 * control plane no longer knows.
 */
void
cp_remove_node(const char *node)
{
	CpSnapshot	snap;
	CpNode	   *n;
	FelixStoreCmp cmp;
	FelixStoreOp ops[5];
	int64		rev;

	cp_check_node_name(node);
	cp_serialize();
	(void) cp_snapshot_read(&snap, false, ERROR);
	n = cp_snapshot_node(&snap, node);
	if (n == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("node \"%s\" is not known to the control plane", node),
				 errhint("felix_nodes lists the nodes it knows.")));
	if (snap.have_alive && cp_alive_has(&snap.alive, node))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("node \"%s\" is alive", node),
				 errhint("Stop its server first (it registers again at its next heartbeat otherwise).")));
	for (int i = 0; i < snap.nshards; i++)
		if (cp_shard_has_replica(&snap.shards[i], node))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_IN_USE),
					 errmsg("node \"%s\" still holds a replica of stream \"%s\" shard %d",
							node, snap.shards[i].stream, snap.shards[i].shard),
					 errhint("Move its replicas away first: felix_move_replica('%s', %d, '%s', <node>).",
							 snap.shards[i].stream, snap.shards[i].shard, node)));
	cmp.key = cp_key_node(node);
	cmp.mod_revision = n->rev;
	ops[0].key = cmp.key;
	ops[0].value = NULL;
	ops[1].key = cp_key_leads(node);
	ops[1].value = NULL;
	ops[2].key = cp_key_clash(node);
	ops[2].value = NULL;
	ops[3].key = cp_key_ends(node);
	ops[3].value = NULL;
	ops[4].key = cp_key_claims(node);
	ops[4].value = NULL;
	if (felix_store_txn(&cmp, 1, ops, 5, &rev, ERROR) != FELIX_STORE_OK)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("node \"%s\" changed while it was being removed", node),
				 errhint("Run felix_remove_node again.")));
	ereport(LOG, (errmsg("felix: node \"%s\" was removed from the control plane", node)));
}

static int
node_row_cmp(const void *a, const void *b)
{
	return strcmp(((const CpNodeRow *) a)->node->name, ((const CpNodeRow *) b)->node->name);
}

bool
cp_read_for_nodes(CpSnapshot *snap, int elevel)
{
	return cp_snapshot_read_parts(snap, (const char *[]) {"nodes/", "clashes/", CP_KEY_DUTY, CP_KEY_ALIVE},
								  4, elevel);
}

int
cp_list_nodes(const CpSnapshot *snap, CpNodeRow **rows)
{
	*rows = palloc0(sizeof(CpNodeRow) * (snap->nnodes + 1));
	for (int i = 0; i < snap->nnodes; i++)
	{
		const CpNode *n = &snap->nodes[i];

		(*rows)[i].node = n;
		(*rows)[i].alive = snap->have_alive && cp_alive_has(&snap->alive, n->name);
		(*rows)[i].duty = snap->have_duty && strcmp(snap->duty.node, n->name) == 0;
		(*rows)[i].clash = cp_snapshot_clash(snap, n->name);
	}
	qsort(*rows, snap->nnodes, sizeof(CpNodeRow), node_row_cmp);
	return snap->nnodes;
}

int
cp_list_halted(const CpSnapshot *snap, CpHaltRow **rows)
{
	int			n = 0;

	*rows = palloc0(sizeof(CpHaltRow) * (snap->nreports * (CP_MAX_REPLICAS + 1) + 1));
	for (int i = 0; i < snap->nreports; i++)
	{
		const CpReports *r = snap->reports[i];
		const CpShard *s;
		bool		any = false;

		/* the shard looked up only for a report of a halt: most have none */
		for (int j = 0; j < r->n && !any; j++)
			any = r->rows[j].halted != NULL;
		if (!any)
			continue;
		s = cp_snapshot_shard(snap, snap->report_stream[i], snap->report_shard[i]);
		if (s == NULL)
			continue;
		for (int j = 0; j < r->n; j++)
		{
			const CpReport *x = &r->rows[j];
			CpHaltRow  *h;

			if (x->halted == NULL || x->generation != s->generation ||
				s->leader == NULL || strcmp(x->leader, s->leader) != 0)
				continue;
			h = &(*rows)[n++];
			h->stream = s->stream;
			h->shard = s->shard;
			h->node = x->follower;
			h->generation = x->generation;
			h->leader = x->leader;
			h->position = x->position;
			h->reason = x->halted;
			h->since_ms = x->halted_since_ms;
		}
	}
	return n;
}
