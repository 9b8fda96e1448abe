/*-------------------------------------------------------------------------
 *
 * truncate.c
 *	  log_truncate_to: remove every record from a given seq on.  This is
 *	  how a replica drops the part of its log that diverged from a new
 *	  leader's; on a single node nothing calls it with anything to cut.
 *
 * INVARIANT kept here: no record at or below the high-water mark is ever
 * rewritten.  The caller passes hwm_end (exclusive), and a cut that would
 * remove any record below it is refused before a byte is touched.
 *
 * Steps, each leaving a valid log if the server stops right after it:
 *	 1. Segments after the one holding the cut are unlinked newest first,
 *		the directory synced after each, so the remaining segments always
 *		form an unbroken run (at worst the last one is still sealed, which
 *		recovery accepts).
 *	 2. The segment holding the cut is shortened to the end of the batch
 *		holding the cut (or to the cut itself at a batch boundary) and
 *		synced: everything after that batch is gone, a preallocated zero
 *		tail included.
 *	 3. A batch straddling the cut keeps its first records: its kept records
 *		are byte for byte the start of its body, so only its 48-byte header
 *		is rewritten (count, body_len, body_crc) and synced, then its new
 *		8-byte trailer is written right after the kept records and the file
 *		shortened to that trailer's end, and synced.  The header goes down
 *		first: a stop after it leaves a valid shortened batch whose trailer
 *		is not yet written, followed by the rest of the old body, which is
 *		not a batch and has nothing valid after it; recovery keeps the
 *		shortened batch (header and body check out), writes its trailer and
 *		cuts the rest (recovery.c).  The other order could leave the old
 *		header over a body the new trailer has overwritten while the old
 *		trailer is still present: a complete-looking batch that fails its
 *		CRC, which recovery must report as corruption.
 * A cut inside a sealed segment removes its seal: it becomes the active
 * segment again.
 *
 * Locking rule: runs with the shard's append lock held exclusively; readers
 * read only below the high-water mark, which is never touched here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log_internal.h"
#include "miscadmin.h"
#include "common/file_perm.h"
#include "storage/fd.h"

/* Generation recorded in the seal of a sealed segment (0 if unreadable). */
static uint64
seal_generation(const char *dir, uint64 base)
{
	char		path[MAXPGPATH];
	int			fd;
	uint64		size;
	FelixBatchHeader h;
	uint64		gen = 0;

	felix_segment_path(path, dir, base);
	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
		return 0;
	size = felix_fd_size(fd, path);
	if (size >= SEG_HEADER_SIZE + SEAL_BATCH_SIZE &&
		felix_pread_all(fd, &h, sizeof(h), size - SEAL_BATCH_SIZE) == (ssize_t) sizeof(h) &&
		batch_header_check(&h) == FELIX_HDR_OK && h.kind == FELIX_BATCH_SEAL)
		gen = h.generation;
	CloseTransientFile(fd);
	return gen;
}

/*
 * Bytes segment `base` counts in total_bytes: the logical end for the
 * active segment (its preallocated tail is not counted), the file size for
 * a sealed one (which ends exactly at its seal).
 */
static uint64
segment_logical_size(const FelixLogState *st, const char *path, uint64 base)
{
	struct stat sb;

	if (st->has_active && base == st->active_base)
		return st->active_bytes;
	if (stat(path, &sb) != 0)
		return 0;
	return (uint64) sb.st_size;
}

void
log_truncate_to(const char *dir, const char *what, FelixLogState *st,
				uint64 cut, uint64 hwm_end)
{
	uint64	   *bases;
	int			n;
	int			s;
	uint64		base;
	char		path[MAXPGPATH];
	FelixSegFile sf;
	uint64		old_size;
	uint64		removed_bytes = 0;
	uint64		off;
	uint64		bseq;
	uint64		cut_off = 0;
	bool		straddle = false;
	FelixBatchHeader keep_hdr;
	FelixBatchTrailer keep_trailer;
	uint64		orig_len = 0;
	int			fd;
	pg_crc32c	crc;
	FelixIndexBuild ib;
	FelixWalk	w;

	/* keep [start, cut) */
	if (cut >= st->next_seq)
		return;					/* nothing from cut on */

	/* INVARIANT: records below hwm_end are acknowledged; never rewritten */
	if (cut < hwm_end)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: cannot truncate the log after seq %lld: that would cut at or below the high-water mark",
						what, (long long) cut - 1),
				 errdetail("Records up to seq %llu are acknowledged and are never rewritten.",
						   (unsigned long long) (hwm_end - 1)),
				 errhint("Only records above the high-water mark can be truncated.")));
	if (cut < st->start_seq)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: cannot truncate the log after seq %lld: the log starts at seq %llu",
						what, (long long) cut - 1,
						(unsigned long long) st->start_seq),
				 errhint("Records before the log's start were removed by retention; rebuild the shard instead.")));

	n = felix_list_segments(dir, what, &bases);
	for (s = n - 1; s >= 0 && bases[s] > cut; s--)
		;
	if (s < 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("%s: no segment file in \"%s\" holds seq %llu",
						what, dir, (unsigned long long) cut),
				 errhint("Restore the shard's files from a replica or a backup.")));
	base = bases[s];

	/* 1. later segments go first, newest first, each removal durable */
	for (int j = n - 1; j > s; j--)
	{
		char		p[MAXPGPATH];

		CHECK_FOR_INTERRUPTS();
		felix_segment_path(p, dir, bases[j]);
		removed_bytes += segment_logical_size(st, p, bases[j]);
		felix_unlink(p, what);
		felix_index_path(p, dir, bases[j]);
		felix_unlink(p, what);
		fsync_fname(dir, true);
	}
	felix_fd_cache_forget(dir);

	/* find the batch holding the cut, starting from the index */
	felix_segment_path(path, dir, base);
	old_size = segment_logical_size(st, path, base);
	(void) segfile_open(&sf, path, what, FELIX_READ_CHUNK, false);
	fxidx_seek(&sf, dir, what, base, cut, false, &bseq, &off);
	for (;;)
	{
		FelixBatchHeader h;
		FelixHeaderCheck hc;
		uint64		len;

		CHECK_FOR_INTERRUPTS();
		if (bseq == cut)
		{
			cut_off = off;		/* a batch boundary (or the seal) */
			break;
		}
		if (!segfile_header(&sf, off, &h))
			felix_report_corruption(what, path, off,
									psprintf("The segment ends at seq %llu, before seq %llu.",
											 (unsigned long long) bseq,
											 (unsigned long long) cut));
		hc = batch_header_check(&h);
		if (hc != FELIX_HDR_OK)
			felix_report_corruption(what, path, off, felix_header_problem(hc));
		if (h.base_seq != bseq || h.kind != FELIX_BATCH_RECORDS)
			felix_report_corruption(what, path, off,
									psprintf("Expected a batch starting at seq %llu.",
											 (unsigned long long) bseq));
		len = batch_stored_len(&h);
		if (bseq + h.count > cut)
		{
			/* straddles the cut: keep its first cut - bseq records */
			const char *p = segfile_get(&sf, off, len);
			FelixBatchIter it;
			FelixRecord rec;
			uint32		keep = (uint32) (cut - bseq);
			StringInfoData kb;

			if (p == NULL || !batch_body_check(&h, p + BATCH_HEADER_SIZE))
				felix_report_corruption(what, path, off,
										"The batch body does not match its checksum or its record count.");
			batch_iter_init(&it, &h, p + BATCH_HEADER_SIZE);
			for (uint32 k = 0; k < keep; k++)
				(void) batch_iter_next(&it, &rec);

			/*
			 * The kept records are exactly the body's first it.offset bytes;
			 * build the shortened batch through the normal sealing and
			 * stamping path, keeping the original's position fields.  Only
			 * its header and trailer are written to the file.
			 */
			initStringInfo(&kb);
			batch_begin(&kb);
			appendBinaryStringInfo(&kb, p + BATCH_HEADER_SIZE, it.offset);
			memcpy(kb.data + offsetof(FelixBatchHeader, count), &keep, sizeof(keep));
			batch_seal_body(&kb, FELIX_BATCH_RECORDS);
			batch_stamp(kb.data, h.base_seq, h.generation, h.timestamp);
			memcpy(&keep_hdr, kb.data, sizeof(keep_hdr));
			memcpy(&keep_trailer, kb.data + kb.len - BATCH_TRAILER_SIZE,
				   sizeof(keep_trailer));
			pfree(kb.data);
			cut_off = off;
			orig_len = len;
			straddle = true;
			break;
		}
		off += len;
		bseq += h.count;
	}
	segfile_close(&sf);

	/* 2. cut after the batch holding the cut (or at the cut) */
	fd = OpenTransientFile(path, O_RDWR | PG_BINARY);
	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_TRUNCATE);
	if (ftruncate(fd, (off_t) (cut_off + orig_len)) != 0)
	{
		pgstat_report_wait_end();
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not truncate segment file \"%s\": %m", what, path)));
	}
	pgstat_report_wait_end();
	felix_fdatasync(fd, path, what);

	/* 3. shorten a straddling batch in place: header first, then trailer */
	if (straddle)
	{
		uint64		new_end = cut_off + batch_stored_len(&keep_hdr);
		bool		ok;

		ok = felix_pwrite_all(fd, &keep_hdr, sizeof(keep_hdr), cut_off);
		/* the header must be on disk before the trailer (see the file header) */
		if (ok)
		{
			felix_fdatasync(fd, path, what);
			ok = felix_pwrite_all(fd, &keep_trailer, sizeof(keep_trailer),
								  new_end - BATCH_TRAILER_SIZE) &&
				ftruncate(fd, (off_t) new_end) == 0;
		}
		if (!ok)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not rewrite the batch at offset %llu of segment file \"%s\": %m",
							what, (unsigned long long) cut_off, path),
					 errhint("Restart the server: recovery finishes or undoes this truncation.")));
		felix_fdatasync(fd, path, what);
	}
	CloseTransientFile(fd);

	/* 4. recompute the tail bookkeeping from what is now on disk */
	(void) segfile_open(&sf, path, what, FELIX_VERIFY_CHUNK, false);
	INIT_CRC32C(crc);
	{
		const char *p = segfile_get(&sf, 0, SEG_HEADER_SIZE);

		if (p == NULL)
			felix_report_corruption(what, path, 0,
									"The file is shorter than a segment header.");
		COMP_CRC32C(crc, p, SEG_HEADER_SIZE);
	}
	fxidx_build_init(&ib);
	segment_walk(&sf, what, SEG_HEADER_SIZE, base, true, &ib, &crc, &w);
	segfile_close(&sf);
	if (w.sealed || w.end_seq != cut)
		felix_report_corruption(what, path, w.end_offset,
								psprintf("After truncation the segment should end at seq %llu but ends at seq %llu.",
										 (unsigned long long) cut,
										 (unsigned long long) w.end_seq));
	fxidx_write(dir, what, base, ib.entries, ib.n, true);

	st->has_active = true;
	st->active_base = base;
	st->active_bytes = w.end_offset;
	st->alloc_bytes = w.end_offset;	/* the file ends there; re-extended lazily */
	st->active_crc = crc;
	st->index_mark = ib.n > 0 ? ib.mark : 0;
	st->next_seq = cut;
	st->total_bytes -= removed_bytes + (old_size - w.end_offset);
	if (w.batches > 0)
		st->last_generation = w.last_generation;
	else
		st->last_generation = s > 0 ? seal_generation(dir, bases[s - 1]) : 0;
	st->segments_version++;
	fxidx_build_free(&ib);
	pfree(bases);

	/* the generation map must not name generations that have no records left */
	genmap_truncate(dir, what, cut);

	ereport(LOG,
			(errmsg("%s: truncated the log from seq %llu on (%llu bytes removed)",
					what, (unsigned long long) cut,
					(unsigned long long) (removed_bytes + (old_size - w.end_offset)))));
}

void
log_discard(const char *dir, const char *what, FelixLogState *st,
			uint64 start_seq, uint64 generation)
{
	uint64	   *bases;
	int			n;
	char		path[MAXPGPATH];
	uint32		version = st->segments_version;

	felix_fd_cache_forget(dir);
	/* the mark first: it must never outlive records it vouched for */
	log_hwm_reset(dir, what);
	snprintf(path, sizeof(path), "%s/%s", dir, FELIX_GENMAP_FILE);
	felix_unlink(path, what);

	/* newest first, so a stop part-way leaves an unbroken, shorter run */
	n = felix_list_segments(dir, what, &bases);
	for (int i = n - 1; i >= 0; i--)
	{
		CHECK_FOR_INTERRUPTS();
		felix_index_path(path, dir, bases[i]);
		felix_unlink(path, what);
		felix_segment_path(path, dir, bases[i]);
		felix_unlink(path, what);
		fsync_fname(dir, true);
	}
	if (bases)
		pfree(bases);

	memset(st, 0, sizeof(*st));
	st->segments_version = version + 1;
	st->start_seq = st->next_seq = start_seq;
	segment_create(dir, what, st, generation);
	ereport(LOG,
			(errmsg("%s: discarded its copy; the log now begins, empty, at seq " UINT64_FORMAT,
					what, start_seq)));
}
