/*-------------------------------------------------------------------------
 *
 * felix.c
 *	  Library entry point: settings, hooks, shared memory and the workers
 *	  are all registered here, once, while the postmaster loads felix from
 *	  shared_preload_libraries.  With shmem.c it is the root of the layers
 *	  (docs/design.md): the one place that wires every layer together.  Loaded any other way, felix registers
 *	  nothing, and every entry point refuses with a hint through
 *	  felix_require_preload().
 *
 * Locking rule: runs in the postmaster before any backend exists; nothing
 * to lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "am/am.h"
#include "core/catalog.h"
#include "api/forward.h"
#include "api/pending.h"
#include "api/seclabel.h"
#include "api/stream.h"
#include "control/conninfo.h"
#include "control/store.h"
#include "felix.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/postmaster.h"
#include "replication/quorum.h"
#include "replication/ship.h"
#include "worker/duties.h"
#include "worker/heartbeat.h"
#include "worker/node.h"
#include "worker/reporter.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	/*
	 * Loaded later (CREATE EXTENSION without the preload): define nothing,
	 * since PGC_POSTMASTER settings cannot appear after startup; the
	 * install script's first statement then refuses with a hint.
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;

	felix_settings_define();
	felix_conninfo_check_settings();
	felix_store_check_settings();

	felix_preloaded = true;
	felix_shmem_install_hooks();
	shard_set_notify(quorum_notify);
	felix_am_init();
	felix_catalog_init();
	pending_init();
	forward_commit_init();
	felix_stream_init();
	felix_seclabel_init();
	felix_node_worker_register();
	felix_heartbeat_worker_register();
	felix_duty_worker_register();
	felix_ship_worker_register();
	if (felix_store_is_etcd())
		felix_reporter_register();
}

