/*-------------------------------------------------------------------------
 *
 * append.c
 *	  The follower's side of log shipping: felix.replicate(stream, shard,
 *	  generation, from_seq, leader_hwm_end, batches), called over libpq by
 *	  the shard's leader (ship.c), and the append rule it applies.
 *
 *	  Who may call it: only a node, as its felix_node_<name> role (a
 *	  member of felix_replication), and only the node this one knows to
 *	  lead the shipment's generation (superusers excepted): a generation it
 *	  has not heard of yet is refused until its next heartbeat tells it who
 *	  leads it (check_sender).  A peer
 *	  is checked, not believed: every record shipped is validated as a
 *	  value of the stream's payload type (payload.c) before anything is
 *	  stored, as COPY validates its input.
 *
 *	  The rule, in the order it is checked:
 *	   1. generation below this node's generation for the shard: the
 *		  sender is a superseded leader; answer ('fenced', tail) and store
 *		  or discard nothing.  A generation above ours is accepted -- the
 *		  control plane grants generations only to leaders, this node has
 *		  just not heard yet -- but it is not adopted here: that is the
 *		  assignment's job (shard_apply_assignment).  A node that leads the
 *		  shard itself stores nothing, whatever the generation.
 *	   2. from_seq past our tail: ('gap', tail), and the leader rewinds.
 *	   3. every shipped batch is verified (header CRC, body CRC, trailer,
 *		  contiguity) before anything else happens.
 *	   4. batches wholly below our tail are compared byte for byte with
 *		  what we store over the same span; a difference, or a batch that
 *		  straddles our tail, is ('conflict', that batch's first seq) --
 *		  unless the batch that found it is of a newer generation than the
 *		  newest this log holds and the difference lies at or after where
 *		  that older generation began here: then our records from there on
 *		  are an earlier leader's unadopted proposals, above the high-water
 *		  mark, and are dropped (log_truncate_after, which refuses to cut
 *		  at or below the mark), and the answer is ('gap', new tail).
 *	   5. the rest is appended unchanged (the leader stamped it), the
 *		  generation map noting any generation new to this log, and made
 *		  durable (fdatasync) BEFORE answering ('stored', end of the
 *		  batches sent) -- the end of what was compared or written, not our
 *		  tail, so the leader never moves past records nobody compared.  If
 *		  appending batch k fails, the batches of this call before it are
 *		  cut back: a failed shipment leaves the log as it was.
 *	  The high-water mark this node shows its readers then becomes
 *	  min(leader_hwm_end, durable end) (shard_after_replicated).
 *
 * Locking rule: the shard's append lock is held (shard_lock_tail) from
 * reading the generation and tail until the new tail is published, so no
 * other append, trim or truncation interleaves with a check and the bytes
 * it allowed.  The shipped bytes are verified before the lock is taken.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "api/catalog.h"
#include "api/payload.h"
#include "control/conninfo.h"
#include "felix.h"
#include "privilege.h"
#include "fmgr.h"
#include "funcapi.h"
#include "metrics.h"
#include "miscadmin.h"
#include "storage/format.h"
#include "storage/log.h"
#include "storage/shard.h"
#include "storage/spin.h"
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

	if (cut == 0 || b->hdr.generation <= ours)
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
					genmap_note(dir, what, b->hdr.generation, b->hdr.base_seq);
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

/*
 * The sender must be the leader this node knows for the generation it
 * ships at: a node logs in as felix_node_<name>, and the control plane told
 * this node who leads its generation.  A generation newer than any this
 * node has heard of is refused too, with FELIX_ERRCODE_GENERATION_UNKNOWN:
 * nobody can say yet who leads it, and this node learns it from the
 * control plane at its next heartbeat -- the leader retries soon.  (An
 * older generation was answered 'fenced' before this check.)  Superusers,
 * who may act for any node, pass.  Called with the tail held, which it
 * releases on refusal.
 */
static void
check_sender(FelixShard *s, const char *what, uint64 generation, uint64 shard_generation)
{
	char		leader[NAMEDATALEN];
	char	   *caller;

	if (superuser())
		return;
	SpinLockAcquire(&s->mutex);
	strlcpy(leader, s->leader, sizeof(leader));
	SpinLockRelease(&s->mutex);
	if (generation > shard_generation || leader[0] == '\0')
	{
		shard_unlock_tail(s);
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_GENERATION_UNKNOWN),
				 errmsg("%s: this node has not learned who leads generation " UINT64_FORMAT " yet",
						what, generation),
				 errdetail("It knows generation " UINT64_FORMAT "%s%s%s.", shard_generation,
						   leader[0] ? ", led by \"" : "", leader, leader[0] ? "\"" : ""),
				 errhint("The leader retries; this node learns of the generation from the control plane at its next heartbeat.")));
	}
	caller = GetUserNameFromId(GetSessionUserId(), false);
	if (strcmp(caller, felix_node_role(leader)) == 0)
		return;
	shard_unlock_tail(s);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("%s: role \"%s\" may not ship generation " UINT64_FORMAT ", which node \"%s\" leads",
					what, caller, generation, leader),
			 errhint("Only the shard's leader ships to its followers, as role %s.",
					 felix_node_role(leader))));
}

PG_FUNCTION_INFO_V1(felix_replicate);
Datum
felix_replicate(PG_FUNCTION_ARGS)
{
	char	   *stream_name;
	int32		shard;
	int64		generation_arg;
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
	uint64		generation;
	uint64		from_seq;
	uint64		sent_end;
	uint64		shard_generation;
	FelixRole	role;
	uint64		tail;
	uint64		start_seq;
	int			nbelow;
	int			mismatch;
	bool		appended;
	int			stop;

	felix_require_preload();
	felix_require_replication_role("felix.replicate");
	for (int i = 0; i < 6; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("felix.replicate: argument %d must not be NULL", i + 1),
					 errhint("felix.replicate is called by a shard's leader, not by users.")));
	stream_name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	shard = PG_GETARG_INT32(1);
	generation_arg = PG_GETARG_INT64(2);
	from_arg = PG_GETARG_INT64(3);
	hwm_arg = PG_GETARG_INT64(4);
	shipment = PG_GETARG_BYTEA_PP(5);
	if (generation_arg <= 0 || from_arg < 0 || hwm_arg < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.replicate for stream \"%s\" shard %d: generation must be positive and positions not negative",
						stream_name, shard),
				 errhint("felix.replicate is called by a shard's leader, not by users.")));
	generation = (uint64) generation_arg;
	from_seq = (uint64) from_arg;

	InitMaterializedSRF(fcinfo, 0);

	stream = felix_stream_by_name(stream_name);
	stream_copy = *stream;
	felix_check_shard(&stream_copy, shard);
	s = felix_stream_shard(&stream_copy, shard);
	what = shard_what(s);
	shard_dir(s, dir);

	/* 3. Verify everything shipped before looking at our log. */
	batches = verify_shipment(what, VARDATA_ANY(shipment),
							  VARSIZE_ANY_EXHDR(shipment), from_seq,
							  generation, stream_copy.payload_type, &nbatches);
	sent_end = nbatches > 0 ?
		batches[nbatches - 1].hdr.base_seq + batches[nbatches - 1].hdr.count :
		from_seq;

	shard_lock_tail(s);

	SpinLockAcquire(&s->mutex);
	shard_generation = s->generation;
	role = s->role;
	SpinLockRelease(&s->mutex);
	tail = s->log.next_seq;
	start_seq = s->log.start_seq;

	/* 1. A superseded leader can make us store or discard nothing. */
	if (generation < shard_generation)
	{
		shard_unlock_tail(s);
		answer(fcinfo, "fenced", tail);
		return (Datum) 0;
	}
	/*
	 * Only a follower stores shipments.  A leader at the shipment's
	 * generation means two nodes believe they lead it; a leader at an older
	 * one was deposed and has not heard yet -- either way nothing of the
	 * shipment may land in a log this node serves writes from.
	 */
	if (role == FELIX_ROLE_LEADER)
	{
		shard_unlock_tail(s);
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_NOT_LEADER),
				 errmsg("%s: this node leads the shard at generation " UINT64_FORMAT " and takes no shipment for it (sent at generation " UINT64_FORMAT ")",
						what, shard_generation, generation),
				 errhint(generation == shard_generation ?
						 "Two nodes believe they lead the same generation; check felix_shards on both and the control plane's assignments." :
						 "This node will learn of the newer generation from the control plane and follow it.")));
	}
	check_sender(s, what, generation, shard_generation);

	/* 2. We lack records before the shipment: the leader rewinds to our tail. */
	if (from_seq > tail)
	{
		shard_unlock_tail(s);
		answer(fcinfo, "gap", tail);
		return (Datum) 0;
	}

	/* 4. The overlap with what we hold must agree byte for byte. */
	nbelow = 0;
	while (nbelow < nbatches &&
		   batches[nbelow].hdr.base_seq + batches[nbelow].hdr.count <= tail)
		nbelow++;
	if (nbelow < nbatches && batches[nbelow].hdr.base_seq < tail)
	{
		/* straddles our tail: our last batch and the leader's disagree */
		mismatch = nbelow;
	}
	else
		mismatch = -1;
	if (nbelow > 0)
	{
		int			m = compare_overlap(dir, what, batches, nbelow, start_seq);

		if (m >= 0)
			mismatch = m;
	}
	if (mismatch >= 0)
	{
		uint64		cut = batches[mismatch].hdr.base_seq;

		if (divergence_droppable(s, dir, what, &batches[mismatch], cut))
		{
			/*
			 * Our records from `cut` on are an earlier leader's proposals
			 * that a newer generation did not adopt.  They lie above the
			 * high-water mark (log_truncate_after refuses otherwise), so
			 * dropping them rewrites nothing acknowledged.  Answer with our
			 * new tail: the leader resends from there.
			 */
			uint64		hwm;
			uint64		dropped_generation = s->log.last_generation;

			SpinLockAcquire(&s->mutex);
			hwm = s->hwm_end;
			SpinLockRelease(&s->mutex);
			log_truncate_after(dir, what, &s->log, cut - 1, hwm);
			shard_after_replicated(s, 0);
			ereport(LOG,
					(errmsg("%s: dropped records from seq " UINT64_FORMAT " written at generation " UINT64_FORMAT ", which generation " UINT64_FORMAT " did not adopt",
							what, cut, dropped_generation, batches[mismatch].hdr.generation)));
			tail = s->log.next_seq;
			shard_unlock_tail(s);
			answer(fcinfo, "gap", tail);
			return (Datum) 0;
		}
		shard_unlock_tail(s);
		answer(fcinfo, "conflict", cut);
		return (Datum) 0;
	}

	/* 5. Append the rest unchanged, noting each generation new to the log. */
	stop = append_shipped(s, dir, what, batches, nbelow, nbatches);
	appended = stop > nbelow;
	if (stop < nbatches)
	{
		/* the appended part before the conflict is kept, made durable */
		if (appended)
		{
			log_sync(dir, what, s->log.active_base);
			shard_after_replicated(s, Min((uint64) hwm_arg, batches[stop].hdr.base_seq));
		}
		shard_unlock_tail(s);
		answer(fcinfo, "conflict", batches[stop].hdr.base_seq);
		return (Datum) 0;
	}

	/*
	 * Durable before the answer: the leader counts this node towards a
	 * quorum on the strength of it.  Sealed segments were synced when
	 * log_append sealed them; the active one is synced here.
	 */
	if (appended)
	{
		log_sync(dir, what, s->log.active_base);
		felix_count(FELIX_CTR_BATCHES_REPLICATED, nbatches - nbelow);
	}

	/*
	 * What our readers may see: at most what the leader says a majority
	 * holds, and only as far as this shipment has checked or written.
	 */
	shard_after_replicated(s, Min((uint64) hwm_arg, sent_end));
	shard_unlock_tail(s);

	answer(fcinfo, "stored", sent_end);
	return (Datum) 0;
}
