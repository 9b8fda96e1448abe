/*-------------------------------------------------------------------------
 *
 * felix.h
 *	  Names shared by every felix subsystem, at the bottom of the layers
 *	  (base): the settings, the shard key, the helpers of src/base/common.c,
 *	  and the shared-memory registry through which each subsystem reserves
 *	  its space.
 *
 * Nothing here takes a lock; each subsystem's header states its own rule.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_H
#define FELIX_H

#include "postgres.h"
#include "fmgr.h"

/* ---- settings (src/base/settings.c) ---- */

/* Define every felix.* setting (from _PG_init, while preloading). */
extern void felix_settings_define(void);

extern char *felix_data_directory;	/* felix.data_directory; "" = $PGDATA/felix */
extern int	felix_max_shards;		/* felix.max_shards: shared shard slots */
extern int	felix_segment_bytes;	/* felix.segment_bytes: roll threshold */
extern int	felix_index_interval_bytes; /* felix.index_interval_bytes */
extern int	felix_max_record_bytes; /* felix.max_record_bytes */
extern int	felix_max_shards_per_stream;	/* felix.max_shards_per_stream */
extern int	felix_retention_interval;	/* felix.retention_check_interval, ms */
extern char *felix_database;		/* felix.database: where the node worker runs */

/* ---- cluster GUCs (replication) ---- */
extern char *felix_node_name;		/* felix.node_name; "" = node_<port> */
extern char *felix_node_conninfo;	/* felix.node_conninfo; "" = derived */
extern char *felix_control_conninfo;	/* felix.control_conninfo; "" = embedded */
extern int	felix_lease_duration;	/* ms */
extern int	felix_rebuild_max_concurrent;	/* rebuilds at once, node-wide */
extern int	felix_rebuild_bytes_per_sec;	/* per rebuilding follower; 0: no cap */
extern int	felix_heartbeat_interval;	/* ms */
extern int	felix_lease_margin;		/* ms */
extern int	felix_lease_epsilon;	/* ms */
extern int	felix_quorum_timeout;	/* ms */
extern int	felix_node_expiry;		/* ms */
extern int	felix_store_guard_interval;	/* ms */
extern bool felix_control_plane_duties;	/* may run failure detection and promotion */

/* ---- the etcd control-plane store (control/store_etcd.c) ---- */
extern char *felix_etcd_endpoints;	/* "" = the embedded store */
extern char *felix_etcd_prefix;		/* every key of this cluster under it */
extern int	felix_etcd_timeout;		/* ms, one request across all endpoints */
extern char *felix_etcd_cacert;
extern char *felix_etcd_cert;
extern char *felix_etcd_key;
extern char *felix_etcd_user;
extern char *felix_etcd_password_file;

/* ---- limits on what one role or transaction may take ---- */
extern int	felix_max_transaction_bytes;	/* buffered INSERT/COPY bytes */
extern int	felix_max_streams_per_role; /* streams a non-superuser may own */
extern int	felix_max_shards_per_role;	/* shards a non-superuser may own */
extern int	felix_max_bytes_per_role;	/* MB its streams may hold here; 0: no cap */
extern bool felix_forward_publishes;	/* forward publishes to the shard's leader */

/* felix's own SQLSTATEs (class 55: object not in prerequisite state) */
#define FELIX_ERRCODE_QUORUM_TIMEOUT	MAKE_SQLSTATE('5','5','F','0','1')
#define FELIX_ERRCODE_NOT_LEADER		MAKE_SQLSTATE('5','5','F','0','2')
#define FELIX_ERRCODE_LEASE_EXPIRED		MAKE_SQLSTATE('5','5','F','0','3')
/* a peer speaks of a generation this node has not learned of yet */
#define FELIX_ERRCODE_GENERATION_UNKNOWN	MAKE_SQLSTATE('5','5','F','0','4')
/* A shipment or request reached a node other than the one it names. */
#define FELIX_ERRCODE_WRONG_NODE		MAKE_SQLSTATE('5','5','F','0','5')

/* When a publish is acknowledged: durable on the leader, or on a majority. */
typedef enum FelixConsistency
{
	FELIX_CONSISTENCY_LEADER,
	FELIX_CONSISTENCY_QUORUM
} FelixConsistency;

/* The maximum bytes one batch may hold; larger INSERT/COPY buffers split. */
#define FELIX_MAX_BATCH_BYTES	(64 * 1024 * 1024)

/*
 * A shard is named locally by the database, the stream's table OID and the
 * shard number.  Its files live in <data_directory>/<dboid>/<relid>/<shard>/.
 */
typedef struct FelixShardKey
{
	Oid			dboid;
	Oid			relid;
	int32		shard;
} FelixShardKey;

/* Absolute path of felix.data_directory, resolved at first use. */
extern const char *felix_data_root(void);
/* <root>/<dboid>/<relid>/<shard> into buf (MAXPGPATH). */
extern void felix_shard_dir(const FelixShardKey *key, char *buf);
/* <root>/<dboid>/<relid> into buf (MAXPGPATH). */
extern void felix_stream_dir(Oid dboid, Oid relid, char *buf);

/* Raise an error unless felix was loaded through shared_preload_libraries. */
extern void felix_require_preload(void);
extern void felix_require_nargs(FunctionCallInfo fcinfo, int nargs, const char *function);

/* The version of felix's SQL objects this library serves (felix.control). */
#define FELIX_SQL_VERSION	"1.1"
/* The version installed in this database ("" if none) into buf; true if
 * it is FELIX_SQL_VERSION.  In a transaction. */
extern bool felix_extension_version(char *buf, Size len);
extern bool felix_preloaded;

/* ---- shared-memory registry (src/shmem.c) ----
 *
 * Every subsystem that needs shared memory lists one entry in the table in
 * shmem.c: the request hook sums the sizes, the startup hook calls each
 * init function under AddinShmemInitLock; init attaches its structures
 * with ShmemInitStruct/ShmemInitHash and sets them up when not found.
 */
typedef struct FelixShmemEntry
{
	Size		(*size) (void);
	void		(*init) (void);
} FelixShmemEntry;

extern void felix_shmem_install_hooks(void);

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC); leases are judged by it. */
extern int64 felix_monotonic_ns(void);
#define NS_PER_MS	INT64CONST(1000000)

/* Sleep ms on the latch in a backend's wait, servicing interrupts. */
extern void felix_nap(long ms);

#endif							/* FELIX_H */
