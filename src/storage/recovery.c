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
 *	 - the last segment is walked batch by batch (header CRC, body CRC, seq
 *	   continuity), and its end is classified as clean, torn or corrupt;
 *	 - each segment's index is validated and rebuilt when missing or wrong.
 *
 * The torn-tail rule is in recover_last_segment(); it is the one place
 * where felix deletes bytes it did not write moments ago, so it errs on the
 * side of refusing: anything that could be an acknowledged batch is
 * reported as corruption and nothing is cut.
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

#include "felix.h"
#include "log_internal.h"
#include "metrics.h"
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
	felix_fdatasync(fd, path);
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
		!batch_body_check(&h, seal + BATCH_HEADER_SIZE))
		felix_report_corruption(what, path, seal_off,
								"A segment that is followed by another must end with a valid seal batch; this one does not.");
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
		COMP_CRC32C(crc, buf, want);
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

/*
 * The bytes from `off` to end of file start with a header that failed its
 * check.  Are they nonetheless one complete batch whose header was damaged?
 * Yes when the bytes after the header hash to the body_crc the header
 * claims (that is whatever length field got damaged), or when magic and
 * seq are right, the claimed length reaches end of file exactly and the
 * claimed count of records fills it exactly (the CRC fields got damaged).
 */
static bool
complete_batch_with_bad_header(FelixSegFile *sf, uint64 off, uint64 size,
							   uint64 expect_seq)
{
	FelixBatchHeader h;
	uint64		rest = size - off - BATCH_HEADER_SIZE;
	const char *body;
	pg_crc32c	crc;

	if (!segfile_header(sf, off, &h))
		return false;
	if (rest == 0 || rest > FELIX_MAX_BATCH_BYTES)
		return false;
	body = segfile_get(sf, off + BATCH_HEADER_SIZE, rest);
	if (body == NULL)
		return false;
	INIT_CRC32C(crc);
	COMP_CRC32C(crc, body, rest);
	FIN_CRC32C(crc);
	if (crc == h.body_crc)
		return true;
	return h.magic == FELIX_BATCH_MAGIC && h.base_seq == expect_seq &&
		h.body_len == rest && h.kind == FELIX_BATCH_RECORDS &&
		records_fill(body, rest, h.count);
}

/*
 * First offset after `off` where a valid batch header (magic, CRC, fields)
 * starts with a seq not before expect_seq; 0 if none.  Bytes are searched
 * one offset at a time because after damage we do not know where batches
 * begin.
 */
static uint64
find_valid_header_after(FelixSegFile *sf, uint64 off, uint64 size,
						uint64 expect_seq)
{
	const uint32 magic = FELIX_BATCH_MAGIC;
	uint64		pos = off + 1;

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

typedef struct LastInfo
{
	uint64		size;			/* after any cut */
	bool		sealed;
	uint64		next_seq;
	pg_crc32c	crc;			/* running CRC of [0, size) */
	uint64		index_mark;
	uint64		last_generation;	/* 0 if the segment holds no records */
} LastInfo;

/* Cut the file back to `off`, make that durable, and say so. */
static void
cut_torn_tail(const char *path, const char *what, uint64 off, uint64 size,
			  const char *reason)
{
	int			fd = OpenTransientFile(path, O_RDWR | PG_BINARY);

	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_TRUNCATE);
	if (ftruncate(fd, (off_t) off) != 0)
	{
		pgstat_report_wait_end();
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not truncate segment file \"%s\" to %llu bytes: %m",
						what, path, (unsigned long long) off)));
	}
	pgstat_report_wait_end();
	felix_fdatasync(fd, path);
	CloseTransientFile(fd);

	felix_count(FELIX_CTR_TORN_TAILS_REPAIRED, 1);
	ereport(LOG,
			(errmsg("%s: repaired torn tail of segment file \"%s\": cut %llu bytes at offset %llu",
					what, path, (unsigned long long) (size - off),
					(unsigned long long) off),
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
	felix_fdatasync(fd, path);
	CloseTransientFile(fd);
	felix_count(FELIX_CTR_TORN_TAILS_REPAIRED, 1);
	ereport(LOG,
			(errmsg("%s: repaired segment file \"%s\" whose creation was interrupted (%llu bytes); it is now empty",
					what, path, (unsigned long long) size)));
}

/*
 * Walk the last segment batch by batch and decide how it ends.
 *
 * THE TORN-TAIL RULE.  A publish is acknowledged only after fdatasync
 * covered its whole batch, so an acknowledged batch is complete on disk.
 * At the first batch that fails its checks, the bytes from there to the
 * end are a TORN TAIL — an unfinished write nobody was told succeeded —
 * and are cut, when:
 *	 (a) fewer than 48 bytes remain (not even a header was written); or
 *	 (b) the header is all zero bytes and no valid batch header follows
 *		 anywhere later in the file (space the file system had extended but
 *		 the write never reached); or
 *	 (c) the header is valid but its body runs past the end of the file
 *		 (the write stopped part way); or
 *	 (d) the header fails its magic or CRC check, no valid batch header
 *		 follows anywhere later in the file, and the remaining bytes are
 *		 not one complete batch with a damaged header (see
 *		 complete_batch_with_bad_header).
 * Everything else is CORRUPTION and nothing is cut:
 *	 - a complete batch (wholly inside the file) whose body does not match
 *	   its CRC: it may well have been acknowledged;
 *	 - any failing batch followed later in the file by a valid batch: bytes
 *	   after it were written, so it is not the tail that tore;
 *	 - a header that matches its CRC but has impossible fields, or a seq
 *	   that does not continue the previous batch: a writer wrote it that way;
 *	 - a complete batch whose header alone was damaged.
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
	FelixSegmentHeader sh;

	felix_segment_path(path, dir, base);
	(void) segfile_open(&sf, path, what, FELIX_VERIFY_CHUNK, false);
	size = felix_fd_size(sf.fd, path);

	/*
	 * The header is written and fsync'd before any batch is appended, so a
	 * damaged header with nothing after it is an interrupted creation and
	 * is rewritten; a damaged header with batches after it is corruption.
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
		uint64		len;
		uint64		later;
		const char *p;

		CHECK_FOR_INTERRUPTS();

		/* (a) not even a header's worth of bytes */
		if (size - off < BATCH_HEADER_SIZE)
		{
			torn = psprintf("Only %llu bytes follow the last complete batch, fewer than a batch header.",
							(unsigned long long) (size - off));
			break;
		}
		(void) segfile_header(&sf, off, &h);
		hc = batch_header_check(&h);

		if (hc == FELIX_HDR_ZERO || hc == FELIX_HDR_BAD_MAGIC || hc == FELIX_HDR_BAD_CRC)
		{
			if (hc != FELIX_HDR_ZERO &&
				complete_batch_with_bad_header(&sf, off, size, seq))
				felix_report_corruption(what, path, off,
										psprintf("%s The bytes after it form a complete batch, so this is damage, not an unfinished write.",
												 felix_header_problem(hc)));
			later = find_valid_header_after(&sf, off, size, seq);
			if (later != 0)
				felix_report_corruption(what, path, off,
										psprintf("%s A valid batch follows at byte offset %llu, so this is damage, not an unfinished write.",
												 felix_header_problem(hc),
												 (unsigned long long) later));
			/* (b) and (d) */
			torn = psprintf("%s Nothing valid follows it.", felix_header_problem(hc));
			break;
		}
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

		len = BATCH_HEADER_SIZE + h.body_len;
		/* (c) the write stopped inside the body */
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
		if (!batch_body_check(&h, p + BATCH_HEADER_SIZE))
			felix_report_corruption(what, path, off,
									"The batch is complete but its body does not match its checksum or its record count; a complete batch may have been acknowledged, so it is not cut.");

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
		COMP_CRC32C(crc, p, len);
		off += len;
	}

	if (torn != NULL)
	{
		segfile_close(&sf);
		cut_torn_tail(path, what, off, size, torn);
		size = off;
		(void) segfile_open(&sf, path, what, FELIX_READ_CHUNK, false);
	}
	else
		sync_file(path, what);	/* may have survived only in the page cache */

	check_index(&sf, dir, what, base, sealed ? size - SEAL_BATCH_SIZE : size,
				&ib, true);
	segfile_close(&sf);

	li->size = size;
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
