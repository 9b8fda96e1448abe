/*-------------------------------------------------------------------------
 *
 * nodes.c
 *	  The node directory: name -> conninfo for every node this node has
 *	  heard of through the control plane.  The heartbeat worker writes it
 *	  after each heartbeat (the leader and leader_conninfo of every shard
 *	  the control plane returned, and, every few seconds or when a name is
 *	  new, the control plane's node list, felix.cp_nodes()); the ship
 *	  worker reads it to reach a follower, and error hints read it to name
 *	  a leader's conninfo.
 *
 *	  The directory is a cache of the control plane's word, never an
 *	  authority: a stale entry costs a failed connection attempt, which the
 *	  reader retries after the next heartbeat refreshed it.  It is rebuilt
 *	  from scratch after every server start.
 *
 * Locking rule: `lock` (one LWLock) guards every entry.  felix_node_note
 * takes it exclusive; lookups take it shared and copy out.  Nothing else
 * is acquired while it is held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/nodes.h"
#include "felix.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#define FELIX_NODE_CONNINFO_LEN	1024

typedef struct FelixNodeEntry
{
	bool		used;
	char		name[NAMEDATALEN];
	char		conninfo[FELIX_NODE_CONNINFO_LEN];
	TimestampTz last_seen;		/* this node's clock: last noted */
} FelixNodeEntry;

typedef struct FelixNodeDirectory
{
	int			tranche_id;
	LWLock		lock;
	FelixNodeEntry entries[FELIX_MAX_NODES];	/* (lock) */
} FelixNodeDirectory;

static FelixNodeDirectory *directory = NULL;

Size
felix_nodes_shmem_size(void)
{
	return MAXALIGN(sizeof(FelixNodeDirectory));
}

void
felix_nodes_shmem_init(void)
{
	bool		found;

	directory = ShmemInitStruct("felix node directory", sizeof(FelixNodeDirectory), &found);
	if (!found)
	{
		memset(directory, 0, sizeof(FelixNodeDirectory));
		directory->tranche_id = LWLockNewTrancheId();
		LWLockInitialize(&directory->lock, directory->tranche_id);
	}
}

/* Name this backend's view of the tranche (wait events); false if no shmem. */
static bool
directory_attach(void)
{
	static bool tranche_registered = false;

	if (directory == NULL)
		return false;
	if (!tranche_registered)
	{
		LWLockRegisterTranche(directory->tranche_id, "felix_node_directory");
		tranche_registered = true;
	}
	return true;
}

/* Index of `name`'s entry, or -1.  Caller holds the lock. */
static int
directory_find(const char *name)
{
	for (int i = 0; i < FELIX_MAX_NODES; i++)
	{
		FelixNodeEntry *e = &directory->entries[i];

		if (e->used && strncmp(e->name, name, NAMEDATALEN) == 0)
			return i;
	}
	return -1;
}

void
felix_node_note(const char *name, const char *conninfo)
{
	int			i;
	FelixNodeEntry *e;

	if (name == NULL || name[0] == '\0' || conninfo == NULL || !directory_attach())
		return;

	LWLockAcquire(&directory->lock, LW_EXCLUSIVE);
	i = directory_find(name);
	if (i < 0)
	{
		/* A free entry, else the one least recently seen. */
		int			victim = 0;

		for (i = 0; i < FELIX_MAX_NODES; i++)
		{
			if (!directory->entries[i].used)
				break;
			if (directory->entries[i].last_seen < directory->entries[victim].last_seen)
				victim = i;
		}
		if (i == FELIX_MAX_NODES)
			i = victim;
		e = &directory->entries[i];
		memset(e, 0, sizeof(FelixNodeEntry));
		e->used = true;
		strlcpy(e->name, name, NAMEDATALEN);
	}
	e = &directory->entries[i];
	strlcpy(e->conninfo, conninfo, FELIX_NODE_CONNINFO_LEN);
	e->last_seen = GetCurrentTimestamp();
	LWLockRelease(&directory->lock);
}

bool
felix_node_conninfo_of(const char *name, char *buf, Size len)
{
	bool		found = false;
	int			i;

	if (len > 0)
		buf[0] = '\0';
	if (name == NULL || name[0] == '\0' || !directory_attach())
		return false;

	LWLockAcquire(&directory->lock, LW_SHARED);
	i = directory_find(name);
	if (i >= 0)
	{
		if (len > 0)
			strlcpy(buf, directory->entries[i].conninfo, len);
		found = true;
	}
	LWLockRelease(&directory->lock);
	return found;
}

bool
felix_node_known(const char *name)
{
	bool		found;

	if (name == NULL || name[0] == '\0' || !directory_attach())
		return false;
	LWLockAcquire(&directory->lock, LW_SHARED);
	found = directory_find(name) >= 0;
	LWLockRelease(&directory->lock);
	return found;
}
