-- felix 1.0: streams stored in felix's own segment log, read through the
-- felix table access method, published through plain SQL.
\echo Use "CREATE EXTENSION felix" to load this file. \quit

CREATE SCHEMA felix;

-- Refuse early, with a hint, when the library was not preloaded: shared
-- memory and the node worker only exist when it was.
CREATE FUNCTION felix.require_preload() RETURNS void
    AS 'MODULE_PATHNAME', 'felix_require_preload_sql' LANGUAGE C STRICT;
SELECT felix.require_preload();

-- ---------------------------------------------------------------------
-- Catalog (schema felix): one row per stream of this database.
-- ---------------------------------------------------------------------
CREATE TABLE felix.streams (
    id                 bigserial PRIMARY KEY,
    name               text NOT NULL UNIQUE,
    relid              oid NOT NULL UNIQUE,
    shards             integer NOT NULL CHECK (shards > 0),
    replication_factor integer NOT NULL CHECK (replication_factor > 0),
    consistency        text NOT NULL CHECK (consistency IN ('leader', 'quorum')),
    payload_type       regtype NOT NULL,
    storage            text NOT NULL CHECK (storage IN ('local', 'object')),
    retention_bytes    bigint CHECK (retention_bytes > 0),
    retention          interval,
    created_at         timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON felix.streams FROM PUBLIC;
GRANT SELECT ON felix.streams TO PUBLIC;
GRANT USAGE ON SCHEMA felix TO PUBLIC;

-- ---------------------------------------------------------------------
-- Table access method
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.tableam_handler(internal) RETURNS table_am_handler
    AS 'MODULE_PATHNAME', 'felix_tableam_handler' LANGUAGE C STRICT;
CREATE ACCESS METHOD felix TYPE TABLE HANDLER felix.tableam_handler;
COMMENT ON ACCESS METHOD felix IS 'append-only felix stream';

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

CREATE FUNCTION felix_publish_batch(stream text, payloads jsonb[], keys text[] DEFAULT NULL)
RETURNS SETOF felix_position
    AS 'MODULE_PATHNAME', 'felix_publish_batch' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1000;
CREATE FUNCTION felix_publish_batch(stream text, payloads text[], keys text[] DEFAULT NULL)
RETURNS SETOF felix_position
    AS 'MODULE_PATHNAME', 'felix_publish_batch' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1000;
CREATE FUNCTION felix_publish_batch(stream text, payloads bytea[], keys text[] DEFAULT NULL)
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

-- Nodes authenticate to peers and to the control plane as this role.  It
-- gets EXECUTE on the cp_* functions and nothing else; they run as the
-- extension's owner.  Roles are cluster-wide: DROP EXTENSION keeps it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'felix_replication') THEN
        CREATE ROLE felix_replication LOGIN NOINHERIT;
    END IF;
END
$$;

-- Cluster members: a node is alive while its last heartbeat is younger
-- than felix.node_expiry.
CREATE TABLE felix.nodes (
    name           text PRIMARY KEY CHECK (name <> ''),
    conninfo       text NOT NULL,
    registered_at  timestamptz NOT NULL,
    last_heartbeat timestamptz NOT NULL
);

-- Streams as the cluster knows them; every node creates its own table and
-- felix.streams row from these.
CREATE TABLE felix.cluster_streams (
    name               text PRIMARY KEY CHECK (name <> ''),
    shards             integer NOT NULL CHECK (shards > 0),
    replication_factor integer NOT NULL CHECK (replication_factor > 0),
    consistency        text NOT NULL CHECK (consistency IN ('leader', 'quorum')),
    payload_type       text NOT NULL CHECK (payload_type IN ('jsonb', 'text', 'bytea')),
    storage            text NOT NULL CHECK (storage IN ('local', 'object')),
    retention_bytes    bigint CHECK (retention_bytes > 0),
    retention          interval,
    created_at         timestamptz NOT NULL
);

-- One row per shard: who leads it at which generation, its replica set
-- (fixed at placement, leader included), and the lease.  lease_granted_at
-- is NULL from the moment a generation is published until its leader's
-- first heartbeat takes the lease; lease_ms is the duration that grant
-- promised.  assigned_at is when the generation was published.
-- unplaced_reason says why a lapsed shard has no successor yet; the
-- leader column then still names the last leader.
CREATE TABLE felix.assignments (
    stream           text NOT NULL REFERENCES felix.cluster_streams (name) ON DELETE CASCADE,
    shard            integer NOT NULL CHECK (shard >= 0),
    generation       bigint NOT NULL CHECK (generation >= 1),
    leader           text,
    replicas         text[] NOT NULL CHECK (cardinality(replicas) > 0),
    lease_granted_at timestamptz,
    lease_ms         integer NOT NULL CHECK (lease_ms > 0),
    unplaced_reason  text,
    assigned_at      timestamptz NOT NULL,
    PRIMARY KEY (stream, shard),
    -- Nothing outside the replica set ever leads: it holds no copy.
    CHECK (leader IS NULL OR leader = ANY (replicas))
) WITH (fillfactor = 50);   -- every heartbeat rewrites its leader's rows: room for HOT
CREATE INDEX assignments_leader ON felix.assignments (leader);

-- The leader's word on each follower: how far it has acknowledged
-- (exclusive end) and whether it holds every record acknowledged to a
-- client.  Written only by felix.cp_report, and only while the reporter
-- leads the shard at that generation.  token orders one leader's reports
-- at one generation: a request that arrives after a later one (it was
-- held up, and the leader gave up on it) is not allowed to undo it.
CREATE TABLE felix.replica_reports (
    stream      text NOT NULL,
    shard       integer NOT NULL,
    generation  bigint NOT NULL,
    leader      text NOT NULL,
    follower    text NOT NULL,
    acked_end   bigint NOT NULL CHECK (acked_end >= 0),
    caught_up   boolean NOT NULL,
    reported_at timestamptz NOT NULL,
    token       bigint,
    PRIMARY KEY (stream, shard, follower),
    FOREIGN KEY (stream, shard) REFERENCES felix.assignments (stream, shard) ON DELETE CASCADE
) WITH (fillfactor = 50);

REVOKE ALL ON felix.nodes, felix.cluster_streams, felix.assignments, felix.replica_reports
    FROM PUBLIC;

-- The control plane's timing settings, in ms.  pg_settings gives integer
-- settings in their base unit (current_setting() would say '1s'); the
-- documented defaults stand in while a setting is unknown.
CREATE FUNCTION felix.cp_settings(
    OUT lease_ms integer, OUT margin_ms integer,
    OUT heartbeat_ms integer, OUT expiry_ms integer)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH s AS (
        SELECT s.name, CASE WHEN s.setting ~ '^[0-9]+$' THEN s.setting::integer END AS ms
          FROM pg_catalog.pg_settings s
         WHERE s.name IN ('felix.lease_duration', 'felix.lease_margin',
                          'felix.heartbeat_interval', 'felix.node_expiry'))
    SELECT coalesce((SELECT ms FROM s WHERE name = 'felix.lease_duration'), 1000),
           coalesce((SELECT ms FROM s WHERE name = 'felix.lease_margin'), 200),
           coalesce((SELECT ms FROM s WHERE name = 'felix.heartbeat_interval'), 200),
           coalesce((SELECT ms FROM s WHERE name = 'felix.node_expiry'), 1500)
$$;

-- Placement score of a node for one shard: deterministic, so a replica set
-- is a function of the stream, the shard and the alive nodes.
CREATE FUNCTION felix.cp_score(node text, stream text, shard integer) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT pg_catalog.hashtext(node OPERATOR(pg_catalog.||) '/'
                               OPERATOR(pg_catalog.||) stream OPERATOR(pg_catalog.||) '/'
                               OPERATOR(pg_catalog.||) shard::pg_catalog.text)
$$;

-- A conninfo with its password replaced by ********, in keyword/value or
-- URI form, for views and messages.
CREATE FUNCTION felix.cp_mask_conninfo(conninfo text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        WHEN conninfo ~* '^postgres(ql)?://' THEN
            regexp_replace(
                regexp_replace(conninfo, '^(postgres(ql)?://[^/?#@:]*:)[^/?#@]*@', '\1********@', 'i'),
                '([?&]password=)[^&#]*', '\1********', 'gi')
        ELSE
            regexp_replace(conninfo,
                           '(^|\s)(password\s*=\s*)(''(\\.|[^''\\])*''|\S+)', '\1\2********', 'gi')
        END
$$;

-- ---------------------------------------------------------------------
-- felix.cp_heartbeat: register the node, renew or take the leases it is
-- due, and tell it every assignment of every stream.
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.cp_heartbeat(node text, conninfo text)
RETURNS TABLE (stream text, shard integer, generation bigint, leader text,
               leader_conninfo text, replicas text[], lease_granted boolean,
               lease_ms integer, unplaced_reason text, shards integer,
               replication_factor integer, consistency text, payload_type text,
               retention_bytes bigint, retention interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cfg       record;
    a         record;
    t         timestamptz;
    g_streams text[] := '{}';
    g_shards  integer[] := '{}';
BEGIN
    IF cp_heartbeat.node IS NULL OR cp_heartbeat.node = '' THEN
        RAISE EXCEPTION 'a node name must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Set felix.node_name, or leave it empty for node_<port>.';
    END IF;
    IF octet_length(cp_heartbeat.node) >= 64 THEN
        RAISE EXCEPTION 'node name "%" is too long', cp_heartbeat.node
            USING ERRCODE = 'name_too_long',
                  HINT = 'A node name has at most 63 bytes (felix.node_name).';
    END IF;
    IF cp_heartbeat.conninfo IS NULL THEN
        RAISE EXCEPTION 'node "%": conninfo must not be NULL', cp_heartbeat.node
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the conninfo peers use to reach the node (felix.node_conninfo).';
    END IF;
    cfg := felix.cp_settings();

    t := clock_timestamp();
    INSERT INTO felix.nodes AS n (name, conninfo, registered_at, last_heartbeat)
    VALUES (cp_heartbeat.node, cp_heartbeat.conninfo, t, t)
    ON CONFLICT ON CONSTRAINT nodes_pkey
    DO UPDATE SET conninfo = EXCLUDED.conninfo, last_heartbeat = EXCLUDED.last_heartbeat;

    -- The leases this node is due, each row locked before its clock is read.
    FOR a IN
        SELECT x.stream, x.shard, x.lease_granted_at, x.lease_ms
          FROM felix.assignments x
         WHERE x.leader = cp_heartbeat.node
         ORDER BY x.stream, x.shard
           FOR UPDATE
    LOOP
        t := clock_timestamp();
        -- A fresh generation's lease is taken here, by its leader's first
        -- heartbeat.  A held lease is renewed only while it has not lapsed
        -- by our clock: once it has, nothing extends it, the leader stops at
        -- its own expiry and cp_tick decides who serves next.  The node
        -- anchors the lease at the instant it sent this heartbeat, which is
        -- before t, so its expiry falls before ours.
        IF a.lease_granted_at IS NULL
           OR t <= a.lease_granted_at + a.lease_ms * interval '1 millisecond' THEN
            UPDATE felix.assignments x
               SET lease_granted_at = t, lease_ms = cfg.lease_ms, unplaced_reason = NULL
             WHERE x.stream = a.stream AND x.shard = a.shard;
            g_streams := g_streams || a.stream;
            g_shards := g_shards || a.shard;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT x.stream, x.shard, x.generation, x.leader, n.conninfo, x.replicas,
           EXISTS (SELECT 1 FROM unnest(g_streams, g_shards) AS g(s, h)
                    WHERE g.s = x.stream AND g.h = x.shard),
           x.lease_ms, x.unplaced_reason, s.shards, s.replication_factor,
           s.consistency, s.payload_type, s.retention_bytes, s.retention
      FROM felix.assignments x
      JOIN felix.cluster_streams s ON s.name = x.stream
      LEFT JOIN felix.nodes n ON n.name = x.leader
     ORDER BY x.stream, x.shard;
END
$$;

-- ---------------------------------------------------------------------
-- felix.cp_create_stream: validate like felix_create_stream, then place
-- every shard on replication_factor alive nodes at generation 1.
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.cp_create_stream(
    name               text,
    shards             integer  DEFAULT 1,
    replication_factor integer  DEFAULT 1,
    consistency        text     DEFAULT 'leader',
    payload_type       text     DEFAULT 'jsonb',
    storage            text     DEFAULT 'local',
    retention_bytes    bigint   DEFAULT NULL,
    retention          interval DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_name     text := cp_create_stream.name;
    v_shards   integer := cp_create_stream.shards;
    v_rf       integer := cp_create_stream.replication_factor;
    cfg        record;
    t          timestamptz;
    max_per    integer;
    max_slots  integer;
    alive      text[];
    arg_names  text[] := ARRAY['shards', 'replication_factor', 'consistency',
                               'payload_type', 'storage'];
    arg_nulls  boolean[];
    max_replicas constant integer := 7;  -- FELIX_MAX_REPLICAS (storage/shard.h)
BEGIN
    IF v_name IS NULL OR v_name = '' THEN
        RAISE EXCEPTION 'a stream name must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the stream''s name as the first argument.';
    END IF;
    IF octet_length(v_name) >= 64 THEN
        RAISE EXCEPTION 'stream name "%" is too long', v_name
            USING ERRCODE = 'name_too_long',
                  HINT = 'A stream name has at most 63 bytes.';
    END IF;
    arg_nulls := ARRAY[v_shards IS NULL, v_rf IS NULL, cp_create_stream.consistency IS NULL,
                       cp_create_stream.payload_type IS NULL, cp_create_stream.storage IS NULL];
    FOR i IN 1 .. 5 LOOP
        IF arg_nulls[i] THEN
            RAISE EXCEPTION 'stream "%": % must not be NULL', v_name, arg_names[i]
                USING ERRCODE = 'null_value_not_allowed',
                      HINT = 'Leave the argument out to use its default.';
        END IF;
    END LOOP;

    SELECT CASE WHEN s.setting ~ '^[0-9]+$' THEN s.setting::integer END INTO max_per
      FROM pg_catalog.pg_settings s WHERE s.name = 'felix.max_shards_per_stream';
    SELECT CASE WHEN s.setting ~ '^[0-9]+$' THEN s.setting::integer END INTO max_slots
      FROM pg_catalog.pg_settings s WHERE s.name = 'felix.max_shards';
    max_per := coalesce(max_per, 256);
    max_slots := coalesce(max_slots, 1024);
    IF v_shards <= 0 OR v_shards > max_per THEN
        RAISE EXCEPTION 'stream "%": shards must be between 1 and %, not %', v_name, max_per, v_shards
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The upper bound is felix.max_shards_per_stream.';
    END IF;
    IF v_shards > max_slots THEN
        RAISE EXCEPTION 'stream "%": % shards exceed felix.max_shards (%)', v_name, v_shards, max_slots
            USING ERRCODE = 'configuration_limit_exceeded',
                  HINT = 'Raise felix.max_shards and restart the server.';
    END IF;
    IF v_rf <= 0 THEN
        RAISE EXCEPTION 'stream "%": replication_factor must be at least 1, not %', v_name, v_rf
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'replication_factor counts the nodes holding each shard, the leader included.';
    END IF;
    IF v_rf > max_replicas THEN
        RAISE EXCEPTION 'stream "%": replication_factor must be at most %, not %', v_name, max_replicas, v_rf
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('A shard has at most %s copies, the leader included.', max_replicas);
    END IF;
    IF cp_create_stream.consistency NOT IN ('leader', 'quorum') THEN
        RAISE EXCEPTION 'stream "%": invalid consistency "%"', v_name, cp_create_stream.consistency
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'consistency must be leader or quorum.';
    END IF;
    IF cp_create_stream.payload_type NOT IN ('jsonb', 'text', 'bytea') THEN
        RAISE EXCEPTION 'stream "%": invalid payload_type "%"', v_name, cp_create_stream.payload_type
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'payload_type must be one of jsonb, text, bytea.';
    END IF;
    IF cp_create_stream.storage NOT IN ('local', 'object') THEN
        RAISE EXCEPTION 'stream "%": invalid storage "%"', v_name, cp_create_stream.storage
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'storage must be local or object.';
    END IF;
    IF cp_create_stream.retention_bytes <= 0 THEN
        RAISE EXCEPTION 'stream "%": retention_bytes must be positive, not %', v_name, cp_create_stream.retention_bytes
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Leave retention_bytes NULL to keep every record.';
    END IF;
    IF cp_create_stream.retention <= interval '0' THEN
        RAISE EXCEPTION 'stream "%": retention must be a positive interval', v_name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Leave retention NULL to keep records regardless of age.';
    END IF;
    -- Refused, never silently downgraded.
    IF cp_create_stream.storage = 'object' THEN
        RAISE EXCEPTION 'stream "%": storage ''object'' is not supported yet', v_name
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'This felix release keeps shards in local segment files only.',
                  HINT = 'Create the stream with storage => ''local''.';
    END IF;

    IF EXISTS (SELECT 1 FROM felix.cluster_streams cs WHERE cs.name = v_name) THEN
        RAISE EXCEPTION 'stream "%" already exists', v_name
            USING ERRCODE = 'duplicate_object',
                  HINT = format('Choose another name, or drop the stream with felix_drop_stream(%L).', v_name);
    END IF;

    cfg := felix.cp_settings();
    t := clock_timestamp();
    SELECT coalesce(array_agg(n.name ORDER BY n.name COLLATE "C"), '{}') INTO alive
      FROM felix.nodes n
     WHERE n.last_heartbeat >= t - cfg.expiry_ms * interval '1 millisecond';
    IF cardinality(alive) < v_rf THEN
        RAISE EXCEPTION 'stream "%": replication_factor % needs % alive nodes, but %', v_name, v_rf, v_rf,
                CASE cardinality(alive) WHEN 0 THEN 'no node is alive'
                                        WHEN 1 THEN 'only 1 node is alive'
                                        ELSE format('only %s nodes are alive', cardinality(alive)) END
            USING ERRCODE = 'insufficient_resources',
                  DETAIL = CASE WHEN cardinality(alive) = 0
                                THEN format('No node has heartbeated to the control plane in the last %s ms (felix.node_expiry).', cfg.expiry_ms)
                                ELSE format('Alive nodes (heartbeat within %s ms): %s.', cfg.expiry_ms, array_to_string(alive, ', ')) END,
                  HINT = 'Start more felix nodes that heartbeat to this control plane, or use a smaller replication_factor; felix_nodes lists the nodes.';
    END IF;

    INSERT INTO felix.cluster_streams AS cs
           (name, shards, replication_factor, consistency, payload_type, storage,
            retention_bytes, retention, created_at)
    VALUES (v_name, v_shards, v_rf, cp_create_stream.consistency, cp_create_stream.payload_type,
            cp_create_stream.storage, cp_create_stream.retention_bytes,
            cp_create_stream.retention, t)
    ON CONFLICT ON CONSTRAINT cluster_streams_pkey DO NOTHING;
    IF NOT FOUND THEN
        -- Created concurrently since the check above.
        RAISE EXCEPTION 'stream "%" already exists', v_name
            USING ERRCODE = 'duplicate_object',
                  HINT = format('Choose another name, or drop the stream with felix_drop_stream(%L).', v_name);
    END IF;

    -- Replica set: the replication_factor alive nodes scoring highest for
    -- this shard (ties by name); the first of them leads generation 1.
    INSERT INTO felix.assignments AS x
           (stream, shard, generation, leader, replicas, lease_granted_at,
            lease_ms, unplaced_reason, assigned_at)
    SELECT v_name, h.shard, 1, p.replicas[1], p.replicas, NULL, cfg.lease_ms, NULL, t
      FROM generate_series(0, v_shards - 1) AS h(shard)
     CROSS JOIN LATERAL (
            SELECT array_agg(q.node ORDER BY q.score DESC, q.node COLLATE "C") AS replicas
              FROM (SELECT u.node, felix.cp_score(u.node, v_name, h.shard) AS score
                      FROM unnest(alive) AS u(node)
                     ORDER BY 2 DESC, u.node COLLATE "C"
                     LIMIT v_rf) AS q) AS p;
END
$$;

-- ---------------------------------------------------------------------
-- felix.cp_drop_stream: forget a stream, its assignments and reports.
-- missing_ok: a node dropping a table the control plane never knew (or
-- already forgot) is not an error.
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.cp_drop_stream(name text, missing_ok boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF cp_drop_stream.name IS NULL THEN
        RAISE EXCEPTION 'a stream name must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the name of the stream to drop; felix_streams lists them.';
    END IF;
    -- Same lock order as every other cp_* function.
    PERFORM 1 FROM felix.assignments x
      WHERE x.stream = cp_drop_stream.name ORDER BY x.stream, x.shard FOR UPDATE;
    DELETE FROM felix.cluster_streams cs WHERE cs.name = cp_drop_stream.name;
    IF NOT FOUND AND NOT cp_drop_stream.missing_ok THEN
        RAISE EXCEPTION 'stream "%" does not exist', cp_drop_stream.name
            USING ERRCODE = 'undefined_table',
                  HINT = 'The control plane knows no stream of that name; felix_streams lists the existing ones.';
    END IF;
END
$$;

-- ---------------------------------------------------------------------
-- felix.cp_report: a leader's reports on its followers, accepted only
-- while it leads the shard at the reported generation.  Committed like any
-- other control-plane change (synchronous_commit as configured, on by
-- default): a report that released acknowledgements must survive a crash
-- of the control plane, or an older report left behind could name a
-- follower that lacks them.
--
-- token: the leader's ordering of its requests (strictly increasing for
-- one leader at one generation; NULL for a hand-made report).  A row is
-- written only if it is newer than the stored one from the same leader
-- and generation, and the return value counts the rows written: a
-- request that lost to a later one says so, and the leader does not take
-- it as landed.
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.cp_report(leader text, reports jsonb, token bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r          record;
    a          record;
    t          timestamptz;
    bad        jsonb;
    accepted   integer := 0;
    cur_stream text;
    cur_shard  integer;
    have_a     boolean := false;
    named      text[];
    written    integer;
BEGIN
    IF cp_report.leader IS NULL OR cp_report.leader = '' THEN
        RAISE EXCEPTION 'a reporting node name must not be NULL or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the name of the node that leads the reported shards.';
    END IF;
    IF cp_report.reports IS NULL OR jsonb_typeof(cp_report.reports) <> 'array' THEN
        RAISE EXCEPTION 'node "%": reports must be a JSON array', cp_report.leader
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass [{"stream": ..., "shard": ..., "generation": ..., "follower": ..., "acked_end": ..., "caught_up": ...}, ...].';
    END IF;
    -- A malformed element refuses the whole call: nothing of it lands.
    SELECT e.v INTO bad
      FROM jsonb_array_elements(cp_report.reports) AS e(v)
     WHERE jsonb_typeof(e.v) IS DISTINCT FROM 'object'
        OR jsonb_typeof(e.v -> 'stream') IS DISTINCT FROM 'string'
        OR jsonb_typeof(e.v -> 'follower') IS DISTINCT FROM 'string'
        OR jsonb_typeof(e.v -> 'caught_up') IS DISTINCT FROM 'boolean'
        OR jsonb_typeof(e.v -> 'shard') IS DISTINCT FROM 'number'
        OR jsonb_typeof(e.v -> 'generation') IS DISTINCT FROM 'number'
        OR jsonb_typeof(e.v -> 'acked_end') IS DISTINCT FROM 'number'
        OR (e.v ->> 'shard') !~ '^[0-9]{1,9}$'
        OR (e.v ->> 'generation') !~ '^[0-9]{1,18}$'
        OR (e.v ->> 'acked_end') !~ '^[0-9]{1,18}$'
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node "%": malformed replica report %', cp_report.leader, bad
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A report is an object with string stream and follower, non-negative integer shard, generation and acked_end, and boolean caught_up.',
                  HINT = 'This is felix''s internal protocol; leader and control plane may run different felix versions.';
    END IF;

    -- Shard by shard in lock order; within a shard the last word on a
    -- follower wins.
    FOR r IN
        SELECT e.v ->> 'stream' AS stream, (e.v ->> 'shard')::integer AS shard,
               (e.v ->> 'generation')::bigint AS generation, e.v ->> 'follower' AS follower,
               (e.v ->> 'acked_end')::bigint AS acked_end, (e.v ->> 'caught_up')::boolean AS caught_up
          FROM jsonb_array_elements(cp_report.reports) WITH ORDINALITY AS e(v, ord)
         ORDER BY 1, 2, e.ord
    LOOP
        IF cur_stream IS DISTINCT FROM r.stream OR cur_shard IS DISTINCT FROM r.shard THEN
            IF named IS NOT NULL THEN
                PERFORM felix.cp_report_unnamed(cur_stream, cur_shard, cp_report.leader,
                                                 cp_report.token, named);
            END IF;
            cur_stream := r.stream;
            cur_shard := r.shard;
            named := NULL;
            -- Shared lock: reports of one shard land together, but never
            -- while a tick or a heartbeat is changing its assignment.
            SELECT x.generation, x.leader, x.replicas INTO a
              FROM felix.assignments x
             WHERE x.stream = r.stream AND x.shard = r.shard
               FOR SHARE;
            have_a := FOUND;
        END IF;
        -- Compare-and-set: the reporter must lead this shard at exactly the
        -- reported generation, so a superseded leader's report never lands.
        -- A follower outside the replica set is not recorded.
        CONTINUE WHEN NOT have_a OR a.leader IS DISTINCT FROM cp_report.leader
                   OR a.generation <> r.generation
                   OR NOT (r.follower = ANY (a.replicas)) OR r.follower = cp_report.leader;
        t := clock_timestamp();
        INSERT INTO felix.replica_reports AS rr
               (stream, shard, generation, leader, follower, acked_end, caught_up, reported_at, token)
        VALUES (r.stream, r.shard, r.generation, cp_report.leader, r.follower, r.acked_end,
                r.caught_up, t, cp_report.token)
        ON CONFLICT ON CONSTRAINT replica_reports_pkey
        DO UPDATE SET generation = EXCLUDED.generation, leader = EXCLUDED.leader,
                      acked_end = EXCLUDED.acked_end, caught_up = EXCLUDED.caught_up,
                      reported_at = EXCLUDED.reported_at, token = EXCLUDED.token
         WHERE rr.generation <> EXCLUDED.generation OR rr.leader <> EXCLUDED.leader
            OR rr.token IS NULL OR EXCLUDED.token IS NULL OR rr.token < EXCLUDED.token;
        GET DIAGNOSTICS written = ROW_COUNT;
        named := coalesce(named, '{}') || r.follower;
        accepted := accepted + written;
    END LOOP;
    IF named IS NOT NULL THEN
        PERFORM felix.cp_report_unnamed(cur_stream, cur_shard, cp_report.leader,
                                         cp_report.token, named);
    END IF;
    RETURN accepted;
END
$$;

-- A leader's accepted reports on a shard describe its whole replica set:
-- a follower it left out (a halted one, say) is no longer caught up,
-- whatever an earlier report said -- unless that report is newer than
-- this one.
CREATE FUNCTION felix.cp_report_unnamed(stream text, shard integer, leader text,
                                        token bigint, named text[]) RETURNS void
    LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    UPDATE felix.replica_reports rr
       SET caught_up = false
     WHERE rr.stream = cp_report_unnamed.stream AND rr.shard = cp_report_unnamed.shard
       AND rr.caught_up AND NOT (rr.follower = ANY (cp_report_unnamed.named))
       AND (rr.leader <> cp_report_unnamed.leader OR rr.token IS NULL
            OR cp_report_unnamed.token IS NULL OR rr.token < cp_report_unnamed.token)
$$;

-- ---------------------------------------------------------------------
-- felix.cp_tick: failure detection and promotion.  Returns how many shards
-- were given a new generation.
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.cp_tick() RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cfg          record;
    k            record;
    a            record;
    cand         record;
    t            timestamptz;
    margin       interval;
    expiry       interval;
    window_      interval;
    promotable   timestamptz;   -- when a successor could first be granted
    leader_alive boolean;
    main         text;
    details      text;
    reason       text;
    promoted     integer := 0;
BEGIN
    cfg := felix.cp_settings();
    margin := cfg.margin_ms * interval '1 millisecond';
    expiry := cfg.expiry_ms * interval '1 millisecond';
    window_ := (cfg.expiry_ms + cfg.heartbeat_ms) * interval '1 millisecond';

    -- Unlocked pass to find the shards worth locking; each is re-read and
    -- decided under its row lock.
    FOR k IN
        SELECT x.stream, x.shard
          FROM felix.assignments x
         WHERE x.lease_granted_at IS NULL
            OR x.lease_granted_at + x.lease_ms * interval '1 millisecond' + margin < clock_timestamp()
         ORDER BY x.stream, x.shard
    LOOP
        SELECT x.* INTO a FROM felix.assignments x
         WHERE x.stream = k.stream AND x.shard = k.shard
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;          -- dropped meanwhile
        t := clock_timestamp();
        -- A leader whose lease lapsed counts as alive again only once it has
        -- heartbeated after the lapse: a dead leader's last heartbeat can be
        -- younger than node_expiry when the lease lapses.
        leader_alive := EXISTS (SELECT 1 FROM felix.nodes n
                                 WHERE n.name = a.leader AND n.last_heartbeat >= t - expiry
                                   AND (a.lease_granted_at IS NULL
                                        OR n.last_heartbeat > a.lease_granted_at
                                                              + a.lease_ms * interval '1 millisecond'));

        IF a.lease_granted_at IS NOT NULL THEN
            promotable := a.lease_granted_at + a.lease_ms * interval '1 millisecond' + margin;
            -- The safety interval.  The leader anchored this lease no later
            -- than lease_granted_at (it counts from when it sent the
            -- heartbeat) and stops writing lease_epsilon before that anchor
            -- plus lease_ms, by its own monotonic clock.  Waiting until
            -- lease_ms + margin have passed since the grant by our clock
            -- means it has stopped before a successor can exist, as long as
            -- the two clocks' drift over one lease stays inside the margin.
            -- Promoting any earlier could give the generation two writers.
            CONTINUE WHEN NOT (t > promotable);
        ELSE
            -- Published but never taken: no node ever held this generation's
            -- lease.  Give its leader a lease's worth of time to show up;
            -- while it is alive it will take the lease itself.
            promotable := t;
            CONTINUE WHEN leader_alive
                       OR NOT (t > a.assigned_at + a.lease_ms * interval '1 millisecond' + margin);
        END IF;

        -- Candidates, best first.  The last leader, alive again, holds every
        -- record of its generation, so it counts as furthest ahead.  Any
        -- other must be in the replica set, alive, and reported caught up
        -- (bound zero) by this generation's leader, in a report no older than
        -- node_expiry + heartbeat_interval now.  A leader-consistency leader
        -- acknowledges without reporting, until its lease lapses; a report
        -- that has aged past the window may predate writes it acknowledged
        -- (a control plane that was down cannot tell), so it does not
        -- qualify and the shard waits for its last leader to come back.
        -- The defaults keep the window (1.7 s) longer than a lease plus the
        -- margin plus a tick, so a report made at the last renewal of a
        -- leader that died still qualifies at the first promotable tick.
        -- A halted follower
        -- is never reported caught up.  Furthest ahead first; score only
        -- breaks ties.
        SELECT c.node, c.is_leader, c.acked_end INTO cand
          FROM (SELECT a.leader AS node, true AS is_leader, NULL::bigint AS acked_end
                 WHERE leader_alive
                UNION ALL
                SELECT rr.follower, false, rr.acked_end
                  FROM felix.replica_reports rr
                  JOIN felix.nodes n ON n.name = rr.follower
                 WHERE rr.stream = a.stream AND rr.shard = a.shard
                   AND rr.generation = a.generation AND rr.leader = a.leader
                   AND rr.caught_up
                   AND rr.reported_at > t - window_
                   AND rr.follower = ANY (a.replicas) AND rr.follower <> a.leader
                   -- alive, and seen after the lease lapsed: a follower that
                   -- died with its leader may still look recent here
                   AND n.last_heartbeat >= t - expiry
                   AND (a.lease_granted_at IS NULL
                        OR n.last_heartbeat > a.lease_granted_at
                                              + a.lease_ms * interval '1 millisecond')) AS c
         ORDER BY c.is_leader DESC, c.acked_end DESC,
                  felix.cp_score(c.node, a.stream, a.shard) DESC, c.node COLLATE "C"
         LIMIT 1;

        IF FOUND THEN
            -- A new generation is a new lease: its leader takes it at its
            -- next heartbeat.
            UPDATE felix.assignments x
               SET generation = a.generation + 1, leader = cand.node,
                   lease_granted_at = NULL, lease_ms = cfg.lease_ms,
                   unplaced_reason = NULL, assigned_at = t
             WHERE x.stream = a.stream AND x.shard = a.shard
               AND x.generation = a.generation;
            promoted := promoted + 1;
            RAISE LOG 'felix: stream "%" shard %: % leads generation % (was % at generation %)',
                a.stream, a.shard, cand.node, a.generation + 1, a.leader, a.generation;
            CONTINUE;
        END IF;

        -- Nobody qualifies: the shard stays unplaced.  Handing it to a node
        -- that does not hold the log would serve an empty shard at a newer
        -- generation, which is data loss nobody sees; unavailable is visible.
        IF a.leader IS NULL THEN
            main := format('no replica was reported caught up at generation %s and no leader is known',
                           a.generation);
        ELSIF a.replicas = ARRAY[a.leader] THEN
            main := format('the only copy is on %s, which %s at generation %s and is not alive',
                           a.leader,
                           CASE WHEN a.lease_granted_at IS NULL THEN 'never took its lease'
                                ELSE 'lost its lease' END,
                           a.generation);
        ELSE
            main := format('no replica was reported caught up at generation %s, and leader %s %s and is not alive',
                           a.generation, a.leader,
                           CASE WHEN a.lease_granted_at IS NULL THEN 'never took its lease'
                                ELSE 'lost its lease' END);
        END IF;
        SELECT string_agg(format('%s: %s', f.node,
                   CASE WHEN n.name IS NULL OR n.last_heartbeat < t - expiry THEN 'not alive'
                        WHEN rr.follower IS NULL OR rr.generation <> a.generation
                             OR rr.leader IS DISTINCT FROM a.leader THEN 'no report'
                        WHEN NOT rr.caught_up THEN 'behind'
                        ELSE 'report too old' END),
                   '; ' ORDER BY f.node COLLATE "C")
          INTO details
          FROM unnest(a.replicas) AS f(node)
          LEFT JOIN felix.nodes n ON n.name = f.node
          LEFT JOIN felix.replica_reports rr
                 ON rr.stream = a.stream AND rr.shard = a.shard AND rr.follower = f.node
         WHERE f.node IS DISTINCT FROM a.leader;
        reason := main;
        -- Keep it short enough for a node's shard slot (FELIX_REASON_LEN).
        IF details IS NOT NULL AND octet_length(main || ' (' || details || ')') < 160 THEN
            reason := main || ' (' || details || ')';
        END IF;
        IF a.unplaced_reason IS DISTINCT FROM reason THEN
            UPDATE felix.assignments x
               SET unplaced_reason = reason
             WHERE x.stream = a.stream AND x.shard = a.shard
               AND x.generation = a.generation;
            RAISE LOG 'felix: stream "%" shard % is unplaced: %', a.stream, a.shard, reason;
        END IF;
    END LOOP;
    RETURN promoted;
END
$$;

-- ---------------------------------------------------------------------
-- felix.cp_nodes: the cluster's nodes as the control plane sees them
-- (felix_nodes on every node shows this).
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.cp_nodes()
RETURNS TABLE (name text, conninfo text, alive boolean, last_heartbeat timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    expiry interval := (felix.cp_settings()).expiry_ms * interval '1 millisecond';
BEGIN
    RETURN QUERY
    SELECT n.name, felix.cp_mask_conninfo(n.conninfo),
           n.last_heartbeat >= clock_timestamp() - expiry, n.last_heartbeat
      FROM felix.nodes n
     ORDER BY n.name COLLATE "C";
END
$$;

-- Internal: the cp_* entry points are for felix_replication (and
-- superusers) only; the helpers for the entry points only.
REVOKE ALL ON FUNCTION felix.cp_settings(), felix.cp_score(text, text, integer),
    felix.cp_mask_conninfo(text), felix.cp_report_unnamed(text, integer, text, bigint, text[]),
    felix.cp_heartbeat(text, text),
    felix.cp_create_stream(text, integer, integer, text, text, text, bigint, interval),
    felix.cp_drop_stream(text, boolean), felix.cp_report(text, jsonb, bigint), felix.cp_tick(),
    felix.cp_nodes()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.cp_heartbeat(text, text),
    felix.cp_create_stream(text, integer, integer, text, text, text, bigint, interval),
    felix.cp_drop_stream(text, boolean), felix.cp_report(text, jsonb, bigint), felix.cp_tick(),
    felix.cp_nodes()
    TO felix_replication;
-- END control plane

-- ---------------------------------------------------------------------
-- Views
-- ---------------------------------------------------------------------
CREATE VIEW felix_streams AS
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

-- The cluster's nodes as the control plane sees them (felix.cp_nodes(),
-- called over libpq; any password in a conninfo is masked).
CREATE FUNCTION felix.nodes_view(
    OUT name text, OUT conninfo text, OUT alive boolean, OUT last_heartbeat timestamptz)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_nodes_view' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_nodes AS SELECT * FROM felix.nodes_view();

-- ---------------------------------------------------------------------
-- Replication (log shipping)
-- ---------------------------------------------------------------------
-- The follower's append rule, called over libpq by a shard's leader:
-- ('stored', end of the batches sent) once they are durable here,
-- ('gap', tail), ('conflict', first seq of the differing batch) or
-- ('fenced', tail) when the sender's generation is superseded.
CREATE FUNCTION felix.replicate(stream text, shard integer, generation bigint,
                                from_seq bigint, leader_hwm_end bigint, batches bytea)
RETURNS TABLE(status text, seq bigint)
    AS 'MODULE_PATHNAME', 'felix_replicate' LANGUAGE C CALLED ON NULL INPUT VOLATILE ROWS 1;
REVOKE ALL ON FUNCTION felix.replicate(text, integer, bigint, bigint, bigint, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION felix.replicate(text, integer, bigint, bigint, bigint, bytea) TO felix_replication;

-- On a leader, each follower of each shard it leads: how far it has
-- acknowledged, how far behind it is, and whether shipping goes on.
CREATE FUNCTION felix.replication_view(
    OUT stream text, OUT shard integer, OUT generation bigint, OUT follower text,
    OUT acked_seq bigint, OUT lag_records bigint, OUT state text,
    OUT last_answer timestamptz, OUT last_error text)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_replication_view' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_replication AS SELECT * FROM felix.replication_view();
