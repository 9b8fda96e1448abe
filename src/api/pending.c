/*-------------------------------------------------------------------------
 *
 * pending.c
 *	  Transactional INSERT and COPY into a stream.  Rows are encoded into a
 *	  per-shard batch buffer as they arrive and appended at pre-commit, one
 *	  batch per shard (a shard's part over FELIX_COMMIT_BATCH_BYTES as
 *	  several batches appended together, so seeks stay short).  An abort
 *	  drops everything; a rollback to a savepoint drops what was added since
 *	  the savepoint; PREPARE TRANSACTION with buffered rows is refused,
 *	  because a prepared transaction may commit in another session that has
 *	  none of this backend's memory.
 *
 *	  Savepoints: within one buffer, everything added after a subtransaction
 *	  began belongs to that subtransaction or its descendants, so it is a
 *	  suffix.  A mark {subid, len, count} is pushed the first time a
 *	  subtransaction adds to a buffer; aborting subtransaction X restores the
 *	  oldest mark with subid >= X (sub ids grow monotonically, and every
 *	  subtransaction begun after X while X is open descends from X).
 *
 *	  Records are appended in the pre-commit callback, before the commit
 *	  record is written: an append error aborts the transaction cleanly,
 *	  and what the commit had appended on any shard is cut back, so a
 *	  failed commit publishes nothing (leader_commit).  The residual
 *	  window — appended, then the commit itself fails — is the
 *	  crash-during-commit case and is documented in docs/sql-api.md.
 *
 *	  A transaction buffers at most felix.max_transaction_bytes; a row
 *	  that would take it past is refused before its memory is taken.  The
 *	  streams' owners' byte caps (felix.max_bytes_per_role) are checked at
 *	  commit, once, over everything the commit appends (publish.c).
 *
 *	  A row that brings its seq is a restored record (restore_add): it
 *	  keeps its seq and published_at, goes in batches of its own (one per
 *	  run of equal published_at), and the commit appends them only at the
 *	  very seqs they had (shard_append_locked): a restore never renumbers.
 *
 * Locking rule: backend-local.  The INSERT already holds RowExclusiveLock
 * on the stream's table until commit, so the stream cannot be dropped
 * between buffering and appending.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "core/catalog.h"
#include "api/forward.h"
#include "api/pending.h"
#include "api/publish.h"
#include "felix.h"
#include "miscadmin.h"
#include "replication/leader.h"
#include "storage/shard.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

/* Largest total a transaction may buffer for one shard. */
#define FELIX_MAX_PENDING_BYTES		(512 * 1024 * 1024)

/* Size of the batches a large commit is appended in. */
#define FELIX_COMMIT_BATCH_BYTES	(1024 * 1024)

typedef struct PendingMark
{
	SubTransactionId subid;
	int			len;
	uint32		count;
} PendingMark;

typedef struct PendingShard
{
	const FelixStream *stream;	/* copied into pending_cxt */
	int			shard;
	StringInfoData buf;			/* batch_begin'd; records appended */
	uint32		count;
	List	   *marks;			/* PendingMark *, oldest first */
	List	   *roles;			/* OIDs of the roles that inserted rows */

	/*
	 * Restored records (rows that bring their seq and published_at, as a
	 * pg_dump restore's COPY does): one batch per run of equal
	 * published_at, at most FELIX_COMMIT_BATCH_BYTES each.
	 */
	bool		restore;
	uint64		restore_first;	/* seq of the first restored row */
	uint64		restore_next;	/* seq the next one must have */
	StringInfo *rbatches;
	uint32	   *rcounts;
	TimestampTz *rstamps;
	int			nrbatches;
	int			rcap;
} PendingShard;

static MemoryContext pending_cxt = NULL;	/* child of TopTransactionContext */
static List *pending = NIL;		/* PendingShard * */
static Size pending_bytes = 0;	/* sum of every buffer's length */

static PendingShard *
pending_shard(const FelixStream *stream, int shard)
{
	ListCell   *lc;
	PendingShard *ps;
	MemoryContext old;

	foreach(lc, pending)
	{
		ps = lfirst(lc);
		if (ps->stream->relid == stream->relid && ps->shard == shard)
			return ps;
	}

	if (pending_cxt == NULL)
		pending_cxt = AllocSetContextCreate(TopTransactionContext,
											"felix pending records",
											ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(pending_cxt);
	ps = palloc0(sizeof(PendingShard));
	ps->stream = memcpy(palloc(sizeof(FelixStream)), stream, sizeof(FelixStream));
	ps->shard = shard;
	initStringInfo(&ps->buf);
	batch_begin(&ps->buf);
	pending = lappend(pending, ps);
	MemoryContextSwitchTo(old);
	return ps;
}

static void
pending_mark(PendingShard *ps)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	PendingMark *top = ps->marks ? llast(ps->marks) : NULL;

	if (subid == TopSubTransactionId || (top != NULL && top->subid == subid))
		return;
	{
		MemoryContext old = MemoryContextSwitchTo(pending_cxt);
		PendingMark *m = palloc(sizeof(PendingMark));

		m->subid = subid;
		m->len = ps->buf.len;
		m->count = ps->count;
		ps->marks = lappend(ps->marks, m);
		MemoryContextSwitchTo(old);
	}
}

static void
refuse_column(const FelixStream *stream, const char *column)
{
	ereport(ERROR,
			(errcode(ERRCODE_GENERATED_ALWAYS),
			 errmsg("stream \"%s\": column \"%s\" is assigned by felix", stream->name, column),
			 errhint("Leave \"%s\" out of the INSERT; felix fills it in when the record is published.",
					 column)));
}

/*
 * A restored row: it keeps the seq and published_at it was dumped with.
 * Only the stream's owner restores; a shard's restored rows come in seq
 * order with no gap, into a shard that holds no records when the
 * transaction commits (shard_append_locked checks that under the tail
 * lock), and not mixed with new records.  Nothing is ever renumbered.
 */
static void
restore_add(const FelixStream *stream, TupleTableSlot *slot, PendingShard *ps,
			const char *key, int key_len, const char *bytes, uint32 len)
{
	uint64		seq;
	TimestampTz ts = DatumGetTimestampTz(slot->tts_values[FELIX_ATTNUM_PUBLISHED_AT - 1]);
	int64		given = DatumGetInt64(slot->tts_values[FELIX_ATTNUM_SEQ - 1]);
	StringInfo	cur;
	MemoryContext old;

	if (!pg_class_ownercheck(stream->relid, GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("stream \"%s\" shard %d: only the stream's owner may restore records with their seq",
						stream->name, ps->shard),
				 errhint("Leave \"seq\" and \"published_at\" out to publish new records, or restore as the owner.")));
	if (GetCurrentTransactionNestLevel() > 1)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("stream \"%s\" shard %d: records cannot be restored inside a savepoint",
						stream->name, ps->shard),
				 errhint("Restore the stream's records in a transaction of their own, as pg_restore and psql do.")));
	if (given < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d: seq " INT64_FORMAT " is negative",
						stream->name, ps->shard, given),
				 errhint("Restore the rows pg_dump wrote, unchanged.")));
	seq = (uint64) given;
	if (ps->count > 0 && !ps->restore)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("stream \"%s\" shard %d: restored records and new records cannot share a transaction",
						stream->name, ps->shard),
				 errhint("Restore the records first and commit, then publish new ones.")));
	if (ps->restore && seq != ps->restore_next)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d: restored records must have contiguous seqs, but seq " UINT64_FORMAT " follows seq " UINT64_FORMAT,
						stream->name, ps->shard, seq, ps->restore_next - 1),
				 errdetail("felix keeps every record at the seq it was dumped with and never renumbers them."),
				 errhint("Restore each shard's rows complete and in seq order, as pg_dump wrote them.")));

	old = MemoryContextSwitchTo(pending_cxt);
	if (!ps->restore)
	{
		ps->restore = true;
		ps->restore_first = seq;
		ps->rcap = 8;
		ps->rbatches = palloc(sizeof(StringInfo) * ps->rcap);
		ps->rcounts = palloc(sizeof(uint32) * ps->rcap);
		ps->rstamps = palloc(sizeof(TimestampTz) * ps->rcap);
	}
	cur = ps->nrbatches > 0 ? ps->rbatches[ps->nrbatches - 1] : NULL;
	if (cur == NULL || ps->rstamps[ps->nrbatches - 1] != ts ||
		(Size) cur->len + len + FELIX_RECORD_OVERHEAD + Max(key_len, 0) > FELIX_COMMIT_BATCH_BYTES)
	{
		if (ps->nrbatches == ps->rcap)
		{
			ps->rcap *= 2;
			ps->rbatches = repalloc(ps->rbatches, sizeof(StringInfo) * ps->rcap);
			ps->rcounts = repalloc(ps->rcounts, sizeof(uint32) * ps->rcap);
			ps->rstamps = repalloc(ps->rstamps, sizeof(TimestampTz) * ps->rcap);
		}
		cur = makeStringInfo();
		batch_begin(cur);
		ps->rbatches[ps->nrbatches] = cur;
		ps->rcounts[ps->nrbatches] = 0;
		ps->rstamps[ps->nrbatches] = ts;
		ps->nrbatches++;
	}
	{
		int			before = cur->len;

		batch_add(cur, key, key_len, bytes, len);
		pending_bytes += cur->len - before;
	}
	MemoryContextSwitchTo(old);
	ps->rcounts[ps->nrbatches - 1]++;
	ps->restore_next = seq + 1;
	ps->count++;
}

int
pending_add(const FelixStream *stream, TupleTableSlot *slot)
{
	bool		isnull;
	Datum		d;
	int64		shard_arg = -1;
	const char *key = NULL;
	int			key_len = -1;
	int			shard;
	const char *bytes;
	uint32		len;
	Size		need;
	PendingShard *ps;

	bool		restoring;

	/*
	 * PostgreSQL checks a serializable transaction for conflicts after the
	 * pre-commit callbacks, so after the records were published: a
	 * serialization failure there would invite a retry that publishes them
	 * again.
	 */
	if (IsolationIsSerializable())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot insert into stream \"%s\" in a SERIALIZABLE transaction", stream->name),
				 errdetail("A serialization failure would come after the records were published, and a retry would publish them again."),
				 errhint("Insert in a READ COMMITTED or REPEATABLE READ transaction, or publish with felix_publish.")));
	slot_getallattrs(slot);

	/* a row with its seq is a restored record: shard and published_at too */
	restoring = !slot->tts_isnull[FELIX_ATTNUM_SEQ - 1];
	if (!restoring && !slot->tts_isnull[FELIX_ATTNUM_PUBLISHED_AT - 1])
		refuse_column(stream, "published_at");
	if (restoring && (slot->tts_isnull[FELIX_ATTNUM_SHARD - 1] ||
					  slot->tts_isnull[FELIX_ATTNUM_PUBLISHED_AT - 1]))
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("stream \"%s\": a restored record needs its shard, seq and published_at",
						stream->name),
				 errhint("Leave \"seq\" out to publish a new record; restore rows as pg_dump wrote them.")));

	d = slot->tts_values[FELIX_ATTNUM_SHARD - 1];
	isnull = slot->tts_isnull[FELIX_ATTNUM_SHARD - 1];
	if (!isnull)
	{
		shard_arg = DatumGetInt32(d);
		felix_check_shard(stream, shard_arg);
	}
	if (!slot->tts_isnull[FELIX_ATTNUM_KEY - 1])
	{
		text	   *k = DatumGetTextPP(slot->tts_values[FELIX_ATTNUM_KEY - 1]);

		key = VARDATA_ANY(k);
		key_len = VARSIZE_ANY_EXHDR(k);
	}

	shard = publish_route(stream, shard_arg, key, key_len);
	publish_payload_bytes(stream, shard,
						  slot->tts_values[FELIX_ATTNUM_PAYLOAD - 1],
						  slot->tts_isnull[FELIX_ATTNUM_PAYLOAD - 1],
						  stream->payload_type, &bytes, &len, key_len);

	ps = pending_shard(stream, shard);
	need = len + FELIX_RECORD_OVERHEAD + Max(key_len, 0);
	if (!restoring && ps->restore)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("stream \"%s\" shard %d: restored records and new records cannot share a transaction",
						stream->name, shard),
				 errhint("Restore the records first and commit, then publish new ones.")));
	/* Refused before the memory is taken, never after. */
	if (pending_bytes + need > (Size) felix_max_transaction_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("transaction would buffer more than felix.max_transaction_bytes (%d bytes) of records; "
						"refused at stream \"%s\" shard %d",
						felix_max_transaction_bytes, stream->name, shard),
				 errdetail("Rows inserted into a stream wait in the session's memory until COMMIT."),
				 errhint("Commit in smaller transactions, or publish with felix_publish_batch.")));
	if ((Size) ps->buf.len + need > FELIX_MAX_PENDING_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("transaction buffers more than %d bytes for stream \"%s\" shard %d",
						FELIX_MAX_PENDING_BYTES, stream->name, shard),
				 errhint("Commit in smaller transactions, or use felix_publish_batch.")));
	if (restoring)
	{
		restore_add(stream, slot, ps, key, key_len, bytes, len);
		return shard;
	}
	pending_mark(ps);
	{
		MemoryContext old = MemoryContextSwitchTo(pending_cxt);
		int			before = ps->buf.len;

		/* a leader elsewhere checks the inserting roles' rights again */
		ps->roles = list_append_unique_oid(ps->roles, GetUserId());
		batch_add(&ps->buf, key, key_len, bytes, len);
		pending_bytes += ps->buf.len - before;
		MemoryContextSwitchTo(old);
	}
	ps->count++;
	return shard;
}

/*
 * A shard's buffered records as the batches they are appended in: up to
 * FELIX_COMMIT_BATCH_BYTES the one batch they were buffered in; a larger
 * buffer re-encoded into batches of about that size, so that a seek into
 * the shard never has to read and check more than one such batch.
 * Returns the number of batches (*batches and *counts palloc'd).
 */
static int
pending_batches(PendingShard *ps, StringInfo **batches_out, uint32 **counts_out)
{
	FelixBatchHeader h;
	FelixBatchIter it;
	FelixRecord rec;
	StringInfo *batches;
	uint32	   *counts;
	int			n = 0;
	int			max_batches;

	if (ps->buf.len <= FELIX_COMMIT_BATCH_BYTES)
	{
		batch_seal_body(&ps->buf, FELIX_BATCH_RECORDS);
		*batches_out = palloc(sizeof(StringInfo));
		(*batches_out)[0] = &ps->buf;
		*counts_out = palloc(sizeof(uint32));
		(*counts_out)[0] = ps->count;
		return 1;
	}

	/* batch_add keeps the buffer's header count current: walk it as is. */
	max_batches = ps->buf.len / (FELIX_COMMIT_BATCH_BYTES / 2) + 2;
	batches = palloc(sizeof(StringInfo) * max_batches);
	counts = palloc0(sizeof(uint32) * max_batches);
	memcpy(&h, ps->buf.data, sizeof(h));
	batch_iter_init(&it, &h, ps->buf.data + sizeof(FelixBatchHeader));
	while (batch_iter_next(&it, &rec))
	{
		Size		need = FELIX_RECORD_OVERHEAD + rec.payload_len +
			(rec.key ? rec.key_len : 0);

		if (n == 0 || (counts[n - 1] > 0 &&
					   (Size) batches[n - 1]->len + need > FELIX_COMMIT_BATCH_BYTES))
		{
			Assert(n < max_batches);
			batches[n] = makeStringInfo();
			batch_begin(batches[n]);
			n++;
		}
		batch_add(batches[n - 1], rec.key, rec.key ? (int32) rec.key_len : -1,
				  rec.payload, rec.payload_len);
		counts[n - 1]++;
	}
	for (int i = 0; i < n; i++)
		batch_seal_body(batches[i], FELIX_BATCH_RECORDS);
	*batches_out = batches;
	*counts_out = counts;
	return n;
}

/*
 * Publish every buffered record, or none: one part per shard, committed
 * together by the leader's write path (leader_commit: all shards'
 * batches down before any is published, all cut back if one fails), or,
 * when other nodes lead some of the shards and felix.forward_publishes is
 * on, staged at every leader before any is published (forward_commit).
 * The owners' byte caps are checked once per leader, for its parts,
 * before anything is appended.
 */
static void
pending_publish_all(void)
{
	ListCell   *lc;
	FelixCommitPart *parts;
	PublishCharge *charges;
	List	  **roles;
	int			n = 0;

	parts = palloc0(sizeof(FelixCommitPart) * Max(list_length(pending), 1));
	charges = palloc0(sizeof(PublishCharge) * Max(list_length(pending), 1));
	roles = palloc0(sizeof(List *) * Max(list_length(pending), 1));
	foreach(lc, pending)
	{
		PendingShard *ps = lfirst(lc);

		if (ps->count == 0)
			continue;
		parts[n].s = felix_stream_shard(ps->stream, ps->shard);
		if (ps->restore)
		{
			for (int i = 0; i < ps->nrbatches; i++)
				batch_seal_body(ps->rbatches[i], FELIX_BATCH_RECORDS);
			parts[n].batches = ps->rbatches;
			parts[n].counts = ps->rcounts;
			parts[n].nbatches = ps->nrbatches;
			parts[n].restore = true;
			parts[n].restore_at = ps->restore_first;
			parts[n].stamps = ps->rstamps;
		}
		else
			parts[n].nbatches = pending_batches(ps, &parts[n].batches, &parts[n].counts);
		charges[n].stream = ps->stream;
		roles[n] = ps->roles;
		for (int i = 0; i < parts[n].nbatches; i++)
			charges[n].bytes += parts[n].batches[i]->len;
		n++;
	}
	if (n == 0)
		return;
	if (forward_commit_wanted(parts, n))
	{
		/* some shards are led elsewhere: each leader checks its own caps */
		forward_commit(parts, charges, roles, n);
		return;
	}
	publish_check_bytes(charges, n);
	leader_commit(parts, n);
}

static void
pending_forget(void)
{
	/* The memory goes with TopTransactionContext. */
	pending = NIL;
	pending_cxt = NULL;
	pending_bytes = 0;
}

static void
pending_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* An error here aborts the transaction, whose abort forgets. */
			pending_publish_all();
			pending_forget();
			break;
		case XACT_EVENT_PRE_PREPARE:
			{
				ListCell   *lc;

				foreach(lc, pending)
				{
					PendingShard *ps = lfirst(lc);

					if (ps->count > 0)
						ereport(ERROR,
								(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
								 errmsg("cannot PREPARE a transaction that inserted into stream \"%s\"",
										ps->stream->name),
								 errhint("Commit the INSERT in an ordinary transaction, or publish with felix_publish.")));
				}
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			pending_forget();
			break;
		default:
			break;
	}
}

static void
pending_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;

	foreach(lc, pending)
	{
		PendingShard *ps = lfirst(lc);
		ListCell   *mc;

		foreach(mc, ps->marks)
		{
			PendingMark *m = lfirst(mc);

			if (m->subid >= mySubid)
			{
				pending_bytes -= ps->buf.len - m->len;
				ps->buf.len = m->len;
				ps->buf.data[ps->buf.len] = '\0';
				ps->count = m->count;
				/* batch_add keeps the header's count current: restore it too */
				memcpy(ps->buf.data + offsetof(FelixBatchHeader, count),
					   &m->count, sizeof(uint32));
				ps->marks = list_truncate(ps->marks, foreach_current_index(mc));
				break;
			}
		}
	}
}

void
pending_init(void)
{
	RegisterXactCallback(pending_xact_callback, NULL);
	RegisterSubXactCallback(pending_subxact_callback, NULL);
}
