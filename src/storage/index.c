/*-------------------------------------------------------------------------
 *
 * index.c
 *	  The sparse index of a segment (<base>.idx): entries {seq, offset}
 *	  saying "the batch at this file offset starts at this seq", one for the
 *	  segment's first batch and then one every felix.index_interval_bytes.
 *	  Also the strict batch walk over a segment that rebuilding the index,
 *	  truncation and retention share.
 *
 * The index is a hint and is never trusted.  log_append adds entries to the
 * active segment's file without syncing it; a seal makes it whole and
 * fsyncs it; recovery rewrites the active segment's index from its walk and
 * rebuilds any sealed segment's index that fails validation; and every
 * lookup reads the batch header the chosen entry points at (magic, CRC,
 * seq) before using it.  When that check fails the index of a sealed
 * segment is rebuilt on the spot; for the active segment the lookup falls
 * back to the segment's first batch (its index belongs to the appender).
 *
 * Index files are rewritten in place (truncate, then write) rather than
 * renamed over, because appenders hold O_APPEND descriptors to them: a
 * rename would leave those writing into an unlinked file.
 *
 * Locking rule: appends to an index file happen under the shard's append
 * lock (from log_append).  Lookups take no lock.  A rebuild from a reader
 * only rewrites a sealed segment's index, which no appender touches;
 * concurrent rebuilds write identical bytes at the same offsets.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/crc.h"
#include "felix.h"
#include "log_internal.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "common/file_perm.h"
#include "storage/fd.h"
#include "utils/memutils.h"

/* ----------------------------------------------------------------
 * Building entry lists
 * ----------------------------------------------------------------
 */

/* The one rule for where entries go: first batch, then every interval. */
bool
fxidx_wants_entry(uint64 off, uint64 mark)
{
	if (off == SEG_HEADER_SIZE || felix_index_interval_bytes <= 0)
		return true;
	return off - mark >= (uint64) felix_index_interval_bytes;
}

void
fxidx_build_init(FelixIndexBuild *b)
{
	b->cap = 64;
	b->n = 0;
	b->entries = palloc(b->cap * sizeof(FelixIndexEntry));
	b->mark = 0;
}

void
fxidx_build_note(FelixIndexBuild *b, uint64 seq, uint64 off)
{
	if (!fxidx_wants_entry(off, b->mark))
		return;
	if (b->n == b->cap)
	{
		b->cap *= 2;
		b->entries = repalloc_huge(b->entries, b->cap * sizeof(FelixIndexEntry));
	}
	b->entries[b->n].seq = seq;
	b->entries[b->n].offset = off;
	b->n++;
	b->mark = off;
}

void
fxidx_build_free(FelixIndexBuild *b)
{
	if (b->entries)
		pfree(b->entries);
	b->entries = NULL;
	b->n = b->cap = 0;
}

static void
fxidx_header_init(FelixIndexHeader *h, uint64 base)
{
	pg_crc32c	crc;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, FELIX_INDEX_MAGIC, sizeof(h->magic));
	h->version = 1;
	h->base_seq = base;
	INIT_CRC32C(crc);
	COMP_CRC32C(crc, h, offsetof(FelixIndexHeader, crc));
	FIN_CRC32C(crc);
	h->crc = crc;
}

static bool
fxidx_header_ok(const FelixIndexHeader *h, uint64 base)
{
	pg_crc32c	crc;

	if (memcmp(h->magic, FELIX_INDEX_MAGIC, sizeof(h->magic)) != 0)
		return false;
	INIT_CRC32C(crc);
	COMP_CRC32C(crc, h, offsetof(FelixIndexHeader, crc));
	FIN_CRC32C(crc);
	return crc == h->crc && h->version == 1 && h->base_seq == base;
}

/* ----------------------------------------------------------------
 * Index files
 * ----------------------------------------------------------------
 */

bool
fxidx_read(const char *dir, uint64 base, FelixIndexEntry **entries, int *n)
{
	char		path[MAXPGPATH];
	int			fd;
	uint64		size;
	FelixIndexHeader hdr;
	char	   *buf;
	ssize_t		got;

	*entries = NULL;
	*n = 0;
	felix_index_path(path, dir, base);
	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
		return false;
	size = felix_fd_size(fd, path);
	if (size < INDEX_HEADER_SIZE ||
		(size - INDEX_HEADER_SIZE) % sizeof(FelixIndexEntry) != 0 ||
		size > MaxAllocHugeSize)
	{
		CloseTransientFile(fd);
		return false;
	}
	buf = palloc_extended(size, MCXT_ALLOC_HUGE);
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_READ);
	got = felix_pread_all(fd, buf, size, 0);
	pgstat_report_wait_end();
	CloseTransientFile(fd);
	if (got != (ssize_t) size)
	{
		pfree(buf);
		return false;
	}
	memcpy(&hdr, buf, sizeof(hdr));
	if (!fxidx_header_ok(&hdr, base))
	{
		pfree(buf);
		return false;
	}
	*n = (int) ((size - INDEX_HEADER_SIZE) / sizeof(FelixIndexEntry));
	*entries = palloc_extended(Max(*n, 1) * sizeof(FelixIndexEntry), MCXT_ALLOC_HUGE);
	memcpy(*entries, buf + INDEX_HEADER_SIZE, *n * sizeof(FelixIndexEntry));
	pfree(buf);
	return true;
}

/*
 * Is this entry list plausible for a segment whose batches end at data_end?
 * The first entry must be the first batch, entries strictly increasing and
 * inside the data, and the last one must point at a real RECORDS batch with
 * that seq.  (Entries in between are verified when a lookup uses them.)
 */
bool
fxidx_entries_valid(FelixSegFile *sf, uint64 base,
					const FelixIndexEntry *entries, int n, uint64 data_end)
{
	FelixBatchHeader h;

	if (n == 0)
		return data_end <= SEG_HEADER_SIZE;
	if (entries[0].offset != SEG_HEADER_SIZE || entries[0].seq != base)
		return false;
	for (int i = 0; i < n; i++)
	{
		if (entries[i].offset + BATCH_HEADER_SIZE > data_end)
			return false;
		if (i > 0 && (entries[i].seq <= entries[i - 1].seq ||
					  entries[i].offset <= entries[i - 1].offset))
			return false;
	}
	if (!segfile_header(sf, entries[n - 1].offset, &h))
		return false;
	return batch_header_check(&h) == FELIX_HDR_OK &&
		h.kind == FELIX_BATCH_RECORDS && h.base_seq == entries[n - 1].seq;
}

/*
 * Rewrite the index file in place.  Failures are reported as WARNING: the
 * index is a hint, and a missing or short one is detected and rebuilt.
 */
void
fxidx_write(const char *dir, const char *what, uint64 base,
			const FelixIndexEntry *entries, int n, bool sync)
{
	char		path[MAXPGPATH];
	int			fd;
	Size		len = INDEX_HEADER_SIZE + (Size) n * sizeof(FelixIndexEntry);
	char	   *buf;
	FelixIndexHeader hdr;
	bool		ok;

	felix_index_path(path, dir, base);
	fd = OpenTransientFilePerm(path, O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY,
							   pg_file_create_mode);
	if (fd < 0)
	{
		ereport(WARNING,
				(errcode_for_file_access(),
				 errmsg("%s: could not open index file \"%s\": %m", what, path),
				 errdetail("Lookups in this segment will read from its first batch.")));
		return;
	}
	buf = palloc_extended(len, MCXT_ALLOC_HUGE);
	fxidx_header_init(&hdr, base);
	memcpy(buf, &hdr, sizeof(hdr));
	if (n > 0)
		memcpy(buf + INDEX_HEADER_SIZE, entries, (Size) n * sizeof(FelixIndexEntry));
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	ok = felix_pwrite_all(fd, buf, len, 0);
	pgstat_report_wait_end();
	pfree(buf);
	if (ok && sync)
	{
		pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_SYNC);
		ok = (pg_fsync(fd) == 0);
		pgstat_report_wait_end();
	}
	if (!ok)
		ereport(WARNING,
				(errcode_for_file_access(),
				 errmsg("%s: could not write index file \"%s\": %m", what, path),
				 errdetail("Lookups in this segment will read from its first batch.")));
	CloseTransientFile(fd);
}

/* Open (creating if needed) for appending; writes the header into a new file. */
static int
fxidx_open_common(const char *dir, const char *what, uint64 base, bool truncate)
{
	char		path[MAXPGPATH];
	int			fd;
	FelixIndexHeader hdr;

	felix_index_path(path, dir, base);
	fd = BasicOpenFilePerm(path,
						   O_WRONLY | O_CREAT | O_APPEND | PG_BINARY |
						   (truncate ? O_TRUNC : 0),
						   pg_file_create_mode);
	if (fd < 0)
	{
		ereport(WARNING,
				(errcode_for_file_access(),
				 errmsg("%s: could not open index file \"%s\": %m", what, path),
				 errdetail("The segment stays readable; seeks in it read from its first batch.")));
		return -1;
	}
	if (truncate || felix_fd_size(fd, path) == 0)
	{
		fxidx_header_init(&hdr, base);
		if (!felix_pwrite_all(fd, &hdr, sizeof(hdr), 0))
		{
			ereport(WARNING,
					(errcode_for_file_access(),
					 errmsg("%s: could not write index file \"%s\": %m", what, path)));
			close(fd);
			return -1;
		}
	}
	return fd;
}

int
fxidx_create(const char *dir, const char *what, uint64 base)
{
	return fxidx_open_common(dir, what, base, true);
}

int
fxidx_open_append(const char *dir, const char *what, uint64 base)
{
	return fxidx_open_common(dir, what, base, false);
}

void
fxidx_append_entry(int fd, const char *dir, uint64 base, uint64 seq,
				   uint64 offset)
{
	FelixIndexEntry e;
	ssize_t		n;

	e.seq = seq;
	e.offset = offset;
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	n = write(fd, &e, sizeof(e));
	pgstat_report_wait_end();
	if (n != (ssize_t) sizeof(e))
	{
		char		path[MAXPGPATH];
		struct stat sb;

		if (n >= 0)
			errno = ENOSPC;
		felix_index_path(path, dir, base);
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not append to index file \"%s\": %m", path),
				 errdetail("The index is a hint; it is rebuilt when the segment is sealed.")));
		/* keep the file a whole number of entries so later appends line up */
		if (fstat(fd, &sb) == 0 && (uint64) sb.st_size > INDEX_HEADER_SIZE)
		{
			uint64		whole = INDEX_HEADER_SIZE +
				(((uint64) sb.st_size - INDEX_HEADER_SIZE) / sizeof(e)) * sizeof(e);

			if (ftruncate(fd, (off_t) whole) != 0)
				ereport(LOG,
						(errcode_for_file_access(),
						 errmsg("could not truncate index file \"%s\": %m", path)));
		}
	}
}

/* ----------------------------------------------------------------
 * Walking a segment
 * ----------------------------------------------------------------
 */

void
segment_walk(FelixSegFile *sf, const char *what, uint64 off, uint64 seq,
			 bool check_bodies, FelixIndexBuild *ib, pg_crc32c *crc,
			 FelixWalk *w)
{
	uint64		file_size = felix_fd_size(sf->fd, sf->path);

	memset(w, 0, sizeof(*w));
	w->end_offset = off;
	w->end_seq = seq;

	for (;;)
	{
		FelixBatchHeader h;
		FelixHeaderCheck hc;
		uint64		batch_len;
		const char *p = NULL;

		CHECK_FOR_INTERRUPTS();

		if (off >= file_size)
			break;
		if (!segfile_header(sf, off, &h))
			felix_report_corruption(what, sf->path, off,
									psprintf("%llu stray bytes follow the last batch.",
											 (unsigned long long) (file_size - off)));
		hc = batch_header_check(&h);
		if (hc != FELIX_HDR_OK)
			felix_report_corruption(what, sf->path, off, felix_header_problem(hc));
		if (h.base_seq != seq)
			felix_report_corruption(what, sf->path, off,
									psprintf("The batch starts at seq %llu where seq %llu was expected.",
											 (unsigned long long) h.base_seq,
											 (unsigned long long) seq));
		batch_len = batch_stored_len(&h);
		if (off + batch_len > file_size)
			felix_report_corruption(what, sf->path, off,
									psprintf("The batch claims %llu bytes but the file ends %llu bytes later.",
											 (unsigned long long) batch_len,
											 (unsigned long long) (file_size - off)));

		if (check_bodies || crc != NULL || h.kind == FELIX_BATCH_SEAL)
		{
			p = segfile_get(sf, off, batch_len);
			if (p == NULL)
				felix_report_corruption(what, sf->path, off,
										"The file ended while the batch was being read.");
			if (check_bodies && !batch_body_check(&h, p + BATCH_HEADER_SIZE))
				felix_report_corruption(what, sf->path, off,
										"The batch body does not match its checksum or its record count.");
			if (batch_trailer_check(&h, p + batch_len - BATCH_TRAILER_SIZE) != FELIX_TRAILER_OK)
				felix_report_corruption(what, sf->path, off + batch_len - BATCH_TRAILER_SIZE,
										"The batch trailer does not match the batch header.");
			if (crc != NULL)
				*crc = felix_crc32c_update(*crc, p, batch_len);
		}

		if (h.kind == FELIX_BATCH_SEAL)
		{
			memcpy(&w->seal_crc, p + BATCH_HEADER_SIZE, sizeof(uint32));
			w->sealed = true;
			off += batch_len;
			w->end_offset = off;
			if (off < file_size)
				felix_report_corruption(what, sf->path, off,
										psprintf("%llu bytes follow the segment's seal batch.",
												 (unsigned long long) (file_size - off)));
			break;
		}

		if (ib != NULL)
			fxidx_build_note(ib, h.base_seq, off);
		w->last_generation = h.generation;
		w->last_timestamp = h.timestamp;
		w->last_batch_offset = off;
		w->batches++;
		seq += h.count;
		off += batch_len;
		w->end_offset = off;
		w->end_seq = seq;
	}
}

/* Walk the whole segment from its first batch and rewrite its index. */
void
fxidx_rebuild(FelixSegFile *sf, const char *dir, const char *what,
			  uint64 base, bool sync)
{
	FelixIndexBuild ib;
	FelixWalk	w;

	fxidx_build_init(&ib);
	segment_walk(sf, what, SEG_HEADER_SIZE, base, false, &ib, NULL, &w);
	fxidx_write(dir, what, base, ib.entries, ib.n, sync);
	fxidx_build_free(&ib);
	felix_count(FELIX_CTR_INDEX_REBUILDS, 1);
}

/*
 * Called right after a seal: the entries appended during the segment's life
 * were never synced and may have gaps; keep them if they are plausible,
 * rebuild them otherwise, and make the file durable either way.
 */
void
fxidx_finish_sealed(const char *dir, const char *what, uint64 base,
					uint64 seal_offset)
{
	FelixSegFile sf;
	char		path[MAXPGPATH];
	FelixIndexEntry *entries;
	int			n;

	felix_segment_path(path, dir, base);
	(void) segfile_open(&sf, path, what, FELIX_READ_CHUNK, false);
	if (fxidx_read(dir, base, &entries, &n) &&
		fxidx_entries_valid(&sf, base, entries, n, seal_offset))
	{
		int			fd;

		felix_index_path(path, dir, base);
		fd = OpenTransientFile(path, O_RDWR | PG_BINARY);
		if (fd < 0 || pg_fsync(fd) != 0)
			ereport(WARNING,
					(errcode_for_file_access(),
					 errmsg("%s: could not fsync index file \"%s\": %m", what, path),
					 errdetail("The index is rebuilt at the next start if it was lost.")));
		if (fd >= 0)
			CloseTransientFile(fd);
	}
	else
		fxidx_rebuild(&sf, dir, what, base, true);
	if (entries)
		pfree(entries);
	segfile_close(&sf);
}

/* The last entry with seq <= target, or -1. */
static int
fxidx_search(const FelixIndexEntry *entries, int n, uint64 target)
{
	int			lo = 0;
	int			hi = n - 1;
	int			best = -1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (entries[mid].seq <= target)
		{
			best = mid;
			lo = mid + 1;
		}
		else
			hi = mid - 1;
	}
	return best;
}

/* Does the batch at entry e really start at e->seq (and not after target)? */
static bool
fxidx_entry_ok(FelixSegFile *sf, const FelixIndexEntry *e, uint64 target)
{
	FelixBatchHeader h;

	if (e->offset < SEG_HEADER_SIZE || e->seq > target)
		return false;
	if (!segfile_header(sf, e->offset, &h))
		return false;
	return batch_header_check(&h) == FELIX_HDR_OK &&
		h.kind == FELIX_BATCH_RECORDS && h.base_seq == e->seq;
}

/*
 * Binary search of the index file itself with small preads, so a seek into
 * a 64 MB segment costs a dozen 16-byte reads rather than reading the
 * whole index.  False if the file is unusable or no entry is <= target.
 */
static bool
fxidx_search_file(const char *dir, uint64 base, uint64 target,
				  FelixIndexEntry *out)
{
	char		path[MAXPGPATH];
	int			fd;
	uint64		size;
	FelixIndexHeader hdr;
	int64		lo,
				hi,
				n;
	bool		found = false;

	felix_index_path(path, dir, base);
	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
		return false;
	size = felix_fd_size(fd, path);
	if (size < INDEX_HEADER_SIZE ||
		(size - INDEX_HEADER_SIZE) % sizeof(FelixIndexEntry) != 0 ||
		felix_pread_all(fd, &hdr, sizeof(hdr), 0) != (ssize_t) sizeof(hdr) ||
		!fxidx_header_ok(&hdr, base))
	{
		CloseTransientFile(fd);
		return false;
	}
	n = (int64) ((size - INDEX_HEADER_SIZE) / sizeof(FelixIndexEntry));
	lo = 0;
	hi = n - 1;
	while (lo <= hi)
	{
		int64		mid = lo + (hi - lo) / 2;
		FelixIndexEntry e;

		if (felix_pread_all(fd, &e, sizeof(e),
							INDEX_HEADER_SIZE + mid * sizeof(e)) != (ssize_t) sizeof(e))
			break;
		if (e.seq <= target)
		{
			*out = e;
			found = true;
			lo = mid + 1;
		}
		else
			hi = mid - 1;
	}
	CloseTransientFile(fd);
	return found;
}

void
fxidx_seek(FelixSegFile *sf, const char *dir, const char *what, uint64 base,
		   uint64 target, bool rebuild_ok, uint64 *seq, uint64 *offset)
{
	FelixIndexEntry e;
	FelixIndexBuild ib;
	FelixWalk	w;
	int			i;

	*seq = base;
	*offset = SEG_HEADER_SIZE;
	if (target <= base)
		return;

	/*
	 * Never trust the index: the batch the entry names must really be there.
	 * (An index whose first entry lies past the target is wrong as well: the
	 * segment's first batch always has an entry.)
	 */
	if (fxidx_search_file(dir, base, target, &e) && fxidx_entry_ok(sf, &e, target))
	{
		*seq = e.seq;
		*offset = e.offset;
		return;
	}

	if (!rebuild_ok)
		return;

	/* wrong or missing: rebuild it; the walk also tells us where target is */
	ereport(LOG,
			(errmsg("%s: index of segment file \"%s\" is missing or wrong; rebuilding it",
					what, sf->path)));
	fxidx_build_init(&ib);
	segment_walk(sf, what, SEG_HEADER_SIZE, base, false, &ib, NULL, &w);
	fxidx_write(dir, what, base, ib.entries, ib.n, true);
	felix_count(FELIX_CTR_INDEX_REBUILDS, 1);
	i = fxidx_search(ib.entries, ib.n, target);
	if (i >= 0)
	{
		*seq = ib.entries[i].seq;
		*offset = ib.entries[i].offset;
	}
	fxidx_build_free(&ib);
}

/*
 * The newest RECORDS batch of a sealed segment: start at the index's last
 * entry (verified) and walk to the seal; without a usable index, walk the
 * whole segment.
 */
void
segment_last_batch(const char *dir, const char *what, uint64 base, FelixWalk *w)
{
	FelixSegFile sf;
	char		path[MAXPGPATH];
	FelixIndexEntry *entries;
	int			n;
	uint64		off = SEG_HEADER_SIZE;
	uint64		seq = base;

	felix_segment_path(path, dir, base);
	(void) segfile_open(&sf, path, what, FELIX_READ_CHUNK, false);
	if (fxidx_read(dir, base, &entries, &n) && n > 0 &&
		fxidx_entry_ok(&sf, &entries[n - 1], PG_UINT64_MAX))
	{
		off = entries[n - 1].offset;
		seq = entries[n - 1].seq;
	}
	if (entries)
		pfree(entries);
	segment_walk(&sf, what, off, seq, false, NULL, NULL, w);
	segfile_close(&sf);
}
