/*-------------------------------------------------------------------------
 *
 * hwm.c
 *	  The durable high-water mark of a shard (file "hwm" beside its
 *	  segments): the end of what this replica knows to be acknowledged, so
 *	  that after a restart it serves those records at once and the guard
 *	  that forbids cutting acknowledged records (truncate.c) still knows
 *	  where they end -- and, once a leader found this copy differing from
 *	  its own, where it differs (readers stop short of it across restarts,
 *	  until the copy is begun again).
 *
 * The file holds two 24-byte slots, each {hwm_end, diverged_at, write
 * count, crc}; a write goes to the slot the older one is in, and is
 * fdatasync'd before it returns.  A torn write spoils one slot only: the reader takes
 * the valid slot with the highest count, so it always finds the last mark
 * that was made durable, or the one before it.  The mark only moves up,
 * except when the whole log is discarded (log_hwm_reset).
 *
 * Locking rule: writers hold the shard's mark_lock (the node worker's
 * persister, a divergence, a discard), never needing the tail for it;
 * log_hwm_read runs when the shard opens, with the tail held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "common/file_perm.h"
#include "storage/fd.h"

#include "log_internal.h"
#include "storage/crc.h"

#define FELIX_HWM_FILE	"hwm"

typedef struct HwmSlot
{
	uint64		hwm_end;
	uint64		diverged_at;	/* PG_UINT64_MAX: not known to differ */
	uint32		count;			/* which write this was: the newest wins */
	pg_crc32c	crc;			/* of the fields above */
} HwmSlot;

static void
hwm_path(char *buf, const char *dir)
{
	snprintf(buf, MAXPGPATH, "%s/%s", dir, FELIX_HWM_FILE);
}

static pg_crc32c
slot_crc(const HwmSlot *h)
{
	return felix_crc32c(h, offsetof(HwmSlot, crc));
}

/* The newest valid slot of the file (count 0, hwm_end 0 when none). */
static HwmSlot
hwm_newest(const char *dir, int *which)
{
	char		path[MAXPGPATH];
	HwmSlot		slots[2];
	HwmSlot		best = {0, PG_UINT64_MAX, 0, 0};
	int			fd;
	ssize_t		got;

	*which = -1;
	hwm_path(path, dir);
	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
		return best;
	memset(slots, 0, sizeof(slots));
	got = felix_pread_all(fd, slots, sizeof(slots), 0);
	CloseTransientFile(fd);
	for (int i = 0; i < 2; i++)
	{
		if (got < (ssize_t) ((i + 1) * sizeof(HwmSlot)))
			break;
		if (slots[i].crc == slot_crc(&slots[i]) && slots[i].count > best.count)
		{
			best = slots[i];
			*which = i;
		}
	}
	return best;
}

uint64
log_hwm_read(const char *dir, uint64 *diverged_at)
{
	int			which;
	HwmSlot		h = hwm_newest(dir, &which);

	*diverged_at = h.diverged_at;
	return h.hwm_end;
}

void
log_hwm_write(const char *dir, const char *what, uint64 hwm_end, uint64 diverged_at)
{
	char		path[MAXPGPATH];
	int			which;
	HwmSlot		cur = hwm_newest(dir, &which);
	HwmSlot		next;
	int			fd;
	bool		created;

	memset(&next, 0, sizeof(next));
	next.hwm_end = hwm_end;
	next.diverged_at = diverged_at;
	next.count = cur.count + 1;
	next.crc = slot_crc(&next);

	felix_ensure_dir(dir, what);
	hwm_path(path, dir);
	created = access(path, F_OK) != 0;
	fd = OpenTransientFilePerm(path, O_RDWR | O_CREAT | PG_BINARY, pg_file_create_mode);
	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not open high-water mark file \"%s\": %m", what, path)));
	/* over the older slot: the newer one survives a torn write */
	if (!felix_pwrite_all(fd, &next, sizeof(next), (which == 0 ? 1 : 0) * sizeof(HwmSlot)))
	{
		int			save_errno = errno;

		CloseTransientFile(fd);
		errno = save_errno;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("%s: could not write high-water mark file \"%s\": %m", what, path),
				 errhint("Check free space and permissions of the felix data directory.")));
	}
	felix_fdatasync(fd, path, what);
	CloseTransientFile(fd);
	if (created)
		fsync_fname(dir, true);
}

void
log_hwm_reset(const char *dir, const char *what)
{
	char		path[MAXPGPATH];

	hwm_path(path, dir);
	felix_unlink(path, what);
	fsync_fname(dir, true);
}
