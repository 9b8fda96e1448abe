/*-------------------------------------------------------------------------
 *
 * retention.c
 *	  Retention (log_trim): removing whole sealed segments from the front of
 *	  a shard's log by size and by age, and removing a dropped stream's
 *	  shard directory (log_remove_all).
 *
 * A segment is removed whole or not at all, oldest first, and never the
 * last segment (the active one, or a sealed last one that still records
 * where the log ends).  Its age is the publish timestamp of its newest
 * batch, found from the index's last entry (checked) by walking to the
 * seal.  Each removal is made durable (directory fsync) before the next, so
 * after a crash the remaining segments still form an unbroken run and
 * recovery finds the new start.
 *
 * Trimming only moves the start forward: it never rewrites a byte, so it
 * cannot touch the high-water-mark invariant.  A reader may still be
 * reading a segment that is unlinked here; its open descriptor keeps
 * working, and a reader that has not opened it yet moves on (reader.c).
 *
 * Locking rule: log_trim runs with the shard's append lock held
 * exclusively.  log_remove_all runs after the dropping transaction
 * committed, when no backend can reach the shard any more; it reports
 * problems as WARNING because an error after commit cannot undo the drop.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <unistd.h>

#include "log_internal.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "storage/fd.h"

int
log_trim(const char *dir, const char *what, FelixLogState *st,
		 int64 retention_bytes, int64 retention_ms, TimestampTz now)
{
	uint64	   *bases;
	int			n;
	int			removed = 0;
	TimestampTz cutoff = 0;
	bool		by_age = retention_ms > 0;

	if (retention_bytes <= 0 && retention_ms <= 0)
		return 0;
	if (by_age)
	{
		/* older than now - retention; a retention beyond the clock's range keeps all */
		if (retention_ms > PG_INT64_MAX / 1000 ||
			now < PG_INT64_MIN + retention_ms * 1000)
			by_age = false;
		else
			cutoff = now - retention_ms * 1000;
	}

	n = felix_list_segments(dir, what, &bases);
	for (int i = 0; i < n - 1; i++)
	{
		char		seg[MAXPGPATH];
		char		idx[MAXPGPATH];
		struct stat sb;
		bool		remove = false;

		CHECK_FOR_INTERRUPTS();
		felix_segment_path(seg, dir, bases[i]);
		if (stat(seg, &sb) != 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("%s: could not stat segment file \"%s\": %m", what, seg)));

		if (retention_bytes > 0 && st->total_bytes > (uint64) retention_bytes)
			remove = true;
		else if (by_age)
		{
			FelixWalk	w;

			segment_last_batch(dir, what, bases[i], &w);
			remove = (w.batches == 0 || w.last_timestamp < cutoff);
		}
		if (!remove)
			break;

		felix_index_path(idx, dir, bases[i]);
		felix_unlink(seg, what);
		felix_unlink(idx, what);
		/* durable before the next one goes: no hole can ever appear */
		fsync_fname(dir, true);

		st->start_seq = bases[i + 1];
		st->total_bytes -= Min((uint64) sb.st_size, st->total_bytes);
		removed++;
	}
	if (n > 0)
		pfree(bases);

	if (removed > 0)
	{
		st->segments_version++;
		felix_count(FELIX_CTR_SEGMENTS_TRIMMED, removed);
		ereport(DEBUG1,
				(errmsg_internal("%s: retention removed %d segments; the log now starts at seq %llu",
								 what, removed, (unsigned long long) st->start_seq)));
	}
	return removed;
}

void
log_remove_all(const char *dir)
{
	struct stat sb;
	char		parent[MAXPGPATH];

	felix_fd_cache_forget(dir);
	if (stat(dir, &sb) != 0)
	{
		if (errno != ENOENT)
			ereport(WARNING,
					(errcode_for_file_access(),
					 errmsg("could not stat directory \"%s\": %m", dir)));
		return;
	}
	/* rmtree reports each failure as a WARNING itself */
	if (!rmtree(dir, true))
		ereport(WARNING,
				(errmsg("some files of \"%s\" could not be removed", dir),
				 errhint("Remove the directory by hand; felix no longer uses it.")));
	strlcpy(parent, dir, sizeof(parent));
	get_parent_directory(parent);
	if (parent[0] != '\0')
		(void) fsync_fname_ext(parent, true, false, WARNING);
}
