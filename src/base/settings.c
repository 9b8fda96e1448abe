/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  Every felix.* setting: its variable, and its definition with its
 *	  default, range and context (felix_settings_define, from _PG_init).
 *	  Each module reads the variables it needs through felix.h; none
 *	  defines a setting of its own.
 *
 * Locking rule: the variables are written by PostgreSQL's GUC machinery
 * in each process; nothing to lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "felix.h"
#include "utils/guc.h"

char	   *felix_data_directory = NULL;
int			felix_max_shards = 1024;
int			felix_segment_bytes = 64 * 1024 * 1024;
int			felix_index_interval_bytes = 4096;
int			felix_max_record_bytes = 1024 * 1024;
int			felix_max_shards_per_stream = 256;
int			felix_retention_interval = 10000;
char	   *felix_database = NULL;
char	   *felix_node_name = NULL;
char	   *felix_node_conninfo = NULL;
char	   *felix_control_conninfo = NULL;
int			felix_lease_duration = 1000;
int			felix_rebuild_max_concurrent = 1;
int			felix_rebuild_bytes_per_sec = 0;
int			felix_heartbeat_interval = 200;
int			felix_lease_margin = 200;
int			felix_lease_epsilon = 100;
int			felix_quorum_timeout = 5000;
int			felix_node_expiry = 1500;
int			felix_store_guard_interval = 300000;
bool		felix_control_plane_duties = true;
char	   *felix_etcd_endpoints = NULL;
char	   *felix_etcd_prefix = NULL;
int			felix_etcd_timeout = 2000;
char	   *felix_etcd_cacert = NULL;
char	   *felix_etcd_cert = NULL;
char	   *felix_etcd_key = NULL;
char	   *felix_etcd_user = NULL;
char	   *felix_etcd_password_file = NULL;
int			felix_max_transaction_bytes = 256 * 1024 * 1024;
int			felix_max_streams_per_role = 64;
int			felix_max_shards_per_role = 256;
int			felix_max_bytes_per_role = 0;
bool		felix_forward_publishes = true;


void
felix_settings_define(void)
{
	DefineCustomStringVariable("felix.data_directory",
							   "Directory holding every shard's segment log.",
							   "Empty means the felix directory inside the data directory.",
							   &felix_data_directory, "",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_shards",
							"Shards this node can hold open at once (shared memory slots).",
							NULL,
							&felix_max_shards, 1024, 1, 1000000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.segment_bytes",
							"Size at which a shard's active segment is sealed and a new one begun.",
							NULL,
							&felix_segment_bytes, 64 * 1024 * 1024,
							64 * 1024, INT_MAX / 2,
							PGC_SIGHUP, GUC_UNIT_BYTE, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.index_interval_bytes",
							"Bytes of log between two entries of a segment's sparse index.",
							NULL,
							&felix_index_interval_bytes, 4096, 256, 64 * 1024 * 1024,
							PGC_SIGHUP, GUC_UNIT_BYTE, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_record_bytes",
							"Largest record (key plus payload) a stream accepts.",
							NULL,
							&felix_max_record_bytes, 1024 * 1024, 16, 64 * 1024 * 1024,
							PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_transaction_bytes",
							"Most record bytes one transaction may buffer for INSERT and COPY into streams.",
							"Buffered records wait in the session's memory until COMMIT.",
							&felix_max_transaction_bytes, 256 * 1024 * 1024, 1024, INT_MAX,
							PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_streams_per_role",
							"Most streams a role that is not a superuser may own.",
							NULL,
							&felix_max_streams_per_role, 64, 0, 1000000,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_shards_per_role",
							"Most shards, over all its streams, a role that is not a superuser may own.",
							"Every shard holds one of the node's felix.max_shards slots.",
							&felix_max_shards_per_role, 256, 0, 1000000,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_bytes_per_role",
							"Most bytes the streams a role that is not a superuser owns may hold on this node.",
							"The bytes of felix_shards over the shards of the role's streams this node holds, "
							"checked when records are published; 0 means no cap.",
							&felix_max_bytes_per_role, 0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.max_shards_per_stream",
							"Most shards one stream may be created with.",
							NULL,
							&felix_max_shards_per_stream, 256, 1, 65536,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.retention_check_interval",
							"How often the node worker applies retention.",
							NULL,
							&felix_retention_interval, 10000, 100, 24 * 3600 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.database",
							   "Database the felix node worker connects to.",
							   NULL,
							   &felix_database, "postgres",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);

	DefineCustomStringVariable("felix.node_name",
							   "This node's name in the felix cluster.",
							   "Empty means node_<port>.",
							   &felix_node_name, "",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.node_conninfo",
							   "Where peers reach this node, and how it logs in to them (libpq conninfo, no password).",
							   "Empty means this server's first Unix socket directory and port, "
							   "database felix.database; the user is felix_node_<name> unless it names one. "
							   "A password goes in a password file (passfile=...).",
							   &felix_node_conninfo, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.control_conninfo",
							   "Where the control plane is (libpq conninfo, without credentials).",
							   "Empty means this node hosts the control plane itself.",
							   &felix_control_conninfo, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.lease_duration",
							"How long a granted lease lasts.",
							NULL,
							&felix_lease_duration, 1000, 100, 600000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.heartbeat_interval",
							"How often a node heartbeats (and renews its leases).",
							NULL,
							&felix_heartbeat_interval, 200, 10, 60000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.lease_margin",
							"Extra wait before the control plane grants the next generation.",
							"Covers clock drift between nodes and the delay of a grant.",
							&felix_lease_margin, 200, 0, 600000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.lease_epsilon",
							"How long before its lease expires a leader stops accepting writes.",
							NULL,
							&felix_lease_epsilon, 100, 0, 600000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.quorum_timeout",
							"How long a quorum publish waits for a majority.",
							NULL,
							&felix_quorum_timeout, 5000, 1, 3600000,
							PGC_USERSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.node_expiry",
							"A node whose last heartbeat is older than this is not alive.",
							NULL,
							&felix_node_expiry, 1500, 10, 3600000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.store_guard_interval",
							"How often the duty holder reads the whole control-plane state to find keys changed outside felix.",
							"A key written or deleted in the store without felix's marks (by hand) is believed at most this long; "
							"every other process reads only what changed.",
							&felix_store_guard_interval, 300000, 1000, 86400000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomBoolVariable("felix.forward_publishes",
							 "Whether a publish or commit to a shard this node does not lead is forwarded to its leader.",
							 "Off: such a publish is refused with 55F02 naming the leader, for applications that route themselves.",
							 &felix_forward_publishes, true,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("felix.control_plane_duties",
							 "Whether this node may run the control-plane duties (failure detection, promotion).",
							 "Exactly one node runs them at a time, chosen through the control-plane store; "
							 "a node with this off never takes them, and gives them up if it holds them.",
							 &felix_control_plane_duties, true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.rebuild_max_concurrent",
							"How many halted followers this node, as their leader, rebuilds at once.",
							"0 rebuilds nothing automatically; felix_rebuild and felix_rebuild_halted still run one at a time.",
							&felix_rebuild_max_concurrent, 1, 0, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.rebuild_bytes_per_sec",
							"How fast a follower being rebuilt is shipped to (0: no cap).",
							"Paces only rebuilds; a follower that is merely behind is shipped to at full speed.",
							&felix_rebuild_bytes_per_sec, 0, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_BYTE, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_endpoints",
							   "Client URLs of the etcd cluster holding the control plane, comma-separated.",
							   "Empty means the embedded store (felix.control_conninfo).",
							   &felix_etcd_endpoints, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_prefix",
							   "The etcd key prefix under which this felix cluster keeps its state.",
							   "Every node of one cluster uses the same prefix.",
							   &felix_etcd_prefix, "/felix/",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomIntVariable("felix.etcd_timeout",
							"How long one request to etcd may take, across every endpoint tried.",
							NULL,
							&felix_etcd_timeout, 2000, 100, 600000,
							PGC_SIGHUP, GUC_UNIT_MS | GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_cacert",
							   "CA certificate file that verifies https etcd endpoints.",
							   NULL, &felix_etcd_cacert, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_cert",
							   "Client certificate file presented to etcd.",
							   NULL, &felix_etcd_cert, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_key",
							   "Private key file of felix.etcd_cert.",
							   NULL, &felix_etcd_key, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_user",
							   "The etcd user felix authenticates as (empty: none).",
							   NULL, &felix_etcd_user, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomStringVariable("felix.etcd_password_file",
							   "File holding the password of felix.etcd_user.",
							   "The password itself is never a setting.",
							   &felix_etcd_password_file, "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	MarkGUCPrefixReserved("felix");
}

