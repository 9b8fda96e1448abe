/*-------------------------------------------------------------------------
 *
 * tableam.c
 *	  The felix table access method.  A stream's table owns no heap pages:
 *	  its rows are the records of its shards' segment logs.  Reading walks
 *	  shards 0..N-1 and, in each, seqs [start_seq, hwm_end) through the
 *	  storage layer's reader -- or, for a shard this node holds no copy
 *	  of, from one of its replicas (remote.c) -- so rows always come out
 *	  in (shard, seq) order.  Writing (INSERT, COPY) hands each row to pending.c, which
 *	  buffers it and appends at commit.  Everything a log cannot do —
 *	  change or remove one row, lock it, find it by ctid, index it — raises
 *	  a clear error here; refuse.c usually refuses the same statements
 *	  earlier, and these errors are the backstop.
 *
 *	  FelixCursor is the one reader of stream rows: the sequential scan,
 *	  ANALYZE sampling and the FelixScan custom scan (scan.c) all use it.
 *
 *	  Visibility: a cursor snapshots each shard's [start_seq, hwm_end) the
 *	  first time it reaches that shard and keeps it, so one scan node sees
 *	  a stable set of records across rescans.  Records appended later, and
 *	  records another transaction has buffered but not committed, are not
 *	  seen.  A transaction's own INSERTed rows are buffered until commit and
 *	  so are not seen by its own SELECTs either.
 *
 * Locking rule: no felix lock is taken here.  The executor holds at least
 * AccessShareLock on the stream's table for the whole scan, so the stream
 * (and its shard slots) cannot be dropped underneath a cursor; reads stay
 * below the snapshotted hwm_end, where bytes are never rewritten (see
 * log.h), so they need no shard lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/multixact.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "am/am.h"
#include "am/remote.h"
#include "core/catalog.h"
#include "core/payload.h"
#include "api/pending.h"
#include "catalog/pg_type.h"
#include "catalog/index.h"
#include "catalog/storage.h"
#include "commands/vacuum.h"
#include "executor/tuptable.h"
#include "felix.h"
#include "base/isolate.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "storage/log.h"
#include "storage/shard.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(felix_tableam_handler);

static BlockNumber sample_layout(const FelixStream *stream, BlockNumber *first,
								 uint64 *start, uint64 *end);

/* ---------------------------------------------------------------------
 * FelixCursor
 * ---------------------------------------------------------------------
 */

/* One shard's visible range, snapshotted on first use. */
typedef struct CursorShard
{
	bool		taken;
	bool		elsewhere;		/* no copy here: read from a replica */
	bool		end_known;		/* elsewhere: end fixed by the first read */
	uint64		start;			/* visible [start, end) */
	uint64		end;
	uint64		unchecked_lo;	/* records in [lo, hi) are checked (see below) */
	uint64		unchecked_hi;
	FelixShard *slot;
} CursorShard;

struct FelixCursor
{
	FelixStream stream;			/* copy: the catalog cache may be reset */
	MemoryContext mcxt;			/* reader, buffers, shard array */
	CursorShard *shards;		/* stream.shards entries */

	/* requested range; hi bounds exclusive */
	int32		shard_lo;
	int32		shard_hi;
	uint64		seq_lo;
	uint64		seq_hi;
	bool		needed[FELIX_NATTS];

	/*
	 * Sampling mode (ANALYZE): the reader runs to the shard's visible end
	 * and is kept open between blocks, so consecutive blocks continue it
	 * instead of seeking again.
	 */
	bool		sampling;

	/* Read only this node's copies (felix.read_shard answering a peer). */
	bool		local_only;

	/* position */
	int32		cur;			/* shard being read; shard_hi when done */
	FelixLogReader *reader;		/* open on shard `cur`, or NULL */
	FelixRemoteReader *remote;	/* ... or this, for a shard held elsewhere */
	char	   *what;			/* shard_what() of `cur`, for the reader */
	uint64		next_seq;		/* seq the next record should have */
	uint64		cur_hi;			/* stop before this seq in `cur` */

	/* varlena buffers for the row being returned */
	char	   *keybuf;
	Size		keycap;
	char	   *paybuf;
	Size		paycap;

	uint64		records;
};

FelixCursor *
felix_cursor_begin(const FelixStream *stream)
{
	MemoryContext mcxt;
	FelixCursor *c;

	mcxt = AllocSetContextCreate(CurrentMemoryContext, "felix cursor",
								 ALLOCSET_DEFAULT_SIZES);
	c = MemoryContextAllocZero(mcxt, sizeof(FelixCursor));
	c->mcxt = mcxt;
	c->stream = *stream;
	c->shards = MemoryContextAllocZero(mcxt, sizeof(CursorShard) * Max(stream->shards, 1));
	for (int i = 0; i < FELIX_NATTS; i++)
		c->needed[i] = true;
	felix_cursor_set_range(c, 0, stream->shards, 0, PG_UINT64_MAX);
	return c;
}

static void
cursor_close_reader(FelixCursor *c)
{
	if (c->reader != NULL)
	{
		log_reader_close(c->reader);
		c->reader = NULL;
	}
	if (c->remote != NULL)
	{
		remote_reader_close(c->remote);
		c->remote = NULL;
	}
	if (c->what != NULL)
	{
		pfree(c->what);
		c->what = NULL;
	}
}

void
felix_cursor_set_range(FelixCursor *c, int32 shard_lo, int32 shard_hi,
					   uint64 seq_lo, uint64 seq_hi)
{
	cursor_close_reader(c);
	c->shard_lo = Max(shard_lo, 0);
	c->shard_hi = Min(shard_hi, c->stream.shards);
	if (c->shard_hi < c->shard_lo)
		c->shard_hi = c->shard_lo;
	c->seq_lo = seq_lo;
	c->seq_hi = seq_hi;
	c->cur = c->shard_lo;
	c->next_seq = 0;
	c->cur_hi = 0;
}

void
felix_cursor_set_local(FelixCursor *c)
{
	c->local_only = true;
}

void
felix_cursor_set_columns(FelixCursor *c, const bool *needed)
{
	memcpy(c->needed, needed, sizeof(c->needed));
}

uint64
felix_cursor_records(FelixCursor *c)
{
	return c->records;
}

void
felix_cursor_end(FelixCursor *c)
{
	cursor_close_reader(c);
	MemoryContextDelete(c->mcxt);
}

/* Snapshot shard i's visible range (opening the shard if needed). */
static CursorShard *
cursor_take(FelixCursor *c, int32 i)
{
	CursorShard *cs = &c->shards[i];

	if (!cs->taken)
	{
		cs->slot = felix_stream_shard(&c->stream, i);
		/*
		 * A shard this node holds no copy of is read from a replica; its
		 * visible end is that replica's mark, learned by the first read.
		 * (ANALYZE samples only what is here.)
		 */
		cs->elsewhere = !c->local_only && !c->sampling &&
			remote_shard_elsewhere(cs->slot);
		if (cs->elsewhere)
		{
			cs->start = 0;
			cs->end = PG_UINT64_MAX;
		}
		else
		{
			shard_visible(cs->slot, &cs->start, &cs->end);
			shard_unchecked(cs->slot, &cs->unchecked_lo, &cs->unchecked_hi);
		}
		cs->taken = true;
	}
	return cs;
}

/* Open the reader on shard `cur`; false if nothing of it lies in range. */
static bool
cursor_open(FelixCursor *c)
{
	CursorShard *cs = cursor_take(c, c->cur);
	uint64		lo = Max(c->seq_lo, cs->start);
	uint64		hi = Min(c->seq_hi, cs->end);
	char		dir[MAXPGPATH];
	MemoryContext old;

	if (lo >= hi)
		return false;

	if (cs->elsewhere)
	{
		uint64		end;

		old = MemoryContextSwitchTo(c->mcxt);
		c->remote = remote_reader_open(&c->stream, c->cur, lo, hi, &end);
		MemoryContextSwitchTo(old);
		if (!cs->end_known)
		{
			/* the first read fixes what this cursor sees of the shard */
			cs->end = Max(end, lo);
			cs->end_known = true;
		}
		c->next_seq = lo;
		c->cur_hi = Min(hi, cs->end);
		return true;
	}

	old = MemoryContextSwitchTo(c->mcxt);
	shard_dir(cs->slot, dir);
	c->what = shard_what(cs->slot);
	/*
	 * The reader seeks through the sparse index to `lo`, so a read that
	 * starts deep in a shard costs the same as one at its start.
	 */
	c->reader = log_reader_open(dir, c->what, lo, c->sampling ? cs->end : hi);
	MemoryContextSwitchTo(old);
	c->next_seq = lo;
	c->cur_hi = hi;
	return true;
}

/* A varlena of `len` bytes in a reusable buffer; valid until the next row. */
static Datum
cursor_varlena(FelixCursor *c, char **buf, Size *cap, const char *bytes, uint32 len)
{
	Size		need = VARHDRSZ + (Size) len;

	if (need > *cap)
	{
		Size		newcap = Max(need, Max(*cap * 2, 256));

		if (*buf != NULL)
			pfree(*buf);
		*buf = MemoryContextAlloc(c->mcxt, newcap);
		*cap = newcap;
	}
	SET_VARSIZE(*buf, need);
	memcpy(*buf + VARHDRSZ, bytes, len);
	return PointerGetDatum(*buf);
}

/*
 * A record becomes values of text and of the stream's payload type only
 * if its key and payload are valid ones: bytes that are not would be
 * trusted by jsonb_out, the jsonb operators and the text functions, which
 * may crash on them, and a node must never crash on what a peer sent or a
 * file held.  Checked here: every record read from a peer, and every
 * record of this node's segment files as they were when the shard opened,
 * until the node worker has checked those once (shard_unchecked).
 * Records appended since were checked before they were written (a value
 * PostgreSQL made, or a shipment verified by append.c), and CRC-32C
 * catches damage to them; checking every record on every read would cost
 * a full scan three times its time (docs/security.md).
 */
static void
cursor_check_record(FelixCursor *c, int32 shard, const FelixRecord *rec,
					bool key, bool payload)
{
	char	   *why = NULL;
	bool		bad_key = key && rec->key != NULL &&
		!payload_is_valid(TEXTOID, rec->key, rec->key_len, &why);

	if (!bad_key && (!payload ||
					 payload_is_valid(c->stream.payload_type, rec->payload,
									  rec->payload_len, &why)))
		return;
	felix_count(FELIX_CTR_CORRUPTIONS_DETECTED, 1);
	if (c->remote != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("stream \"%s\" shard %d: the record at seq " UINT64_FORMAT " read from node \"%s\" is not a valid %s: %s",
						c->stream.name, shard, rec->seq, remote_reader_node(c->remote),
						bad_key ? "key" : format_type_be(c->stream.payload_type), why),
				 errhint("Read the shard on another replica (felix_shards lists them), and check that node's felix version and its copy of the shard.")));
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("stream \"%s\" shard %d: the record at seq " UINT64_FORMAT " in this node's segment files is not a valid %s: %s",
					c->stream.name, shard, rec->seq,
					bad_key ? "key" : format_type_be(c->stream.payload_type), why),
			 errhint("The files were changed outside felix.  Restore the shard's copy from a replica (felix_rebuild on a follower) or from a backup.")));
}

static void
cursor_fill(FelixCursor *c, TupleTableSlot *slot, int32 shard, const FelixRecord *rec)
{
	Datum	   *values;
	bool	   *isnull;

	if (slot->tts_tupleDescriptor->natts != FELIX_NATTS)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("table of stream \"%s\" has %d columns, expected %d",
						c->stream.name, slot->tts_tupleDescriptor->natts, FELIX_NATTS),
				 errhint("A stream's table must keep the shape felix_create_stream gave it; recreate the stream.")));

	if (c->remote != NULL ||
		(rec->seq >= c->shards[shard].unchecked_lo && rec->seq < c->shards[shard].unchecked_hi))
		cursor_check_record(c, shard, rec, c->needed[FELIX_ATTNUM_KEY - 1],
							c->needed[FELIX_ATTNUM_PAYLOAD - 1]);
	ExecClearTuple(slot);
	values = slot->tts_values;
	isnull = slot->tts_isnull;

	values[FELIX_ATTNUM_SHARD - 1] = Int32GetDatum(shard);
	isnull[FELIX_ATTNUM_SHARD - 1] = false;
	values[FELIX_ATTNUM_SEQ - 1] = Int64GetDatum((int64) rec->seq);
	isnull[FELIX_ATTNUM_SEQ - 1] = false;

	if (c->needed[FELIX_ATTNUM_KEY - 1] && rec->key != NULL)
	{
		values[FELIX_ATTNUM_KEY - 1] =
			cursor_varlena(c, &c->keybuf, &c->keycap, rec->key, rec->key_len);
		isnull[FELIX_ATTNUM_KEY - 1] = false;
	}
	else
	{
		values[FELIX_ATTNUM_KEY - 1] = (Datum) 0;
		isnull[FELIX_ATTNUM_KEY - 1] = true;
	}

	/* The payload bytes are the varlena's contents (format.h). */
	if (c->needed[FELIX_ATTNUM_PAYLOAD - 1])
	{
		values[FELIX_ATTNUM_PAYLOAD - 1] =
			cursor_varlena(c, &c->paybuf, &c->paycap, rec->payload, rec->payload_len);
		isnull[FELIX_ATTNUM_PAYLOAD - 1] = false;
	}
	else
	{
		values[FELIX_ATTNUM_PAYLOAD - 1] = (Datum) 0;
		isnull[FELIX_ATTNUM_PAYLOAD - 1] = true;
	}

	values[FELIX_ATTNUM_PUBLISHED_AT - 1] = TimestampTzGetDatum(rec->published_at);
	isnull[FELIX_ATTNUM_PUBLISHED_AT - 1] = false;

	slot->tts_tableOid = c->stream.relid;
	/* Records have no ctid; (shard, seq) is their address. */
	ItemPointerSetInvalid(&slot->tts_tid);
	ExecStoreVirtualTuple(slot);
}

bool
felix_cursor_next(FelixCursor *c, TupleTableSlot *slot)
{
	FelixRecord rec;

	for (;;)
	{
		MemoryContext old;
		bool		got;

		CHECK_FOR_INTERRUPTS();

		if (c->reader == NULL && c->remote == NULL)
		{
			if (c->cur >= c->shard_hi)
				break;
			if (!cursor_open(c))
			{
				c->cur++;
				continue;
			}
		}

		if (c->next_seq >= c->cur_hi)
		{
			/* A sampling cursor keeps its reader for the next block. */
			if (c->sampling)
				break;
			cursor_close_reader(c);
			c->cur++;
			continue;
		}

		old = MemoryContextSwitchTo(c->mcxt);
		got = c->remote != NULL ? remote_reader_next(c->remote, &rec) :
			log_reader_next(c->reader, &rec);
		MemoryContextSwitchTo(old);
		if (!got)
		{
			cursor_close_reader(c);
			if (c->sampling)
				break;
			c->cur++;
			continue;
		}

		/*
		 * Seqs are contiguous in a shard, so rec.seq == next_seq, except
		 * that retention may have removed a segment after our snapshot and
		 * the reader then skips ahead.  Records past cur_hi are outside the
		 * range (a sampling cursor counts them in this block: harmless).
		 */
		if (rec.seq >= c->cur_hi && !c->sampling)
		{
			cursor_close_reader(c);
			c->cur++;
			continue;
		}
		c->next_seq = rec.seq + 1;
		cursor_fill(c, slot, c->cur, &rec);
		c->records++;
		return true;
	}

	ExecClearTuple(slot);
	return false;
}

/*
 * Sampling: position on [lo, hi) of one shard whose visible range was
 * preset, continuing the open reader when it stands exactly at lo.
 */
static void
cursor_sample_seek(FelixCursor *c, int32 shard, uint64 lo, uint64 hi)
{
	c->sampling = true;
	if (c->reader != NULL && c->cur == shard && c->next_seq == lo)
	{
		c->cur_hi = hi;
		return;
	}
	felix_cursor_set_range(c, shard, shard + 1, lo, hi);
}

/*
 * Drop the open reader without closing it: its file was already closed by
 * an aborted subtransaction (the caller's), so only the memory remains.
 */
static void
cursor_forget_reader(FelixCursor *c)
{
	c->reader = NULL;
	if (c->what != NULL)
	{
		pfree(c->what);
		c->what = NULL;
	}
	c->cur = c->shard_hi;
}

static void
cursor_preset(FelixCursor *c, int32 shard, FelixShard *slot, uint64 start, uint64 end)
{
	CursorShard *cs = &c->shards[shard];

	cs->slot = slot;
	cs->start = start;
	cs->end = end;
	cs->taken = true;
}

/* ---------------------------------------------------------------------
 * Stream lookup and shard statistics
 * ---------------------------------------------------------------------
 */
/*
 * The stream this relation is, or NULL when it is not one (a table made
 * USING felix by hand is not).  A registered stream whose columns are not
 * what its definition says is refused outright (catalog.c).
 */
static const FelixStream *
stream_or_null(Relation rel)
{
	const FelixStream *s;

	if (!felix_uses_felix_am(rel))
		return NULL;
	s = felix_stream_by_relid(RelationGetRelid(rel));
	if (s != NULL)
		felix_stream_check_shape(s, RelationGetDescr(rel));
	return s;
}

static const FelixStream *
stream_or_error(Relation rel)
{
	const FelixStream *s = stream_or_null(rel);

	if (s == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("table \"%s\" uses the felix access method but is not a felix stream",
						RelationGetRelationName(rel)),
				 errhint("Create streams with felix_create_stream(); a table created "
						 "directly with USING felix has no shards to hold records.")));
	return s;
}

void
felix_am_stream(Relation rel, FelixStream *out)
{
	*out = *stream_or_error(rel);
}

bool
felix_am_shard_stats(const FelixStream *stream, int shard,
					 uint64 *start_seq, uint64 *hwm_end, uint64 *bytes)
{
	FelixShardKey key;
	FelixShard *s;
	FelixShardPositions v;

	key.dboid = MyDatabaseId;
	key.relid = stream->relid;
	key.shard = shard;
	s = shard_lookup(&key);
	if (s == NULL)
		return false;

	shard_read_positions(s, &v);
	*start_seq = v.start_seq;
	*hwm_end = Max(v.hwm_end, v.start_seq);
	*bytes = v.total_bytes;
	return v.phase == FELIX_SHARD_OPEN;
}

/* ---------------------------------------------------------------------
 * Sequential scan and ANALYZE
 * ---------------------------------------------------------------------
 */

/* ANALYZE's view of the stream: block numbers mapped onto shards. */
typedef struct SampleMap
{
	int			nshards;
	BlockNumber *first_block;	/* [nshards + 1]: shard i owns [first[i], first[i+1]) */
	uint64	   *start;
	uint64	   *end;
	bool	   *skipped;		/* a read of the shard failed: leave it out */

	/* the rows of the current block, read ahead (see sample_read_block) */
	MemoryContext block_cxt;
	TupleTableSlot *read_slot;
	HeapTuple  *rows;
	int			nrows;
	int			next_row;
	int			cap;
} SampleMap;

typedef struct FelixScanDescData
{
	TableScanDescData base;
	bool		is_stream;
	FelixStream stream;
	FelixCursor *cursor;
	SampleMap  *sample;
} FelixScanDescData;

typedef FelixScanDescData *FelixScanDesc;

static TableScanDesc
felix_scan_begin(Relation rel, Snapshot snapshot, int nkeys,
				 struct ScanKeyData *key, ParallelTableScanDesc pscan,
				 uint32 flags)
{
	const char *name = RelationGetRelationName(rel);
	FelixScanDesc scan;

	if (pscan != NULL)
		felix_refuse_feature(name, "parallel scans",
							 "Run the query with max_parallel_workers_per_gather = 0.");
	if (flags & SO_TYPE_SAMPLESCAN)
		felix_refuse_feature(name, "TABLESAMPLE", FELIX_HINT_READ_BY_POSITION);
	if (flags & (SO_TYPE_TIDSCAN | SO_TYPE_TIDRANGESCAN))
		felix_refuse_feature(name, "ctid lookups", FELIX_HINT_READ_BY_POSITION);
	if (flags & SO_TYPE_BITMAPSCAN)
		felix_refuse_feature(name, "bitmap scans", FELIX_HINT_READ_BY_POSITION);
	if (nkeys > 0)
		felix_refuse_feature(name, "scan keys", FELIX_HINT_READ_BY_POSITION);

	scan = palloc0(sizeof(FelixScanDescData));
	scan->base.rs_rd = rel;
	scan->base.rs_snapshot = snapshot;
	scan->base.rs_nkeys = 0;
	scan->base.rs_key = NULL;
	scan->base.rs_flags = flags;
	scan->base.rs_parallel = NULL;

	if (flags & SO_TYPE_ANALYZE)
	{
		/* ANALYZE of every table must not fail because of this one. */
		const FelixStream *s = stream_or_null(rel);

		if (s != NULL)
		{
			scan->is_stream = true;
			scan->stream = *s;
			scan->cursor = felix_cursor_begin(&scan->stream);
		}
	}
	else
	{
		felix_am_stream(rel, &scan->stream);
		scan->is_stream = true;
		scan->cursor = felix_cursor_begin(&scan->stream);
	}
	return (TableScanDesc) scan;
}

static void
felix_scan_end(TableScanDesc sscan)
{
	FelixScanDesc scan = (FelixScanDesc) sscan;

	if (scan->cursor != NULL)
		felix_cursor_end(scan->cursor);
	if (scan->sample != NULL)
	{
		ExecDropSingleTupleTableSlot(scan->sample->read_slot);
		MemoryContextDelete(scan->sample->block_cxt);
		pfree(scan->sample->first_block);
		pfree(scan->sample->start);
		pfree(scan->sample->end);
		pfree(scan->sample->skipped);
		pfree(scan->sample);
	}
	if (scan->base.rs_flags & SO_TEMP_SNAPSHOT)
		UnregisterSnapshot(scan->base.rs_snapshot);
	pfree(scan);
}

static void
felix_scan_rescan(TableScanDesc sscan, struct ScanKeyData *key, bool set_params,
				  bool allow_strat, bool allow_sync, bool allow_pagemode)
{
	FelixScanDesc scan = (FelixScanDesc) sscan;

	if (set_params)
	{
		scan->base.rs_flags &= ~(SO_ALLOW_STRAT | SO_ALLOW_SYNC | SO_ALLOW_PAGEMODE);
		if (allow_strat)
			scan->base.rs_flags |= SO_ALLOW_STRAT;
		if (allow_sync)
			scan->base.rs_flags |= SO_ALLOW_SYNC;
		if (allow_pagemode)
			scan->base.rs_flags |= SO_ALLOW_PAGEMODE;
	}
	if (scan->cursor != NULL)
		felix_cursor_set_range(scan->cursor, 0, scan->stream.shards, 0, PG_UINT64_MAX);
}

static bool
felix_scan_getnextslot(TableScanDesc sscan, ScanDirection direction,
					   TupleTableSlot *slot)
{
	FelixScanDesc scan = (FelixScanDesc) sscan;

	if (ScanDirectionIsBackward(direction))
		felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "backward scans",
							 "Declare the cursor with SCROLL to move backward through a stream.");
	if (scan->cursor == NULL)
	{
		ExecClearTuple(slot);
		return false;
	}
	return felix_cursor_next(scan->cursor, slot);
}

static void
felix_scan_set_tidrange(TableScanDesc sscan, ItemPointer mintid, ItemPointer maxtid)
{
	felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "ctid lookups",
						 FELIX_HINT_READ_BY_POSITION);
}

static bool
felix_scan_getnextslot_tidrange(TableScanDesc sscan, ScanDirection direction,
								TupleTableSlot *slot)
{
	felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "ctid lookups",
						 FELIX_HINT_READ_BY_POSITION);
}

/*
 * ANALYZE asks for block numbers below relation_size / BLCKSZ.  Those
 * blocks are laid over the open shards in proportion to their bytes, at
 * least one block for each shard holding records: shard i owns blocks
 * [first[i], first[i+1]), and block k of a shard with n blocks stands for
 * the k-th n-th of its visible seqs.  A block is BLCKSZ bytes of log, or
 * more when the stream is larger than one relation segment.  Only shards
 * already open are sampled, so ANALYZE never runs recovery.
 *
 * Fills first[] (nshards + 1 entries) and start[]/end[] (visible ranges)
 * when given; returns the number of blocks.
 */
static BlockNumber
sample_layout(const FelixStream *stream, BlockNumber *first,
			  uint64 *start, uint64 *end)
{
	int			n = stream->shards;
	uint64	   *bytes = palloc0(sizeof(uint64) * n);
	uint64		total = 0;
	double		per_block;
	BlockNumber next = 0;

	for (int i = 0; i < n; i++)
	{
		uint64		s;
		uint64		e;

		if (!felix_am_shard_stats(stream, i, &s, &e, &bytes[i]) || e <= s)
		{
			bytes[i] = 0;
			s = e = 0;
		}
		if (start != NULL)
		{
			start[i] = s;
			end[i] = e;
		}
		total += bytes[i];
	}

	/* one block may be added per shard by rounding up: leave room for it */
	per_block = Max((double) BLCKSZ,
					(double) total / Max(RELSEG_SIZE - n, 1));
	for (int i = 0; i < n; i++)
	{
		if (first != NULL)
			first[i] = next;
		if (bytes[i] > 0)
			next += (BlockNumber) Max(ceil((double) bytes[i] / per_block), 1.0);
	}
	if (first != NULL)
		first[n] = next;
	pfree(bytes);
	return next;
}

static void
sample_map_build(FelixScanDesc scan)
{
	SampleMap  *m = palloc0(sizeof(SampleMap));
	int			n = scan->stream.shards;

	m->nshards = n;
	m->first_block = palloc0(sizeof(BlockNumber) * (n + 1));
	m->start = palloc0(sizeof(uint64) * n);
	m->end = palloc0(sizeof(uint64) * n);
	m->skipped = palloc0(sizeof(bool) * n);
	m->block_cxt = AllocSetContextCreate(CurrentMemoryContext, "felix analyze block",
										 ALLOCSET_DEFAULT_SIZES);
	m->read_slot = MakeSingleTupleTableSlot(RelationGetDescr(scan->base.rs_rd),
											&TTSOpsVirtual);
	m->cap = 64;
	m->rows = palloc(sizeof(HeapTuple) * m->cap);
	sample_layout(&scan->stream, m->first_block, m->start, m->end);
	for (int i = 0; i < n; i++)
	{
		FelixShardKey key;

		if (m->end[i] <= m->start[i])
			continue;
		key.dboid = MyDatabaseId;
		key.relid = scan->stream.relid;
		key.shard = i;
		cursor_preset(scan->cursor, i, shard_lookup(&key), m->start[i], m->end[i]);
	}
	scan->sample = m;
}

static void
sample_read_rows(void *arg)
{
	FelixScanDesc scan = arg;
	SampleMap  *m = scan->sample;

	while (felix_cursor_next(scan->cursor, m->read_slot))
	{
		MemoryContext old = MemoryContextSwitchTo(m->block_cxt);

		if (m->nrows == m->cap)
		{
			m->cap *= 2;
			m->rows = repalloc(m->rows, sizeof(HeapTuple) * m->cap);
		}
		m->rows[m->nrows++] = ExecCopySlotHeapTuple(m->read_slot);
		MemoryContextSwitchTo(old);
	}
}

/*
 * Read the current block's records into m->rows.  The read runs in a
 * subtransaction so that a damaged shard costs ANALYZE that shard's sample
 * (with a WARNING) instead of failing a database-wide ANALYZE; any other
 * error, a cancel included, is rethrown.  Returns false if it failed.
 */
static bool
sample_read_block(FelixScanDesc scan, int shard)
{
	SampleMap  *m = scan->sample;
	ErrorData  *edata;

	MemoryContextReset(m->block_cxt);
	m->nrows = 0;
	m->next_row = 0;

	edata = felix_run_isolated(sample_read_rows, scan);
	if (edata == NULL)
		return true;

	if (edata->sqlerrcode != ERRCODE_DATA_CORRUPTED &&
		ERRCODE_TO_CATEGORY(edata->sqlerrcode) != ERRCODE_SYSTEM_ERROR)
		ReThrowError(edata);

	/* the aborted subtransaction closed the reader's file */
	cursor_forget_reader(scan->cursor);
	m->skipped[shard] = true;
	m->nrows = 0;
	ereport(WARNING,
			(errcode(edata->sqlerrcode),
			 errmsg("%s", edata->message),
			 edata->detail ? errdetail("%s", edata->detail) : 0,
			 errhint("ANALYZE left shard %d out; the statistics of stream \"%s\" come from its other shards.",
					 shard, scan->stream.name)));
	FreeErrorData(edata);
	return false;
}

static bool
felix_scan_analyze_next_block(TableScanDesc sscan, BlockNumber blockno,
							  BufferAccessStrategy bstrategy)
{
	FelixScanDesc scan = (FelixScanDesc) sscan;
	SampleMap  *m;
	int			lo;
	int			hi;
	int			shard;
	uint64		count;
	BlockNumber nblocks;
	BlockNumber local;
	uint64		seq_lo;
	uint64		seq_hi;

	if (!scan->is_stream)
		return false;
	if (scan->sample == NULL)
		sample_map_build(scan);
	m = scan->sample;
	if (blockno >= m->first_block[m->nshards])
		return false;

	/* the last shard whose first block is <= blockno */
	lo = 0;
	hi = m->nshards - 1;
	while (lo < hi)
	{
		int			mid = (lo + hi + 1) / 2;

		if (m->first_block[mid] <= blockno)
			lo = mid;
		else
			hi = mid - 1;
	}
	shard = lo;
	nblocks = m->first_block[shard + 1] - m->first_block[shard];
	if (nblocks == 0)
		return false;
	local = blockno - m->first_block[shard];
	count = m->end[shard] - m->start[shard];
	seq_lo = m->start[shard] + (uint64) ((double) count * local / nblocks);
	seq_hi = (local + 1 == nblocks) ? m->end[shard] :
		m->start[shard] + (uint64) ((double) count * (local + 1) / nblocks);
	if (seq_lo >= seq_hi || m->skipped[shard])
		return false;
	cursor_sample_seek(scan->cursor, shard, seq_lo, seq_hi);
	return sample_read_block(scan, shard);
}

static bool
felix_scan_analyze_next_tuple(TableScanDesc sscan, TransactionId OldestXmin,
							  double *liverows, double *deadrows,
							  TupleTableSlot *slot)
{
	FelixScanDesc scan = (FelixScanDesc) sscan;
	SampleMap  *m = scan->sample;

	if (m == NULL || m->next_row >= m->nrows)
	{
		ExecClearTuple(slot);
		return false;
	}
	ExecForceStoreHeapTuple(m->rows[m->next_row++], slot, false);
	*liverows += 1;
	return true;
}

static bool
felix_scan_bitmap_next_block(TableScanDesc sscan, struct TBMIterateResult *tbmres)
{
	felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "bitmap scans",
						 FELIX_HINT_READ_BY_POSITION);
}

static bool
felix_scan_bitmap_next_tuple(TableScanDesc sscan, struct TBMIterateResult *tbmres,
							 TupleTableSlot *slot)
{
	felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "bitmap scans",
						 FELIX_HINT_READ_BY_POSITION);
}

static bool
felix_scan_sample_next_block(TableScanDesc sscan, struct SampleScanState *scanstate)
{
	felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "TABLESAMPLE",
						 FELIX_HINT_READ_BY_POSITION);
}

static bool
felix_scan_sample_next_tuple(TableScanDesc sscan, struct SampleScanState *scanstate,
							 TupleTableSlot *slot)
{
	felix_refuse_feature(RelationGetRelationName(sscan->rs_rd), "TABLESAMPLE",
						 FELIX_HINT_READ_BY_POSITION);
}

/* ---------------------------------------------------------------------
 * Parallel scans: never planned (scan.c removes partial paths)
 * ---------------------------------------------------------------------
 */
#define FELIX_HINT_NO_PARALLEL "Run the query with max_parallel_workers_per_gather = 0."

static Size
felix_parallelscan_estimate(Relation rel)
{
	felix_refuse_feature(RelationGetRelationName(rel), "parallel scans",
						 FELIX_HINT_NO_PARALLEL);
}

static Size
felix_parallelscan_initialize(Relation rel, ParallelTableScanDesc pscan)
{
	felix_refuse_feature(RelationGetRelationName(rel), "parallel scans",
						 FELIX_HINT_NO_PARALLEL);
}

static void
felix_parallelscan_reinitialize(Relation rel, ParallelTableScanDesc pscan)
{
	felix_refuse_feature(RelationGetRelationName(rel), "parallel scans",
						 FELIX_HINT_NO_PARALLEL);
}

/* ---------------------------------------------------------------------
 * Indexes and row identity: a stream has neither
 * ---------------------------------------------------------------------
 */
#define FELIX_HINT_NO_INDEX \
	"Streams are read in (shard, seq) order and seek with WHERE shard = ... AND seq >= ...; they need no index."

static struct IndexFetchTableData *
felix_index_fetch_begin(Relation rel)
{
	felix_refuse_feature(RelationGetRelationName(rel), "indexes", FELIX_HINT_NO_INDEX);
}

static void
felix_index_fetch_reset(struct IndexFetchTableData *data)
{
	felix_refuse_feature(RelationGetRelationName(data->rel), "indexes", FELIX_HINT_NO_INDEX);
}

static void
felix_index_fetch_end(struct IndexFetchTableData *data)
{
	felix_refuse_feature(RelationGetRelationName(data->rel), "indexes", FELIX_HINT_NO_INDEX);
}

static bool
felix_index_fetch_tuple(struct IndexFetchTableData *scan, ItemPointer tid,
						Snapshot snapshot, TupleTableSlot *slot,
						bool *call_again, bool *all_dead)
{
	felix_refuse_feature(RelationGetRelationName(scan->rel), "indexes", FELIX_HINT_NO_INDEX);
}

static bool
felix_tuple_fetch_row_version(Relation rel, ItemPointer tid, Snapshot snapshot,
							  TupleTableSlot *slot)
{
	felix_refuse_feature(RelationGetRelationName(rel), "fetching a record by ctid",
						 FELIX_HINT_READ_BY_POSITION);
}

static bool
felix_tuple_tid_valid(TableScanDesc scan, ItemPointer tid)
{
	felix_refuse_feature(RelationGetRelationName(scan->rs_rd), "ctid lookups",
						 FELIX_HINT_READ_BY_POSITION);
}

static void
felix_tuple_get_latest_tid(TableScanDesc scan, ItemPointer tid)
{
	felix_refuse_feature(RelationGetRelationName(scan->rs_rd), "ctid lookups",
						 FELIX_HINT_READ_BY_POSITION);
}

/* Every record a cursor returns is below the high-water mark: committed. */
static bool
felix_tuple_satisfies_snapshot(Relation rel, TupleTableSlot *slot, Snapshot snapshot)
{
	return true;
}

static TransactionId
felix_index_delete_tuples(Relation rel, TM_IndexDeleteOp *delstate)
{
	felix_refuse_feature(RelationGetRelationName(rel), "indexes", FELIX_HINT_NO_INDEX);
}

static double
felix_index_build_range_scan(Relation table_rel, Relation index_rel,
							 struct IndexInfo *index_info, bool allow_sync,
							 bool anyvisible, bool progress,
							 BlockNumber start_blockno, BlockNumber numblocks,
							 IndexBuildCallback callback, void *callback_state,
							 TableScanDesc scan)
{
	felix_refuse_feature(RelationGetRelationName(table_rel), "indexes", FELIX_HINT_NO_INDEX);
}

static void
felix_index_validate_scan(Relation table_rel, Relation index_rel,
						  struct IndexInfo *index_info, Snapshot snapshot,
						  struct ValidateIndexState *state)
{
	felix_refuse_feature(RelationGetRelationName(table_rel), "indexes", FELIX_HINT_NO_INDEX);
}

/* ---------------------------------------------------------------------
 * Writing: INSERT and COPY buffer rows until commit; nothing else writes
 * ---------------------------------------------------------------------
 */
/*
 * Buffer one row (pending.c).  The slot (virtual: felix_slot_callbacks)
 * then shows what is known before commit -- the shard the row goes to, for
 * RETURNING; seq and published_at stay NULL until the commit assigns them.
 */
static void
insert_one(const FelixStream *stream, Relation rel, TupleTableSlot *slot)
{
	int			shard = pending_add(stream, slot);

	slot->tts_values[FELIX_ATTNUM_SHARD - 1] = Int32GetDatum(shard);
	slot->tts_isnull[FELIX_ATTNUM_SHARD - 1] = false;
	slot->tts_tableOid = RelationGetRelid(rel);
	ItemPointerSetInvalid(&slot->tts_tid);
}

static void
felix_tuple_insert(Relation rel, TupleTableSlot *slot, CommandId cid,
				   int options, struct BulkInsertStateData *bistate)
{
	/* a copy: the catalog cache may be reset while the row is checked */
	FelixStream stream = *stream_or_error(rel);

	insert_one(&stream, rel, slot);
}

static void
felix_multi_insert(Relation rel, TupleTableSlot **slots, int nslots,
				   CommandId cid, int options, struct BulkInsertStateData *bistate)
{
	FelixStream copy = *stream_or_error(rel);

	for (int i = 0; i < nslots; i++)
		insert_one(&copy, rel, slots[i]);
}

static void
felix_finish_bulk_insert(Relation rel, int options)
{
	/* Rows are appended at commit by pending.c; nothing to flush here. */
}

#define FELIX_HINT_NO_CONFLICT \
	"Streams have no unique keys to conflict on; use a plain INSERT."

static void
felix_tuple_insert_speculative(Relation rel, TupleTableSlot *slot, CommandId cid,
							   int options, struct BulkInsertStateData *bistate,
							   uint32 specToken)
{
	felix_refuse_feature(RelationGetRelationName(rel), "INSERT ... ON CONFLICT",
						 FELIX_HINT_NO_CONFLICT);
}

static void
felix_tuple_complete_speculative(Relation rel, TupleTableSlot *slot,
								 uint32 specToken, bool succeeded)
{
	felix_refuse_feature(RelationGetRelationName(rel), "INSERT ... ON CONFLICT",
						 FELIX_HINT_NO_CONFLICT);
}

static TM_Result
felix_tuple_delete(Relation rel, ItemPointer tid, CommandId cid,
				   Snapshot snapshot, Snapshot crosscheck, bool wait,
				   TM_FailureData *tmfd, bool changingPart)
{
	felix_refuse_change(RelationGetRelationName(rel), "DELETE", FELIX_HINT_RETENTION);
}

static TM_Result
felix_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot,
				   CommandId cid, Snapshot snapshot, Snapshot crosscheck,
				   bool wait, TM_FailureData *tmfd, LockTupleMode *lockmode,
				   bool *update_indexes)
{
	felix_refuse_change(RelationGetRelationName(rel), "UPDATE", FELIX_HINT_APPEND_ONLY);
}

static TM_Result
felix_tuple_lock(Relation rel, ItemPointer tid, Snapshot snapshot,
				 TupleTableSlot *slot, CommandId cid, LockTupleMode mode,
				 LockWaitPolicy wait_policy, uint8 flags, TM_FailureData *tmfd)
{
	felix_refuse_change(RelationGetRelationName(rel), "row locking",
						"Records in a stream never change, so they need no row locks; "
						"read them without FOR UPDATE or FOR SHARE.");
}

/* ---------------------------------------------------------------------
 * Relation storage: the table itself owns no files
 * ---------------------------------------------------------------------
 */

/*
 * CREATE TABLE ... USING felix.  The records live in the shards' segment
 * logs under felix.data_directory; the relation file itself stays empty
 * forever.  It is created all the same because parts of PostgreSQL open a
 * table's first segment file regardless of its access method: ANALYZE
 * prefetches the blocks it samples, and CREATE DATABASE copies every
 * relation file of its template.
 *
 * No transaction id is ever stored in the table: relfrozenxid and
 * relminmxid stay invalid, which keeps the stream out of anti-wraparound
 * vacuums.
 */
static void
felix_relation_set_new_filenode(Relation rel, const RelFileNode *newrnode,
								char persistence, TransactionId *freezeXid,
								MultiXactId *minmulti)
{
	SMgrRelation srel;

	*freezeXid = InvalidTransactionId;
	*minmulti = InvalidMultiXactId;
	srel = RelationCreateStorage(*newrnode, persistence, true);
	smgrclose(srel);
}

static void
felix_relation_nontransactional_truncate(Relation rel)
{
	felix_refuse_change(RelationGetRelationName(rel), "TRUNCATE", FELIX_HINT_RETENTION);
}

/*
 * A new tablespace (ALTER TABLE ALL IN TABLESPACE moves a stream along; an
 * explicit SET TABLESPACE on a stream is refused in refuse.c): the empty
 * relation file moves, the records stay where they are.
 */
static void
felix_relation_copy_data(Relation rel, const RelFileNode *newrnode)
{
	SMgrRelation dst;

	dst = RelationCreateStorage(*newrnode, rel->rd_rel->relpersistence, true);
	RelationDropStorage(rel);
	smgrclose(dst);
}

/*
 * A database-wide VACUUM FULL rewrites every table by copying it into a
 * new relation file and swapping files.  A stream's records are keyed by
 * its table's OID, which the swap keeps, so there is nothing to copy and
 * the stream comes through unchanged.  (VACUUM FULL or CLUSTER naming a
 * stream is refused in refuse.c.)
 */
static void
felix_relation_copy_for_cluster(Relation OldTable, Relation NewTable,
								Relation OldIndex, bool use_sort,
								TransactionId OldestXmin,
								TransactionId *xid_cutoff,
								MultiXactId *multi_cutoff,
								double *num_tuples, double *tups_vacuumed,
								double *tups_recently_dead)
{
	*xid_cutoff = InvalidTransactionId;
	*multi_cutoff = InvalidMultiXactId;
	*num_tuples = 0;
	*tups_vacuumed = 0;
	*tups_recently_dead = 0;
}

/* Nothing to vacuum: no dead rows, no xids; retention reclaims space. */
static void
felix_relation_vacuum(Relation rel, struct VacuumParams *params,
					  BufferAccessStrategy bstrategy)
{
}

/*
 * The size ANALYZE plans its block sample from: the blocks of the sample
 * layout (see sample_layout), about the stream's bytes / BLCKSZ but never
 * past one relation segment, because ANALYZE prefetches the blocks it
 * samples from the (empty) relation file and a block number past the
 * first segment would make it look for a segment file that does not
 * exist.  (pg_relation_size reads the relation file and so reports 0 for
 * a stream; felix_shards.bytes is the real size.)
 */
static uint64
felix_relation_size(Relation rel, ForkNumber forkNumber)
{
	const FelixStream *stream;
	FelixStream copy;

	if (forkNumber != MAIN_FORKNUM)
		return 0;
	stream = stream_or_null(rel);
	if (stream == NULL)
		return 0;
	copy = *stream;
	return (uint64) sample_layout(&copy, NULL, NULL, NULL) * BLCKSZ;
}

static bool
felix_relation_needs_toast_table(Relation rel)
{
	return false;
}

/* Never asked: a stream has no TOAST table (needs_toast_table is false). */
static Oid
felix_relation_toast_am(Relation rel)
{
	return InvalidOid;
}

static void
felix_relation_fetch_toast_slice(Relation toastrel, Oid valueid, int32 attrsize,
								 int32 sliceoffset, int32 slicelength,
								 struct varlena *result)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("felix streams have no TOAST table"),
			 errhint("Stream payloads are stored whole in the segment log.")));
}

/* Default guess for a stream none of whose shards is open yet. */
#define FELIX_GUESS_PAGES_PER_SHARD		10
#define FELIX_GUESS_RECORD_BYTES		128

/*
 * Planner size estimate from the shards' shared state (cheap: no shard is
 * opened).  Shards not yet open count as the average of the open ones.
 */
static void
felix_relation_estimate_size(Relation rel, int32 *attr_widths,
							 BlockNumber *pages, double *tuples,
							 double *allvisfrac)
{
	const FelixStream *stream = stream_or_null(rel);
	double		records = 0;
	double		bytes = 0;
	int			known = 0;

	*allvisfrac = 0;
	if (stream == NULL)
	{
		*pages = 0;
		*tuples = 0;
		return;
	}
	for (int i = 0; i < stream->shards; i++)
	{
		uint64		start;
		uint64		end;
		uint64		b;

		if (felix_am_shard_stats(stream, i, &start, &end, &b))
		{
			records += (double) (end - start);
			bytes += (double) b;
			known++;
		}
	}
	if (known == 0)
	{
		bytes = (double) stream->shards * FELIX_GUESS_PAGES_PER_SHARD * BLCKSZ;
		records = bytes / FELIX_GUESS_RECORD_BYTES;
	}
	else if (known < stream->shards)
	{
		records = records * stream->shards / known;
		bytes = bytes * stream->shards / known;
	}
	/* a scan opens every shard's log: at least one page's worth each */
	*tuples = records;
	*pages = (BlockNumber) Min(Max(ceil(bytes / BLCKSZ), (double) stream->shards),
							   (double) MaxBlockNumber);
}

/* ---------------------------------------------------------------------
 * The routine
 * ---------------------------------------------------------------------
 */
static const TupleTableSlotOps *
felix_slot_callbacks(Relation rel)
{
	return &TTSOpsVirtual;
}

static const TableAmRoutine felix_methods = {
	.type = T_TableAmRoutine,

	.slot_callbacks = felix_slot_callbacks,

	.scan_begin = felix_scan_begin,
	.scan_end = felix_scan_end,
	.scan_rescan = felix_scan_rescan,
	.scan_getnextslot = felix_scan_getnextslot,

	.scan_set_tidrange = felix_scan_set_tidrange,
	.scan_getnextslot_tidrange = felix_scan_getnextslot_tidrange,

	.parallelscan_estimate = felix_parallelscan_estimate,
	.parallelscan_initialize = felix_parallelscan_initialize,
	.parallelscan_reinitialize = felix_parallelscan_reinitialize,

	.index_fetch_begin = felix_index_fetch_begin,
	.index_fetch_reset = felix_index_fetch_reset,
	.index_fetch_end = felix_index_fetch_end,
	.index_fetch_tuple = felix_index_fetch_tuple,

	.tuple_fetch_row_version = felix_tuple_fetch_row_version,
	.tuple_tid_valid = felix_tuple_tid_valid,
	.tuple_get_latest_tid = felix_tuple_get_latest_tid,
	.tuple_satisfies_snapshot = felix_tuple_satisfies_snapshot,
	.index_delete_tuples = felix_index_delete_tuples,

	.tuple_insert = felix_tuple_insert,
	.tuple_insert_speculative = felix_tuple_insert_speculative,
	.tuple_complete_speculative = felix_tuple_complete_speculative,
	.multi_insert = felix_multi_insert,
	.tuple_delete = felix_tuple_delete,
	.tuple_update = felix_tuple_update,
	.tuple_lock = felix_tuple_lock,
	.finish_bulk_insert = felix_finish_bulk_insert,

	.relation_set_new_filenode = felix_relation_set_new_filenode,
	.relation_nontransactional_truncate = felix_relation_nontransactional_truncate,
	.relation_copy_data = felix_relation_copy_data,
	.relation_copy_for_cluster = felix_relation_copy_for_cluster,
	.relation_vacuum = felix_relation_vacuum,
	.scan_analyze_next_block = felix_scan_analyze_next_block,
	.scan_analyze_next_tuple = felix_scan_analyze_next_tuple,
	.index_build_range_scan = felix_index_build_range_scan,
	.index_validate_scan = felix_index_validate_scan,

	.relation_size = felix_relation_size,
	.relation_needs_toast_table = felix_relation_needs_toast_table,
	.relation_toast_am = felix_relation_toast_am,
	.relation_fetch_toast_slice = felix_relation_fetch_toast_slice,

	.relation_estimate_size = felix_relation_estimate_size,

	.scan_bitmap_next_block = felix_scan_bitmap_next_block,
	.scan_bitmap_next_tuple = felix_scan_bitmap_next_tuple,
	.scan_sample_next_block = felix_scan_sample_next_block,
	.scan_sample_next_tuple = felix_scan_sample_next_tuple,
};

Datum
felix_tableam_handler(PG_FUNCTION_ARGS)
{
	PG_RETURN_POINTER(&felix_methods);
}

void
felix_am_init(void)
{
	felix_scan_init();
	felix_refuse_init();
	remote_init();
}
