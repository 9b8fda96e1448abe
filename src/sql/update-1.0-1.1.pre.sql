-- felix 1.0 -> 1.1: ALTER EXTENSION felix UPDATE.
\echo Use "ALTER EXTENSION felix UPDATE TO '1.1'" to load this file. \quit

-- This script is built (Makefile) from this file, src/sql/objects.sql (the
-- objects felix 1.1 creates beyond src/sql/base.sql, exactly as a fresh
-- CREATE EXTENSION does) and src/sql/update-1.0-1.1.post.sql.  Here: take
-- 1.0 down to what base.sql would have made, keeping its data.
--
-- Run it on every node, in every database with felix, after the node runs
-- the felix 1.1 library (docs/operations.md, "Upgrading felix").

-- felix.streams: the control plane's identity of each stream.  1.0 had
-- none; every node, and the control plane (post script), derive the same
-- one from the stream's name, which was unique in the cluster.
ALTER TABLE felix.streams ADD COLUMN creation_id uuid;
UPDATE felix.streams
   SET creation_id = pg_catalog.md5('felix 1.0 stream ' OPERATOR(pg_catalog.||) name)::uuid;
ALTER TABLE felix.streams ALTER COLUMN creation_id SET NOT NULL;
REVOKE ALL ON felix.streams FROM PUBLIC;

-- The 1.0 control plane's tables keep their rows for the post script,
-- under names 1.1's views do not take.
ALTER TABLE felix.nodes RENAME TO v1_0_nodes;
ALTER TABLE felix.cluster_streams RENAME TO v1_0_cluster_streams;
ALTER TABLE felix.assignments RENAME TO v1_0_assignments;
ALTER TABLE felix.replica_reports RENAME TO v1_0_replica_reports;

-- Everything else of 1.0 goes; objects.sql creates its 1.1 form.
DROP VIEW felix_streams, felix_shards, felix_metrics, felix_nodes, felix_replication;
DROP EVENT TRIGGER felix_sql_drop;
DROP FUNCTION felix.on_sql_drop();
DROP FUNCTION
    felix_create_stream(text, integer, integer, text, text, text, bigint, interval),
    felix_drop_stream(text),
    felix_publish(text, jsonb, text, integer),
    felix_publish(text, text, text, integer),
    felix_publish(text, bytea, text, integer),
    felix_publish_batch(text, jsonb[], text[]),
    felix_publish_batch(text, text[], text[]),
    felix_publish_batch(text, bytea[], text[]),
    felix_enforce_retention(text),
    felix.truncate_after(text, integer, bigint),
    felix.cp_settings(),
    felix.cp_score(text, text, integer),
    felix.cp_mask_conninfo(text),
    felix.cp_heartbeat(text, text),
    felix.cp_create_stream(text, integer, integer, text, text, text, bigint, interval),
    felix.cp_drop_stream(text, boolean),
    felix.cp_report(text, jsonb, bigint),
    felix.cp_report_unnamed(text, integer, text, bigint, text[]),
    felix.cp_tick(),
    felix.cp_nodes(),
    felix.shard_states(),
    felix.metrics(),
    felix.nodes_view(),
    felix.replicate(text, integer, bigint, bigint, bigint, bytea),
    felix.replication_view();
DROP TYPE felix_position;

