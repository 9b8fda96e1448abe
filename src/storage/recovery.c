/*-------------------------------------------------------------------------
 *
 * recovery.c
 *	  Opening a shard's log after a start (log_recover): verify what is on
 *	  disk, repair a torn tail, rebuild indexes, and compute the tail
 *	  bookkeeping (FelixLogState) that segment.c appends from.
 *
 * What is checked:
 *	 - the segments form one unbroken run of seqs: each segment begins where
 *	   the previous one's seal says it ends (a gap or an overlap is damage);
 *	 - every segment but the last is sealed, and its bytes before the seal
 *	   match the seal's whole-file CRC-32C;
 *	 - the last segment is walked batch by batch (header CRC, body CRC,
 *	   trailer, seq continuity), and its end is classified as clean (the
 *	   end of the file or a preallocated zero tail), torn or corrupt;
 *	 - each segment's index is validated and rebuilt when missing or wrong.
 *
 * The torn-tail rule is in recover_last_segment(); it is the one place
 * where felix deletes bytes it did not write moments ago, so it errs on the
 * side of refusing: anything that could be an acknowledged batch is
 * reported as corruption and nothing is cut.  Its batch trailers are what
 * tell a complete batch from an unfinished write.
 *
 * Also here: the corruption report shared by every storage file.
 *
 * Locking rule: log_recover runs with the shard's append lock held
 * exclusively (no appender, trimmer or truncater can run); readers of the
 * shard cannot exist yet because the shard is not open.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "storage/crc.h"
#include "felix.h"
#include "log_internal.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "common/file_perm.h"
#include "storage/fd.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/* ----------------------------------------------------------------
 * Reporting
 * ----------------------------------------------------------------
 */

void
felix_report_corruption(const char *what, const char *path, uint64 offset,
						const char *detail)
{
	felix_count(FELIX_CTR_CORRUPTIONS_DETECTED, 1);
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("%s: corrupt data in file \"%s\" at byte offset %llu",
					what, path, (unsigned long long) offset),
			 errdetail_internal("%s", detail),
			 errhint("Restore the file from a replica or a backup; the shard refuses to serve until it is repaired.")));
	pg_unreachable();
}

const char *
felix_header_problem(FelixHeaderCheck c)
{
	switch (c)
	{
		case FELIX_HDR_OK:
			return "The batch header is valid.";
		case FELIX_HDR_ZERO:
			return "The batch header is all zero bytes.";
		case FELIX_HDR_BAD_MAGIC:
			return "The batch header does not begin with the batch magic number.";
		case FELIX_HDR_BAD_CRC:
			return "The batch header does not match its checksum.";
		case FELIX_HDR_BAD_FIELDS:
			return "The batch header matches its checksum but its fields are impossible.";
	}
	return "The batch header is invalid.";
}

/* ----------------------------------------------------------------
 * Helpers
 * ----------------------------------------------------------------
 */

/* Remove index files whose segment is gone (a removal cut short by a crash). */
static void
remove_strays(const char *dir, const char *what)
{
	DIR		   *d = AllocateDir(dir);
	struct dirent *de;

	if (d == NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open directory \"%s\": %m", what, dir)));
	while ((de = ReadDir(d, dir)) != NULL)
	{
		size_t		len = strlen(de->d_name);
		char		path[MAXPGPATH];

		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (len == 24 && strcmp(de->d_name + 20, ".idx") == 0)
		{
			char		seg[MAXPGPATH];

			snprintf(seg, sizeof(seg), "%s/%.20s.seg", dir, de->d_name);
			if (access(seg, F_OK) != 0 && errno == ENOENT)
				felix_unlink(path, what);
		}
	}
	FreeDir(d);
}

static void
read_segment_header(int fd, const char *path, const char *what, uint64 base,
					uint64 size)
{
	FelixSegmentHeader sh;

	if (size < SEG_HEADER_SIZE ||
		felix_pread_all(fd, &sh, sizeof(sh), 0) != (ssize_t) sizeof(sh))
		felix_report_corruption(what, path, 0,
								"The file is shorter than a segment header.");
	if (!segment_header_check(&sh))
		felix_report_corruption(what, path, 0,
								"The segment header does not match its checksum.");
	if (sh.base_seq != base)
		felix_report_corruption(what, path, 0,
								psprintf("The segment header says base seq %llu but the file name says %llu.",
										 (unsigned long long) sh.base_seq,
										 (unsigned long long) base));
}

static void
sync_file(const char *path, const char *what)
{
	int			fd = OpenTransientFile(path, O_RDWR | PG_BINARY);

	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open file \"%s\": %m", what, path)));
	felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);
}

/*
 * Validate a segment's index against the segment (data ending at
 * data_end); rewrite it from `built` (if given) or from a walk otherwise.
 */
static void
check_index(FelixSegFile *sf, const char *dir, const char *what, uint64 base,
			uint64 data_end, FelixIndexBuild *built, bool sync)
{
	FelixIndexEntry *entries;
	int			n;
	bool		ok;

	ok = fxidx_read(dir, base, &entries, &n);
	if (built != NULL)
	{
		/* we know exactly what it should say */
		ok = ok && n == built->n &&
			(n == 0 || memcmp(entries, built->entries, n * sizeof(FelixIndexEntry)) == 0);
		if (!ok)
		{
			fxidx_write(dir, what, base, built->entries, built->n, sync);
			felix_count(FELIX_CTR_INDEX_REBUILDS, 1);
		}
	}
	else
	{
		ok = ok && fxidx_entries_valid(sf, base, entries, n, data_end);
		if (!ok)
		{
			ereport(LOG,
					(errmsg("%s: index of segment file \"%s\" is missing or wrong; rebuilding it",
							what, sf->path)));
			fxidx_rebuild(sf, dir, what, base, sync);
		}
	}
	if (entries)
		pfree(entries);
}

/* ----------------------------------------------------------------
 * Sealed segments
 * ----------------------------------------------------------------
 */

typedef struct SealInfo
{
	uint64		end_seq;
	uint64		size;
	uint64		generation;
} SealInfo;

/*
 * A segment that has a successor must be sealed, and its bytes before the
 * seal must hash to the CRC the seal carries.  The file is read once,
 * sequentially, in large chunks.
 */
static void
recover_sealed_segment(const char *dir, const char *what, uint64 base,
					   SealInfo *si)
{
	char		path[MAXPGPATH];
	FelixSegFile sf;
	uint64		size;
	uint64		seal_off;
	FelixBatchHeader h;
	char		seal[SEAL_BATCH_SIZE];
	uint32		stored_crc;
	pg_crc32c	crc;
	char	   *buf;

	felix_segment_path(path, dir, base);
	(void) segfile_open(&sf, path, what, FELIX_READ_CHUNK, false);
	size = felix_fd_size(sf.fd, path);
	read_segment_header(sf.fd, path, what, base, size);

	if (size < SEG_HEADER_SIZE + SEAL_BATCH_SIZE)
		felix_report_corruption(what, path, size,
								"A segment that is followed by another must end with a seal batch, but this one is too short to hold one.");
	seal_off = size - SEAL_BATCH_SIZE;
	if (felix_pread_all(sf.fd, seal, sizeof(seal), seal_off) != (ssize_t) sizeof(seal))
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not read segment file \"%s\": %m", what, path)));
	memcpy(&h, seal, sizeof(h));
	if (batch_header_check(&h) != FELIX_HDR_OK || h.kind != FELIX_BATCH_SEAL ||
		!batch_body_check(&h, seal + BATCH_HEADER_SIZE) ||
		batch_trailer_check(&h, seal + SEAL_BATCH_SIZE - BATCH_TRAILER_SIZE) != FELIX_TRAILER_OK)
		felix_report_corruption(what, path, seal_off,
								"A segment that is followed by another must end with a valid seal batch (header, body and trailer); this one does not.");
	if (h.base_seq < base)
		felix_report_corruption(what, path, seal_off,
								psprintf("The seal says the segment ends at seq %llu, before its base seq %llu.",
										 (unsigned long long) h.base_seq,
										 (unsigned long long) base));
	memcpy(&stored_crc, seal + BATCH_HEADER_SIZE, sizeof(stored_crc));

	/* whole-file checksum of everything before the seal */
	buf = palloc(FELIX_VERIFY_CHUNK);
	INIT_CRC32C(crc);
	for (uint64 off = 0; off < seal_off;)
	{
		Size		want = Min((uint64) FELIX_VERIFY_CHUNK, seal_off - off);
		ssize_t		got;

		CHECK_FOR_INTERRUPTS();
		pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_READ);
		got = felix_pread_all(sf.fd, buf, want, off);
		pgstat_report_wait_end();
		if (got != (ssize_t) want)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not read segment file \"%s\" at offset %llu: %m",
							what, path, (unsigned long long) off)));
		crc = felix_crc32c_update(crc, buf, want);
		off += want;
	}
	FIN_CRC32C(crc);
	pfree(buf);

	if (crc != stored_crc)
	{
		FelixWalk	w;

		/*
		 * Find the damaged batch so the report names its offset: a strict
		 * walk with body checks stops at the first bad one.  If every batch
		 * checks out, the damage is in bytes no batch CRC covers.
		 */
		segment_walk(&sf, what, SEG_HEADER_SIZE, base, true, NULL, NULL, &w);
		felix_report_corruption(what, path, seal_off,
								psprintf("The seal's whole-file checksum is %08X but the file's bytes hash to %08X.",
										 stored_crc, crc));
	}

	si->end_seq = h.base_seq;
	si->size = size;
	si->generation = h.generation;

	check_index(&sf, dir, what, base, seal_off, NULL, true);
	segfile_close(&sf);
	/* it was synced when sealed; syncing a clean file again is cheap */
	sync_file(path, what);
}

/* ----------------------------------------------------------------
 * The last segment and the torn-tail rule
 * ----------------------------------------------------------------
 */

/* Do exactly `count` records fill body[0, len)?  (No CRC involved.) */
static bool
records_fill(const char *body, uint64 len, uint32 count)
{
	uint64		off = 0;

	if (count == 0)
		return false;
	for (uint32 i = 0; i < count; i++)
	{
		uint32		lens[2];
		uint64		need;

		if (off + FELIX_RECORD_OVERHEAD > len)
			return false;
		memcpy(lens, body + off, sizeof(lens));
		need = lens[1];
		if (lens[0] != FELIX_NULL_KEY)
			need += lens[0];
		off += FELIX_RECORD_OVERHEAD;
		if (need > len - off)
			return false;
		off += need;
	}
	return off == len;
}

/* Are bytes [from, to) of the file all zero? */
static bool
region_all_zero(FelixSegFile *sf, uint64 from, uint64 to)
{
	while (from < to)
	{
		Size		span = (Size) Min((uint64) FELIX_VERIFY_CHUNK, to - from);
		const char *p;

		CHECK_FOR_INTERRUPTS();
		p = segfile_get(sf, from, span);
		if (p == NULL)
			return false;
		for (Size i = 0; i < span; i++)
		{
			if (p[i] != 0)
				return false;
		}
		from += span;
	}
	return true;
}

/*
 * First offset in [from, to - len] where the `len` bytes of `pattern`
 * occur; 0 if nowhere.
 */
static uint64
find_bytes(FelixSegFile *sf, uint64 from, uint64 to, const char *pattern,
		   Size len)
{
	uint64		pos = from;

	while (pos + len <= to)
	{
		Size		span = (Size) Min((uint64) FELIX_VERIFY_CHUNK - len, to - pos);
		const char *p;
		const char *hit;

		CHECK_FOR_INTERRUPTS();
		/* read len - 1 bytes beyond the span so a match across it is seen */
		p = segfile_get(sf, pos, Min((uint64) span + len - 1, to - pos));
		if (p == NULL)
			return 0;
		hit = p;
		while ((hit = memchr(hit, pattern[0], span - (hit - p))) != NULL)
		{
			if (pos + (hit - p) + len > to)
				return 0;
			if (memcmp(hit, pattern, len) == 0)
				return pos + (hit - p);
			hit++;
			if (hit >= p + span)
				break;
		}
		pos += span;
	}
	return 0;
}

/*
 * The header at `off` failed its magic or CRC check (and is not all zero).
 * Was a complete batch nonetheless written there, and damaged since?  Yes
 * when any of these holds, because an unfinished write has none of them:
 *	 1. the trailer at the length the header claims is present: its magic,
 *		or a copy of the header's header_crc (either: a single flipped byte
 *		in the trailer must not make a complete batch look unfinished);
 *	 2. the body of the claimed length hashes to the claimed body CRC (a
 *		field other than body_len and body_crc was damaged);
 *	 3. the header's own trailer -- the trailer magic followed by the
 *		header's header_crc -- appears within a batch's reach after the
 *		header (body_len was damaged, so the claimed end is wrong);
 *	 4. magic and seq are right and the claimed count of records fills the
 *		claimed body exactly (the CRC fields were damaged).
 * Lengths here come from a header whose CRC failed: each is only a claim,
 * bounded by the largest batch and the end of the file before it is used.
 */
static bool
complete_batch_with_bad_header(FelixSegFile *sf, uint64 off, uint64 size,
							   uint64 expect_seq)
{
	FelixBatchHeader h;
	const char *p;
	FelixBatchTrailer own;
	uint64		reach;

	if (!segfile_header(sf, off, &h))
		return false;

	/* 1, 2 and 4 need the claimed batch to lie inside the file */
	if (h.body_len >= sizeof(uint32) && h.body_len <= FELIX_MAX_BATCH_BYTES &&
		batch_stored_len(&h) <= size - off)
	{
		uint64		len = batch_stored_len(&h);

		p = segfile_get(sf, off, len);
		if (p != NULL)
		{
			pg_crc32c	crc;

			if (batch_trailer_check(&h, p + len - BATCH_TRAILER_SIZE) != FELIX_TRAILER_ABSENT)
				return true;
			INIT_CRC32C(crc);
			crc = felix_crc32c_update(crc, p + BATCH_HEADER_SIZE, h.body_len);
			FIN_CRC32C(crc);
			if (crc == h.body_crc)
				return true;
			if (h.magic == FELIX_BATCH_MAGIC && h.base_seq == expect_seq &&
				h.kind == FELIX_BATCH_RECORDS &&
				records_fill(p + BATCH_HEADER_SIZE, h.body_len, h.count))
				return true;
		}
	}

	/* 3: look for the header's own trailer wherever the batch could end */
	batch_trailer_make(&h, &own);
	if (own.header_crc == 0)
		return false;			/* a zero copy would match unwritten space */
	reach = Min(size, off + BATCH_HEADER_SIZE + FELIX_MAX_BATCH_BYTES + BATCH_TRAILER_SIZE);
	return find_bytes(sf, off + BATCH_HEADER_SIZE, reach, (const char *) &own,
					  sizeof(own)) != 0;
}

/*
 * First offset at or after `from` where a valid batch header (magic, CRC,
 * fields) starts with a seq not before expect_seq; 0 if none.  Bytes are
 * searched one offset at a time because after damage we do not know where
 * batches begin.  A preallocated zero tail is skipped at memchr speed.
 */
static uint64
find_valid_header_after(FelixSegFile *sf, uint64 from, uint64 size,
						uint64 expect_seq)
{
	const uint32 magic = FELIX_BATCH_MAGIC;
	uint64		pos = from;

	while (pos + BATCH_HEADER_SIZE <= size)
	{
		Size		span = (Size) Min((uint64) FELIX_VERIFY_CHUNK, size - pos);
		const char *p;
		const char *hit;

		CHECK_FOR_INTERRUPTS();
		p = segfile_get(sf, pos, span);
		if (p == NULL)
			return 0;
		hit = memchr(p, ((const char *) &magic)[0], span);
		if (hit == NULL)
		{
			pos += span;
			continue;
		}
		pos += (hit - p);
		if (pos + BATCH_HEADER_SIZE > size)
			return 0;
		{
			FelixBatchHeader h;

			if (segfile_header(sf, pos, &h) && h.magic == FELIX_BATCH_MAGIC &&
				batch_header_check(&h) == FELIX_HDR_OK && h.base_seq >= expect_seq)
				return pos;
		}
		pos++;
	}
	return 0;
}

/*
 * A bad header at `off` ends the data only if nothing valid follows it: a
 * valid batch later in the file makes it damage, not `not_what` (the end of
 * the data, an unfinished write), and the segment refuses to serve.
 */
static void
refuse_if_valid_follows(FelixSegFile *sf, uint64 off, uint64 size, uint64 seq,
						FelixHeaderCheck hc, const char *what, const char *path,
						const char *not_what)
{
	uint64		later = find_valid_header_after(sf, off + 1, size, seq);

	if (later != 0)
		felix_report_corruption(what, path, off,
								psprintf("%s A valid batch follows at byte offset %llu, so this is damage, not %s.",
										 felix_header_problem(hc),
										 (unsigned long long) later, not_what));
}

typedef struct LastInfo
{
	uint64		size;			/* logical end: after the last batch */
	uint64		alloc;			/* physical size of the file afterwards */
	bool		sealed;
	uint64		next_seq;
	pg_crc32c	crc;			/* running CRC of [0, size) */
	uint64		index_mark;
	uint64		last_generation;	/* 0 if the segment holds no records */
} LastInfo;

/*
 * Repair the end of the last segment and make it durable: write the
 * trailer `fix` at fix_off (when fix is given), then cut the file at
 * cut_to (when cut_to is below size).  Logged and counted as a torn tail
 * when `reason` is given; a zero tail left behind a seal is dropped
 * quietly.
 */
static void
repair_tail(const char *path, const char *what, const FelixBatchTrailer *fix,
			uint64 fix_off, uint64 cut_to, uint64 size, const char *reason)
{
	int			fd = OpenTransientFile(path, O_RDWR | PG_BINARY);

	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
	if (fix != NULL)
	{
		bool		ok;

		pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
		ok = felix_pwrite_all(fd, fix, sizeof(*fix), fix_off);
		pgstat_report_wait_end();
		if (!ok)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not write the batch trailer at offset %llu of segment file \"%s\": %m",
							what, (unsigned long long) fix_off, path)));
	}
	if (cut_to < size)
	{
		pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_TRUNCATE);
		if (ftruncate(fd, (off_t) cut_to) != 0)
		{
			pgstat_report_wait_end();
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not truncate segment file \"%s\" to %llu bytes: %m",
							what, path, (unsigned long long) cut_to)));
		}
		pgstat_report_wait_end();
	}
	felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);

	if (reason == NULL)
		return;
	felix_count(FELIX_CTR_TORN_TAILS_REPAIRED, 1);
	if (cut_to < size)
		ereport(LOG,
				(errmsg("%s: repaired torn tail of segment file \"%s\": cut %llu bytes at offset %llu",
						what, path, (unsigned long long) (size - cut_to),
						(unsigned long long) cut_to),
				 errdetail_internal("%s", reason)));
	else
		ereport(LOG,
				(errmsg("%s: repaired torn tail of segment file \"%s\": wrote the trailer of the last batch at offset %llu",
						what, path, (unsigned long long) fix_off),
				 errdetail_internal("%s", reason)));
}

/* Rewrite the header of a last segment whose creation was cut short. */
static void
rewrite_segment_header(const char *path, const char *what, uint64 base,
					   uint64 generation, uint64 size)
{
	FelixSegmentHeader sh;
	int			fd = OpenTransientFile(path, O_RDWR | PG_BINARY);

	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
	segment_header_init(&sh, base, generation);
	if (!felix_pwrite_all(fd, &sh, sizeof(sh), 0) ||
		ftruncate(fd, (off_t) sizeof(sh)) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not rewrite header of segment file \"%s\": %m",
						what, path)));
	felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);
	felix_count(FELIX_CTR_TORN_TAILS_REPAIRED, 1);
	ereport(LOG,
			(errmsg("%s: repaired segment file \"%s\" whose creation was interrupted (%llu bytes); it is now empty",
					what, path, (unsigned long long) size)));
}

/*
 * Walk the last segment batch by batch and decide how it ends.
 *
 * What an append leaves on disk.  A batch (header, body, trailer) is
 * written front to back with one write, usually into preallocated space
 * that reads as zeros, and a publish is acknowledged only after fdatasync
 * covered the whole batch.  So an acknowledged batch is complete on disk,
 * trailer included; an interrupted write can leave only a prefix of one
 * batch at the very end of the data, never its trailer; and after the data
 * the file holds zeros up to its physical end.
 *
 * THE RULE.  At the write position (after the last good batch):
 *	 (a) the end of the file, or fewer than 48 bytes left that are all zero:
 *		 CLEAN END;
 *	 (b) a header of all zero bytes: if a valid batch header appears
 *		 anywhere later in the file, CORRUPTION (bytes after it were
 *		 written); else if every remaining byte is zero, CLEAN END (the
 *		 preallocated tail); else TORN (a write whose header never reached
 *		 the disk);
 *	 (c) a valid header whose batch (with its trailer) runs past the end of
 *		 the file: TORN (the write stopped part way);
 *	 (d) a valid header whose body fails its CRC or record structure: if
 *		 the trailer is PRESENT (its magic matches, or its header_crc copy
 *		 does; either suffices, so one flipped trailer byte cannot make a
 *		 complete batch look unfinished) the batch was completely written:
 *		 CORRUPTION.  If the trailer is ABSENT (neither matches: zeros or
 *		 stale bytes) and no valid batch header follows anywhere later:
 *		 TORN.  Absent with a valid batch later: CORRUPTION;
 *	 (e) a valid header and body whose trailer is not right: with a valid
 *		 batch header later, CORRUPTION (the trailer was damaged after the
 *		 batch was complete).  Otherwise this is the last batch and its
 *		 records are whole (header and body CRC matched): either the write
 *		 stopped inside the last 8 bytes (or a truncation stopped between
 *		 rewriting a header and its trailer, see truncate.c), or a byte of
 *		 a written trailer flipped.  Either way no record is lost by
 *		 keeping it: the batch is KEPT and its trailer rewritten (counted
 *		 as a torn-tail repair), never cut;
 *	 (f) a header that fails its magic or CRC check (not all zero): if the
 *		 bytes show a complete batch nonetheless (see
 *		 complete_batch_with_bad_header: the trailer at the claimed length,
 *		 the claimed body CRC, the header's own trailer further on, or the
 *		 records filling the claimed body) CORRUPTION; if a valid batch
 *		 header follows anywhere later, CORRUPTION; else TORN;
 *	 (g) fewer than 48 bytes left and not all zero: TORN;
 *	 (h) a header that matches its CRC but has impossible fields or a seq
 *		 that does not continue the previous batch, or a valid batch after
 *		 the seal: CORRUPTION (a writer wrote it that way).
 * A TORN tail is cut at the write position (the region after it reads as
 * zeros again; the next append re-extends the file), synced, logged and
 * counted.  CORRUPTION is reported with ERRCODE_DATA_CORRUPTED naming the
 * file and offset, and nothing is cut.  A sealed last segment with zeros
 * after its seal (the server stopped between writing the seal and cutting
 * the preallocated tail) has the zeros cut.
 *
 * Blind spots, both leaning towards refusing rather than cutting: a
 * complete last batch whose body fails its CRC is reported even though,
 * after an operating-system crash that wrote the batch's pages out of
 * order, it could be an unacknowledged write whose trailer page reached the
 * disk and a body page did not; and a header whose own damage hides every
 * sign of completeness (its body_len and header_crc both damaged) at the
 * very end of the data is cut as torn.
 */
static void
recover_last_segment(const char *dir, const char *what, uint64 base,
					 uint64 prev_generation, LastInfo *li)
{
	char		path[MAXPGPATH];
	FelixSegFile sf;
	uint64		size;
	uint64		off;
	uint64		seq = base;
	pg_crc32c	crc;
	FelixIndexBuild ib;
	bool		sealed = false;
	uint64		last_gen = 0;
	const char *torn = NULL;
	bool		have_fix = false;
	FelixBatchTrailer fix;
	uint64		fix_off = 0;
	uint64		cut_to;
	FelixSegmentHeader sh;

	felix_segment_path(path, dir, base);
	(void) segfile_open(&sf, path, what, FELIX_VERIFY_CHUNK, false);
	size = felix_fd_size(sf.fd, path);

	/*
	 * The header is written and fsync'd before any batch is appended (and
	 * before the file is extended), so a damaged header with nothing after
	 * it is an interrupted creation and is rewritten; a damaged header with
	 * bytes after it is corruption.
	 */
	if (size <= SEG_HEADER_SIZE)
	{
		bool		ok = false;

		if (size == SEG_HEADER_SIZE &&
			felix_pread_all(sf.fd, &sh, sizeof(sh), 0) == (ssize_t) sizeof(sh) &&
			segment_header_check(&sh))
		{
			if (sh.base_seq != base)
				felix_report_corruption(what, path, 0,
										psprintf("The segment header says base seq %llu but the file name says %llu.",
												 (unsigned long long) sh.base_seq,
												 (unsigned long long) base));
			ok = true;
		}
		if (!ok)
		{
			segfile_close(&sf);
			rewrite_segment_header(path, what, base, prev_generation, size);
			(void) segfile_open(&sf, path, what, FELIX_VERIFY_CHUNK, false);
			size = SEG_HEADER_SIZE;
		}
	}
	read_segment_header(sf.fd, path, what, base, size);

	INIT_CRC32C(crc);
	{
		const char *p = segfile_get(&sf, 0, SEG_HEADER_SIZE);

		COMP_CRC32C(crc, p, SEG_HEADER_SIZE);
	}
	fxidx_build_init(&ib);

	off = SEG_HEADER_SIZE;
	while (off < size)
	{
		FelixBatchHeader h;
		FelixHeaderCheck hc;
		FelixTrailerCheck tc;
		uint64		len;
		uint64		later;
		const char *p;

		CHECK_FOR_INTERRUPTS();

		/* (a), (g): not even a header's worth of bytes */
		if (size - off < BATCH_HEADER_SIZE)
		{
			if (!region_all_zero(&sf, off, size))
				torn = psprintf("Only %llu bytes follow the last complete batch, fewer than a batch header, and they are not zero.",
								(unsigned long long) (size - off));
			break;
		}
		(void) segfile_header(&sf, off, &h);
		hc = batch_header_check(&h);

		/* (b) */
		if (hc == FELIX_HDR_ZERO)
		{
			refuse_if_valid_follows(&sf, off, size, seq, hc, what, path,
									"the end of the data");
			if (!region_all_zero(&sf, off, size))
				torn = psprintf("%s Non-zero bytes follow it, but nothing valid.",
								felix_header_problem(hc));
			break;
		}

		/* (f) */
		if (hc == FELIX_HDR_BAD_MAGIC || hc == FELIX_HDR_BAD_CRC)
		{
			if (complete_batch_with_bad_header(&sf, off, size, seq))
				felix_report_corruption(what, path, off,
										psprintf("%s The bytes after it form a complete batch, so this is damage, not an unfinished write.",
												 felix_header_problem(hc)));
			refuse_if_valid_follows(&sf, off, size, seq, hc, what, path,
									"an unfinished write");
			torn = psprintf("%s Nothing valid follows it.", felix_header_problem(hc));
			break;
		}

		/* (h) */
		if (hc != FELIX_HDR_OK)
			felix_report_corruption(what, path, off, felix_header_problem(hc));
		if (sealed)
			felix_report_corruption(what, path, off,
									"A valid batch follows the segment's seal batch.");
		if (h.base_seq != seq)
			felix_report_corruption(what, path, off,
									psprintf("The batch starts at seq %llu where seq %llu was expected.",
											 (unsigned long long) h.base_seq,
											 (unsigned long long) seq));

		len = batch_stored_len(&h);
		/* (c) the write stopped inside the batch */
		if (len > size - off)
		{
			torn = psprintf("The batch header is valid but its %llu bytes run %llu bytes past the end of the file.",
							(unsigned long long) len,
							(unsigned long long) (off + len - size));
			break;
		}
		p = segfile_get(&sf, off, len);
		if (p == NULL)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not read segment file \"%s\" at offset %llu",
							what, path, (unsigned long long) off)));
		tc = batch_trailer_check(&h, p + len - BATCH_TRAILER_SIZE);

		/* (d) */
		if (!batch_body_check(&h, p + BATCH_HEADER_SIZE))
		{
			if (tc != FELIX_TRAILER_ABSENT)
				felix_report_corruption(what, path, off,
										"The batch is complete (its trailer is present) but its body does not match its checksum or its record count; a complete batch may have been acknowledged, so it is not cut.");
			later = find_valid_header_after(&sf, off + 1, size, seq);
			if (later != 0)
				felix_report_corruption(what, path, off,
										psprintf("The batch body does not match its checksum or its record count, and a valid batch follows at byte offset %llu, so this is damage, not an unfinished write.",
												 (unsigned long long) later));
			torn = "The batch header is valid but its body does not match its checksum and its trailer was never written: the write stopped part way.";
			break;
		}

		/* (e) */
		if (tc != FELIX_TRAILER_OK)
		{
			later = find_valid_header_after(&sf, off + len, size,
											h.kind == FELIX_BATCH_RECORDS ? seq + h.count : seq);
			if (later != 0)
				felix_report_corruption(what, path, off + len - BATCH_TRAILER_SIZE,
										psprintf("The batch trailer does not match the batch header, and a valid batch follows at byte offset %llu.",
												 (unsigned long long) later));
			batch_trailer_make(&h, &fix);
			fix_off = off + len - BATCH_TRAILER_SIZE;
			have_fix = true;
			/* the search moved the buffer: read the batch again */
			p = segfile_get(&sf, off, len);
			if (p == NULL)
				ereport(ERROR,
						(errcode_for_file_access(),
						 errmsg("%s: could not read segment file \"%s\" at offset %llu",
								what, path, (unsigned long long) off)));
		}

		if (h.kind == FELIX_BATCH_SEAL)
		{
			pg_crc32c	file_crc = crc;
			uint32		stored;

			FIN_CRC32C(file_crc);
			memcpy(&stored, p + BATCH_HEADER_SIZE, sizeof(stored));
			if (stored != file_crc)
				felix_report_corruption(what, path, off,
										psprintf("The seal's whole-file checksum is %08X but the file's bytes hash to %08X.",
												 stored, file_crc));
			sealed = true;
		}
		else
		{
			fxidx_build_note(&ib, h.base_seq, off);
			last_gen = h.generation;
			seq += h.count;
		}
		/* the running CRC covers the bytes as they will be: trailer fixed */
		if (tc != FELIX_TRAILER_OK)
		{
			crc = felix_crc32c_update(crc, p, len - BATCH_TRAILER_SIZE);
			crc = felix_crc32c_update(crc, &fix, sizeof(fix));
		}
		else
			crc = felix_crc32c_update(crc, p, len);
		off += len;
	}

	segfile_close(&sf);

	/*
	 * Cut a torn tail at the write position, and the zero tail behind a
	 * seal (a seal is the file's exact end); otherwise the zeros after the
	 * data stay allocated for the next appends.
	 */
	cut_to = (torn != NULL || sealed) ? off : size;
	if (have_fix || cut_to < size)
	{
		const char *reason = torn;

		if (have_fix)
			reason = psprintf("The last batch's header and body are whole but its trailer is not (the write stopped before its end, or the trailer was damaged); the batch is kept and its trailer rewritten.%s%s",
							  torn != NULL ? " " : "", torn != NULL ? torn : "");
		repair_tail(path, what, have_fix ? &fix : NULL, fix_off, cut_to, size,
					reason);
		size = cut_to;
	}
	else
		sync_file(path, what);	/* may have survived only in the page cache */
	(void) segfile_open(&sf, path, what, FELIX_READ_CHUNK, false);

	check_index(&sf, dir, what, base, sealed ? off - SEAL_BATCH_SIZE : off,
				&ib, true);
	segfile_close(&sf);

	li->size = off;
	li->alloc = size;
	li->sealed = sealed;
	li->next_seq = seq;
	li->crc = crc;
	li->index_mark = ib.n > 0 ? ib.mark : 0;
	li->last_generation = last_gen != 0 ? last_gen : prev_generation;
	fxidx_build_free(&ib);
}

/* ----------------------------------------------------------------
 * log_recover
 * ----------------------------------------------------------------
 */

void
log_recover(const char *dir, const char *what, FelixLogState *st)
{
	uint32		old_version = st->segments_version;
	uint64	   *bases;
	int			n;
	uint64		expect_base;
	uint64		total = 0;
	uint64		prev_gen = 0;
	char		prev_path[MAXPGPATH];
	LastInfo	li;

	felix_ensure_dir(dir, what);
	felix_fd_cache_forget(dir);
	remove_strays(dir, what);

	memset(st, 0, sizeof(*st));
	INIT_CRC32C(st->active_crc);
	/*
	 * Descriptor caches in other backends trust an entry only while the
	 * version is unchanged; make sure a re-recovered shard (or a slot whose
	 * state was zeroed) does not land on a version they remember.
	 */
	st->segments_version = old_version + 1 +
		(uint32) ((uint64) GetCurrentTimestamp() % 1000003);

	n = felix_list_segments(dir, what, &bases);
	if (n == 0)
	{
		fsync_fname(dir, true);
		return;
	}

	expect_base = bases[0];
	prev_path[0] = '\0';
	for (int i = 0; i < n; i++)
	{
		char		path[MAXPGPATH];

		CHECK_FOR_INTERRUPTS();
		felix_segment_path(path, dir, bases[i]);
		/* the segments must form one unbroken run of seqs */
		if (bases[i] != expect_base)
			felix_report_corruption(what, path, 0,
									psprintf("Segment \"%s\" ends at seq %llu but this segment begins at seq %llu: the log has a %s.",
											 prev_path,
											 (unsigned long long) expect_base,
											 (unsigned long long) bases[i],
											 bases[i] > expect_base ? "gap" : "overlap"));
		if (i < n - 1)
		{
			SealInfo	si;

			recover_sealed_segment(dir, what, bases[i], &si);
			expect_base = si.end_seq;
			total += si.size;
			prev_gen = si.generation;
		}
		strlcpy(prev_path, path, sizeof(prev_path));
	}

	recover_last_segment(dir, what, bases[n - 1], prev_gen, &li);
	fsync_fname(dir, true);

	st->start_seq = bases[0];
	st->next_seq = li.next_seq;
	st->total_bytes = total + li.size;
	st->last_generation = li.last_generation;
	st->active_base = bases[n - 1];
	st->active_bytes = li.size;
	st->alloc_bytes = li.alloc;
	st->active_crc = li.crc;
	st->index_mark = li.index_mark;
	/*
	 * A sealed last segment is never appended to again: the next append
	 * creates the segment beginning at next_seq.  active_base still names
	 * the (existing) last segment, so a log_sync of it is harmless.
	 */
	st->has_active = !li.sealed;
	pfree(bases);

	ereport(DEBUG1,
			(errmsg_internal("%s: recovered log [%llu, %llu) in %d segments, %llu bytes",
							 what, (unsigned long long) st->start_seq,
							 (unsigned long long) st->next_seq, n,
							 (unsigned long long) st->total_bytes)));
}
