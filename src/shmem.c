/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  The one shared-memory registry.  Each subsystem lists a {size, init}
 *	  entry in felix_shmem_entries; the request hook sums them into a single
 *	  RequestAddinShmemSpace call and the startup hook lets each attach its
 *	  structures in table order.  Adding a subsystem's shared state means
 *	  adding a line here, not another hook.
 *
 * Locking rule: the startup hook runs every init under AddinShmemInitLock,
 * so each structure is set up exactly once per postmaster start.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/halts.h"
#include "control/nodes.h"
#include "control/store_view.h"
#include "base/wake.h"
#include "felix.h"
#include "base/metrics.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "replication/state.h"
#include "storage/incarnation.h"
#include "storage/shard.h"
#include "replication/report_queue.h"

static const FelixShmemEntry felix_shmem_entries[] = {
	{incarnation_shmem_size, incarnation_shmem_init},
	{shard_registry_size, shard_registry_init},
	{metrics_shmem_size, metrics_shmem_init},
	{felix_nodes_shmem_size, felix_nodes_shmem_init},
	{felix_halts_shmem_size, felix_halts_shmem_init},
	{repl_state_shmem_size, repl_state_shmem_init},
	{felix_wake_shmem_size, felix_wake_shmem_init},
	{felix_store_view_shmem_size, felix_store_view_shmem_init},
	{report_queue_shmem_size, report_queue_shmem_init},
};

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
felix_shmem_request(void)
{
	Size		total = 0;

	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	for (int i = 0; i < lengthof(felix_shmem_entries); i++)
		total = add_size(total, felix_shmem_entries[i].size());
	RequestAddinShmemSpace(total);
}

static void
felix_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	for (int i = 0; i < lengthof(felix_shmem_entries); i++)
		felix_shmem_entries[i].init();
	LWLockRelease(AddinShmemInitLock);
}

void
felix_shmem_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = felix_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = felix_shmem_startup;
}
