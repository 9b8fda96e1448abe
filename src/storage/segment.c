/*-------------------------------------------------------------------------
 *
 * segment.c
 *	  The write side of a shard's segment log: appending a batch at the
 *	  tail, rolling (sealing the full segment and creating the next one),
 *	  and fdatasync of the active segment.  Also the small file helpers the
 *	  other storage files share (paths, directory listing, whole reads and
 *	  writes).
 *
 * log_append runs on every publish, so it does no directory listing and no
 * open(): each backend keeps a small cache of open descriptors, one entry
 * per shard directory holding the active segment and its index file.  An
 * entry is trusted only while its segments_version equals the shard's
 * (shared) FelixLogState.segments_version: every roll, trim, truncation and
 * recovery bumps that number, so a descriptor for a file that another
 * backend unlinked (and maybe recreated under the same name) is never
 * written through.  log_sync, which has no FelixLogState, instead checks
 * that the cached file still has a link before syncing it.
 *
 * Preallocation.  The active segment file is extended ahead of the write
 * position with posix_fallocate, FELIX_PREALLOCATE_BYTES at a time, so most
 * appends write into space the file already has and the fdatasync that
 * follows need not commit a change of file size (on ext4 that is a journal
 * commit, about half again the cost of the sync).  The file's physical
 * size is FelixLogState.alloc_bytes; the logical end, active_bytes, stays
 * the authority on where the data ends, and everything between the two is
 * zero bytes (recovery treats them as the clean end of data, see
 * recovery.c).  File systems without fallocate support get plain appends.
 *
 * Durability order on a roll: seal batch written, the file cut to its exact
 * end (no zero tail stays behind a seal), segment fdatasync'd, index made
 * whole and fsync'd, and only then the next segment created and the
 * directory fsync'd.  So a segment that has a successor on disk is always
 * sealed on disk and ends exactly with its seal; recovery relies on that.
 *
 * Locking rule: log_append (and the roll and create it does) runs with the
 * shard's append lock held exclusively; it reads and moves FelixLogState.
 * log_sync runs without the append lock (a flusher holds the flush lock)
 * and touches only the file it is given.  The descriptor cache is
 * backend-local.
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
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* ----------------------------------------------------------------
 * Paths, directories, whole reads and writes
 * ----------------------------------------------------------------
 */

void
felix_segment_path(char *buf, const char *dir, uint64 base)
{
	snprintf(buf, MAXPGPATH, "%s/%020llu.seg", dir, (unsigned long long) base);
}

void
felix_index_path(char *buf, const char *dir, uint64 base)
{
	snprintf(buf, MAXPGPATH, "%s/%020llu.idx", dir, (unsigned long long) base);
}

static int
cmp_uint64(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return (x > y) - (x < y);
}

/* Parse "<20 digits>.<ext>"; true and *base on a match. */
static bool
parse_numbered_name(const char *name, const char *ext, uint64 *base)
{
	size_t		len = strlen(name);
	uint64		v = 0;

	if (len != 20 + 1 + strlen(ext) || name[20] != '.' ||
		strcmp(name + 21, ext) != 0)
		return false;
	for (int i = 0; i < 20; i++)
	{
		if (name[i] < '0' || name[i] > '9')
			return false;
		if (v > (PG_UINT64_MAX - (name[i] - '0')) / 10)
			return false;
		v = v * 10 + (name[i] - '0');
	}
	*base = v;
	return true;
}

int
felix_list_segments(const char *dir, const char *what, uint64 **bases)
{
	DIR		   *d;
	struct dirent *de;
	int			n = 0;
	int			cap = 16;
	uint64	   *out;

	*bases = NULL;
	d = AllocateDir(dir);
	if (d == NULL)
	{
		if (errno == ENOENT)
			return 0;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open directory \"%s\": %m", what, dir)));
	}
	out = palloc(cap * sizeof(uint64));
	while ((de = ReadDir(d, dir)) != NULL)
	{
		uint64		base;

		if (!parse_numbered_name(de->d_name, "seg", &base))
			continue;
		if (n == cap)
		{
			cap *= 2;
			out = repalloc(out, cap * sizeof(uint64));
		}
		out[n++] = base;
	}
	FreeDir(d);
	if (n == 0)
	{
		pfree(out);
		return 0;
	}
	qsort(out, n, sizeof(uint64), cmp_uint64);
	*bases = out;
	return n;
}

void
felix_ensure_dir(const char *dir, const char *what)
{
	struct stat sb;
	char		parent[MAXPGPATH];

	if (stat(dir, &sb) == 0)
	{
		if (!S_ISDIR(sb.st_mode))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("%s: \"%s\" exists but is not a directory", what, dir),
					 errhint("Move the file away so felix can create the shard's directory.")));
		return;
	}
	if (errno != ENOENT)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not stat directory \"%s\": %m", what, dir)));

	strlcpy(parent, dir, sizeof(parent));
	get_parent_directory(parent);
	if (parent[0] != '\0' && strcmp(parent, dir) != 0)
		felix_ensure_dir(parent, what);

	if (MakePGDirectory(dir) != 0 && errno != EEXIST)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not create directory \"%s\": %m", what, dir)));
	/* the new directory and its entry in the parent must survive a crash */
	fsync_fname(dir, true);
	if (parent[0] != '\0')
		fsync_fname(parent, true);
}

bool
felix_pwrite_all(int fd, const void *buf, Size len, uint64 off)
{
	const char *p = buf;

	while (len > 0)
	{
		ssize_t		n = pg_pwrite(fd, p, len, (off_t) off);

		if (n < 0)
		{
			if (errno == EINTR)
				continue;
			return false;
		}
		if (n == 0)
		{
			/* no progress and no error: treat as a full disk */
			errno = ENOSPC;
			return false;
		}
		p += n;
		off += n;
		len -= n;
	}
	return true;
}

ssize_t
felix_pread_all(int fd, void *buf, Size len, uint64 off)
{
	char	   *p = buf;
	Size		done = 0;

	while (done < len)
	{
		ssize_t		n = pg_pread(fd, p + done, len - done, (off_t) (off + done));

		if (n < 0)
		{
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			break;
		done += n;
	}
	return (ssize_t) done;
}

uint64
felix_fd_size(int fd, const char *path)
{
	struct stat sb;

	if (fstat(fd, &sb) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not stat file \"%s\": %m", path)));
	return (uint64) sb.st_size;
}

void
felix_fdatasync(int fd, const char *path, const char *what)
{
	int			rc;

	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_SYNC);
	rc = pg_fdatasync(fd);
	pgstat_report_wait_end();
	/*
	 * As for PostgreSQL's own files: after a failed sync the kernel may have
	 * dropped the dirty pages, so a retry could "succeed" without the data
	 * on disk.  data_sync_elevel makes that a PANIC unless data_sync_retry.
	 */
	if (rc != 0)
		ereport(data_sync_elevel(ERROR),
				(errcode_for_file_access(),
				 errmsg("%s: could not fdatasync file \"%s\": %m", what, path),
				 errdetail("Records this sync was to make durable are not acknowledged by it."),
				 errhint("Check the storage under the felix data directory.")));
}

void
felix_unlink(const char *path, const char *what)
{
	if (unlink(path) != 0 && errno != ENOENT)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not remove file \"%s\": %m", what, path)));
}

/* ----------------------------------------------------------------
 * Descriptor cache (backend-local)
 * ----------------------------------------------------------------
 */

#define SEG_CACHE_MAX	32

typedef struct SegCacheEntry
{
	char		dir[MAXPGPATH]; /* hash key: the shard directory */
	uint64		base;			/* segment the descriptors belong to */
	int			seg_fd;			/* -1 when not open */
	int			idx_fd;			/* -1 when not open (index is a hint) */
	bool		version_known;	/* opened by log_append/create, not log_sync */
	uint32		version;		/* FelixLogState.segments_version then */
	uint64		last_used;
} SegCacheEntry;

static HTAB *seg_cache = NULL;
static uint64 seg_cache_clock = 0;

static void
cache_close_fds(SegCacheEntry *e)
{
	if (e->seg_fd >= 0)
	{
		close(e->seg_fd);
		ReleaseExternalFD();
		e->seg_fd = -1;
	}
	if (e->idx_fd >= 0)
	{
		close(e->idx_fd);
		ReleaseExternalFD();
		e->idx_fd = -1;
	}
	e->version_known = false;
}

/* Drop the least recently used entry other than keep; false if none. */
static bool
cache_evict_one(SegCacheEntry *keep)
{
	HASH_SEQ_STATUS hs;
	SegCacheEntry *e;
	SegCacheEntry *victim = NULL;

	hash_seq_init(&hs, seg_cache);
	while ((e = hash_seq_search(&hs)) != NULL)
	{
		if (e == keep)
			continue;
		if (victim == NULL || e->last_used < victim->last_used)
			victim = e;
	}
	if (victim == NULL)
		return false;
	cache_close_fds(victim);
	hash_search(seg_cache, victim->dir, HASH_REMOVE, NULL);
	return true;
}

/*
 * Account for one more long-lived descriptor with fd.c, evicting our own
 * cached descriptors first if fd.c says we hold too many.
 */
static void
cache_reserve_fd(SegCacheEntry *keep)
{
	while (!AcquireExternalFD())
	{
		if (!cache_evict_one(keep))
		{
			ReserveExternalFD();
			return;
		}
	}
}

/*
 * Has the file behind fd lost its last name (or can we not tell)?
 *
 * Asks only for the link count: on Linux statx with STATX_NLINK.  A plain
 * fstat also asks for the timestamps, and since Linux 6.13 a file whose
 * ctime was queried gets a fine-grained timestamp update on its next write,
 * dirtying the inode: the fdatasync that follows then has to commit the
 * file system journal, which costs as much as the size change preallocation
 * avoids (measured on ext4: about 50 us of a 100 us sync).  log_sync asks
 * this on every flush, right between a write and its fdatasync.
 */
static bool
fd_unlinked(int fd)
{
#if defined(__linux__) && defined(STATX_NLINK)
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH, STATX_NLINK, &sx) == 0 &&
		(sx.stx_mask & STATX_NLINK) != 0)
		return sx.stx_nlink == 0;
#endif
	{
		struct stat sb;

		return fstat(fd, &sb) != 0 || sb.st_nlink == 0;
	}
}

/*
 * Close descriptors of files that no longer have a name (a dropped stream,
 * a trimmed segment), so their disk space is given back.  Runs only when
 * we are about to open something anyway, and at most once a second
 * (SEG_SWEEP_INTERVAL_NS): a backend that appends to more shards than it
 * caches (a follower's felix_replicate session, a publisher over thousands
 * of shards) opens files at almost every append, and a look at every cached
 * descriptor each time was a twentieth of a loaded node's CPU at 3,000
 * shards.  Such a file's space comes back a second later at most, or when
 * its entry is evicted or reused, whichever is first.
 */
#define SEG_SWEEP_INTERVAL_NS	(INT64CONST(1000) * 1000000)

static int64 seg_swept_ns = 0;

static void
cache_sweep_unlinked(void)
{
	HASH_SEQ_STATUS hs;
	SegCacheEntry *e;
	int64		now = felix_monotonic_ns();

	if (seg_swept_ns != 0 && now - seg_swept_ns < SEG_SWEEP_INTERVAL_NS)
		return;
	seg_swept_ns = now;
	hash_seq_init(&hs, seg_cache);
	while ((e = hash_seq_search(&hs)) != NULL)
	{
		if (e->seg_fd >= 0 && fd_unlinked(e->seg_fd))
			cache_close_fds(e);
	}
}

static SegCacheEntry *
cache_entry(const char *dir, bool create)
{
	SegCacheEntry *e;
	bool		found;

	if (seg_cache == NULL)
	{
		HASHCTL		ctl;

		if (!create)
			return NULL;
		ctl.keysize = MAXPGPATH;
		ctl.entrysize = sizeof(SegCacheEntry);
		ctl.hcxt = TopMemoryContext;
		seg_cache = hash_create("felix segment descriptors", SEG_CACHE_MAX,
								&ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	if (strlen(dir) >= MAXPGPATH)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("felix directory path \"%s\" is too long", dir)));

	e = hash_search(seg_cache, dir, create ? HASH_ENTER : HASH_FIND, &found);
	if (e == NULL)
		return NULL;
	if (!found)
	{
		e->base = 0;
		e->seg_fd = -1;
		e->idx_fd = -1;
		e->version_known = false;
		e->version = 0;
		if (hash_get_num_entries(seg_cache) > SEG_CACHE_MAX)
			(void) cache_evict_one(e);
	}
	e->last_used = ++seg_cache_clock;
	return e;
}

void
felix_fd_cache_forget(const char *dir)
{
	SegCacheEntry *e = cache_entry(dir, false);

	if (e == NULL)
		return;
	cache_close_fds(e);
	hash_search(seg_cache, e->dir, HASH_REMOVE, NULL);
}

static int
open_segment_fd(SegCacheEntry *e, const char *path, const char *what, int flags)
{
	int			fd;

	cache_reserve_fd(e);
	fd = BasicOpenFilePerm(path, flags | PG_BINARY, pg_file_create_mode);
	if (fd < 0)
	{
		int			save_errno = errno;

		ReleaseExternalFD();
		errno = save_errno;
	}
	return fd;
}

/*
 * Descriptors for the active segment of st.  Trusted only if they were
 * opened for this very segment at the current segments_version (see the
 * file header); otherwise everything cached for the directory is closed
 * and the active segment is reopened.
 */
static SegCacheEntry *
active_files(const char *dir, const char *what, FelixLogState *st)
{
	SegCacheEntry *e = cache_entry(dir, true);
	char		path[MAXPGPATH];

	if (e->seg_fd >= 0 && e->version_known &&
		e->version == st->segments_version && e->base == st->active_base)
		return e;

	cache_close_fds(e);
	cache_sweep_unlinked();
	felix_segment_path(path, dir, st->active_base);
	e->seg_fd = open_segment_fd(e, path, what, O_RDWR);
	if (e->seg_fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
	cache_reserve_fd(e);
	e->idx_fd = fxidx_open_append(dir, what, st->active_base);
	if (e->idx_fd < 0)
		ReleaseExternalFD();
	e->base = st->active_base;
	e->version = st->segments_version;
	e->version_known = true;
	return e;
}

/* ----------------------------------------------------------------
 * Append, roll, create
 * ----------------------------------------------------------------
 */

/*
 * Write len bytes at the tail offset `off` of the active segment.  On
 * failure the file is cut back to `off` so that the segment still ends at
 * a batch boundary and holds only zero bytes after it: the next append (or
 * recovery) must never find half a batch behind the logical end.
 */
static void
write_at_tail(int fd, const char *dir, const char *what, FelixLogState *st,
			  const char *data, Size len, uint64 off)
{
	bool		ok;

	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	ok = felix_pwrite_all(fd, data, len, off);
	pgstat_report_wait_end();
	if (!ok)
	{
		int			save_errno = errno;
		char		path[MAXPGPATH];

		felix_segment_path(path, dir, st->active_base);
		if (ftruncate(fd, (off_t) off) == 0)
			st->alloc_bytes = off;
		else
		{
			ereport(WARNING,
					(errcode_for_file_access(),
					 errmsg("%s: could not cut segment file \"%s\" back to %llu bytes after a failed write: %m",
							what, path, (unsigned long long) off)));
			st->alloc_bytes = Max(st->active_bytes, felix_fd_size(fd, path));
		}
		errno = save_errno;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not write %zu bytes to segment file \"%s\" at offset %llu: %m",
						what, len, path, (unsigned long long) off),
				 errdetail("The batch was not written; the segment still ends at offset %llu.",
						   (unsigned long long) off),
				 errhint("Check free space and permissions of the felix data directory.")));
	}
	/* a write past the allocated end grew the file */
	if (off + len > st->alloc_bytes)
		st->alloc_bytes = off + len;
}

/* posix_fallocate, retried when interrupted; returns 0 or an errno value. */
static int
fallocate_range(int fd, uint64 from, uint64 to)
{
	int			rc;

	Assert(to > from);
	do
	{
		pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_EXTEND);
		rc = posix_fallocate(fd, (off_t) from, (off_t) (to - from));
		pgstat_report_wait_end();
	} while (rc == EINTR);
	return rc;
}

/*
 * Make the active segment file physically at least `end` bytes long before
 * a batch ending there is written, extending it in FELIX_PREALLOCATE_BYTES
 * steps (never far past where the segment will be sealed).  The new space
 * reads as zeros, which is what recovery expects after the last batch.
 *
 * A full disk raises the same error a failed write does, after trying to
 * allocate just what this batch needs.  A file system that does not support
 * preallocation (EOPNOTSUPP, EINVAL) turns it off for the shard: the write
 * then extends the file as a plain append does.
 */
static void
segment_reserve(int fd, const char *dir, const char *what, FelixLogState *st,
				uint64 end)
{
	uint64		target;
	uint64		limit;
	int			rc;
	char		path[MAXPGPATH];

	if (st->prealloc_off || end <= st->alloc_bytes)
		return;

	target = ((end + FELIX_PREALLOCATE_BYTES - 1) / FELIX_PREALLOCATE_BYTES) *
		FELIX_PREALLOCATE_BYTES;
	/* a segment holds at most felix.segment_bytes of batches and a seal */
	limit = Max(end, (uint64) felix_segment_bytes + SEAL_BATCH_SIZE);
	target = Min(target, limit);

	felix_segment_path(path, dir, st->active_base);
	rc = fallocate_range(fd, st->alloc_bytes, target);
	if (rc == ENOSPC && target > end)
	{
		/*
		 * The disk cannot take a whole chunk; it may still take this batch.
		 * A failed allocation may have extended the file part way: give
		 * that back first, so the file's size stays alloc_bytes.
		 */
		if (ftruncate(fd, (off_t) st->alloc_bytes) != 0)
			st->alloc_bytes = Max(st->active_bytes, felix_fd_size(fd, path));
		target = end;
		if (target > st->alloc_bytes)
			rc = fallocate_range(fd, st->alloc_bytes, target);
		else
			rc = 0;
	}
	if (rc == 0)
	{
		st->alloc_bytes = Max(st->alloc_bytes, target);
		return;
	}

	if (rc == EOPNOTSUPP || rc == EINVAL
#if defined(ENOTSUP) && ENOTSUP != EOPNOTSUPP
		|| rc == ENOTSUP
#endif
		)
	{
		st->prealloc_off = true;
		ereport(DEBUG1,
				(errmsg_internal("%s: the file system of \"%s\" does not preallocate (%s); appending without preallocation",
								 what, path, strerror(rc))));
		return;
	}

	/*
	 * A failed allocation may have extended the file part way; give that
	 * back (the bytes are zeros past the logical end either way).
	 */
	if (ftruncate(fd, (off_t) st->alloc_bytes) != 0)
		st->alloc_bytes = Max(st->active_bytes, felix_fd_size(fd, path));
	errno = rc;
	ereport(ERROR,
			(errcode_for_file_access(),
			 errmsg("%s: could not write %llu bytes to segment file \"%s\" at offset %llu: %m",
					what, (unsigned long long) (end - st->active_bytes), path,
					(unsigned long long) st->active_bytes),
			 errdetail("The batch was not written; the segment still ends at offset %llu.",
					   (unsigned long long) st->active_bytes),
			 errhint("Check free space and permissions of the felix data directory.")));
}

/*
 * Create the segment that starts at st->next_seq and make it the active
 * one: header written and synced, directory synced, index file started.
 */
void
segment_create(const char *dir, const char *what, FelixLogState *st,
			   uint64 generation)
{
	uint64		base = st->next_seq;
	char		path[MAXPGPATH];
	FelixSegmentHeader hdr;
	SegCacheEntry *e;
	int			fd;

	felix_segment_path(path, dir, base);
	e = cache_entry(dir, true);
	cache_close_fds(e);
	cache_sweep_unlinked();

	fd = open_segment_fd(e, path, what, O_RDWR | O_CREAT | O_EXCL);
	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not create segment file \"%s\": %m", what, path),
				 errhint("A file of that name should not exist; the log ends at seq %llu.",
						 (unsigned long long) base)));

	segment_header_init(&hdr, base, generation);
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	if (!felix_pwrite_all(fd, &hdr, sizeof(hdr), 0))
	{
		int			save_errno = errno;

		pgstat_report_wait_end();
		close(fd);
		ReleaseExternalFD();
		(void) unlink(path);
		errno = save_errno;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not write header of segment file \"%s\": %m",
						what, path),
				 errhint("Check free space and permissions of the felix data directory.")));
	}
	pgstat_report_wait_end();
	if (pg_fsync(fd) != 0)
		ereport(data_sync_elevel(ERROR),
				(errcode_for_file_access(),
				 errmsg("could not fsync file \"%s\": %m", path)));

	e->seg_fd = fd;
	cache_reserve_fd(e);
	e->idx_fd = fxidx_create(dir, what, base);
	if (e->idx_fd < 0)
		ReleaseExternalFD();

	/* the file's name must be durable before any batch in it is acknowledged */
	fsync_fname(dir, true);

	st->has_active = true;
	st->active_base = base;
	st->active_bytes = SEG_HEADER_SIZE;
	st->alloc_bytes = SEG_HEADER_SIZE;	/* extended by the first append */
	INIT_CRC32C(st->active_crc);
	COMP_CRC32C(st->active_crc, &hdr, sizeof(hdr));
	st->index_mark = 0;
	st->total_bytes += SEG_HEADER_SIZE;
	st->segments_version++;

	e->base = base;
	e->version = st->segments_version;
	e->version_known = true;
}

/*
 * Seal the active segment: a SEAL batch carrying the CRC-32C of every byte
 * before it (kept incrementally in st->active_crc, so nothing is re-read),
 * the file cut to the seal's end (dropping the preallocated zeros),
 * fdatasync, then the index made whole and durable.  Afterwards the log
 * has no active segment until the next append creates one.
 */
static void
segment_seal(const char *dir, const char *what, FelixLogState *st)
{
	SegCacheEntry *e = active_files(dir, what, st);
	StringInfoData buf;
	pg_crc32c	file_crc = st->active_crc;
	uint64		off = st->active_bytes;
	uint64		end;
	char		path[MAXPGPATH];

	FIN_CRC32C(file_crc);
	initStringInfo(&buf);
	batch_begin(&buf);
	appendBinaryStringInfo(&buf, (const char *) &file_crc, sizeof(file_crc));
	batch_seal_body(&buf, FELIX_BATCH_SEAL);
	batch_stamp(buf.data, st->next_seq, st->last_generation, GetCurrentTimestamp());
	Assert(buf.len == SEAL_BATCH_SIZE);
	end = off + buf.len;

	felix_segment_path(path, dir, st->active_base);
	write_at_tail(e->seg_fd, dir, what, st, buf.data, buf.len, off);

	/*
	 * A sealed segment ends exactly with its seal: recovery finds the seal
	 * at the end of the file.  The cut goes down with the same fdatasync
	 * (a size change is metadata fdatasync must make durable).
	 */
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_TRUNCATE);
	if (ftruncate(e->seg_fd, (off_t) end) != 0)
	{
		pgstat_report_wait_end();
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not truncate segment file \"%s\" to %llu bytes after sealing it: %m",
						what, path, (unsigned long long) end),
				 errhint("Check the felix data directory; the segment stays active.")));
	}
	pgstat_report_wait_end();
	st->alloc_bytes = end;
	felix_fdatasync(e->seg_fd, path, what);

	/* sealed and durable: from here on the segment is never written again */
	st->active_crc = felix_crc32c_update(st->active_crc, buf.data, buf.len);
	st->active_bytes = end;
	st->total_bytes += buf.len;
	st->has_active = false;
	st->segments_version++;
	pfree(buf.data);

	cache_close_fds(e);
	felix_count(FELIX_CTR_SEGMENTS_ROLLED, 1);

	fxidx_finish_sealed(dir, what, st->active_base, off);
}

void
log_append(const char *dir, const char *what, FelixLogState *st,
		   const char *batch, Size len)
{
	FelixBatchHeader h;
	FelixHeaderCheck hc = FELIX_HDR_BAD_FIELDS;
	SegCacheEntry *e;
	uint64		off;

	if (len >= BATCH_HEADER_SIZE)
	{
		memcpy(&h, batch, sizeof(h));
		hc = batch_header_check(&h);
	}
	if (hc != FELIX_HDR_OK || h.kind != FELIX_BATCH_RECORDS ||
		batch_stored_len(&h) != len || h.base_seq != st->next_seq ||
		batch_trailer_check(&h, batch + len - BATCH_TRAILER_SIZE) != FELIX_TRAILER_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("%s: refusing to append a malformed batch", what),
				 errdetail("The batch must be a stamped RECORDS batch, trailer included, starting at seq %llu.",
						   (unsigned long long) st->next_seq)));

	/*
	 * Roll when this batch would take the active segment past
	 * felix.segment_bytes, but never leave a segment empty: a batch larger
	 * than the limit gets a segment of its own.
	 */
	if (st->has_active && st->active_bytes > SEG_HEADER_SIZE &&
		st->active_bytes + len > (uint64) felix_segment_bytes)
		segment_seal(dir, what, st);
	if (!st->has_active)
		segment_create(dir, what, st, h.generation);

	e = active_files(dir, what, st);
	off = st->active_bytes;
	segment_reserve(e->seg_fd, dir, what, st, off + len);
	write_at_tail(e->seg_fd, dir, what, st, batch, len, off);

	/* the bytes are down; nothing below may fail before *st says so */
	if (fxidx_wants_entry(off, st->index_mark))
	{
		if (e->idx_fd >= 0)
			fxidx_append_entry(e->idx_fd, dir, st->active_base, h.base_seq, off);
		st->index_mark = off;
	}
	st->active_crc = felix_crc32c_update(st->active_crc, batch, len);
	st->active_bytes += len;
	st->total_bytes += len;
	st->next_seq += h.count;
	st->last_generation = h.generation;
}

void
log_sync(const char *dir, const char *what, uint64 active_base)
{
	SegCacheEntry *e = cache_entry(dir, true);
	char		path[MAXPGPATH];

	felix_segment_path(path, dir, active_base);
	/* a cached descriptor of an unlinked file must not stand in for it */
	if (e->seg_fd >= 0 &&
		(e->base != active_base || fd_unlinked(e->seg_fd)))
		cache_close_fds(e);
	if (e->seg_fd < 0)
	{
		cache_sweep_unlinked();
		e->seg_fd = open_segment_fd(e, path, what, O_RDWR);
		if (e->seg_fd < 0)
		{
			/*
			 * No such segment: the log is empty, or a truncation removed the
			 * segment after the caller took its snapshot.  Either way no
			 * record of it remains to be made durable.
			 */
			if (errno == ENOENT)
				return;
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not open segment file \"%s\": %m", what, path)));
		}
		e->base = active_base;
		e->version_known = false;
	}
	felix_fdatasync(e->seg_fd, path, what);
	felix_count(FELIX_CTR_FSYNCS, 1);
}
