-- ---------------------------------------------------------------------
-- Streams
-- ---------------------------------------------------------------------
CREATE TYPE felix_position AS (shard integer, seq bigint);

CREATE FUNCTION felix_create_stream(
    name               text,
    shards             integer  DEFAULT 1,
    replication_factor integer  DEFAULT 1,
    consistency        text     DEFAULT 'leader',
    payload_type       text     DEFAULT 'jsonb',
    storage            text     DEFAULT 'local',
    retention_bytes    bigint   DEFAULT NULL,
    retention          interval DEFAULT NULL)
RETURNS regclass
    AS 'MODULE_PATHNAME', 'felix_create_stream' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE FUNCTION felix_drop_stream(stream text) RETURNS void
    AS 'MODULE_PATHNAME', 'felix_drop_stream' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- Publishing: acknowledged (durable) before returning; not undone by a
-- rollback.  One C function serves every payload type: a payload of
-- another type is converted to the stream's type through text.
CREATE FUNCTION felix_publish(stream text, payload jsonb,
                              key text DEFAULT NULL, shard integer DEFAULT NULL)
RETURNS felix_position
    AS 'MODULE_PATHNAME', 'felix_publish' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix_publish(stream text, payload text,
                              key text DEFAULT NULL, shard integer DEFAULT NULL)
RETURNS felix_position
    AS 'MODULE_PATHNAME', 'felix_publish' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix_publish(stream text, payload bytea,
                              key text DEFAULT NULL, shard integer DEFAULT NULL)
RETURNS felix_position
    AS 'MODULE_PATHNAME', 'felix_publish' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE FUNCTION felix_publish_batch(stream text, payloads jsonb[], keys text[] DEFAULT NULL,
                                    shard integer DEFAULT NULL)
RETURNS SETOF felix_position
    AS 'MODULE_PATHNAME', 'felix_publish_batch' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1000;
CREATE FUNCTION felix_publish_batch(stream text, payloads text[], keys text[] DEFAULT NULL,
                                    shard integer DEFAULT NULL)
RETURNS SETOF felix_position
    AS 'MODULE_PATHNAME', 'felix_publish_batch' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1000;
CREATE FUNCTION felix_publish_batch(stream text, payloads bytea[], keys text[] DEFAULT NULL,
                                    shard integer DEFAULT NULL)
RETURNS SETOF felix_position
    AS 'MODULE_PATHNAME', 'felix_publish_batch' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1000;

-- Apply a stream's retention now instead of waiting for the node worker.
CREATE FUNCTION felix_enforce_retention(stream text) RETURNS integer
    AS 'MODULE_PATHNAME', 'felix_enforce_retention' LANGUAGE C STRICT VOLATILE;

-- ---------------------------------------------------------------------
-- Internal functions: not for PUBLIC.
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.truncate_after(stream text, shard integer, seq bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'felix_truncate_after' LANGUAGE C STRICT VOLATILE;
REVOKE ALL ON FUNCTION felix.truncate_after(text, integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION felix.require_preload() FROM PUBLIC;

-- A stream's table dropped by any route (felix_drop_stream, DROP TABLE,
-- DROP SCHEMA ... CASCADE) leaves the catalog here; its files are removed
-- by the library when the drop commits.
CREATE FUNCTION felix.on_sql_drop() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM felix.streams s
     USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_catalog.pg_class'::regclass
       AND d.objsubid = 0
       AND d.objid = s.relid;
END
$$;
REVOKE ALL ON FUNCTION felix.on_sql_drop() FROM PUBLIC;
CREATE EVENT TRIGGER felix_sql_drop ON sql_drop EXECUTE FUNCTION felix.on_sql_drop();

-- BEGIN control plane
-- ---------------------------------------------------------------------
-- Control plane (docs/control-plane.md).  These tables exist wherever the
-- extension is installed; only the control-plane database's are used (the
-- one felix.control_conninfo reaches, or felix.database of the node that
-- hosts the control plane).  Nodes touch them only through the felix.cp_*
-- functions below.  Each call is one transaction that changes state by
-- compare-and-set under row locks on felix.assignments, always taken in
-- (stream, shard) order: heartbeats, reports, ticks and drops serialize
-- per shard and cannot deadlock with one another.  Times are the control
-- plane's clock_timestamp(), read after the row lock is held.
-- ---------------------------------------------------------------------

-- Every node logs in to its peers and to the control plane as a role of
-- its own, felix_node_<name> (felix_create_node_role), a member of the
-- group felix_replication.  The group gets EXECUTE on the cp_* functions
-- and the node-to-node calls (felix.replicate, felix.read_shard, ...) and
-- nothing else; the cp_* functions run as the extension's owner, and each
-- checks that its caller acts for the node it names.  Roles are
-- cluster-wide: DROP EXTENSION keeps them.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'felix_replication') THEN
        CREATE ROLE felix_replication NOLOGIN;
    END IF;
END
$$;

-- This node's name (felix.node_name, or node_<port>).
CREATE FUNCTION felix.node_name() RETURNS text
    AS 'MODULE_PATHNAME', 'felix_node_name_sql' LANGUAGE C STRICT STABLE;

-- The role node `node` logs in as.
CREATE FUNCTION felix.node_role(node text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT 'felix_node_' OPERATOR(pg_catalog.||) node
$$;

-- Refuse a node name that cannot be one: empty, or too long for
-- felix_node_<name> to be a role name.
CREATE FUNCTION felix.check_node_name(node text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'a node name must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'A node''s name is its felix.node_name (node_<port> when that is empty).';
    END IF;
    IF octet_length(node) > 52 THEN
        RAISE EXCEPTION 'node name "%" is too long', node
            USING ERRCODE = 'name_too_long',
                  HINT = 'A node name has at most 52 bytes, so that felix_node_<name> is a valid role name.';
    END IF;
END
$$;

-- Create (or complete) the role node `node` logs in as: LOGIN, a member
-- of felix_replication, nothing else.  Run it on every server of the
-- cluster for every node; set its password with \password.  The role of
-- the node the extension is created on is made at CREATE EXTENSION.
CREATE FUNCTION felix_create_node_role(node text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r text;
BEGIN
    PERFORM felix.check_node_name(node);
    r := felix.node_role(node);
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles x WHERE x.rolname = r) THEN
        EXECUTE format('CREATE ROLE %I LOGIN', r);
    END IF;
    EXECUTE format('GRANT felix_replication TO %I', r);
    RETURN r;
END
$$;
REVOKE ALL ON FUNCTION felix_create_node_role(text) FROM PUBLIC;
-- Internal helpers: for felix's own SQL and superusers, not for PUBLIC.
REVOKE ALL ON FUNCTION felix.node_name(), felix.node_role(text), felix.check_node_name(text)
    FROM PUBLIC;
SELECT felix_create_node_role(felix.node_name());

-- The embedded control-plane store (control/store_table.c): every key of
-- the control plane's state, its JSON value, and the store revision that
-- last wrote it.  Only felix's own code writes it.
CREATE TABLE felix.cp_store (
    key          text COLLATE "C" PRIMARY KEY,
    value        text NOT NULL,
    mod_revision bigint NOT NULL CHECK (mod_revision > 0)
);
-- what changed since a revision (felix_store_range_changed)
CREATE INDEX cp_store_mod_revision ON felix.cp_store (mod_revision);
CREATE SEQUENCE felix.cp_store_revision;
REVOKE ALL ON felix.cp_store, felix.cp_store_revision FROM PUBLIC;

-- What the control-plane store holds under a prefix (etcd or embedded).
CREATE FUNCTION felix.store_read(prefix text DEFAULT '',
    OUT key text, OUT value text, OUT mod_revision bigint)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_store_read' LANGUAGE C STRICT VOLATILE;
REVOKE ALL ON FUNCTION felix.store_read(text) FROM PUBLIC;

-- The control plane's state as tables, read from whichever store this
-- node uses (felix.store_read): for operators and tests.  Superusers only.
CREATE VIEW felix.nodes AS
SELECT j.v->>'name' AS name, j.v->>'conninfo' AS conninfo, j.v->>'incarnation' AS incarnation,
       (j.v->>'starts')::bigint AS starts, j.v->>'boot' AS boot,
       ARRAY(SELECT pg_catalog.jsonb_array_elements_text(j.v->'unable')) AS unable,
       ARRAY(SELECT pg_catalog.jsonb_array_elements_text(
                 CASE WHEN e.v IS NULL THEN j.v->'ends'
                      WHEN (e.v->>'boot') OPERATOR(pg_catalog.=) (j.v->>'boot') THEN e.v->'ends' END)) AS ends,
       (j.v->>'beat')::bigint AS beat, COALESCE(c.v->'claims', j.v->'claims') AS claims,
       j.v->'peers' AS peers,
       pg_catalog.to_timestamp((j.v->>'registered_ms')::numeric / 1000) AS registered_at,
       pg_catalog.to_timestamp((j.v->>'heartbeat_ms')::numeric / 1000) AS last_heartbeat,
       r.mod_revision
  FROM felix.store_read('nodes/') r
  CROSS JOIN LATERAL (SELECT r.value::jsonb AS v) j
  -- a node's log ends and claims have keys of their own (control/cpstate.h)
  LEFT JOIN LATERAL (SELECT x.value::jsonb AS v
                       FROM felix.store_read('ends/' OPERATOR(pg_catalog.||) (j.v->>'name')) x
                      WHERE x.key OPERATOR(pg_catalog.=) ('ends/' OPERATOR(pg_catalog.||) (j.v->>'name'))) e ON true
  LEFT JOIN LATERAL (SELECT x.value::jsonb AS v
                       FROM felix.store_read('claims/' OPERATOR(pg_catalog.||) (j.v->>'name')) x
                      WHERE x.key OPERATOR(pg_catalog.=) ('claims/' OPERATOR(pg_catalog.||) (j.v->>'name'))) c ON true;
CREATE VIEW felix.cluster_streams AS
SELECT v->>'name' AS name, v->>'schema' AS schema, (v->>'creation_id')::uuid AS creation_id,
       (v->>'shards')::integer AS shards, (v->>'replication_factor')::integer AS replication_factor,
       v->>'consistency' AS consistency, v->>'payload_type' AS payload_type,
       v->>'storage' AS storage, (v->>'retention_bytes')::bigint AS retention_bytes,
       pg_catalog.make_interval(months => (v->'retention'->>'months')::integer,
                                days => (v->'retention'->>'days')::integer,
                                secs => (v->'retention'->>'usec')::double precision / 1000000) AS retention,
       pg_catalog.to_timestamp((v->>'created_ms')::numeric / 1000) AS created_at
  FROM felix.store_read('streams/') r, LATERAL (SELECT r.value::jsonb AS v) j;
CREATE VIEW felix.assignments AS
SELECT v->>'stream' AS stream, (v->>'shard')::integer AS shard,
       (v->>'generation')::bigint AS generation, v->>'leader' AS leader,
       v->>'leader_incarnation' AS leader_incarnation,
       ARRAY(SELECT pg_catalog.jsonb_array_elements_text(v->'replicas')) AS replicas,
       v->>'joining' AS joining, v->>'leaving' AS leaving,
       (v->>'taken_generation')::bigint AS taken_generation, v->>'taken_boot' AS taken_boot,
       v->>'unplaced_reason' AS unplaced_reason,
       pg_catalog.to_timestamp((v->>'assigned_ms')::numeric / 1000) AS assigned_at,
       r.mod_revision
  FROM felix.store_read('shards/') r, LATERAL (SELECT r.value::jsonb AS v) j;
CREATE VIEW felix.replica_reports AS
SELECT pg_catalog.regexp_replace(substr(r.key, 9), '/[0-9]+$', '') AS stream,
       pg_catalog.regexp_replace(r.key, '^.*/', '')::integer AS shard,
       e->>'follower' AS follower, (e->>'generation')::bigint AS generation,
       e->>'leader' AS leader, e->>'incarnation' AS follower_incarnation,
       (e->>'acked_end')::bigint AS acked_end, (e->>'caught_up')::boolean AS caught_up,
       e->>'halted' AS halted,
       pg_catalog.to_timestamp((e->>'halted_since_ms')::numeric / 1000) AS halted_since,
       (e->>'position')::bigint AS position,
       pg_catalog.to_timestamp((e->>'reported_ms')::numeric / 1000) AS reported_at,
       (e->>'token')::bigint AS token, (e->>'leader_beat')::bigint AS leader_beat
  FROM felix.store_read('reports/') r,
       LATERAL pg_catalog.jsonb_array_elements(r.value::jsonb -> 'rows') e;
REVOKE ALL ON felix.nodes, felix.cluster_streams, felix.assignments, felix.replica_reports
    FROM PUBLIC;

-- The control plane's calls (control/cp_sql.c): the rules in C over the
-- embedded store above, for nodes reaching this database over libpq.
-- Each checks that its caller acts for the node it names (or is a node,
-- for calls not about one node) and runs as the extension's owner with
-- search_path pinned; see docs/control-plane.md.
CREATE FUNCTION felix.cp_heartbeat(node text, conninfo text, incarnation text,
                                   starts bigint, boot text, unable text[] DEFAULT NULL,
                                   lease_ms integer DEFAULT NULL, peers jsonb DEFAULT NULL,
                                   ends text[] DEFAULT NULL, seen_store_id text DEFAULT NULL,
                                   seen_revision bigint DEFAULT NULL,
                                   known_state bigint DEFAULT NULL,
                                   known_commit bigint DEFAULT NULL,
                                   ends_unchanged boolean DEFAULT false)
RETURNS TABLE (stream text, shard integer, generation bigint, leader text,
               leader_conninfo text, replicas text[], lease_granted boolean,
               lease_ms integer, unplaced_reason text, shards integer,
               replication_factor integer, consistency text, payload_type text,
               retention_bytes bigint, retention interval, schema text, creation_id uuid,
               joining text, leaving text, leader_incarnation text,
               store_id text, store_revision bigint, state_revision bigint,
               full_answer boolean)
    AS 'MODULE_PATHNAME', 'felix_cp_heartbeat_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_report(leader text, reports jsonb, token bigint DEFAULT NULL,
                                incarnation text DEFAULT NULL)
RETURNS integer
    AS 'MODULE_PATHNAME', 'felix_cp_report_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
-- felix.cp_tick: one round of the duties as node (its boot): how many
-- shards it gave a new generation (-1: it does not hold the duties), and in
-- how many ms the first lease it watches lapses (NULL: none), when the
-- caller ticks again.
CREATE FUNCTION felix.cp_tick(node text, boot text, OUT promoted integer, OUT lapse_in_ms integer)
    AS 'MODULE_PATHNAME', 'felix_cp_tick_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_create_stream(
    name               text,
    shards             integer  DEFAULT 1,
    replication_factor integer  DEFAULT 1,
    consistency        text     DEFAULT 'leader',
    payload_type       text     DEFAULT 'jsonb',
    storage            text     DEFAULT 'local',
    retention_bytes    bigint   DEFAULT NULL,
    retention          interval DEFAULT NULL,
    schema             text     DEFAULT 'public',
    lead_here          boolean  DEFAULT false)
RETURNS uuid
    AS 'MODULE_PATHNAME', 'felix_cp_create_stream_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_drop_stream(name text, creation_id uuid, missing_ok boolean DEFAULT false)
RETURNS void
    AS 'MODULE_PATHNAME', 'felix_cp_drop_stream_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_transfer(stream text, shard integer, generation bigint,
                                  from_node text, to_node text)
RETURNS bigint
    AS 'MODULE_PATHNAME', 'felix_cp_transfer_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_move_replica(stream text, shard integer, from_node text, to_node text)
RETURNS text
    AS 'MODULE_PATHNAME', 'felix_cp_move_replica_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_remove_node(node text) RETURNS void
    AS 'MODULE_PATHNAME', 'felix_cp_remove_node_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
-- The promotion an operator chooses (felix_promote_copy): a JSON object
-- with the generation granted, where the copy ends, and what may be lost.
CREATE FUNCTION felix.cp_promote_copy(stream text, shard integer, node text) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'felix_cp_promote_copy_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
-- clash_*: the last server refused this node's name while it was alive.
CREATE FUNCTION felix.cp_nodes()
RETURNS TABLE (name text, conninfo text, alive boolean, last_heartbeat timestamptz,
               incarnation text, duty boolean, peers jsonb,
               clash_incarnation text, clash_conninfo text, clash_at timestamptz)
    AS 'MODULE_PATHNAME', 'felix_cp_nodes_sql' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION felix.cp_name_clash(node text, incarnation text, conninfo text) RETURNS void
    AS 'MODULE_PATHNAME', 'felix_cp_name_clash_sql' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
CREATE FUNCTION felix.cp_halted()
RETURNS TABLE (stream text, shard integer, node text, generation bigint, leader text,
               halted_at_seq bigint, reason text, since timestamptz)
    AS 'MODULE_PATHNAME', 'felix_cp_halted_sql' LANGUAGE C STRICT VOLATILE;

-- Placement score of a node for one shard: deterministic, so a replica set
-- is a function of the stream, the shard and the alive nodes.
CREATE FUNCTION felix.cp_score(node text, stream text, shard integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'felix_cp_score_sql' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
REVOKE ALL ON FUNCTION felix.cp_score(text, text, integer) FROM PUBLIC;

-- Internal: the cp_* entry points are for felix_replication (and
-- superusers) only.
REVOKE ALL ON FUNCTION felix.cp_heartbeat(text, text, text, bigint, text, text[], integer, jsonb, text[], text, bigint, bigint, bigint, boolean),
    felix.cp_create_stream(text, integer, integer, text, text, text, bigint, interval, text, boolean),
    felix.cp_drop_stream(text, uuid, boolean), felix.cp_report(text, jsonb, bigint, text),
    felix.cp_tick(text, text), felix.cp_nodes(), felix.cp_halted(),
    felix.cp_transfer(text, integer, bigint, text, text),
    felix.cp_move_replica(text, integer, text, text), felix.cp_remove_node(text),
    felix.cp_name_clash(text, text, text), felix.cp_promote_copy(text, integer, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.cp_heartbeat(text, text, text, bigint, text, text[], integer, jsonb, text[], text, bigint, bigint, bigint, boolean),
    felix.cp_create_stream(text, integer, integer, text, text, text, bigint, interval, text, boolean),
    felix.cp_drop_stream(text, uuid, boolean), felix.cp_report(text, jsonb, bigint, text),
    felix.cp_tick(text, text), felix.cp_nodes(), felix.cp_halted(),
    felix.cp_transfer(text, integer, bigint, text, text),
    felix.cp_move_replica(text, integer, text, text), felix.cp_remove_node(text),
    felix.cp_name_clash(text, text, text), felix.cp_promote_copy(text, integer, text)
    TO felix_replication;
-- END control plane

-- ---------------------------------------------------------------------
-- Views
-- ---------------------------------------------------------------------
-- Readable like pg_stat_*: everyone sees the streams they may SELECT,
-- members of pg_read_all_stats see all.  security_barrier: a caller's
-- function in a WHERE clause never sees the rows filtered out.
CREATE VIEW felix_streams WITH (security_barrier) AS
SELECT s.name                      AS stream,
       s.relid::regclass           AS relation,
       s.shards,
       s.replication_factor,
       s.consistency,
       s.payload_type,
       s.storage,
       s.retention_bytes,
       s.retention,
       s.created_at
  FROM felix.streams s
 WHERE pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
    OR pg_catalog.has_table_privilege(s.relid, 'SELECT')
 ORDER BY s.name;

CREATE FUNCTION felix.shard_states(
    OUT stream text, OUT shard integer, OUT role text, OUT generation bigint,
    OUT start_seq bigint, OUT next_seq bigint, OUT hwm bigint, OUT bytes bigint,
    OUT state text, OUT error text, OUT leader text, OUT replicas text[],
    OUT lease_remaining_ms bigint, OUT unplaced_reason text)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_shard_states' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_shards AS
SELECT * FROM felix.shard_states() ORDER BY stream, shard;

CREATE FUNCTION felix.metrics(OUT name text, OUT value double precision)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_metrics' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_metrics AS SELECT * FROM felix.metrics();

-- The cluster's nodes as the control plane last described them to this
-- node's heartbeat (read from shared memory: reading the view connects to
-- nothing): alive (heartbeating), whether it runs the control-plane
-- duties, and its state -- alive, unreachable (its peers cannot log in
-- to it; reason says why, from each peer) or dead.  On this node's own
-- row, the control-plane store as its heartbeat last saw it.  The
-- conninfo -- an address, any secret in it masked -- and the store are
-- shown only to members of pg_read_all_stats.
CREATE FUNCTION felix.nodes_view(
    OUT name text, OUT conninfo text, OUT alive boolean, OUT last_heartbeat timestamptz,
    OUT duty boolean, OUT state text, OUT reason text, OUT store text, OUT store_error text)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_nodes_view' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_nodes AS SELECT * FROM felix.nodes_view();

-- ---------------------------------------------------------------------
-- Replication (log shipping)
-- ---------------------------------------------------------------------
-- The follower's rule, called over libpq by a shard's leader (node and
-- incarnation name the follower it means; op is ship, bootstrap or
-- rebuild): ('stored', end of the batches sent) once they are durable
-- here, ('gap', tail), ('conflict', first seq of the differing batch),
-- ('fenced', tail) when the sender's generation is superseded,
-- ('needs_bootstrap', tail) when this copy cannot be built on, and
-- ('bootstrapped' | 'rebuilt', start) when the copy was begun afresh.
CREATE FUNCTION felix.replicate(stream text, shard integer, generation bigint,
                                node text, incarnation text, op text,
                                from_seq bigint, leader_hwm_end bigint, batches bytea)
RETURNS TABLE(status text, seq bigint)
    AS 'MODULE_PATHNAME', 'felix_replicate' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1;
REVOKE ALL ON FUNCTION felix.replicate(text, integer, bigint, text, text, text, bigint, bigint, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.replicate(text, integer, bigint, text, text, text, bigint, bigint, bytea) TO felix_replication;

-- A node reads a shard it holds no copy of from a replica: this node's
-- own copy of seqs [from_seq, to_seq), at most max_records of them, up to
-- its high-water mark (visible_end); payloads as their bytes, publication
-- times as microseconds since 2000-01-01.  Refused when this node holds
-- no copy or knows another stream of that name (creation_id).
CREATE FUNCTION felix.read_shard(stream text, creation_id text, shard integer,
                                 from_seq bigint, to_seq bigint, max_records integer)
RETURNS TABLE(seq bigint, key text, payload bytea, published_at bigint, visible_end bigint)
    AS 'MODULE_PATHNAME', 'felix_read_shard' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
REVOKE ALL ON FUNCTION felix.read_shard(text, text, integer, bigint, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.read_shard(text, text, integer, bigint, bigint, integer) TO felix_replication;

-- A node publishes on the shard's leader for a client connected to it
-- (felix.forward_publishes): the leader checks as_role's privileges and
-- every record, and answers 'published' with the first seq, or
-- 'not_leader' when it refused at admission (nothing was appended).
CREATE FUNCTION felix.forward_publish(stream text, creation_id text, shard integer,
                                      as_role text, batch bytea,
                                      OUT status text, OUT seq bigint)
    AS 'MODULE_PATHNAME', 'felix_forward_publish' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
REVOKE ALL ON FUNCTION felix.forward_publish(text, text, integer, text, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.forward_publish(text, text, integer, text, bytea) TO felix_replication;

-- A node stages on a shards' leader its part of an INSERT or COPY whose
-- shards other nodes lead: the leader checks the INSERT privilege of
-- every role that inserted rows (inserters: {stream, role} pairs) and
-- every batch (one array element per batch; `batches` holds them one
-- after the other), appends them unpublished, and answers 'staged' (or
-- 'not_leader', refused at admission with nothing appended).  The
-- transaction's commit publishes them -- the asking node's COMMIT inside
-- a transaction block, the statement's own outside one -- and its abort
-- cuts them back.
CREATE FUNCTION felix.forward_stage(inserters text[], streams text[], creation_ids text[],
                                    shards integer[], batches bytea)
RETURNS text
    AS 'MODULE_PATHNAME', 'felix_forward_stage' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
REVOKE ALL ON FUNCTION felix.forward_stage(text[], text[], text[], integer[], bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.forward_stage(text[], text[], text[], integer[], bytea) TO felix_replication;

-- Who this node is: its name and the incarnation of its felix data
-- directory.  A node checks at registration that its own conninfo reaches
-- a server answering with its name and incarnation.
CREATE FUNCTION felix.node_identity(OUT name text, OUT incarnation text)
    AS 'MODULE_PATHNAME', 'felix_node_identity' LANGUAGE C STRICT VOLATILE;
REVOKE ALL ON FUNCTION felix.node_identity() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.node_identity() TO felix_replication;

-- On a leader, each follower of each shard it leads: how far it has
-- acknowledged, how far behind it is, and whether shipping goes on.
CREATE FUNCTION felix.replication_view(
    OUT stream text, OUT shard integer, OUT generation bigint, OUT follower text,
    OUT acked_seq bigint, OUT lag_records bigint, OUT state text,
    OUT last_answer timestamptz, OUT last_error text)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_replication_view' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_replication AS SELECT * FROM felix.replication_view();

-- Followers that have halted, as the shards' leaders last reported them
-- to the control plane: the same list on every node, empty when nothing
-- is halted.  action says what to run.
CREATE FUNCTION felix.halted_view(
    OUT stream text, OUT shard integer, OUT node text, OUT generation bigint,
    OUT "position" bigint, OUT reason text, OUT since timestamptz, OUT action text)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_halted_view' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_halted AS SELECT * FROM felix.halted_view();

-- Everyone may read the views; each shows a reader only what it may see
-- (the streams it may SELECT, node addresses to pg_read_all_stats).
GRANT SELECT ON felix_streams, felix_shards, felix_metrics, felix_nodes, felix_replication,
    felix_halted TO PUBLIC;

-- ---------------------------------------------------------------------
-- Operations
-- ---------------------------------------------------------------------
-- Rebuild a halted follower now (on the shard's leader; the stream's
-- owner), under felix.rebuild_max_concurrent but at least one at a time:
-- 'started', or 'queued' when every rebuild slot is taken.
CREATE FUNCTION felix_rebuild(stream text, shard integer, node text) RETURNS text
    AS 'MODULE_PATHNAME', 'felix_rebuild' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
-- Ask for a rebuild of every follower halted diverged or needs_bootstrap
-- of the shards this node leads (of the streams the caller owns); returns
-- how many were asked for.  Meant for a pg_cron job on every node.
CREATE FUNCTION felix_rebuild_halted() RETURNS integer
    AS 'MODULE_PATHNAME', 'felix_rebuild_halted' LANGUAGE C STRICT VOLATILE;

-- Planned moves.  On the shard's leader (the stream's owner): hand the
-- leadership to a follower once it holds every record, without waiting
-- out a lease; publishes are refused (55F02, naming the new leader) for
-- the moment it takes.
CREATE FUNCTION felix_transfer_leadership(stream text, shard integer, node text) RETURNS text
    AS 'MODULE_PATHNAME', 'felix_transfer_leadership' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
-- On the node itself (a superuser): move every leadership it holds to
-- the best of each shard's followers; returns how many moved.
CREATE FUNCTION felix_drain_node(node text) RETURNS integer
    AS 'MODULE_PATHNAME', 'felix_drain_node' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
-- On any node (the stream's owner): replace replica from_node of a shard
-- by to_node (a dead machine, say).  to_node is shipped the log and joins
-- the quorum alongside the old set; from_node leaves once to_node has
-- caught up.
CREATE FUNCTION felix_move_replica(stream text, shard integer, from_node text, to_node text)
RETURNS text
    AS 'MODULE_PATHNAME', 'felix_move_replica' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- Forget a node for good (a dead machine that will not return): refused
-- while it is alive or still holds a replica.  Superusers only.
CREATE FUNCTION felix_remove_node(node text) RETURNS text
    AS 'MODULE_PATHNAME', 'felix_remove_node' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
REVOKE ALL ON FUNCTION felix_remove_node(text) FROM PUBLIC;
-- Superuser: make the copy on node lead an unplaced shard, accepting the
-- loss of what only other copies may hold (it says what); refused while an
-- alive replica's copy may hold more.
CREATE FUNCTION felix_promote_copy(stream text, shard integer, node text) RETURNS text
    AS 'MODULE_PATHNAME', 'felix_promote_copy' LANGUAGE C CALLED ON NULL INPUT VOLATILE;
REVOKE ALL ON FUNCTION felix_promote_copy(text, integer, text) FROM PUBLIC;

-- Heartbeat now (a node taking over a shard is told so by the one handing
-- it over).
CREATE FUNCTION felix.heartbeat_now() RETURNS void
    AS 'MODULE_PATHNAME', 'felix_heartbeat_now' LANGUAGE C STRICT VOLATILE;
REVOKE ALL ON FUNCTION felix.heartbeat_now() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.heartbeat_now() TO felix_replication;
