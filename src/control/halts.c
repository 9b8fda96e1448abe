/*-------------------------------------------------------------------------
 *
 * halts.c
 *	  The cache behind felix_halted (halts.h): after every heartbeat the
 *	  heartbeat worker reads felix.cp_halted() and replaces the list here;
 *	  the view copies it out.  Like the node directory, it is a cache of
 *	  the control plane's word and never an authority: the leader that
 *	  reported a halt acts on its own state, and a rebuild that begins
 *	  drops the entry from the next report.
 *
 * Locking rule: `lock` (one LWLock) guards the list; nothing else is
 * acquired while it is held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "control/halts.h"
#include "felix.h"

typedef struct FelixHaltCache
{
	int			tranche_id;
	LWLock		lock;
	int			n;				/* (lock) */
	FelixHaltInfo halts[FELIX_MAX_HALTS];	/* (lock) */
} FelixHaltCache;

static FelixHaltCache *cache = NULL;

Size
felix_halts_shmem_size(void)
{
	return MAXALIGN(sizeof(FelixHaltCache));
}

void
felix_halts_shmem_init(void)
{
	bool		found;

	cache = ShmemInitStruct("felix halted followers", sizeof(FelixHaltCache), &found);
	if (!found)
	{
		memset(cache, 0, sizeof(FelixHaltCache));
		cache->tranche_id = LWLockNewTrancheId();
		LWLockInitialize(&cache->lock, cache->tranche_id);
	}
	LWLockRegisterTranche(cache->tranche_id, "felix_halts");
}

void
felix_halts_listed(const FelixHaltInfo *halts, int n)
{
	felix_require_preload();
	n = Min(n, FELIX_MAX_HALTS);
	LWLockAcquire(&cache->lock, LW_EXCLUSIVE);
	memcpy(cache->halts, halts, sizeof(FelixHaltInfo) * n);
	cache->n = n;
	LWLockRelease(&cache->lock);
}

int
felix_halts_list(FelixHaltInfo **out)
{
	int			n;

	felix_require_preload();
	*out = palloc(sizeof(FelixHaltInfo) * FELIX_MAX_HALTS);
	LWLockAcquire(&cache->lock, LW_SHARED);
	n = cache->n;
	memcpy(*out, cache->halts, sizeof(FelixHaltInfo) * n);
	LWLockRelease(&cache->lock);
	return n;
}
