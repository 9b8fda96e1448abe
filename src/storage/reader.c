/*-------------------------------------------------------------------------
 *
 * reader.c
 *	  Reading a shard's log in seq order: the sequential record reader
 *	  (log_reader_*), the bounded batch range read replication ships from
 *	  (log_read_range), and the buffered file reader (FelixSegFile) that
 *	  they, recovery and the index share.
 *
 * A reader lists the directory once, picks the segment holding its start,
 * seeks with that segment's sparse index (checked, see index.c) and then
 * streams forward through large buffered reads — one pread per chunk, not
 * per batch — verifying every batch header and, before any record of it is
 * returned or shipped, its body CRC and its trailer.  A seal batch (or the
 * end of the data: the end of the file, or the zero bytes of an active
 * segment's preallocated tail) leads into the segment that begins where the
 * previous one ended.
 *
 * Locking rule: none.  Readers read only below an end the caller took from
 * the shard's shared state (the high-water mark), and bytes there are never
 * rewritten: appends only extend the active segment and truncation happens
 * only above the mark.  Retention may unlink segments at the front while a
 * reader runs; a reader that finds its next segment gone lists the
 * directory again and continues at the first segment that remains (the
 * records in between were trimmed).  Descriptors are transient files, so a
 * reader must be closed before the transaction that opened it ends (an
 * aborting transaction closes them itself).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "log_internal.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/memutils.h"

/* First fill of a buffer: small, so a short seek reads little. */
#define FIRST_CHUNK		(32 * 1024)

/* ----------------------------------------------------------------
 * FelixSegFile: buffered reads of one file
 * ----------------------------------------------------------------
 */

bool
segfile_open(FelixSegFile *sf, const char *path, const char *what,
			 Size chunk, bool missing_ok)
{
	memset(sf, 0, sizeof(*sf));
	strlcpy(sf->path, path, sizeof(sf->path));
	sf->what = what;
	sf->fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (sf->fd < 0)
	{
		if (errno == ENOENT && missing_ok)
			return false;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
	}
	/* start with a small read and double it up to `chunk` as we stream */
	sf->buf = palloc(chunk);
	sf->cap = chunk;
	sf->chunk = Min(chunk, FIRST_CHUNK);
	sf->buf_off = 0;
	sf->buf_len = 0;
	return true;
}

void
segfile_close(FelixSegFile *sf)
{
	if (sf->fd >= 0)
		CloseTransientFile(sf->fd);
	sf->fd = -1;
	if (sf->buf)
		pfree(sf->buf);
	sf->buf = NULL;
	sf->cap = sf->buf_len = 0;
}

/*
 * Bytes [off, off+len) of the file, buffered; NULL if the file ends first.
 * Pointers returned earlier are invalid after the next call.
 */
const char *
segfile_get(FelixSegFile *sf, uint64 off, Size len)
{
	Size		keep = 0;
	Size		want;
	ssize_t		got;

	if (off >= sf->buf_off && off + len <= sf->buf_off + sf->buf_len)
		return sf->buf + (off - sf->buf_off);

	/* keep what is buffered from off onwards, then read behind it */
	if (off >= sf->buf_off && off < sf->buf_off + sf->buf_len)
	{
		keep = sf->buf_off + sf->buf_len - off;
		memmove(sf->buf, sf->buf + (off - sf->buf_off), keep);
	}
	want = Max(len, Min(sf->chunk, sf->cap));
	if (want > sf->cap)
	{
		char	   *nb = palloc_extended(want, MCXT_ALLOC_HUGE);

		if (keep > 0)
			memcpy(nb, sf->buf, keep);
		pfree(sf->buf);
		sf->buf = nb;
		sf->cap = want;
	}
	sf->buf_off = off;
	sf->buf_len = keep;

	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_READ);
	got = felix_pread_all(sf->fd, sf->buf + keep, want - keep, off + keep);
	pgstat_report_wait_end();
	if (got < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not read segment file \"%s\" at offset %llu: %m",
						sf->what, sf->path, (unsigned long long) (off + keep))));
	sf->buf_len = keep + got;

	/* sequential reading: grow the read size up to the buffer's capacity */
	if (sf->chunk < sf->cap)
		sf->chunk = Min(sf->chunk * 2, sf->cap);

	if (sf->buf_len < len)
		return NULL;
	return sf->buf;
}

bool
segfile_header(FelixSegFile *sf, uint64 off, FelixBatchHeader *h)
{
	const char *p = segfile_get(sf, off, BATCH_HEADER_SIZE);

	if (p == NULL)
		return false;
	memcpy(h, p, sizeof(*h));
	return true;
}

/* ----------------------------------------------------------------
 * The record reader
 * ----------------------------------------------------------------
 */

struct FelixLogReader
{
	char		dir[MAXPGPATH];
	char	   *what;
	uint64		from_seq;		/* records below are skipped */
	uint64		end_seq;		/* exclusive end; never read past */
	bool		done;

	uint64	   *bases;			/* last directory listing, sorted */
	int			nsegs;

	FelixSegFile sf;			/* current segment (fd -1 if none) */
	uint64		seg_base;
	bool		seg_last;		/* it was the last one listed */
	uint64		pos;			/* offset of the next batch */
	uint64		expect_seq;		/* base_seq the batch at pos must have */

	/* the batch being decoded */
	bool		in_batch;
	FelixBatchHeader hdr;
	FelixBatchIter it;
	const char *raw;			/* header, body, trailer in sf's buffer */
};

static void
reader_relist(FelixLogReader *r)
{
	if (r->bases)
		pfree(r->bases);
	r->nsegs = felix_list_segments(r->dir, r->what, &r->bases);
}

/* Check the 64-byte file header of the segment just opened. */
static void
reader_check_segment_header(FelixLogReader *r)
{
	FelixSegmentHeader sh;

	if (felix_pread_all(r->sf.fd, &sh, sizeof(sh), 0) != (ssize_t) sizeof(sh))
		felix_report_corruption(r->what, r->sf.path, 0,
								"The file is shorter than a segment header.");
	if (!segment_header_check(&sh))
		felix_report_corruption(r->what, r->sf.path, 0,
								"The segment header does not match its checksum.");
	if (sh.base_seq != r->seg_base)
		felix_report_corruption(r->what, r->sf.path, 0,
								psprintf("The segment header says base seq %llu but the file name says %llu.",
										 (unsigned long long) sh.base_seq,
										 (unsigned long long) r->seg_base));
}

/*
 * Open the segment holding seq `target` and seek to the indexed batch at or
 * before it.  If target lies before the first segment, start at the first
 * segment (the records before it were trimmed).  False if the log holds
 * nothing at or after target.
 */
static bool
reader_seek(FelixLogReader *r, uint64 target)
{
	for (int attempt = 0;; attempt++)
	{
		int			i;
		char		path[MAXPGPATH];

		CHECK_FOR_INTERRUPTS();
		reader_relist(r);
		if (r->nsegs == 0)
			return false;
		for (i = r->nsegs - 1; i > 0 && r->bases[i] > target; i--)
			;
		if (r->bases[i] > target)
			target = r->bases[i];

		felix_segment_path(path, r->dir, r->bases[i]);
		if (!segfile_open(&r->sf, path, r->what, FELIX_READ_CHUNK, true))
		{
			/* unlinked by retention since we listed: look again */
			if (attempt >= 100)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("%s: segment files keep vanishing while a reader opens them", r->what),
						 errhint("Retry the read.")));
			continue;
		}
		r->seg_base = r->bases[i];
		r->seg_last = (i == r->nsegs - 1);
		reader_check_segment_header(r);
		fxidx_seek(&r->sf, r->dir, r->what, r->seg_base, target, !r->seg_last,
				   &r->expect_seq, &r->pos);
		return true;
	}
}

/*
 * Leave the current segment for the one beginning at next_base.  A segment
 * missing from the directory below every remaining one was trimmed: go on
 * at the first remaining segment.  Any other gap is corruption.
 */
static bool
reader_advance(FelixLogReader *r, uint64 next_base, uint64 at_offset)
{
	char		old_path[MAXPGPATH];

	/* a segment cannot follow itself: an empty active segment ends the log */
	if (r->sf.fd >= 0 && next_base <= r->seg_base)
		return false;
	strlcpy(old_path, r->sf.path, sizeof(old_path));
	segfile_close(&r->sf);

	for (int attempt = 0;; attempt++)
	{
		int			i;
		char		path[MAXPGPATH];

		CHECK_FOR_INTERRUPTS();
		for (i = 0; i < r->nsegs && r->bases[i] < next_base; i++)
			;
		if (i == r->nsegs || r->bases[i] != next_base)
		{
			/* not in our listing: maybe created (roll) or removed since */
			reader_relist(r);
			for (i = 0; i < r->nsegs && r->bases[i] < next_base; i++)
				;
			if (r->nsegs == 0)
				return false;
			if (i < r->nsegs && r->bases[i] == next_base)
				;				/* found after all */
			else if (r->bases[0] > next_base)
			{
				/* everything up to bases[0] was trimmed meanwhile */
				next_base = r->bases[0];
				i = 0;
			}
			else if (i == r->nsegs)
			{
				/* the log ends here; our caller knows whether it should */
				return false;
			}
			else
				felix_report_corruption(r->what, old_path, at_offset,
										psprintf("The next segment should begin at seq %llu but the next one in the directory begins at seq %llu.",
												 (unsigned long long) next_base,
												 (unsigned long long) r->bases[i]));
		}

		felix_segment_path(path, r->dir, next_base);
		if (!segfile_open(&r->sf, path, r->what, FELIX_READ_CHUNK, true))
		{
			if (attempt >= 100)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("%s: segment files keep vanishing while a reader opens them", r->what),
						 errhint("Retry the read.")));
			reader_relist(r);
			continue;
		}
		r->seg_base = next_base;
		r->seg_last = (i == r->nsegs - 1);
		reader_check_segment_header(r);
		r->pos = SEG_HEADER_SIZE;
		r->expect_seq = next_base;
		return true;
	}
}

/*
 * Position on the next stored RECORDS batch that holds a seq in
 * [from_seq, end_seq): header, body and trailer verified, r->hdr/raw set,
 * pos moved past it.  False at the end of the log.
 */
static bool
reader_next_batch(FelixLogReader *r)
{
	for (;;)
	{
		FelixBatchHeader h;
		FelixHeaderCheck hc;
		uint64		len;
		const char *p;

		CHECK_FOR_INTERRUPTS();
		if (r->expect_seq >= r->end_seq)
			return false;
		if (r->sf.fd < 0)
			return false;

		if (!segfile_header(&r->sf, r->pos, &h) ||
			(hc = batch_header_check(&h)) == FELIX_HDR_ZERO)
		{
			/*
			 * The data ends without a seal (end of file, or the zeros of the
			 * preallocated tail): this is the active segment and the log
			 * ends here, unless a segment beginning exactly here exists (a
			 * roll we have not listed yet).  A caller's end_seq beyond the
			 * log's end simply ends the read.  Zeros inside a sealed segment
			 * do not get past reader_advance: the next segment does not
			 * begin at this seq, which it reports as damage.
			 */
			if (!reader_advance(r, r->expect_seq, r->pos))
				return false;
			continue;
		}
		if (hc != FELIX_HDR_OK)
			felix_report_corruption(r->what, r->sf.path, r->pos, felix_header_problem(hc));
		if (h.base_seq != r->expect_seq)
			felix_report_corruption(r->what, r->sf.path, r->pos,
									psprintf("The batch starts at seq %llu where seq %llu was expected.",
											 (unsigned long long) h.base_seq,
											 (unsigned long long) r->expect_seq));
		len = batch_stored_len(&h);

		if (h.kind == FELIX_BATCH_SEAL)
		{
			if (!reader_advance(r, h.base_seq, r->pos))
				return false;
			continue;
		}

		/* wholly below from_seq: skip by its length, body unread */
		if (h.base_seq + h.count <= r->from_seq)
		{
			r->pos += len;
			r->expect_seq += h.count;
			continue;
		}

		p = segfile_get(&r->sf, r->pos, len);
		if (p == NULL)
			felix_report_corruption(r->what, r->sf.path, r->pos,
									psprintf("The batch claims %llu bytes but the file ends first.",
											 (unsigned long long) len));
		if (!batch_body_check(&h, p + BATCH_HEADER_SIZE))
			felix_report_corruption(r->what, r->sf.path, r->pos,
									"The batch body does not match its checksum or its record count.");
		if (batch_trailer_check(&h, p + len - BATCH_TRAILER_SIZE) != FELIX_TRAILER_OK)
			felix_report_corruption(r->what, r->sf.path, r->pos + len - BATCH_TRAILER_SIZE,
									"The batch trailer does not match the batch header.");
		r->hdr = h;
		r->raw = p;
		r->pos += len;
		r->expect_seq += h.count;
		return true;
	}
}

/*
 * Open at a position an earlier read handed out, if it still describes the
 * log: the segment is there with a sound header, and a sound batch header
 * beginning at exactly r->from_seq sits at the offset.  False, with nothing
 * open, otherwise.
 */
static bool
reader_resume(FelixLogReader *r, const FelixLogPos *at)
{
	char		path[MAXPGPATH];
	FelixBatchHeader h;

	if (at->seq != r->from_seq || at->offset < SEG_HEADER_SIZE ||
		at->seg_base > at->seq)
		return false;
	felix_segment_path(path, r->dir, at->seg_base);
	if (!segfile_open(&r->sf, path, r->what, FELIX_READ_CHUNK, true))
		return false;
	r->seg_base = at->seg_base;
	reader_check_segment_header(r);
	if (!segfile_header(&r->sf, at->offset, &h) ||
		batch_header_check(&h) != FELIX_HDR_OK || h.base_seq != at->seq)
	{
		segfile_close(&r->sf);
		return false;
	}
	r->seg_last = false;
	r->pos = at->offset;
	r->expect_seq = at->seq;
	return true;
}

static FelixLogReader *
reader_open(const char *dir, const char *what, uint64 from_seq,
			uint64 end_seq, const FelixLogPos *at)
{
	FelixLogReader *r = palloc0(sizeof(FelixLogReader));

	strlcpy(r->dir, dir, sizeof(r->dir));
	r->what = pstrdup(what);
	r->from_seq = from_seq;
	r->end_seq = end_seq;
	r->sf.fd = -1;
	if (from_seq >= end_seq)
		r->done = true;
	else if (at != NULL && reader_resume(r, at))
		;
	else if (!reader_seek(r, from_seq))
		r->done = true;
	return r;
}

FelixLogReader *
log_reader_open(const char *dir, const char *what, uint64 from_seq,
				uint64 end_seq)
{
	return reader_open(dir, what, from_seq, end_seq, NULL);
}

bool
log_reader_next(FelixLogReader *r, FelixRecord *rec)
{
	for (;;)
	{
		if (r->done)
			return false;
		if (r->in_batch)
		{
			while (batch_iter_next(&r->it, rec))
			{
				if (rec->seq < r->from_seq)
					continue;
				if (rec->seq >= r->end_seq)
				{
					r->done = true;
					return false;
				}
				return true;
			}
			r->in_batch = false;
		}
		if (!reader_next_batch(r))
		{
			r->done = true;
			return false;
		}
		batch_iter_init(&r->it, &r->hdr, r->raw + BATCH_HEADER_SIZE);
		r->in_batch = true;
	}
}

void
log_reader_close(FelixLogReader *r)
{
	segfile_close(&r->sf);
	if (r->bases)
		pfree(r->bases);
	pfree(r->what);
	pfree(r);
}

/*
 * Whole stored batches (header, body, trailer) from the one holding
 * from_seq, each verified before it is copied.  A batch is copied when it
 * begins below end_seq (end_seq is expected at a batch boundary: written
 * and flushed ends always are).
 * max_bytes bounds the bytes this call appends, except that the first batch
 * is always copied.
 */
uint64
log_read_range(const char *dir, const char *what, uint64 from_seq,
			   uint64 end_seq, Size max_bytes, StringInfo out, FelixLogPos *pos)
{
	FelixLogReader *r = reader_open(dir, what, from_seq, end_seq, pos);
	uint64		result = from_seq;
	Size		added = 0;

	while (!r->done && reader_next_batch(r))
	{
		Size		len = batch_stored_len(&r->hdr);

		if (added > 0 && added + len > max_bytes)
			break;
		appendBinaryStringInfo(out, r->raw, len);
		added += len;
		result = r->hdr.base_seq + r->hdr.count;
		if (pos != NULL)
		{
			/* the next batch begins right behind this one, in its segment */
			pos->seq = result;
			pos->seg_base = r->seg_base;
			pos->offset = r->pos;
		}
	}
	log_reader_close(r);
	return result;
}
