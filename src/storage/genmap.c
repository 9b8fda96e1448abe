/*-------------------------------------------------------------------------
 *
 * genmap.c
 *	  The generation map of a shard (file "generations" beside its
 *	  segments): which seq each leadership generation began at.  Replication
 *	  uses it to find where a replica's history and a new leader's part.
 *
 * The file is a sequence of 24-byte entries, each with its own CRC, in
 * increasing generation order.  An entry is appended and fdatasync'd before
 * genmap_note returns (the first one also creates the file and syncs the
 * directory) -- or, if the caller asks, written only, and made durable by
 * genmap_sync: a leader taking a thousand shards at once makes each entry
 * durable at the shard's first write instead (replication/lease.c).  A torn last entry (bad CRC with nothing valid after it) ends
 * the map and is overwritten by the next note; a bad entry followed by a
 * valid one is damage and is reported, never skipped.
 *
 * Locking rule: callers hold the shard's append lock (genmap_note when a
 * generation opens, genmap_truncate from log_truncate_to).  genmap_load
 * reads without a lock; it may miss an entry being appended, never see a
 * half-written one as valid (the CRC covers it).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "log_internal.h"
#include "storage/crc.h"
#include "common/file_perm.h"
#include "storage/fd.h"
#include "utils/memutils.h"

#define GEN_ENTRY_SIZE	((uint64) sizeof(FelixGenEntry))

static void
genmap_path(char *buf, const char *dir)
{
	snprintf(buf, MAXPGPATH, "%s/%s", dir, FELIX_GENMAP_FILE);
}

static pg_crc32c
genmap_entry_crc(const FelixGenEntry *e)
{
	return felix_crc32c(e, offsetof(FelixGenEntry, crc));
}

/*
 * Read and check the map.  Returns the number of valid entries; *raw_len
 * gets the file's length (0 if it does not exist).
 */
static int
genmap_read(const char *dir, const char *what, FelixGenEntry **entries,
			uint64 *raw_len)
{
	char		path[MAXPGPATH];
	int			fd;
	uint64		size;
	char	   *buf;
	int			nwhole;
	int			n = 0;

	genmap_path(path, dir);
	*raw_len = 0;
	*entries = palloc(sizeof(FelixGenEntry));
	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
	{
		if (errno == ENOENT)
			return 0;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open generation map \"%s\": %m", what, path)));
	}
	size = felix_fd_size(fd, path);
	if (size > (uint64) MaxAllocSize)
		felix_report_corruption(what, path, 0,
								"The generation map is impossibly large.");
	buf = palloc(Max(size, 1));
	if (felix_pread_all(fd, buf, size, 0) != (ssize_t) size)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not read generation map \"%s\": %m", what, path)));
	CloseTransientFile(fd);
	*raw_len = size;

	nwhole = (int) (size / GEN_ENTRY_SIZE);
	*entries = repalloc(*entries, Max(nwhole, 1) * sizeof(FelixGenEntry));
	for (int i = 0; i < nwhole; i++)
	{
		FelixGenEntry e;

		memcpy(&e, buf + i * GEN_ENTRY_SIZE, sizeof(e));
		if (e.crc != genmap_entry_crc(&e))
		{
			/* the end of the map, unless something valid follows */
			for (int j = i + 1; j < nwhole; j++)
			{
				FelixGenEntry later;

				memcpy(&later, buf + j * GEN_ENTRY_SIZE, sizeof(later));
				if (later.crc == genmap_entry_crc(&later))
					felix_report_corruption(what, path, i * GEN_ENTRY_SIZE,
											psprintf("The generation map entry does not match its checksum, but a valid entry follows at byte offset %llu.",
													 (unsigned long long) (j * GEN_ENTRY_SIZE)));
			}
			break;
		}
		if (n > 0 && (e.generation <= (*entries)[n - 1].generation ||
					  e.first_seq < (*entries)[n - 1].first_seq))
			felix_report_corruption(what, path, i * GEN_ENTRY_SIZE,
									psprintf("Generation %llu at seq %llu does not follow generation %llu at seq %llu.",
											 (unsigned long long) e.generation,
											 (unsigned long long) e.first_seq,
											 (unsigned long long) (*entries)[n - 1].generation,
											 (unsigned long long) (*entries)[n - 1].first_seq));
		(*entries)[n++] = e;
	}
	pfree(buf);
	return n;
}

int
genmap_load(const char *dir, const char *what, FelixGenEntry **entries)
{
	uint64		raw_len;

	return genmap_read(dir, what, entries, &raw_len);
}

/* Open the map of dir (its path into path), or report why not. */
static int
genmap_open(const char *dir, const char *what, char *path, int flags)
{
	int			fd;

	genmap_path(path, dir);
	fd = OpenTransientFilePerm(path, flags | PG_BINARY, pg_file_create_mode);
	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open generation map \"%s\": %m", what, path)));
	return fd;
}

void
genmap_note(const char *dir, const char *what, uint64 generation,
			uint64 first_seq, bool sync)
{
	FelixGenEntry *entries;
	FelixGenEntry e;
	uint64		raw_len;
	int			n;
	char		path[MAXPGPATH];
	int			fd;
	bool		created;

	n = genmap_read(dir, what, &entries, &raw_len);
	if (n > 0 && entries[n - 1].generation == generation)
	{
		pfree(entries);
		return;
	}
	if (n > 0 && (generation < entries[n - 1].generation ||
				  first_seq < entries[n - 1].first_seq))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: generation %llu at seq %llu cannot follow generation %llu at seq %llu",
						what, (unsigned long long) generation,
						(unsigned long long) first_seq,
						(unsigned long long) entries[n - 1].generation,
						(unsigned long long) entries[n - 1].first_seq),
				 errhint("Generations only move forward; this node's view of the shard's leadership is stale.")));
	pfree(entries);

	memset(&e, 0, sizeof(e));
	e.generation = generation;
	e.first_seq = first_seq;
	e.crc = genmap_entry_crc(&e);

	felix_ensure_dir(dir, what);
	genmap_path(path, dir);
	created = (raw_len == 0 && access(path, F_OK) != 0);
	fd = genmap_open(dir, what, path, O_RDWR | O_CREAT);
	/* over a torn last entry, if any, and drop whatever followed it */
	if (!felix_pwrite_all(fd, &e, sizeof(e), n * GEN_ENTRY_SIZE) ||
		(raw_len > (n + 1) * GEN_ENTRY_SIZE &&
		 ftruncate(fd, (off_t) ((n + 1) * GEN_ENTRY_SIZE)) != 0))
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not write generation map \"%s\": %m", what, path),
				 errhint("Check free space and permissions of the felix data directory.")));
	if (sync)
		felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);
	if (sync && created)
		fsync_fname(dir, true);
}

void
genmap_sync(const char *dir, const char *what)
{
	char		path[MAXPGPATH];
	int			fd;

	fd = genmap_open(dir, what, path, O_RDWR);
	felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);
	/* (it may have been created unsynced) */
	fsync_fname(dir, true);
}

void
genmap_truncate(const char *dir, const char *what, uint64 cut)
{
	FelixGenEntry *entries;
	uint64		raw_len;
	int			n;
	int			keep;
	char		path[MAXPGPATH];
	int			fd;

	n = genmap_read(dir, what, &entries, &raw_len);
	for (keep = 0; keep < n && entries[keep].first_seq < cut; keep++)
		;
	pfree(entries);
	if (keep == n && raw_len == n * GEN_ENTRY_SIZE)
		return;

	fd = genmap_open(dir, what, path, O_RDWR);
	if (ftruncate(fd, (off_t) (keep * GEN_ENTRY_SIZE)) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not truncate generation map \"%s\": %m", what, path)));
	felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);
}
