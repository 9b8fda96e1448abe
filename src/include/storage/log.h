/*-------------------------------------------------------------------------
 *
 * log.h
 *	  The segment log of one shard: a directory of segment files, their
 *	  sparse indexes and the generation map.  This is the storage layer's
 *	  whole surface; the shard layer (shard.h) owns the shared state and the
 *	  locks, the storage layer owns the bytes.
 *
 * Locking rule: every function that takes a FelixLogState * (recover,
 * append, sync bookkeeping, trim, truncate) must be called with the shard's
 * append lock held exclusively, because it reads and moves the tail.
 * Readers (FelixLogReader, log_read_range) take no lock: they read only
 * below a visibility bound the caller took from shared state, and the
 * bytes there are never rewritten.  Retention may unlink a segment a
 * reader is about to open; readers treat a vanished segment below the
 * shard's start as trimmed and move on.
 *
 * Positions are exclusive ends: next_seq is the seq the next record gets,
 * so a log holds [start_seq, next_seq).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_LOG_H
#define FELIX_STORAGE_LOG_H

#include "postgres.h"
#include "lib/stringinfo.h"
#include "port/pg_crc32c.h"
#include "storage/format.h"
#include "base/metrics.h"
#include "utils/timestamp.h"

/*
 * How far ahead of the write position the active segment is allocated.
 * Small on purpose: a node may hold a thousand shards, each with an active
 * segment.
 */
#define FELIX_PREALLOCATE_BYTES		(1024 * 1024)

/*
 * The log's tail bookkeeping.  Lives inside the shard's shared state;
 * protected by the shard's append lock (see shard.h).
 */
typedef struct FelixLogState
{
	uint64		start_seq;		/* first seq still held (retention moves it) */
	uint64		next_seq;		/* seq the next appended record gets */
	bool		has_active;		/* an active (unsealed) segment exists */
	uint64		active_base;	/* base seq of the active segment */
	uint64		active_bytes;	/* write offset in the active segment: the
								 * logical end, the authority on where the
								 * data ends */
	pg_crc32c	active_crc;		/* running CRC-32C of those bytes */
	uint64		index_mark;		/* active_bytes at the last index entry */
	uint64		total_bytes;	/* logical bytes across every segment (a
								 * preallocated tail is not counted) */
	uint32		segments_version;	/* bumped on roll, trim and truncate */
	uint64		last_generation;	/* generation of the newest batch; 0 if none */
	uint64		alloc_bytes;	/* physical size of the active segment file:
								 * >= active_bytes; the bytes in between are
								 * preallocated zeros */
	bool		prealloc_off;	/* the file system refused posix_fallocate:
								 * append without preallocating */
} FelixLogState;

/*
 * Open the shard's log after a start: create the directory if missing,
 * verify sealed segments by their whole-file checksum, walk the active
 * segment batch by batch (zero bytes after its last batch are its
 * preallocated tail, the clean end of data), cut a torn tail back to the
 * last valid batch, rebuild missing or wrong index files, and fill *st.
 *
 * Corruption inside the valid region (a checksum mismatch with intact data
 * after it, a bad sealed segment, a gap between segments) is reported with
 * ERRCODE_DATA_CORRUPTED naming the file and byte offset; nothing is cut.
 * `what` names the shard for messages, e.g. stream "orders" shard 2.
 */
extern void log_recover(const char *dir, const char *what, FelixLogState *st);

/*
 * Append one finished batch (built with format.h's batch_* and stamped with
 * base_seq == st->next_seq; len == batch_stored_len, trailer included).
 * Rolls to a new segment first when the active one would pass
 * felix.segment_bytes (sealing the old one: seal batch, file cut to its
 * exact end, fdatasync, index flushed); extends the sparse index.  The
 * active segment file is kept preallocated (posix_fallocate) ahead of the
 * write position in FELIX_PREALLOCATE_BYTES chunks, so that most appends
 * write into allocated space and their fdatasync need not commit a size
 * change.  Not durable until log_sync covers it.
 */
extern void log_append(const char *dir, const char *what, FelixLogState *st,
					   const char *batch, Size len);

/*
 * fdatasync the segment whose base is active_base (the caller snapshots it
 * with the written position under the append lock, then calls this without
 * the append lock).  Sealed segments were synced when they were sealed.
 */
extern void log_sync(const char *dir, const char *what, uint64 active_base);

/* Sequential reader over [from_seq, end_seq); no lock held (see above). */
typedef struct FelixLogReader FelixLogReader;

extern FelixLogReader *log_reader_open(const char *dir, const char *what,
									   uint64 from_seq, uint64 end_seq);
/* Next record, or false at end_seq.  rec's pointers live until the next call. */
extern bool log_reader_next(FelixLogReader *r, FelixRecord *rec);
extern void log_reader_close(FelixLogReader *r);

/*
 * Where a range read stopped: the batch beginning at seq starts at byte
 * offset of the segment whose base is seg_base.  A caller that reads on
 * from there passes it back, and the read starts at once instead of
 * listing the directory and seeking through the index; a position that no
 * longer describes the log (segment gone, no batch beginning at seq there)
 * is ignored and the read seeks as usual.
 */
typedef struct FelixLogPos
{
	uint64		seq;
	uint64		seg_base;
	uint64		offset;
} FelixLogPos;

/*
 * Append to `out` whole batches (header, body and trailer, as stored)
 * starting with the batch that holds from_seq, stopping before end_seq or
 * before out would pass max_bytes (at least one batch is always returned
 * when any record lies in range).  Returns the seq after the last batch copied.
 * This is the bounded range read replication ships from.  pos (may be
 * NULL): in, where a previous read stopped; out, where this one did (left
 * alone when nothing was copied).
 */
extern uint64 log_read_range(const char *dir, const char *what,
							 uint64 from_seq, uint64 end_seq, Size max_bytes,
							 StringInfo out, FelixLogPos *pos);

/*
 * Remove every record from seq `end` on (keep [start, end); end == start
 * empties the log).  Refuses with an error when that would remove a record
 * below hwm_end, the exclusive end of the high-water mark: records at or
 * below the mark are never rewritten.  A batch straddling the cut is
 * shortened in place to its kept prefix.
 */
extern void log_truncate_to(const char *dir, const char *what,
							FelixLogState *st, uint64 end, uint64 hwm_end);

/*
 * Discard the whole log -- records, indexes, generation map, durable mark
 * -- and begin it again, empty, at start_seq (an empty segment whose base
 * is start_seq, written by `generation`).  The one operation that removes
 * records at or below the high-water mark: a bootstrap or a rebuild
 * replaces the copy with the leader's.  A stop part-way leaves a shorter
 * log, or none.
 */
extern void log_discard(const char *dir, const char *what, FelixLogState *st,
						uint64 start_seq, uint64 generation);

/*
 * Retention: unlink whole sealed segments from the front while the log
 * holds more than retention_bytes (if > 0) or while a segment's newest
 * batch is older than retention_ms before now (if > 0).  The active
 * segment is never removed.  Advances st->start_seq; returns segments
 * removed.
 */
extern int	log_trim(const char *dir, const char *what, FelixLogState *st,
					 int64 retention_bytes, int64 retention_ms,
					 TimestampTz now);

/* Remove the shard's whole directory (stream dropped, at commit). */
extern void log_remove_all(const char *dir);

/* ---- durable high-water mark (hwm.c) ---- */

/* The last mark made durable for the shard in dir (0 when none), and
 * where the copy is known to differ from its leader's (PG_UINT64_MAX when
 * it is not). */
extern uint64 log_hwm_read(const char *dir, uint64 *diverged_at);
/* Make them durable (fdatasync'd before returning). */
extern void log_hwm_write(const char *dir, const char *what, uint64 hwm_end,
						  uint64 diverged_at);
/* Forget the mark (the whole log was discarded). */
extern void log_hwm_reset(const char *dir, const char *what);

/* ---- generation map (genmap.c): generation -> first seq ---- */

/* Record that `generation` begins at first_seq unless the map's last entry
 * already names that generation; durable (fsync) before returning if
 * `sync`, else once genmap_sync has returned. */
extern void genmap_note(const char *dir, const char *what, uint64 generation,
						uint64 first_seq, bool sync);
/* Make the map, and its entry in dir, durable. */
extern void genmap_sync(const char *dir, const char *what);
/* Load the map; returns entry count, *entries palloc'd in CurrentMemoryContext. */
extern int	genmap_load(const char *dir, const char *what,
						FelixGenEntry **entries);

#endif							/* FELIX_STORAGE_LOG_H */
