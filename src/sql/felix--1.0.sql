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
    OUT state text, OUT error text)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_shard_states' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_shards AS
SELECT * FROM felix.shard_states() ORDER BY stream, shard;

CREATE FUNCTION felix.metrics(OUT name text, OUT value double precision)
RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'felix_metrics' LANGUAGE C STRICT VOLATILE;

CREATE VIEW felix_metrics AS SELECT * FROM felix.metrics();
