/*-------------------------------------------------------------------------
 *
 * wake.c
 *	  The latch of each kind of background worker, in shared memory, so
 *	  that any module can wake a worker (after a planned transfer, a new
 *	  stream, new records to ship) without calling up into the worker's
 *	  code.  A worker registers its latch as it starts and clears it as it
 *	  exits.
 *
 * Locking rule: none; see wake.h.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/wake.h"
#include "felix.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"

typedef struct FelixWakeSlots
{
	Latch	   *volatile latch[FELIX_WORKER_KINDS];
} FelixWakeSlots;

static FelixWakeSlots *slots = NULL;

Size
felix_wake_shmem_size(void)
{
	return MAXALIGN(sizeof(FelixWakeSlots));
}

void
felix_wake_shmem_init(void)
{
	bool		found;

	slots = ShmemInitStruct("felix wake", sizeof(FelixWakeSlots), &found);
	if (!found)
		memset(slots, 0, sizeof(FelixWakeSlots));
}

static void
wake_exit(int code, Datum arg)
{
	slots->latch[DatumGetInt32(arg)] = NULL;
}

void
felix_wake_register(FelixWorkerKind kind)
{
	Assert(kind >= 0 && kind < FELIX_WORKER_KINDS);
	slots->latch[kind] = MyLatch;
	before_shmem_exit(wake_exit, Int32GetDatum((int32) kind));
}

void
felix_wake(FelixWorkerKind kind)
{
	Latch	   *latch;

	Assert(kind >= 0 && kind < FELIX_WORKER_KINDS);
	latch = slots != NULL ? slots->latch[kind] : NULL;
	if (latch != NULL)
		SetLatch(latch);
}
