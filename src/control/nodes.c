/*-------------------------------------------------------------------------
 *
 * nodes.c
 *	  The node directory: name -> conninfo (and the incarnation of its felix
 *	  data directory) for every node this node has heard of through the
 *	  control plane.  The heartbeat worker writes it
 *	  after each heartbeat (the leader and leader_conninfo of every shard
 *	  the control plane returned, and the control plane's node list,
 *	  felix.cp_nodes(), with each node's liveness); the ship worker reads
 *	  it to reach a follower, error hints read it to name a leader's
 *	  conninfo, and the felix_nodes view shows the node list from it, so
 *	  that reading the view connects to nothing.  A conninfo here is an
 *	  address only (conninfo.c): nodes register nothing else.
 *
 *	  The directory is a cache of the control plane's word, never an
 *	  authority: a stale entry costs a failed connection attempt, which the
 *	  reader retries after the next heartbeat refreshed it.  It is rebuilt
 *	  from scratch after every server start.
 *
 * Locking rule: `lock` (one LWLock) guards every entry.  felix_node_note
 * takes it exclusive; lookups take it shared and copy out.  Nothing else
 * is acquired while it is held.  `identities` is an atomic counter, moved
 * with the lock held exclusive and read without it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/conninfo.h"
#include "control/nodes.h"
#include "lib/stringinfo.h"
#include "utils/json.h"
#include "felix.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

typedef struct FelixNodeEntry
{
	bool		used;
	char		name[NAMEDATALEN];
	char		conninfo[FELIX_NODE_CONNINFO_LEN];
	char		incarnation[FELIX_INCARNATION_LEN];	/* from the node list */
	TimestampTz last_seen;		/* this node's clock: last noted */
	/* from the control plane's last node list (felix_nodes_listed) */
	bool		listed;
	bool		alive;
	bool		duty;
	TimestampTz last_heartbeat; /* the node's own clock, as it wrote it */
	char		peers[FELIX_NODE_PEERS_LEN];
	char		clash_incarnation[FELIX_INCARNATION_LEN];
	char		clash_conninfo[256];
	TimestampTz clash_at;
	/* this node's probe of it */
	bool		probed;
	char		probe_error[256];	/* "" when the probe succeeded */
	int64		probe_due_ns;	/* monotonic: not probed again before */
} FelixNodeEntry;

typedef struct FelixNodeDirectory
{
	int			tranche_id;
	LWLock		lock;
	int			next_probe;		/* round-robin cursor */
	/* moves (under the lock) whenever a node's address or incarnation does */
	pg_atomic_uint64 identities;
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
		pg_atomic_init_u64(&directory->identities, 1);
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

/* The entry for `name`, made (or taken over) if need be.  Caller holds the lock. */
static FelixNodeEntry *
directory_entry(const char *name)
{
	int			i = directory_find(name);
	FelixNodeEntry *e;

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
		pg_atomic_fetch_add_u64(&directory->identities, 1);
	}
	return &directory->entries[i];
}

/* Set e's address and (if given) incarnation.  Caller holds the lock exclusive. */
static void
directory_identify(FelixNodeEntry *e, const char *conninfo, const char *incarnation)
{
	if (strncmp(e->conninfo, conninfo, FELIX_NODE_CONNINFO_LEN - 1) != 0 ||
		(incarnation && strncmp(e->incarnation, incarnation, FELIX_INCARNATION_LEN - 1) != 0))
		pg_atomic_fetch_add_u64(&directory->identities, 1);
	strlcpy(e->conninfo, conninfo, FELIX_NODE_CONNINFO_LEN);
	if (incarnation)
		strlcpy(e->incarnation, incarnation, FELIX_INCARNATION_LEN);
}

void
felix_node_note(const char *name, const char *conninfo)
{
	FelixNodeEntry *e;

	if (name == NULL || name[0] == '\0' || conninfo == NULL || !directory_attach())
		return;

	LWLockAcquire(&directory->lock, LW_EXCLUSIVE);
	e = directory_entry(name);
	if (strncmp(e->conninfo, conninfo, FELIX_NODE_CONNINFO_LEN - 1) != 0)
		e->probe_due_ns = 0;	/* a new address: probe it at the next turn */
	directory_identify(e, conninfo, NULL);
	e->last_seen = GetCurrentTimestamp();
	LWLockRelease(&directory->lock);
}

void
felix_nodes_listed(const FelixNodeInfo *nodes, int n)
{
	TimestampTz now = GetCurrentTimestamp();

	if (!directory_attach())
		return;
	LWLockAcquire(&directory->lock, LW_EXCLUSIVE);
	for (int i = 0; i < FELIX_MAX_NODES; i++)
		directory->entries[i].listed = false;
	for (int i = 0; i < n && i < FELIX_MAX_NODES; i++)
	{
		FelixNodeEntry *e;

		if (nodes[i].name[0] == '\0')
			continue;
		e = directory_entry(nodes[i].name);
		directory_identify(e, nodes[i].conninfo, nodes[i].incarnation);
		e->last_seen = now;
		e->listed = true;
		e->alive = nodes[i].alive;
		e->duty = nodes[i].duty;
		e->last_heartbeat = nodes[i].last_heartbeat;
		strlcpy(e->peers, nodes[i].peers, FELIX_NODE_PEERS_LEN);
		strlcpy(e->clash_incarnation, nodes[i].clash_incarnation, FELIX_INCARNATION_LEN);
		strlcpy(e->clash_conninfo, nodes[i].clash_conninfo, sizeof(e->clash_conninfo));
		e->clash_at = nodes[i].clash_at;
	}
	LWLockRelease(&directory->lock);
}

int
felix_nodes_list(FelixNodeInfo **out)
{
	int			n = 0;

	*out = palloc0(sizeof(FelixNodeInfo) * FELIX_MAX_NODES);
	if (!directory_attach())
		return 0;
	LWLockAcquire(&directory->lock, LW_SHARED);
	for (int i = 0; i < FELIX_MAX_NODES; i++)
	{
		FelixNodeEntry *e = &directory->entries[i];

		if (!e->used || !e->listed)
			continue;
		strlcpy((*out)[n].name, e->name, NAMEDATALEN);
		strlcpy((*out)[n].conninfo, e->conninfo, FELIX_NODE_CONNINFO_LEN);
		strlcpy((*out)[n].incarnation, e->incarnation, FELIX_INCARNATION_LEN);
		(*out)[n].alive = e->alive;
		(*out)[n].duty = e->duty;
		(*out)[n].last_heartbeat = e->last_heartbeat;
		strlcpy((*out)[n].peers, e->peers, FELIX_NODE_PEERS_LEN);
		strlcpy((*out)[n].clash_incarnation, e->clash_incarnation, FELIX_INCARNATION_LEN);
		strlcpy((*out)[n].clash_conninfo, e->clash_conninfo, sizeof(e->clash_conninfo));
		(*out)[n].clash_at = e->clash_at;
		n++;
	}
	LWLockRelease(&directory->lock);
	return n;
}

/* Copy node `name`'s conninfo (len bytes) and incarnation out; false if unknown. */
static bool
directory_lookup(const char *name, char *conninfo, Size len, char *incarnation)
{
	int			i;

	if (conninfo != NULL && len > 0)
		conninfo[0] = '\0';
	if (incarnation != NULL)
		incarnation[0] = '\0';
	if (name == NULL || name[0] == '\0' || !directory_attach())
		return false;

	LWLockAcquire(&directory->lock, LW_SHARED);
	i = directory_find(name);
	if (i >= 0)
	{
		if (conninfo != NULL && len > 0)
			strlcpy(conninfo, directory->entries[i].conninfo, len);
		if (incarnation != NULL)
			strlcpy(incarnation, directory->entries[i].incarnation, FELIX_INCARNATION_LEN);
	}
	LWLockRelease(&directory->lock);
	return i >= 0;
}

bool
felix_node_conninfo_of(const char *name, char *buf, Size len)
{
	return directory_lookup(name, buf, len, NULL);
}

bool
felix_node_incarnation_of(const char *name, char *buf)
{
	return directory_lookup(name, NULL, 0, buf) && buf[0] != '\0';
}

uint64
felix_nodes_identities(void)
{
	return directory_attach() ? pg_atomic_read_u64(&directory->identities) : 0;
}

bool
felix_node_probed(const char *name, bool ok, const char *why, int64 due_ns)
{
	int			i;
	bool		changed = false;
	const char *now = ok ? "" : (why && why[0] ? why : "unreachable");

	if (!directory_attach())
		return false;
	LWLockAcquire(&directory->lock, LW_EXCLUSIVE);
	i = directory_find(name);
	if (i >= 0)
	{
		FelixNodeEntry *e = &directory->entries[i];

		changed = !e->probed || strncmp(e->probe_error, now, sizeof(e->probe_error) - 1) != 0;
		e->probed = true;
		e->probe_due_ns = due_ns;
		strlcpy(e->probe_error, now, sizeof(e->probe_error));
	}
	LWLockRelease(&directory->lock);
	return changed;
}

char *
felix_nodes_probes_json(void)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	if (directory_attach())
	{
		LWLockAcquire(&directory->lock, LW_SHARED);
		for (int i = 0; i < FELIX_MAX_NODES; i++)
		{
			FelixNodeEntry *e = &directory->entries[i];

			if (!e->used || !e->listed || !e->probed)
				continue;
			if (b.len > 1)
				appendStringInfoChar(&b, ',');
			escape_json(&b, e->name);
			appendStringInfoChar(&b, ':');
			escape_json(&b, e->probe_error);
		}
		LWLockRelease(&directory->lock);
	}
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
felix_nodes_next_probe(char *name, char *conninfo, Size len, int64 now_ns)
{
	bool		found = false;

	if (!directory_attach())
		return false;
	LWLockAcquire(&directory->lock, LW_EXCLUSIVE);
	for (int k = 0; k < FELIX_MAX_NODES && !found; k++)
	{
		int			i = (directory->next_probe + k) % FELIX_MAX_NODES;
		FelixNodeEntry *e = &directory->entries[i];

		if (!e->used || !e->listed || e->conninfo[0] == '\0' ||
			(e->probed && e->probe_due_ns > now_ns) ||
			strcmp(e->name, felix_node_name_resolved()) == 0)
			continue;
		strlcpy(name, e->name, NAMEDATALEN);
		strlcpy(conninfo, e->conninfo, len);
		directory->next_probe = (i + 1) % FELIX_MAX_NODES;
		found = true;
	}
	LWLockRelease(&directory->lock);
	return found;
}
