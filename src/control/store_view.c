/*-------------------------------------------------------------------------
 *
 * store_view.c
 *	  What this node's heartbeat last saw of the control-plane store, kept
 *	  in shared memory for felix_nodes: the heartbeat notes every call's
 *	  outcome, and a view reads a copy.
 *
 * Locking rule: one spinlock over the view; held only to copy it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/store_view.h"
#include "felix.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

typedef struct FelixStoreViewShared
{
	slock_t		mutex;
	FelixStoreView view;
} FelixStoreViewShared;

static FelixStoreViewShared *shared = NULL;

Size
felix_store_view_shmem_size(void)
{
	return MAXALIGN(sizeof(FelixStoreViewShared));
}

void
felix_store_view_shmem_init(void)
{
	bool		found;

	shared = ShmemInitStruct("felix store view", sizeof(FelixStoreViewShared), &found);
	if (!found)
	{
		SpinLockInit(&shared->mutex);
		memset(&shared->view, 0, sizeof(FelixStoreView));
	}
}

void
felix_store_view_note(bool ok, const char *store, const char *error, const char *sqlstate)
{
	FelixStoreView v;
	TimestampTz now = GetCurrentTimestamp();
	int64		now_ns = felix_monotonic_ns();

	memset(&v, 0, sizeof(v));
	v.ok = ok;
	strlcpy(v.store, store, sizeof(v.store));
	strlcpy(v.error, error, sizeof(v.error));
	strlcpy(v.sqlstate, sqlstate, sizeof(v.sqlstate));
	SpinLockAcquire(&shared->mutex);
	v.ok_at = ok ? now : shared->view.ok_at;
	v.ok_mono_ns = ok ? now_ns : shared->view.ok_mono_ns;
	v.failing_since = ok ? 0 :
		shared->view.failing_since != 0 ? shared->view.failing_since : now;
	shared->view = v;
	SpinLockRelease(&shared->mutex);
}

void
felix_store_view_blocked(const char *why)
{
	TimestampTz now = GetCurrentTimestamp();

	SpinLockAcquire(&shared->mutex);
	shared->view.ok = false;
	shared->view.sqlstate[0] = '\0';
	strlcpy(shared->view.error, why, sizeof(shared->view.error));
	if (shared->view.failing_since == 0)
		shared->view.failing_since = now;
	SpinLockRelease(&shared->mutex);
}

void
felix_store_view(FelixStoreView *out)
{
	memset(out, 0, sizeof(*out));
	if (shared == NULL)
		return;
	SpinLockAcquire(&shared->mutex);
	*out = shared->view;
	SpinLockRelease(&shared->mutex);
}
