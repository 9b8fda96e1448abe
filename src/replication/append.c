/*-------------------------------------------------------------------------
 *
 * append.c
 *	  The follower's side of log shipping: felix.replicate(stream, shard,
 *	  generation, node, incarnation, op, from_seq, leader_hwm_end, batches),
 *	  called over libpq by the shard's leader (ship.c).
 *
 *	  Who may call it: only a node, as its felix_node_<name> role (a
 *	  member of felix_replication), and only the node this one knows to
 *	  lead the shipment's generation (superusers excepted); and only for
 *	  this node: the call names the node and the incarnation of its felix
 *	  data directory it means, and any other node -- reached through a
 *	  wrong conninfo, or a server whose data directory was replaced --
 *	  refuses it (55F05).  A peer is checked, not believed: every record
 *	  shipped is verified (header CRC, body CRC, trailer, contiguity) and
 *	  validated as a value of the stream's payload type (payload.c) before
 *	  the log is looked at, as COPY validates its input.
 *
 *	  Then, with the shard's tail held throughout: gather_facts reads what
 *	  the rule needs (the shard's generation, role and positions, the
 *	  overlap of the shipment with the log compared byte for byte, the
 *	  generation map's verdict on a difference), replicate_decide (rules.c,
 *	  a pure function with the rule's steps and their reasons) decides, and
 *	  the switch in felix_replicate does what it decided, and only that:
 *	   - refuse (an error), or step down first when the shipment shows that
 *		 this node, leading an older generation, was deposed;
 *	   - answer ('fenced' | 'gap' | 'needs_bootstrap', tail) -- a gap also
 *		 when the shipment begins exactly at our tail after a last record
 *		 of another generation, which must be compared first;
 *	   - answer ('conflict', seq), after marking the copy diverged there so
 *		 its readers stop short of it, durably (shard_mark_diverged_locked);
 *	   - drop an earlier leader's unadopted tail above the mark and answer
 *		 ('gap', new tail);
 *	   - begin the copy afresh at the leader's oldest record (a bootstrap
 *		 of an empty copy, or a rebuild), answering ('bootstrapped' |
 *		 'rebuilt', start);
 *	   - or append the batches the log lacks, unchanged (the leader stamped
 *		 them), noting each generation new to the log in the generation
 *		 map, and make them durable (fdatasync) BEFORE answering ('stored',
 *		 end of the batches sent) -- the end of what was compared or
 *		 written, not our tail, so the leader never moves past records
 *		 nobody compared.  If appending batch k fails, the batches of this
 *		 call before it are cut back: a failed shipment leaves the log as it
 *		 was.  The high-water mark this node shows its readers then becomes
 *		 min(leader_hwm_end, durable end) (shard_after_replicated).
 *
 * Locking rule: the shard's tail is held (shard_lock_tail) from gathering
 * the facts until the decision is carried out, so no other append, trim or
 * truncation interleaves with a check and the bytes it allowed.  The
 * shipped bytes are verified before the tail is taken.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/catalog.h"
#include "core/payload.h"
#include "control/conninfo.h"
#include "base/wake.h"
#include "felix.h"
#include "base/privilege.h"
#include "replication/lease.h"
#include "replication/rules.h"
#include "fmgr.h"
#include "funcapi.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "storage/format.h"
#include "storage/incarnation.h"
#include "storage/log.h"
#include "storage/shard.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

/* One verified batch of a shipment. */
typedef struct ShippedBatch
{
	FelixBatchHeader hdr;		/* aligned copy of the header */
	const char *bytes;			/* the stored form, in the shipment */
	uint64		len;			/* batch_stored_len */
} ShippedBatch;

static void
answer(FunctionCallInfo fcinfo, const char *status, uint64 seq)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	values[0] = CStringGetTextDatum(status);
	values[1] = Int64GetDatum((int64) seq);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * Split the shipment into batches and verify each: header CRC and fields,
 * a RECORDS batch, body CRC and structure, trailer, seqs contiguous from
 * from_seq, generations not past the sender's.  Any failure is an error:
 * nothing of a damaged shipment may be stored.
 */
/*
 * Every record of a verified batch body is a valid key (text) and a valid
 * value of the stream's payload type, or the shipment is refused: bytes
 * stored here are later handed to the type's output function.
 */
static void
verify_records(const char *what, const FelixBatchHeader *h, const char *body,
			   Oid payload_type)
{
	FelixBatchIter it;
	FelixRecord rec;
	char	   *why;

	batch_iter_init(&it, h, body);
	while (batch_iter_next(&it, &rec))
	{
		if (rec.key != NULL && !payload_is_valid(TEXTOID, rec.key, rec.key_len, &why))
			ereport(ERROR,
					(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
					 errmsg("%s: shipped record at seq " UINT64_FORMAT " has an invalid key: %s",
							what, rec.seq, why),
					 errhint("Nothing of the shipment was stored; the leader's copy of the record is damaged or the sender is not a felix leader.")));
		if (!payload_is_valid(payload_type, rec.payload, rec.payload_len, &why))
			ereport(ERROR,
					(errcode(payload_type == TEXTOID ? ERRCODE_CHARACTER_NOT_IN_REPERTOIRE :
							 ERRCODE_INVALID_BINARY_REPRESENTATION),
					 errmsg("%s: shipped record at seq " UINT64_FORMAT " is not a valid %s value: %s",
							what, rec.seq, format_type_be(payload_type), why),
					 errhint("Nothing of the shipment was stored; the leader's copy of the record is damaged or the sender is not a felix leader.")));
	}
}

static ShippedBatch *
verify_shipment(const char *what, const char *data, uint64 size,
				uint64 from_seq, uint64 generation, Oid payload_type,
				int *nbatches)
{
	ShippedBatch *batches = NULL;
	int			n = 0;
	int			cap = 0;
	uint64		off = 0;
	uint64		expect = from_seq;

	while (off < size)
	{
		FelixBatchHeader h;
		FelixHeaderCheck hc;
		uint64		len;

		CHECK_FOR_INTERRUPTS();
		if (size - off < sizeof(FelixBatchHeader))
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("%s: shipped batches end with a partial header at byte offset " UINT64_FORMAT,
							what, off),
					 errhint("The leader retries the shipment; check the network path between the nodes if this repeats.")));
		memcpy(&h, data + off, sizeof(h));
		hc = batch_header_check(&h);
		if (hc != FELIX_HDR_OK || h.kind != FELIX_BATCH_RECORDS)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("%s: shipped batch at byte offset " UINT64_FORMAT " has an invalid header",
							what, off),
					 errdetail("The header does not match its checksum or is not a record batch."),
					 errhint("The leader retries the shipment; check the network path between the nodes if this repeats.")));
		len = batch_stored_len(&h);
		if (len > size - off)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("%s: shipped batch at byte offset " UINT64_FORMAT " claims " UINT64_FORMAT " bytes but only " UINT64_FORMAT " were sent",
							what, off, len, size - off),
					 errhint("The leader retries the shipment; check the network path between the nodes if this repeats.")));
		if (!batch_body_check(&h, data + off + sizeof(FelixBatchHeader)) ||
			batch_trailer_check(&h, data + off + len - sizeof(FelixBatchTrailer)) != FELIX_TRAILER_OK)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("%s: shipped batch at byte offset " UINT64_FORMAT " (seq " UINT64_FORMAT ") does not match its checksum",
							what, off, h.base_seq),
					 errhint("The leader retries the shipment; check the network path between the nodes if this repeats.")));
		if (h.base_seq != expect)
			ereport(ERROR,
					(errcode(ERRCODE_PROTOCOL_VIOLATION),
					 errmsg("%s: shipped batch at byte offset " UINT64_FORMAT " starts at seq " UINT64_FORMAT " where seq " UINT64_FORMAT " was expected",
							what, off, h.base_seq, expect),
					 errhint("Shipped batches must be contiguous and start at from_seq.")));
		if (h.generation > generation || h.generation == 0)
			ereport(ERROR,
					(errcode(ERRCODE_PROTOCOL_VIOLATION),
					 errmsg("%s: shipped batch at seq " UINT64_FORMAT " carries generation " UINT64_FORMAT ", but it was sent at generation " UINT64_FORMAT,
							what, h.base_seq, h.generation, generation),
					 errhint("A leader can only ship records of its own generation or earlier ones.")));
		verify_records(what, &h, data + off + sizeof(FelixBatchHeader), payload_type);

		if (n == cap)
		{
			cap = cap == 0 ? 16 : cap * 2;
			batches = batches == NULL ? palloc(cap * sizeof(ShippedBatch)) :
				repalloc(batches, cap * sizeof(ShippedBatch));
		}
		batches[n].hdr = h;
		batches[n].bytes = data + off;
		batches[n].len = len;
		n++;
		off += len;
		expect = h.base_seq + h.count;
	}
	*nbatches = n;
	return batches;
}

/*
 * Compare batches [0, nbelow) -- all wholly below our tail -- with the
 * bytes we store over the same span.  Returns the index of the first batch
 * that differs, or -1 when all agree.  Batches below our log's start (our
 * retention removed them) cannot be compared and are skipped.
 */
static int
compare_overlap(const char *dir, const char *what, const ShippedBatch *b,
				int nbelow, uint64 start_seq)
{
	int			first = 0;
	uint64		span = 0;
	StringInfoData stored;
	uint64		pos = 0;

	while (first < nbelow && b[first].hdr.base_seq < start_seq)
		first++;
	if (first == nbelow)
		return -1;
	for (int i = first; i < nbelow; i++)
		span += b[i].len;

	initStringInfo(&stored);
	(void) log_read_range(dir, what, b[first].hdr.base_seq,
						  b[nbelow - 1].hdr.base_seq + b[nbelow - 1].hdr.count,
						  (Size) span, &stored, NULL);
	for (int i = first; i < nbelow; i++)
	{
		if ((uint64) stored.len - pos < b[i].len ||
			memcmp(stored.data + pos, b[i].bytes, b[i].len) != 0)
		{
			pfree(stored.data);
			return i;
		}
		pos += b[i].len;
	}
	pfree(stored.data);
	return -1;
}

/* The generation the map last recorded, 0 when it is empty. */
/*
 * The follower's own repair rule: a conflict found by a batch of a newer
 * generation than the newest this log holds, at or after the point where
 * that older generation began here, is an earlier leader's unadopted tail,
 * and may be dropped.  A leader disagreeing with itself (same generation),
 * or a divergence reaching back before that generation began, is not:
 * those halt the follower.  Called with the append lock held.
 */
static bool
divergence_droppable(FelixShard *s, const char *dir, const char *what,
					 const ShippedBatch *b, uint64 cut)
{
	uint64		ours = s->log.last_generation;
	FelixGenEntry *map;
	int			nmap;
	uint64		began = PG_UINT64_MAX;

	if (b->hdr.generation <= ours)
		return false;
	nmap = genmap_load(dir, what, &map);
	for (int i = 0; i < nmap; i++)
		if (map[i].generation == ours)
			began = map[i].first_seq;
	return cut >= began;
}

static uint64
genmap_last_generation(const char *dir, const char *what)
{
	FelixGenEntry *entries;
	int			n = genmap_load(dir, what, &entries);
	uint64		g = n > 0 ? entries[n - 1].generation : 0;

	pfree(entries);
	return g;
}

/*
 * Append shipped batches [from, n) at the tail (held), noting each
 * generation new to the log in the generation map.  Returns n, or the
 * index of the first batch whose generation is older than one the map
 * says began earlier in this log -- the two histories part there; the
 * batches before it stay appended.  If an append fails, everything this
 * call appended is cut back before the error goes on: a failed shipment
 * leaves the log as it was (shard_cut_back).
 */
static int
append_shipped(FelixShard *s, const char *dir, const char *what,
			   const ShippedBatch *batches, int from, int n)
{
	uint64		tail_before = s->log.next_seq;
	volatile int stop = n;
	MemoryContext oldcxt = CurrentMemoryContext;

	PG_TRY();
	{
		uint64		map_generation = 0;
		bool		map_loaded = false;

		for (int i = from; i < n; i++)
		{
			const ShippedBatch *b = &batches[i];

			CHECK_FOR_INTERRUPTS();
			Assert(b->hdr.base_seq == s->log.next_seq);
			if (b->hdr.generation > s->log.last_generation)
			{
				if (!map_loaded)
				{
					map_generation = genmap_last_generation(dir, what);
					map_loaded = true;
				}
				if (b->hdr.generation < map_generation)
				{
					stop = i;
					break;
				}
				if (b->hdr.generation > map_generation)
				{
					genmap_note(dir, what, b->hdr.generation, b->hdr.base_seq, true);
					map_generation = b->hdr.generation;
				}
			}
			log_append(dir, what, &s->log, b->bytes, (Size) b->len);
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		shard_cut_back(s, tail_before);
		ReThrowError(edata);
	}
	PG_END_TRY();
	return stop;
}

static ReplicateOp
parse_op(const char *stream_name, int shard, const char *op)
{
	if (strcmp(op, "ship") == 0)
		return REPLICATE_SHIP;
	if (strcmp(op, "bootstrap") == 0)
		return REPLICATE_BOOTSTRAP;
	if (strcmp(op, "rebuild") == 0)
		return REPLICATE_REBUILD;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("felix.replicate for stream \"%s\" shard %d: unknown operation \"%s\"",
					stream_name, shard, op),
			 errhint("The operations are ship, bootstrap and rebuild; felix.replicate is called by a shard's leader, not by users.")));
	return REPLICATE_SHIP;		/* keep compiler quiet */
}

/*
 * Gather, with the tail held, everything the rule (replicate_decide)
 * looks at.  The overlap of a shipment with what we hold is read and
 * compared here, and the generation map consulted, whether or not the
 * rule will get that far: the decision itself is taken in one place.
 */
static void
gather_facts(ReplicateFacts *f, FelixShard *s, const char *dir, const char *what,
			 const char *target, const char *target_incarnation,
			 const ShippedBatch *batches, int nbatches)
{
	FelixShardPositions v;
	char		incarnation[FELIX_INCARNATION_LEN];
	const char *caller = GetUserNameFromId(GetSessionUserId(), false);

	shard_read_positions(s, &v);
	felix_incarnation(incarnation, NULL);
	f->addressed_here = felix_is_this_node(target) &&
		strcmp(target_incarnation, incarnation) == 0;
	f->superuser = superuser();
	f->caller_is_node = f->superuser ||
		strncmp(caller, FELIX_NODE_ROLE_PREFIX, strlen(FELIX_NODE_ROLE_PREFIX)) == 0;
	f->sender_is_leader = v.leader[0] != '\0' &&
		strcmp(caller, felix_node_role(v.leader)) == 0;
	f->our_generation = v.generation;
	f->we_lead = v.role == FELIX_ROLE_LEADER;
	f->leader_known = v.leader[0] != '\0';
	f->start_seq = s->log.start_seq;
	f->tail = s->log.next_seq;
	f->last_generation = s->log.last_generation;
	f->copy_stale = v.copy_stale;
	f->hwm_end = v.hwm_end;

	f->nbatches = nbatches;
	f->first_generation = nbatches > 0 ? batches[0].hdr.generation : 0;
	f->nbelow = 0;
	while (f->nbelow < nbatches &&
		   batches[f->nbelow].hdr.base_seq + batches[f->nbelow].hdr.count <= f->tail)
		f->nbelow++;
	/* a batch straddling our tail disagrees with our last batch */
	f->mismatch = (f->nbelow < nbatches && batches[f->nbelow].hdr.base_seq < f->tail) ?
		f->nbelow : -1;
	if (f->op == REPLICATE_SHIP && f->nbelow > 0 && f->from_seq <= f->tail)
	{
		int			m = compare_overlap(dir, what, batches, f->nbelow, f->start_seq);

		if (m >= 0)
			f->mismatch = m;
	}
	f->mismatch_seq = f->mismatch >= 0 ? batches[f->mismatch].hdr.base_seq : 0;
	f->droppable = f->mismatch >= 0 &&
		divergence_droppable(s, dir, what, &batches[f->mismatch], f->mismatch_seq);
}

/* Let go of the tail and raise the error a refusal decision stands for. */
static void
refuse(const ReplicateDecision *d, const ReplicateFacts *f, FelixShard *s,
	   const char *what, const char *target, const char *target_incarnation)
{
	FelixShardView v;
	char		incarnation[FELIX_INCARNATION_LEN];
	char	   *caller = GetUserNameFromId(GetSessionUserId(), false);

	shard_unlock_tail(s);
	shard_read(s, &v);
	felix_incarnation(incarnation, NULL);
	switch (d->action)
	{
		case REPLICATE_REFUSE_ADDRESS:
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_WRONG_NODE),
					 errmsg("%s: this shipment is for node \"%s\" (incarnation %s), but this is node \"%s\" (incarnation %s)",
							what, target, target_incarnation, felix_node_name_resolved(), incarnation),
					 errhint("The leader reached the wrong server, or a server whose felix data directory was replaced: check felix.node_conninfo of node \"%s\" and felix_nodes.",
							 target)));
			break;
		case REPLICATE_REFUSE_LEADER:
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_NOT_LEADER),
					 errmsg("%s: this node leads the shard at generation " UINT64_FORMAT " and takes no shipment for it",
							what, f->our_generation),
					 errhint("Two nodes believe they lead the same generation; check felix_shards on both and the control plane's assignments.")));
			break;
		case REPLICATE_REFUSE_UNKNOWN:
			/* a leader we have not heard of: hear of it now, not an interval later */
			felix_wake(FELIX_WORKER_HEARTBEAT);
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_GENERATION_UNKNOWN),
					 errmsg("%s: this node has not learned who leads generation " UINT64_FORMAT " yet",
							what, f->generation),
					 errdetail("It knows generation " UINT64_FORMAT "%s%s%s.", f->our_generation,
							   v.leader[0] ? ", led by \"" : "", v.leader, v.leader[0] ? "\"" : ""),
					 errhint("The leader retries; this node learns of the generation from the control plane at its next heartbeat.")));
			break;
		case REPLICATE_REFUSE_SENDER:
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("%s: role \"%s\" may not ship generation " UINT64_FORMAT ", which node \"%s\" leads",
							what, caller, f->generation, v.leader),
					 errhint("Only the shard's leader ships to its followers, as role %s.",
							 felix_node_role(v.leader))));
			break;
		default:
			elog(ERROR, "felix: %s: replicate decision %d is not a refusal", what, (int) d->action);
	}
}

PG_FUNCTION_INFO_V1(felix_replicate);
Datum
felix_replicate(PG_FUNCTION_ARGS)
{
	char	   *stream_name;
	int32		shard;
	int64		generation_arg;
	char	   *target;
	char	   *target_incarnation;
	int64		from_arg;
	int64		hwm_arg;
	bytea	   *shipment;
	const FelixStream *stream;
	FelixStream stream_copy;
	FelixShard *s;
	char	   *what;
	char		dir[MAXPGPATH];
	ShippedBatch *batches;
	int			nbatches;
	ReplicateFacts f;
	ReplicateDecision d;
	uint64		sent_end;
	int			stop;

	felix_require_preload();
	felix_require_replication_role("felix.replicate");
	felix_require_nargs(fcinfo, 9, "felix.replicate");
	for (int i = 0; i < 9; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.replicate: argument %d must not be NULL", i + 1),
					 errhint("felix.replicate is called by a shard's leader, not by users.")));
	stream_name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	shard = PG_GETARG_INT32(1);
	generation_arg = PG_GETARG_INT64(2);
	target = text_to_cstring(PG_GETARG_TEXT_PP(3));
	target_incarnation = text_to_cstring(PG_GETARG_TEXT_PP(4));
	memset(&f, 0, sizeof(f));
	f.op = parse_op(stream_name, shard, text_to_cstring(PG_GETARG_TEXT_PP(5)));
	from_arg = PG_GETARG_INT64(6);
	hwm_arg = PG_GETARG_INT64(7);
	shipment = PG_GETARG_BYTEA_PP(8);
	if (generation_arg <= 0 || from_arg < 0 || hwm_arg < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.replicate for stream \"%s\" shard %d: generation must be positive and positions not negative",
						stream_name, shard),
				 errhint("felix.replicate is called by a shard's leader, not by users.")));
	f.generation = (uint64) generation_arg;
	f.from_seq = (uint64) from_arg;

	InitMaterializedSRF(fcinfo, 0);

	stream = felix_stream_by_name(stream_name);
	stream_copy = *stream;
	felix_check_shard(&stream_copy, shard);
	s = felix_stream_shard(&stream_copy, shard);
	what = shard_what(s);
	shard_dir(s, dir);

	/* Verify everything shipped before looking at our log. */
	if (f.op != REPLICATE_SHIP && VARSIZE_ANY_EXHDR(shipment) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("%s: a %s carries no batches", what,
						f.op == REPLICATE_BOOTSTRAP ? "bootstrap" : "rebuild"),
				 errhint("felix.replicate is called by a shard's leader, not by users.")));
	batches = verify_shipment(what, VARDATA_ANY(shipment),
							  VARSIZE_ANY_EXHDR(shipment), f.from_seq,
							  f.generation, stream_copy.payload_type, &nbatches);
	sent_end = nbatches > 0 ?
		batches[nbatches - 1].hdr.base_seq + batches[nbatches - 1].hdr.count :
		f.from_seq;

	/* One hold of the tail: the facts, the decision and its effect. */
	shard_lock_tail_open(s);
	gather_facts(&f, s, dir, what, target, target_incarnation, batches, nbatches);
	d = replicate_decide(&f);

	switch (d.action)
	{
		case REPLICATE_REFUSE_ADDRESS:
		case REPLICATE_REFUSE_LEADER:
		case REPLICATE_REFUSE_UNKNOWN:
		case REPLICATE_REFUSE_SENDER:
			refuse(&d, &f, s, what, target, target_incarnation);
			break;

		case REPLICATE_STEP_DOWN:
			/* deposed: stop leading first; who leads now is the next heartbeat's */
			(void) lease_step_down_locked(s, f.generation,
										  psprintf("a shipment of generation " UINT64_FORMAT " arrived", f.generation));
			f.we_lead = false;
			f.leader_known = false;
			d.action = REPLICATE_REFUSE_UNKNOWN;
			refuse(&d, &f, s, what, target, target_incarnation);
			break;

		case REPLICATE_ANSWER_FENCED:
			shard_unlock_tail(s);
			answer(fcinfo, "fenced", d.seq);
			break;

		case REPLICATE_ANSWER_GAP:
			shard_unlock_tail(s);
			answer(fcinfo, "gap", d.seq);
			break;

		case REPLICATE_ANSWER_STALE:
		case REPLICATE_ANSWER_NEEDS_BOOTSTRAP:
			shard_unlock_tail(s);
			answer(fcinfo, "needs_bootstrap", d.seq);
			break;

		case REPLICATE_ANSWER_CONFLICT:
			/* our copy differs where we cannot repair it: serve none of that */
			shard_mark_diverged_locked(s, d.seq);
			shard_unlock_tail(s);
			answer(fcinfo, "conflict", d.seq);
			break;

		case REPLICATE_DROP_THEN_GAP:
			{
				uint64		dropped_generation = s->log.last_generation;

				/*
				 * Our records from d.seq on are an earlier leader's proposals
				 * that a newer generation did not adopt, all above the mark
				 * (the rule checked; shard_truncate_to refuses otherwise).
				 * Answer with our new tail: the leader resends from there.
				 */
				shard_truncate_to_locked(s, d.seq);
				ereport(LOG,
						(errmsg("%s: dropped records from seq " UINT64_FORMAT " written at generation " UINT64_FORMAT ", which generation " UINT64_FORMAT " did not adopt",
								what, d.seq, dropped_generation, batches[f.mismatch].hdr.generation)));
				shard_unlock_tail(s);
				answer(fcinfo, "gap", d.seq);
			}
			break;

		case REPLICATE_BEGIN_AT:
			shard_begin_at_locked(s, d.seq, f.generation);
			shard_unlock_tail(s);
			felix_count(f.op == REPLICATE_REBUILD ? FELIX_CTR_COPIES_REBUILT :
						FELIX_CTR_COPIES_BOOTSTRAPPED, 1);
			answer(fcinfo, f.op == REPLICATE_REBUILD ? "rebuilt" : "bootstrapped", d.seq);
			break;

		case REPLICATE_APPEND:
			/* an empty copy left from an older incarnation is this one's now */
			if (f.copy_stale && f.tail == f.start_seq)
				shard_claim_copy_locked(s);
			/* Append the rest unchanged, noting each generation new to the log. */
			stop = append_shipped(s, dir, what, batches, f.nbelow, nbatches);

			/*
			 * Durable before the answer: the leader counts this node towards
			 * a quorum on the strength of it.  Sealed segments were synced
			 * when log_append sealed them; the active one is synced here.
			 */
			if (stop > f.nbelow)
			{
				log_sync(dir, what, s->log.active_base);
				felix_count(FELIX_CTR_BATCHES_REPLICATED, stop - f.nbelow);
			}
			if (stop < nbatches)
			{
				/* the histories part at batch `stop`: keep what came before */
				shard_after_replicated(s, Min((uint64) hwm_arg, batches[stop].hdr.base_seq));
				shard_mark_diverged_locked(s, batches[stop].hdr.base_seq);
				shard_unlock_tail(s);
				answer(fcinfo, "conflict", batches[stop].hdr.base_seq);
				break;
			}

			/*
			 * What our readers may see: at most what the leader says a
			 * majority holds, and only as far as this shipment has checked
			 * or written.
			 */
			shard_after_replicated(s, Min((uint64) hwm_arg, sent_end));
			shard_unlock_tail(s);
			answer(fcinfo, "stored", sent_end);
			break;
	}
	return (Datum) 0;
}
