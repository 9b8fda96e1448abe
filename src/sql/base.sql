-- felix 1.1: streams stored in felix's own segment log, read through the
-- felix table access method, published through plain SQL.
\echo Use "CREATE EXTENSION felix" to load this file. \quit

-- This script is built (Makefile) from src/sql/base.sql, the objects felix
-- 1.0 already had in this form and that an upgrade keeps, and
-- src/sql/objects.sql, everything else, which the 1.0 -> 1.1 upgrade
-- script creates too: both versions' paths give the same objects.

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
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- The control plane's identity of the stream: a drop is told to it
    -- with this, and it forgets only the stream it registered under it.
    -- (Last, where felix 1.1 added it to 1.0's table.)
    creation_id        uuid NOT NULL
);
-- Only its owner reads it; everyone else sees the streams they may SELECT
-- through the felix_streams view.
REVOKE ALL ON felix.streams FROM PUBLIC;
GRANT USAGE ON SCHEMA felix TO PUBLIC;

-- ---------------------------------------------------------------------
-- Table access method
-- ---------------------------------------------------------------------
CREATE FUNCTION felix.tableam_handler(internal) RETURNS table_am_handler
    AS 'MODULE_PATHNAME', 'felix_tableam_handler' LANGUAGE C STRICT;
CREATE ACCESS METHOD felix TYPE TABLE HANDLER felix.tableam_handler;
COMMENT ON ACCESS METHOD felix IS 'append-only felix stream';

