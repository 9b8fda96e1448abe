/*-------------------------------------------------------------------------
 *
 * incarnation.c
 *	  The identity of this node's felix data directory (incarnation.h).
 *
 *	  The file "incarnation" at the root of the felix data directory holds
 *	  two lines, "incarnation <uuid>" and "starts <n>".  The postmaster
 *	  reads it when shared memory is set up, counts the start and writes it
 *	  back (a new file renamed over the old, both synced) before any
 *	  backend or worker runs; a missing or unreadable file means a new
 *	  directory, so a new incarnation, and so does a start from a base
 *	  backup (PostgreSQL's backup_label is there), whose felix files were
 *	  copied while they were written.  Each start also draws a random boot
 *	  id, kept in memory only.  The heartbeat sends all three to the
 *	  control plane, which remembers the highest start count of each
 *	  incarnation and the boot id that came with it: a directory restored
 *	  from an older copy of itself comes back with a lower count, or with
 *	  the same count from another boot, and felix_incarnation_renew gives
 *	  it a new identity.  (A copy restarted offline more times than the
 *	  original was since the copy was taken is not caught here; a wiped
 *	  directory always is.  The control plane also stops counting a node
 *	  caught up as it starts again, until its leader has shipped to it.)
 *
 *	  Whether felix.node_conninfo reaches this very node (the heartbeat
 *	  worker's check before it registers) is kept here too, for backends
 *	  that register the node themselves.
 *
 *	  What this directory has seen of its control plane is kept here too:
 *	  the file "control_plane" holds the store's id and the highest store
 *	  revision a heartbeat of this node has seen in it.  Every heartbeat
 *	  sends both, and the control plane refuses to serve a node that saw a
 *	  later revision of the same store than it has: the store was put
 *	  back from an older copy, and would hand out generations again
 *	  (cp_heartbeat.c).  The heartbeat worker writes the file (at most once
 *	  a second; a write that fails, on a full disk say, is warned about and
 *	  tried again, and never stops the heartbeats); backends only read the
 *	  shared copy and raise it.
 *
 *	  Each shard directory carries a stamp, the incarnation its copy was
 *	  made under (file "copy_of"), written when the shard is first opened
 *	  and whenever its copy is begun afresh (a bootstrap, a rebuild).  A
 *	  stamp that differs from the node's incarnation marks a copy that
 *	  survived from an older identity: a follower refuses to build on it.
 *
 * Locking rule: `mutex` guards the shared copy; the files are written by
 * the postmaster at startup and by the heartbeat worker (renewal, and what
 * it saw of the store) only.
 * A stamp is written with its shard's tail held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xlog.h"
#include "common/file_perm.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "felix.h"
#include "storage/incarnation.h"

#define FELIX_INCARNATION_FILE	"incarnation"
#define FELIX_STAMP_FILE		"copy_of"
#define FELIX_STORE_SEEN_FILE	"control_plane"

typedef struct FelixIdentity
{
	slock_t		mutex;
	char		incarnation[FELIX_INCARNATION_LEN];
	uint64		boots;
	char		boot_id[FELIX_INCARNATION_LEN]; /* this start's */
	int			conninfo_verified;	/* 1 reaches this node, -1 another, 0 unknown */
	char		store_id[FELIX_INCARNATION_LEN];	/* "" : none seen */
	uint64		store_revision; /* the highest seen in store_id */
	uint64		store_revision_written; /* ... as the file has it */
} FelixIdentity;

static FelixIdentity *identity = NULL;

Size
incarnation_shmem_size(void)
{
	return MAXALIGN(sizeof(FelixIdentity));
}

/* A new random (version 4) uuid in text form. */
static void
new_uuid(char *buf)
{
	uint8		b[16];

	if (!pg_strong_random(b, sizeof(b)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("felix: could not generate a random incarnation id")));
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	snprintf(buf, FELIX_INCARNATION_LEN,
			 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
			 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static bool
uuid_text_valid(const char *s)
{
	if (strlen(s) != FELIX_INCARNATION_LEN - 1)
		return false;
	for (int i = 0; s[i]; i++)
	{
		bool		dash = (i == 8 || i == 13 || i == 18 || i == 23);

		if (dash ? s[i] != '-' : !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return true;
}

/* Write `contents` to dir/name through a temporary file, durably; a failure
 * is reported at elevel (false if that returns). */
static bool
write_small_file(const char *dir, const char *name, const char *contents,
				 const char *what, int elevel)
{
	char		path[MAXPGPATH];
	char		tmp[MAXPGPATH];
	int			fd;
	size_t		len = strlen(contents);

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, name);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY, pg_file_create_mode);
	if (fd < 0)
	{
		ereport(elevel,
				(errcode_for_file_access(),
				 errmsg("%s: could not create \"%s\": %m", what, tmp),
				 errhint("Check free space and permissions of the felix data directory.")));
		return false;
	}
	if (write(fd, contents, len) != (ssize_t) len || pg_fsync(fd) != 0)
	{
		int			save_errno = errno ? errno : ENOSPC;

		close(fd);
		errno = save_errno;
		ereport(elevel,
				(errcode_for_file_access(),
				 errmsg("%s: could not write \"%s\": %m", what, tmp),
				 errhint("Check free space and permissions of the felix data directory.")));
		return false;
	}
	close(fd);
	if (rename(tmp, path) != 0)
	{
		ereport(elevel,
				(errcode_for_file_access(),
				 errmsg("%s: could not rename \"%s\" to \"%s\": %m", what, tmp, path)));
		return false;
	}
	fd = open(dir, O_RDONLY | PG_BINARY);
	if (fd >= 0)
	{
		(void) pg_fsync(fd);
		close(fd);
	}
	return true;
}

/* Read dir/name into buf (at most len - 1 bytes); false if absent. */
static bool
read_small_file(const char *dir, const char *name, char *buf, Size len)
{
	char		path[MAXPGPATH];
	int			fd;
	ssize_t		got;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
		return false;
	got = read(fd, buf, len - 1);
	close(fd);
	if (got < 0)
		return false;
	buf[got] = '\0';
	return true;
}

static void
identity_write(const char *incarnation, uint64 boots)
{
	char		contents[128];

	snprintf(contents, sizeof(contents), "incarnation %s\nstarts " UINT64_FORMAT "\n",
			 incarnation, boots);
	(void) write_small_file(felix_data_root(), FELIX_INCARNATION_FILE, contents,
							"felix data directory", ERROR);
}

/*
 * Does this start recover from a base backup?  pg_basebackup (and the
 * low-level backup API) leave a backup_label in the data directory; the
 * startup process renames it once recovery has begun, after the
 * postmaster has set up shared memory, so it is still there now.  A copy
 * of a running node's felix data directory is neither current (it holds
 * the log as it was when the copy was taken) nor consistent (segments
 * were appended to while they were copied, and felix writes no WAL).
 */
static bool
started_from_base_backup(void)
{
	char		path[MAXPGPATH];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", DataDir, BACKUP_LABEL_FILE);
	return stat(path, &st) == 0;
}

void
incarnation_shmem_init(void)
{
	bool		found;
	char		buf[256];
	char		inc[FELIX_INCARNATION_LEN + 8];
	unsigned long long boots = 0;
	const char *root = felix_data_root();

	identity = ShmemInitStruct("felix incarnation", sizeof(FelixIdentity), &found);
	if (found)
		return;
	SpinLockInit(&identity->mutex);

	if (mkdir(root, pg_dir_create_mode) != 0 && errno != EEXIST)
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("could not create felix data directory \"%s\": %m", root),
				 errhint("Check felix.data_directory and the permissions of its parent.")));

	inc[0] = '\0';
	if (read_small_file(root, FELIX_INCARNATION_FILE, buf, sizeof(buf)) &&
		(sscanf(buf, "incarnation %40s\nstarts %llu", inc, &boots) != 2 ||
		 !uuid_text_valid(inc)))
	{
		ereport(WARNING,
				(errmsg("felix data directory \"%s\": the file \"%s\" is unreadable; this directory gets a new incarnation",
						root, FELIX_INCARNATION_FILE),
				 errdetail("The control plane treats this node as a new, empty replica of every shard until each is rebuilt.")));
		inc[0] = '\0';
	}
	if (inc[0] != '\0' && started_from_base_backup())
	{
		ereport(LOG,
				(errmsg("felix data directory \"%s\": this server starts from a base backup; incarnation %s ends here",
						root, inc),
				 errdetail("The backup copied the felix data directory while records were appended to it, and it holds fewer records than this node acknowledged since: the control plane treats this node as a new, empty replica of every shard, and each shard's leader rebuilds its copy.")));
		inc[0] = '\0';
	}
	if (inc[0] == '\0')
	{
		new_uuid(inc);
		boots = 0;
		ereport(LOG,
				(errmsg("felix data directory \"%s\": incarnation %s", root, inc)));
	}
	boots++;
	identity_write(inc, boots);
	strlcpy(identity->incarnation, inc, FELIX_INCARNATION_LEN);
	identity->boots = boots;
	new_uuid(identity->boot_id);
	identity->conninfo_verified = 0;

	/* what this directory saw of its control plane; unreadable: nothing */
	identity->store_id[0] = '\0';
	identity->store_revision = identity->store_revision_written = 0;
	if (read_small_file(root, FELIX_STORE_SEEN_FILE, buf, sizeof(buf)))
	{
		char		id[FELIX_INCARNATION_LEN + 8];
		unsigned long long rev;

		if (sscanf(buf, "store %40s\nrevision %llu", id, &rev) == 2 && uuid_text_valid(id))
		{
			strlcpy(identity->store_id, id, FELIX_INCARNATION_LEN);
			identity->store_revision = identity->store_revision_written = rev;
		}
	}
}

void
felix_store_seen(char *store_id, uint64 *revision)
{
	SpinLockAcquire(&identity->mutex);
	strlcpy(store_id, identity->store_id, FELIX_INCARNATION_LEN);
	*revision = identity->store_revision;
	SpinLockRelease(&identity->mutex);
}

void
felix_store_seen_note(const char *store_id, uint64 revision)
{
	if (store_id == NULL || !uuid_text_valid(store_id))
		return;
	SpinLockAcquire(&identity->mutex);
	if (strcmp(identity->store_id, store_id) != 0)
	{
		/* another store (a cluster moved to a new one): start over */
		strlcpy(identity->store_id, store_id, FELIX_INCARNATION_LEN);
		identity->store_revision = revision;
		identity->store_revision_written = 0;
	}
	else if (revision > identity->store_revision)
		identity->store_revision = revision;
	SpinLockRelease(&identity->mutex);
}

bool
felix_store_seen_persist(int elevel)
{
	char		id[FELIX_INCARNATION_LEN];
	uint64		rev;
	uint64		written;
	char		contents[128];

	SpinLockAcquire(&identity->mutex);
	strlcpy(id, identity->store_id, FELIX_INCARNATION_LEN);
	rev = identity->store_revision;
	written = identity->store_revision_written;
	SpinLockRelease(&identity->mutex);
	if (id[0] == '\0' || rev == written)
		return true;
	snprintf(contents, sizeof(contents), "store %s\nrevision " UINT64_FORMAT "\n", id, rev);
	if (!write_small_file(felix_data_root(), FELIX_STORE_SEEN_FILE, contents,
						  "felix data directory", elevel))
		return false;
	SpinLockAcquire(&identity->mutex);
	if (strcmp(identity->store_id, id) == 0)
		identity->store_revision_written = Max(identity->store_revision_written, rev);
	SpinLockRelease(&identity->mutex);
	return true;
}

void
felix_incarnation(char *buf, uint64 *boots)
{
	felix_incarnation_boot(buf, boots, NULL);
}

void
felix_incarnation_boot(char *buf, uint64 *boots, char *boot_id)
{
	Assert(identity != NULL);
	SpinLockAcquire(&identity->mutex);
	strlcpy(buf, identity->incarnation, FELIX_INCARNATION_LEN);
	if (boots)
		*boots = identity->boots;
	if (boot_id)
		strlcpy(boot_id, identity->boot_id, FELIX_INCARNATION_LEN);
	SpinLockRelease(&identity->mutex);
}

int
felix_conninfo_verified(void)
{
	int			v;

	SpinLockAcquire(&identity->mutex);
	v = identity->conninfo_verified;
	SpinLockRelease(&identity->mutex);
	return v;
}

void
felix_set_conninfo_verified(int verdict)
{
	SpinLockAcquire(&identity->mutex);
	identity->conninfo_verified = verdict;
	SpinLockRelease(&identity->mutex);
}

void
felix_incarnation_renew(void)
{
	char		inc[FELIX_INCARNATION_LEN];
	char		old[FELIX_INCARNATION_LEN];

	new_uuid(inc);
	felix_incarnation(old, NULL);
	identity_write(inc, 1);
	SpinLockAcquire(&identity->mutex);
	strlcpy(identity->incarnation, inc, FELIX_INCARNATION_LEN);
	identity->boots = 1;
	identity->conninfo_verified = 0;	/* checked again, against the new one */
	SpinLockRelease(&identity->mutex);
	ereport(LOG,
			(errmsg("felix data directory \"%s\" is an older copy of incarnation %s; it is now incarnation %s",
					felix_data_root(), old, inc),
			 errdetail("Every replicated shard copy it holds is rebuilt from its leader before it counts again.")));
}

void
incarnation_stamp_read(const char *dir, char *buf)
{
	char		contents[64];

	buf[0] = '\0';
	if (read_small_file(dir, FELIX_STAMP_FILE, contents, sizeof(contents)))
	{
		contents[strcspn(contents, "\n")] = '\0';
		if (uuid_text_valid(contents))
			strlcpy(buf, contents, FELIX_INCARNATION_LEN);
	}
}

void
incarnation_stamp_write(const char *dir, const char *what)
{
	char		inc[FELIX_INCARNATION_LEN];
	char		contents[64];

	felix_incarnation(inc, NULL);
	snprintf(contents, sizeof(contents), "%s\n", inc);
	(void) write_small_file(dir, FELIX_STAMP_FILE, contents, what, ERROR);
}
