--
-- utility_matrix: every statement that can name a table, applied to a
-- stream (issue 17).  The statements come from PostgreSQL's own command
-- tags: part 1 checks that every tag of tcop/cmdtaglist.h is classified
-- in test/matrix/statements.txt -- "tested", and then a statement of this
-- file runs it against a stream, or "no table", with the reason -- so a
-- statement nobody thought of fails this test instead of being silently
-- allowed.
--
-- Each statement runs as the stream's owner (regress_mx_owner) and, where
-- it means something, as a role holding just the grant the statement
-- needs (regress_mx_user), and is followed by \echo SQLSTATE.  Each must
-- be refused with a clear SQLSTATE or leave the stream healthy: after a
-- statement that succeeded, matrix_check.health() publishes a record
-- with felix_publish and reads it back at its seq, reads every record of
-- every shard, and checks the table's owner, its row in felix_streams and
-- the control plane's row (felix.cluster_streams: the same creation id, in
-- the schema the table is in).  It answers "ok" or what is wrong.  Quotas
-- are checked by what they refuse (part 5), and every stream is dropped
-- at the end and gone from the control plane.
--

-- =====================================================================
-- 1. Coverage: every command tag of PostgreSQL is classified
-- =====================================================================
-- pg_regress exports PG_ABS_SRCDIR; the server's own header directory is
-- in pg_config.  The files are read whole (pg_read_file), split in lines.
\getenv abs_srcdir PG_ABS_SRCDIR
\set statements_file :abs_srcdir '/test/matrix/statements.txt'
\set matrix_file :abs_srcdir '/sql/utility_matrix.sql'
SELECT setting || '/tcop/cmdtaglist.h' AS cmdtaglist_file
  FROM pg_config WHERE name = 'INCLUDEDIR-SERVER' \gset
CREATE TEMP TABLE mx_header AS
SELECT (regexp_match(line, '^PG_CMDTAG\(CMDTAG_\w+, "([^"]+)"'))[1] AS tag
  FROM regexp_split_to_table(pg_read_file(:'cmdtaglist_file'), E'\n') AS line
 WHERE line ~ '^PG_CMDTAG\(';
CREATE TEMP TABLE mx_list AS
SELECT n, trim(f[1]) AS tag, trim(f[2]) AS class, nullif(trim(f[3]), '') AS note
  FROM regexp_split_to_table(pg_read_file(:'statements_file'), E'\n') WITH ORDINALITY AS l(line, n),
       LATERAL regexp_match(line, '^([^|]*)\|([^|]*)\|(.*)$') AS f
 WHERE line !~ '^\s*(#|$)';
CREATE TEMP TABLE mx_sql AS
SELECT line FROM regexp_split_to_table(pg_read_file(:'matrix_file'), E'\n') AS line;
-- what PostgreSQL 15 has, and how the list classifies it
SELECT count(*) AS command_tags FROM mx_header;
SELECT class, count(*) FROM mx_list GROUP BY class ORDER BY class;
-- each of the following must be empty:
-- a tag of the header that the list does not classify
SELECT tag AS unclassified_tag FROM mx_header
 WHERE tag NOT IN (SELECT tag FROM mx_list WHERE tag IS NOT NULL) ORDER BY tag;
-- a line of the list that is not "tag | tested | [pattern]" or
-- "tag | no table | reason", or names a tag twice or one the header lacks
SELECT n AS line, tag, class, note FROM mx_list l
 WHERE tag IS NULL OR class IS NULL
    OR class NOT IN ('tested', 'no table')
    OR (class = 'no table' AND note IS NULL)
    OR tag NOT IN (SELECT tag FROM mx_header)
    OR (SELECT count(*) FROM mx_list d WHERE d.tag = l.tag) > 1
 ORDER BY n;
-- a tag classified "tested" that no statement of this file runs
SELECT tag AS tested_but_not_run, coalesce(note, tag) AS pattern FROM mx_list l
 WHERE class = 'tested'
   AND NOT EXISTS (SELECT 1 FROM mx_sql s
                    WHERE s.line ~* ('^' || coalesce(l.note, l.tag || '\M')))
 ORDER BY tag;
DROP TABLE mx_header, mx_list, mx_sql;

-- =====================================================================
-- 2. Roles, schemas, streams, and the health check
-- =====================================================================
CREATE ROLE regress_mx_owner LOGIN;
CREATE ROLE regress_mx_user LOGIN;
CREATE ROLE regress_mx_heir LOGIN;
CREATE ROLE regress_mx_leaver LOGIN;
-- the owner may act for the heir and the leaver (ALTER ... OWNER TO,
-- REASSIGN OWNED need that); the user owns nothing of the stream's
GRANT regress_mx_heir, regress_mx_leaver TO regress_mx_owner;
CREATE SCHEMA mx AUTHORIZATION regress_mx_owner;
CREATE SCHEMA mx_other AUTHORIZATION regress_mx_owner;
CREATE SCHEMA mxu AUTHORIZATION regress_mx_user;
GRANT USAGE ON SCHEMA mx TO regress_mx_user;
GRANT USAGE, CREATE ON SCHEMA mx TO regress_mx_heir, regress_mx_leaver;
-- schemas are created and handed over below
GRANT CREATE ON DATABASE :"DBNAME" TO regress_mx_owner;
-- the health check runs as the superuser that defines it: it reads
-- felix.cluster_streams, and publishes past any policy
CREATE SCHEMA matrix_check;
GRANT USAGE ON SCHEMA matrix_check TO PUBLIC;
CREATE FUNCTION matrix_check.health(stream text, owner name DEFAULT 'regress_mx_owner')
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    rel oid;
    nsp text;
    problems text[] := '{}';
    marker jsonb := jsonb_build_object('health', gen_random_uuid());
    published record;
    got jsonb;
    total bigint;
    expected bigint;
BEGIN
    SELECT s.relid, n.nspname INTO rel, nsp
      FROM felix.streams s JOIN pg_class c ON c.oid = s.relid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE s.name = stream;
    IF rel IS NULL THEN
        RETURN 'not a stream: no row in felix.streams';
    END IF;
    -- publishes, and the record reads back at its seq
    BEGIN
        SELECT p.shard, p.seq INTO published FROM felix_publish(stream, marker, shard => 0) p;
        EXECUTE format('SELECT payload FROM %s WHERE shard = 0 AND seq = $1', rel::regclass)
           INTO got USING published.seq;
        IF got IS DISTINCT FROM marker THEN
            problems := problems || 'the record published does not read back'::text;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        problems := problems || format('publish or read failed: %s %s', SQLSTATE, SQLERRM);
    END;
    -- reads every record of every shard
    BEGIN
        EXECUTE format('SELECT count(*) FROM %s', rel::regclass) INTO total;
        SELECT sum(next_seq - start_seq) INTO expected
          FROM felix_shards WHERE felix_shards.stream = health.stream;
        IF total IS DISTINCT FROM expected THEN
            problems := problems || format('reads %s records, its shards hold %s', total, expected);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        problems := problems || format('read failed: %s %s', SQLSTATE, SQLERRM);
    END;
    IF (SELECT relowner::regrole::text FROM pg_class WHERE oid = rel) IS DISTINCT FROM owner THEN
        problems := problems || format('owned by %s, not %s',
                                       (SELECT relowner::regrole FROM pg_class WHERE oid = rel), owner);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM felix_streams v
                    WHERE v.stream = health.stream AND v.relation = rel::regclass) THEN
        problems := problems || 'not listed in felix_streams'::text;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM felix.cluster_streams cs JOIN felix.streams s
                       ON s.creation_id = cs.creation_id
                    WHERE cs.name = stream AND s.name = stream AND cs.schema = nsp) THEN
        problems := problems || format('the control plane does not list it in schema %s', nsp);
    END IF;
    RETURN CASE WHEN problems = '{}' THEN 'ok' ELSE array_to_string(problems, '; ') END;
END $$;
-- the stream most statements are applied to, and a heap table beside it
SET SESSION AUTHORIZATION regress_mx_owner;
SET search_path = mx, public;
SELECT felix_create_stream('m1', shards => 2);
RESET search_path;
CREATE TABLE mx.plain (shard int, seq bigint, key text, payload jsonb, published_at timestamptz);
GRANT SELECT ON mx.plain TO regress_mx_user;
SELECT matrix_check.health('m1');

-- =====================================================================
-- 3. ALTER TABLE, every form
-- =====================================================================
-- Forms that change the columns, constraints or storage are refused;
-- statistics targets, column options, triggers, rules, row security and
-- the owner (part 5) may change.  As the owner:
ALTER TABLE mx.m1 ADD COLUMN extra int;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DROP COLUMN key;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key TYPE varchar(10);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key SET DEFAULT 'k';
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key DROP DEFAULT;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key SET NOT NULL;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key DROP NOT NULL;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key DROP EXPRESSION IF EXISTS;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN seq SET GENERATED BY DEFAULT;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN seq DROP IDENTITY IF EXISTS;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN payload SET STORAGE EXTERNAL;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN payload SET COMPRESSION pglz;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key OPTIONS (ADD origin 'x');
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ADD PRIMARY KEY (shard, seq);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ADD CONSTRAINT m1_check CHECK (shard >= 0) NOT VALID;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ADD CONSTRAINT m1_unique UNIQUE USING INDEX m1_index;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ADD FOREIGN KEY (seq) REFERENCES mx.plain (seq);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ADD EXCLUDE USING btree (seq WITH =);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER CONSTRAINT m1_check DEFERRABLE;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 VALIDATE CONSTRAINT m1_check;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DROP CONSTRAINT IF EXISTS m1_check;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 CLUSTER ON m1_index;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET WITHOUT CLUSTER;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET WITHOUT OIDS;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET LOGGED;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET UNLOGGED;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET ACCESS METHOD heap;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET TABLESPACE pg_default;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET (fillfactor = 50);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 RESET (fillfactor);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 INHERIT mx.plain;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 NO INHERIT mx.plain;
\echo SQLSTATE :SQLSTATE
CREATE TYPE mx.m1_shape AS (shard int, seq bigint, key text, payload jsonb, published_at timestamptz);
ALTER TABLE mx.m1 OF mx.m1_shape;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 NOT OF;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 REPLICA IDENTITY FULL;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 REPLICA IDENTITY NOTHING;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 OPTIONS (ADD origin 'x');
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ATTACH PARTITION mx.plain FOR VALUES IN (0);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DETACH PARTITION mx.plain;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DETACH PARTITION mx.plain FINALIZE;
\echo SQLSTATE :SQLSTATE
-- a refused form refuses the whole statement: row security stays off
ALTER TABLE mx.m1 ENABLE ROW LEVEL SECURITY, ADD COLUMN extra int;
\echo SQLSTATE :SQLSTATE
SELECT relrowsecurity FROM pg_class WHERE oid = 'mx.m1'::regclass;
-- the columns are still exactly a stream's
SELECT attname, atttypid::regtype, attnotnull, atthasdef, attstorage, attcompression
  FROM pg_attribute WHERE attrelid = 'mx.m1'::regclass AND attnum > 0 ORDER BY attnum;
SELECT matrix_check.health('m1');
-- forms that leave the stream alone
ALTER TABLE mx.m1 ALTER COLUMN key SET STATISTICS 200;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER TABLE mx.m1 ALTER COLUMN key SET (n_distinct = 10);
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER TABLE mx.m1 ALTER COLUMN key RESET (n_distinct);
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER TABLE mx.m1 ENABLE ROW LEVEL SECURITY;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER TABLE mx.m1 FORCE ROW LEVEL SECURITY;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER TABLE mx.m1 NO FORCE ROW LEVEL SECURITY;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DISABLE ROW LEVEL SECURITY;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- (no rule can exist on a stream: part 8)
ALTER TABLE mx.m1 DISABLE RULE m1_rule;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ENABLE RULE m1_rule;
\echo SQLSTATE :SQLSTATE
-- (ENABLE and DISABLE TRIGGER: part 8)
-- The other relation kinds' ALTER statements reach a stream's table too.
ALTER FOREIGN TABLE mx.m1 ADD COLUMN extra int;
\echo SQLSTATE :SQLSTATE
ALTER FOREIGN TABLE mx.m1 OPTIONS (ADD origin 'x');
\echo SQLSTATE :SQLSTATE
ALTER INDEX mx.m1 SET TABLESPACE pg_default;
\echo SQLSTATE :SQLSTATE
ALTER INDEX mx.m1 DEPENDS ON EXTENSION plpgsql;
\echo SQLSTATE :SQLSTATE
ALTER MATERIALIZED VIEW mx.m1 SET (fillfactor = 50);
\echo SQLSTATE :SQLSTATE
ALTER MATERIALIZED VIEW mx.m1 DEPENDS ON EXTENSION plpgsql;
\echo SQLSTATE :SQLSTATE
ALTER SEQUENCE mx.m1 RESTART;
\echo SQLSTATE :SQLSTATE
ALTER VIEW mx.m1 ALTER COLUMN key SET DEFAULT 'k';
\echo SQLSTATE :SQLSTATE
ALTER TYPE mx.m1 ADD ATTRIBUTE extra int;
\echo SQLSTATE :SQLSTATE
ALTER TYPE mx.m1 ALTER ATTRIBUTE key TYPE varchar(10);
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- As the role with USAGE on the schema only: the same refusals, and the
-- forms felix lets through stop at PostgreSQL's ownership check.
SET SESSION AUTHORIZATION regress_mx_user;
ALTER TABLE mx.m1 ADD COLUMN extra int;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET ACCESS METHOD heap;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ENABLE ROW LEVEL SECURITY;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ALTER COLUMN key SET STATISTICS 10;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT matrix_check.health('m1');

-- =====================================================================
-- 4. Names and schemas
-- =====================================================================
-- felix.streams knows a stream by its table's name, and the control plane
-- records the schema it was created in: every node creates the stream's
-- table there (from felix.cluster_streams).  So neither the name nor the
-- schema may change -- not by ALTER ... SET SCHEMA, and not by renaming
-- the schema holding a stream.
ALTER TABLE mx.m1 RENAME TO m1_renamed;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 RENAME COLUMN key TO k;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 RENAME CONSTRAINT m1_check TO m1_check2;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 SET SCHEMA mx_other;
\echo SQLSTATE :SQLSTATE
ALTER VIEW mx.m1 RENAME TO m1_renamed;
\echo SQLSTATE :SQLSTATE
ALTER VIEW mx.m1 SET SCHEMA mx_other;
\echo SQLSTATE :SQLSTATE
ALTER SEQUENCE mx.m1 SET SCHEMA mx_other;
\echo SQLSTATE :SQLSTATE
ALTER MATERIALIZED VIEW mx.m1 SET SCHEMA mx_other;
\echo SQLSTATE :SQLSTATE
ALTER FOREIGN TABLE mx.m1 SET SCHEMA mx_other;
\echo SQLSTATE :SQLSTATE
ALTER INDEX mx.m1 RENAME TO m1_renamed;
\echo SQLSTATE :SQLSTATE
ALTER TYPE mx.m1 RENAME TO m1_renamed;
\echo SQLSTATE :SQLSTATE
ALTER TYPE mx.m1 RENAME ATTRIBUTE key TO k;
\echo SQLSTATE :SQLSTATE
ALTER TYPE mx.m1 SET SCHEMA mx_other;
\echo SQLSTATE :SQLSTATE
ALTER TYPE mx.m1 OWNER TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
ALTER SCHEMA mx RENAME TO mx_renamed;
\echo SQLSTATE :SQLSTATE
SELECT relname, relnamespace::regnamespace FROM pg_class WHERE oid = 'mx.m1'::regclass;
SELECT matrix_check.health('m1');
-- a schema without streams is renamed as usual, and its owner may change
ALTER SCHEMA mx_other RENAME TO mx_other2;
\echo SQLSTATE :SQLSTATE
ALTER SCHEMA mx_other2 RENAME TO mx_other;
RESET SESSION AUTHORIZATION;
ALTER SCHEMA mx OWNER TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER SCHEMA mx OWNER TO regress_mx_owner;
-- (the heir's grants on mx merged into its ownership, and went with it)
GRANT USAGE, CREATE ON SCHEMA mx TO regress_mx_heir;
SET SESSION AUTHORIZATION regress_mx_owner;
-- the role with USAGE: the same refusals (its missing ownership is not
-- reached)
SET SESSION AUTHORIZATION regress_mx_user;
ALTER TABLE mx.m1 SET SCHEMA mxu;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 RENAME TO m1_renamed;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;

-- =====================================================================
-- 5. Owners and quotas
-- =====================================================================
-- felix.max_streams_per_role and felix.max_shards_per_role count the
-- streams whose table a role owns, so a stream given to a role counts
-- against that role's quotas: ALTER TABLE ... OWNER TO and REASSIGN OWNED
-- are refused (53400) when the new owner would be over them.  The
-- superuser sets the limits for the sessions it hands over.
SET SESSION AUTHORIZATION regress_mx_heir;
SET search_path = mx, public;
SELECT felix_create_stream('h1', shards => 1);
RESET search_path;
RESET SESSION AUTHORIZATION;
SET felix.max_streams_per_role = 1;
SET SESSION AUTHORIZATION regress_mx_owner;
ALTER TABLE mx.m1 OWNER TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
RESET SESSION AUTHORIZATION;
SET felix.max_streams_per_role = 2;
SET felix.max_shards_per_role = 2;
SET SESSION AUTHORIZATION regress_mx_owner;
-- m1's two shards and h1's one
ALTER TABLE mx.m1 OWNER TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
RESET SESSION AUTHORIZATION;
SET felix.max_shards_per_role = 3;
SET SESSION AUTHORIZATION regress_mx_owner;
ALTER TABLE mx.m1 OWNER TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1', 'regress_mx_heir');
-- m1 counts against the heir now: it is at both limits
SET SESSION AUTHORIZATION regress_mx_heir;
SET search_path = mx, public;
SELECT felix_create_stream('h2', shards => 1);
\echo SQLSTATE :SQLSTATE
RESET search_path;
-- the role with USAGE cannot take it, nor give it away
SET SESSION AUTHORIZATION regress_mx_user;
ALTER TABLE mx.m1 OWNER TO regress_mx_user;
\echo SQLSTATE :SQLSTATE
-- back to the owner (who acts for the heir)
SET SESSION AUTHORIZATION regress_mx_owner;
ALTER TABLE mx.m1 OWNER TO regress_mx_owner;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- REASSIGN OWNED gives the heir every stream of the leaver's
SET SESSION AUTHORIZATION regress_mx_leaver;
SET search_path = mx, public;
SELECT felix_create_stream('l1', shards => 1);
SELECT felix_create_stream('l2', shards => 1);
RESET search_path;
SET SESSION AUTHORIZATION regress_mx_owner;
REASSIGN OWNED BY regress_mx_leaver TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('l1', 'regress_mx_leaver'), matrix_check.health('l2', 'regress_mx_leaver');
RESET SESSION AUTHORIZATION;
SET felix.max_streams_per_role = 3;
SET felix.max_shards_per_role = 3;
SET SESSION AUTHORIZATION regress_mx_owner;
REASSIGN OWNED BY regress_mx_leaver TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('l1', 'regress_mx_heir'), matrix_check.health('l2', 'regress_mx_heir');
-- a superuser is not bounded (as at felix_create_stream): it may give a
-- role streams past the role's quota
RESET SESSION AUTHORIZATION;
ALTER TABLE mx.m1 OWNER TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1', 'regress_mx_heir');
ALTER TABLE mx.m1 OWNER TO regress_mx_owner;
-- a role that owns streams cannot be dropped; DROP OWNED drops its
-- streams, cluster-wide
\set VERBOSITY terse
DROP ROLE regress_mx_owner;
\echo SQLSTATE :SQLSTATE
\set VERBOSITY default
SET SESSION AUTHORIZATION regress_mx_owner;
DROP OWNED BY regress_mx_heir;
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
SELECT stream FROM felix_streams WHERE stream IN ('h1', 'l1', 'l2');
SELECT name FROM felix.cluster_streams WHERE name IN ('h1', 'l1', 'l2');
RESET felix.max_streams_per_role;
RESET felix.max_shards_per_role;
-- DROP OWNED took the heir's grants too
GRANT USAGE, CREATE ON SCHEMA mx TO regress_mx_heir;
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT matrix_check.health('m1');

-- =====================================================================
-- 6. Indexes and maintenance
-- =====================================================================
CREATE INDEX m1_index ON mx.m1 (seq);
\echo SQLSTATE :SQLSTATE
CREATE UNIQUE INDEX CONCURRENTLY m1_index ON mx.m1 (shard, seq);
\echo SQLSTATE :SQLSTATE
CLUSTER mx.m1;
\echo SQLSTATE :SQLSTATE
CLUSTER mx.m1 USING m1_index;
\echo SQLSTATE :SQLSTATE
VACUUM (FULL) mx.m1;
\echo SQLSTATE :SQLSTATE
VACUUM FULL mx.plain, mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- a stream has no index, no TOAST table, no dead rows and no xids: these
-- pass over it
REINDEX TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
REINDEX TABLE CONCURRENTLY mx.m1;
\echo SQLSTATE :SQLSTATE
REINDEX SCHEMA mx;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- every table of the database, streams among them (a stream's records
-- are keyed by its table's OID, which the rewrite keeps)
RESET SESSION AUTHORIZATION;
CLUSTER;
\echo SQLSTATE :SQLSTATE
VACUUM (FULL);
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT matrix_check.health('m1');
VACUUM mx.m1;
\echo SQLSTATE :SQLSTATE
VACUUM (FREEZE, VERBOSE) mx.m1;
\echo SQLSTATE :SQLSTATE
VACUUM (ANALYZE, DISABLE_PAGE_SKIPPING, INDEX_CLEANUP ON, TRUNCATE ON) mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ANALYZE mx.m1;
\echo SQLSTATE :SQLSTATE
ANALYZE mx.m1 (key, payload);
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- the role with USAGE: refused, or skipped (VACUUM and ANALYZE are the
-- owner's)
SET SESSION AUTHORIZATION regress_mx_user;
CREATE INDEX m1_index ON mx.m1 (seq);
\echo SQLSTATE :SQLSTATE
REINDEX TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
VACUUM (FULL) mx.m1;
\echo SQLSTATE :SQLSTATE
VACUUM mx.m1;
\echo SQLSTATE :SQLSTATE
ANALYZE mx.m1;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
-- every other index statement that can name it is PostgreSQL's refusal
DROP INDEX mx.m1;
\echo SQLSTATE :SQLSTATE
ALTER INDEX mx.m1 RESET (fillfactor);
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');

-- =====================================================================
-- 7. Reading, writing, locking
-- =====================================================================
-- Records are appended, read and never changed.  The role with USAGE is
-- given exactly the privilege each statement asks for.  (m4, of one
-- shard, holds only what is copied here, so that COPY TO prints it.)
SET search_path = mx, public;
SELECT felix_create_stream('m4', shards => 1);
RESET search_path;
GRANT SELECT, INSERT ON mx.m1, mx.m4 TO regress_mx_user;
SET SESSION AUTHORIZATION regress_mx_user;
INSERT INTO mx.m1 (key, payload) VALUES ('user', '{"by": "insert"}');
\echo SQLSTATE :SQLSTATE
COPY mx.m1 (key, payload) FROM STDIN;
user	{"by": "copy"}
\.
\echo SQLSTATE :SQLSTATE
SELECT key, payload FROM mx.m1 WHERE key = 'user' ORDER BY payload::text;
COPY mx.m4 (key, payload) FROM STDIN;
a	{"n": 1}
b	{"n": 2}
\.
COPY mx.m4 (shard, seq, key, payload) TO STDOUT;
\echo SQLSTATE :SQLSTATE
COPY (SELECT key FROM mx.m1 WHERE key = 'user' ORDER BY payload::text) TO STDOUT;
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS copied INTO TEMP TABLE mx_user_copy FROM mx.m1 WHERE key = 'user';
\echo SQLSTATE :SQLSTATE
CREATE TABLE mxu.snapshot AS SELECT key, payload FROM mx.m1 WHERE key = 'user';
\echo SQLSTATE :SQLSTATE
SELECT count(*) FROM mxu.snapshot;
DROP TABLE mxu.snapshot, mx_user_copy;
INSERT INTO mx.m1 (key, payload) VALUES ('user', '{}') ON CONFLICT DO NOTHING;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT matrix_check.health('m1');
GRANT UPDATE, DELETE, TRUNCATE ON mx.m1 TO regress_mx_user;
SET SESSION AUTHORIZATION regress_mx_user;
UPDATE mx.m1 SET key = 'changed';
\echo SQLSTATE :SQLSTATE
DELETE FROM mx.m1;
\echo SQLSTATE :SQLSTATE
MERGE INTO mx.m1 t USING mx.plain p ON t.seq = p.seq
  WHEN MATCHED THEN DELETE
  WHEN NOT MATCHED THEN INSERT (key, payload) VALUES (p.key, p.payload);
\echo SQLSTATE :SQLSTATE
TRUNCATE mx.m1;
\echo SQLSTATE :SQLSTATE
TRUNCATE mx.plain, mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT seq FROM mx.m1 FOR UPDATE;
\echo SQLSTATE :SQLSTATE
SELECT seq FROM mx.m1 FOR NO KEY UPDATE;
\echo SQLSTATE :SQLSTATE
SELECT seq FROM mx.m1 FOR SHARE;
\echo SQLSTATE :SQLSTATE
SELECT seq FROM mx.m1 FOR KEY SHARE;
\echo SQLSTATE :SQLSTATE
BEGIN;
DECLARE c CURSOR FOR SELECT seq FROM mx.m1 FOR UPDATE;
\echo SQLSTATE :SQLSTATE
ROLLBACK;
PREPARE m1_delete AS DELETE FROM mx.m1 WHERE seq = $1;
\echo SQLSTATE :SQLSTATE
EXECUTE m1_delete(0);
\echo SQLSTATE :SQLSTATE
DEALLOCATE m1_delete;
-- EXPLAIN without ANALYZE plans and runs nothing
EXPLAIN (COSTS OFF) DELETE FROM mx.m1;
\echo SQLSTATE :SQLSTATE
EXPLAIN (ANALYZE, COSTS OFF) DELETE FROM mx.m1;
\echo SQLSTATE :SQLSTATE
-- statements run inside code pass the same checks
DO $$ BEGIN EXECUTE 'TRUNCATE mx.m1'; END $$;
\echo SQLSTATE :SQLSTATE
-- every lock mode its privileges allow; a lock is held until the
-- transaction ends and changes nothing
BEGIN;
LOCK TABLE mx.m1 IN ACCESS SHARE MODE;
LOCK TABLE mx.m1 IN ROW EXCLUSIVE MODE;
LOCK TABLE mx.m1 IN ACCESS EXCLUSIVE MODE;
\echo SQLSTATE :SQLSTATE
COMMIT;
SET SESSION AUTHORIZATION regress_mx_owner;
REVOKE UPDATE, DELETE, TRUNCATE ON mx.m1 FROM regress_mx_user;
-- the owner, the same
UPDATE mx.m1 SET key = 'changed';
\echo SQLSTATE :SQLSTATE
DELETE FROM mx.m1;
\echo SQLSTATE :SQLSTATE
TRUNCATE mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT seq FROM mx.m1 FOR UPDATE;
\echo SQLSTATE :SQLSTATE
BEGIN;
LOCK TABLE mx.m1 IN SHARE ROW EXCLUSIVE MODE;
\echo SQLSTATE :SQLSTATE
COMMIT;
SELECT matrix_check.health('m1'), matrix_check.health('m4');
SELECT felix_drop_stream('m4');

-- =====================================================================
-- 8. Triggers, rules, policies
-- =====================================================================
-- Row-level AFTER triggers are refused (records are appended at commit and
-- cannot be fetched back by row), and so are rules (part 3 of
-- sql/security.sql); BEFORE and statement triggers and policies apply to
-- INSERT and COPY, and felix_publish refuses the callers they would check.
CREATE FUNCTION mx.stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.key := coalesce(NEW.key, 'stamped');
    RETURN NEW;
END $$;
CREATE FUNCTION mx.count_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE '% new records', (SELECT count(*) FROM new_records);
    RETURN NULL;
END $$;
CREATE TRIGGER m1_after AFTER INSERT ON mx.m1 FOR EACH ROW EXECUTE FUNCTION mx.stamp();
\echo SQLSTATE :SQLSTATE
CREATE CONSTRAINT TRIGGER m1_constraint AFTER INSERT ON mx.m1 FOR EACH ROW EXECUTE FUNCTION mx.stamp();
\echo SQLSTATE :SQLSTATE
CREATE TRIGGER m1_instead INSTEAD OF INSERT ON mx.m1 FOR EACH ROW EXECUTE FUNCTION mx.stamp();
\echo SQLSTATE :SQLSTATE
CREATE TRIGGER m1_before BEFORE INSERT ON mx.m1 FOR EACH ROW EXECUTE FUNCTION mx.stamp();
\echo SQLSTATE :SQLSTATE
CREATE TRIGGER m1_statement AFTER INSERT ON mx.m1 REFERENCING NEW TABLE AS new_records
  FOR EACH STATEMENT EXECUTE FUNCTION mx.count_new();
\echo SQLSTATE :SQLSTATE
INSERT INTO mx.m1 (payload) VALUES ('{"by": "trigger"}'), ('{"by": "trigger"}');
SELECT key, count(*) FROM mx.m1 WHERE payload = '{"by": "trigger"}' GROUP BY key;
-- (with INSERT triggers enabled, felix_publish is refused: sql/security.sql)
ALTER TABLE mx.m1 DISABLE TRIGGER m1_before;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DISABLE TRIGGER USER;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
ALTER TABLE mx.m1 ENABLE REPLICA TRIGGER m1_before;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ENABLE ALWAYS TRIGGER m1_before;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 ENABLE TRIGGER ALL;
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.m1 DISABLE TRIGGER ALL;
\echo SQLSTATE :SQLSTATE
ALTER TRIGGER m1_before ON mx.m1 RENAME TO m1_before_renamed;
\echo SQLSTATE :SQLSTATE
ALTER TRIGGER m1_before_renamed ON mx.m1 DEPENDS ON EXTENSION plpgsql;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
DROP TRIGGER m1_before_renamed ON mx.m1;
\echo SQLSTATE :SQLSTATE
DROP TRIGGER m1_statement ON mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- the role with the TRIGGER privilege: the same refusal, and a BEFORE
-- trigger of its own (which only the owner can drop)
GRANT TRIGGER ON mx.m1 TO regress_mx_user;
SET SESSION AUTHORIZATION regress_mx_user;
CREATE TRIGGER m1_user_after AFTER INSERT ON mx.m1 FOR EACH ROW EXECUTE FUNCTION mx.stamp();
\echo SQLSTATE :SQLSTATE
CREATE TRIGGER m1_user_before BEFORE INSERT ON mx.m1 FOR EACH ROW EXECUTE FUNCTION mx.stamp();
\echo SQLSTATE :SQLSTATE
DROP TRIGGER m1_user_before ON mx.m1;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
DROP TRIGGER m1_user_before ON mx.m1;
REVOKE TRIGGER ON mx.m1 FROM regress_mx_user;
SELECT matrix_check.health('m1');
-- rules
CREATE RULE m1_rule AS ON INSERT TO mx.m1 DO INSTEAD NOTHING;
\echo SQLSTATE :SQLSTATE
ALTER RULE m1_rule ON mx.m1 RENAME TO m1_rule2;
\echo SQLSTATE :SQLSTATE
DROP RULE IF EXISTS m1_rule ON mx.m1;
\echo SQLSTATE :SQLSTATE
-- a rule on another table may name the stream; what it runs is checked
CREATE RULE plain_erase AS ON DELETE TO mx.plain DO ALSO DELETE FROM mx.m1;
\echo SQLSTATE :SQLSTATE
DELETE FROM mx.plain;
\echo SQLSTATE :SQLSTATE
DROP RULE plain_erase ON mx.plain;
SELECT matrix_check.health('m1');
-- policies
ALTER TABLE mx.m1 ENABLE ROW LEVEL SECURITY;
CREATE POLICY m1_own_key ON mx.m1 FOR INSERT WITH CHECK (key = current_user);
\echo SQLSTATE :SQLSTATE
CREATE POLICY m1_read ON mx.m1 FOR SELECT USING (true);
\echo SQLSTATE :SQLSTATE
ALTER POLICY m1_own_key ON mx.m1 TO regress_mx_user;
\echo SQLSTATE :SQLSTATE
ALTER POLICY m1_own_key ON mx.m1 RENAME TO m1_key;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
SET SESSION AUTHORIZATION regress_mx_user;
INSERT INTO mx.m1 (key, payload) VALUES ('regress_mx_user', '{"by": "policy"}');
\echo SQLSTATE :SQLSTATE
INSERT INTO mx.m1 (key, payload) VALUES ('someone', '{"by": "policy"}');
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
DROP POLICY m1_key ON mx.m1;
\echo SQLSTATE :SQLSTATE
DROP POLICY m1_read ON mx.m1;
ALTER TABLE mx.m1 DISABLE ROW LEVEL SECURITY;
SELECT matrix_check.health('m1');

-- =====================================================================
-- 9. Inheritance and partitions, both ways
-- =====================================================================
-- A stream is neither a parent nor a child.  Nor may a table made USING
-- felix by hand be one, or carry constraints or defaults: a restore's
-- label would make it a stream (seclabel.c), and felix_publish writes
-- past the executor that checks them.
CREATE TABLE mx.child () INHERITS (mx.m1);
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.part PARTITION OF mx.m1 FOR VALUES IN (0);
\echo SQLSTATE :SQLSTATE
ALTER TABLE mx.plain INHERIT mx.m1;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.parted (shard int, seq bigint, key text, payload jsonb, published_at timestamptz)
  PARTITION BY LIST (shard);
ALTER TABLE mx.parted ATTACH PARTITION mx.m1 FOR VALUES IN (0);
\echo SQLSTATE :SQLSTATE
CREATE SCHEMA mx_sub CREATE TABLE child () INHERITS (mx.m1);
\echo SQLSTATE :SQLSTATE
-- a foreign table is a table too
RESET SESSION AUTHORIZATION;
CREATE FOREIGN DATA WRAPPER mx_fdw;
CREATE SERVER mx_server FOREIGN DATA WRAPPER mx_fdw;
CREATE FOREIGN TABLE mx.foreign_child () INHERITS (mx.m1) SERVER mx_server;
\echo SQLSTATE :SQLSTATE
CREATE FOREIGN TABLE mx.foreign_part PARTITION OF mx.m1 FOR VALUES IN (0) SERVER mx_server;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT count(*) AS children FROM pg_inherits WHERE inhparent = 'mx.m1'::regclass OR inhrelid = 'mx.m1'::regclass;
SELECT matrix_check.health('m1');
-- tables made USING felix by hand
CREATE TABLE mx.hand_part PARTITION OF mx.parted FOR VALUES IN (1) USING felix;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.hand_child () INHERITS (mx.plain) USING felix;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.hand_typed OF mx.m1_shape USING felix;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.hand_checked (shard int, seq bigint, key text CHECK (key <> 'bad'), payload jsonb,
                              published_at timestamptz) USING felix;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.hand_default (shard int, seq bigint, key text DEFAULT 'k', payload jsonb,
                              published_at timestamptz) USING felix;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.hand_like (LIKE mx.plain INCLUDING ALL) USING felix;
\echo SQLSTATE :SQLSTATE
SET default_table_access_method = felix;
CREATE TABLE mx.hand_constrained (shard int, seq bigint, key text, payload jsonb NOT NULL,
                                  published_at timestamptz, CHECK (shard >= 0));
\echo SQLSTATE :SQLSTATE
-- a plain one is inert, and drops without a trace
CREATE TABLE mx.hand_plain (shard int, seq bigint, key text, payload jsonb, published_at timestamptz);
\echo SQLSTATE :SQLSTATE
RESET default_table_access_method;
INSERT INTO mx.hand_plain (payload) VALUES ('{}');
\echo SQLSTATE :SQLSTATE
DROP TABLE mx.hand_plain;
-- tables shaped after a stream are ordinary tables
CREATE TABLE mx.like_m1 (LIKE mx.m1 INCLUDING ALL);
\echo SQLSTATE :SQLSTATE
SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.oid = 'mx.like_m1'::regclass;
DROP TABLE mx.like_m1;
CREATE TABLE mx.typed_m1 OF mx.m1;
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.referencing (seq bigint REFERENCES mx.m1 (seq));
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- the role with SELECT and REFERENCES, in a schema of its own
GRANT REFERENCES ON mx.m1 TO regress_mx_user;
SET SESSION AUTHORIZATION regress_mx_user;
CREATE TABLE mxu.child () INHERITS (mx.m1);
\echo SQLSTATE :SQLSTATE
CREATE TABLE mxu.like_m1 (LIKE mx.m1);
\echo SQLSTATE :SQLSTATE
DROP TABLE mxu.like_m1;
CREATE TABLE mxu.referencing (seq bigint REFERENCES mx.m1 (seq));
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
REVOKE REFERENCES ON mx.m1 FROM regress_mx_user;
DROP TABLE mx.parted;
SELECT matrix_check.health('m1');

-- =====================================================================
-- 10. Statistics, publications, comments, labels, grants
-- =====================================================================
CREATE STATISTICS mx.m1_stats ON shard, key FROM mx.m1;
\echo SQLSTATE :SQLSTATE
ANALYZE mx.m1;
ALTER STATISTICS mx.m1_stats SET STATISTICS 50;
\echo SQLSTATE :SQLSTATE
ALTER STATISTICS mx.m1_stats RENAME TO m1_stats2;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
DROP STATISTICS mx.m1_stats2;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
-- A stream's records are not in the WAL: a publication naming one would
-- carry none of them.  (A publication FOR ALL TABLES or FOR TABLES IN
-- SCHEMA, which only a superuser may create, includes streams all the
-- same, and carries none of their records either.)
CREATE PUBLICATION mx_publication FOR TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
CREATE PUBLICATION mx_publication FOR TABLE mx.plain, mx.m1 WITH (publish = 'insert');
\echo SQLSTATE :SQLSTATE
SET client_min_messages = error;  -- wal_level's warning
CREATE PUBLICATION mx_publication FOR TABLE mx.plain;
RESET client_min_messages;
ALTER PUBLICATION mx_publication ADD TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
ALTER PUBLICATION mx_publication SET TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
ALTER PUBLICATION mx_publication DROP TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS published_streams FROM pg_publication_tables WHERE pubname = 'mx_publication' AND tablename = 'm1';
DROP PUBLICATION mx_publication;
SELECT matrix_check.health('m1');
-- comments
COMMENT ON TABLE mx.m1 IS 'the matrix stream';
\echo SQLSTATE :SQLSTATE
COMMENT ON COLUMN mx.m1.payload IS 'what was published';
\echo SQLSTATE :SQLSTATE
COMMENT ON TYPE mx.m1 IS 'its row type';
\echo SQLSTATE :SQLSTATE
SELECT obj_description('mx.m1'::regclass, 'pg_class'), col_description('mx.m1'::regclass, 4);
SELECT matrix_check.health('m1');
SET SESSION AUTHORIZATION regress_mx_user;
COMMENT ON TABLE mx.m1 IS 'not yours';
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
COMMENT ON TABLE mx.m1 IS NULL;
\echo SQLSTATE :SQLSTATE
-- security labels: felix is the only provider, and its label on a stream
-- can be set only to what it is (seclabel.c)
SELECT label AS m1_label FROM pg_seclabel WHERE objoid = 'mx.m1'::regclass AND provider = 'felix' \gset
SECURITY LABEL FOR felix ON TABLE mx.m1 IS :'m1_label';
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
SECURITY LABEL ON TABLE mx.m1 IS '{"shards": 3, "replication_factor": 1, "consistency": "leader", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
SECURITY LABEL FOR felix ON TABLE mx.m1 IS NULL;
\echo SQLSTATE :SQLSTATE
SECURITY LABEL FOR felix ON COLUMN mx.m1.key IS 'x';
\echo SQLSTATE :SQLSTATE
SECURITY LABEL FOR selinux ON TABLE mx.m1 IS 'x';
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_user;
SECURITY LABEL FOR felix ON TABLE mx.m1 IS :'m1_label';
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT label = :'m1_label' AS label_kept FROM pg_seclabel WHERE objoid = 'mx.m1'::regclass;
-- grants: a role with the grant option passes them on; REVOKE takes them
-- back; the stream keeps its owner
GRANT SELECT ON TABLE mx.m1 TO regress_mx_user WITH GRANT OPTION;
\echo SQLSTATE :SQLSTATE
GRANT UPDATE (key), REFERENCES (seq) ON mx.m1 TO regress_mx_user;
\echo SQLSTATE :SQLSTATE
GRANT ALL ON ALL TABLES IN SCHEMA mx TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_user;
GRANT SELECT ON mx.m1 TO regress_mx_leaver;
\echo SQLSTATE :SQLSTATE
GRANT INSERT ON mx.m1 TO regress_mx_leaver;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT matrix_check.health('m1');
REVOKE ALL ON mx.m1 FROM regress_mx_leaver;
\echo SQLSTATE :SQLSTATE
REVOKE GRANT OPTION FOR SELECT ON mx.m1 FROM regress_mx_user CASCADE;
\echo SQLSTATE :SQLSTATE
REVOKE ALL ON TABLE mx.m1 FROM regress_mx_heir;
\echo SQLSTATE :SQLSTATE
REVOKE UPDATE (key), REFERENCES (seq) ON mx.m1 FROM regress_mx_user;
\echo SQLSTATE :SQLSTATE
SELECT grantee::regrole, privilege_type, is_grantable
  FROM aclexplode((SELECT relacl FROM pg_class WHERE oid = 'mx.m1'::regclass))
 ORDER BY grantee::regrole::text, privilege_type;
SELECT matrix_check.health('m1');
-- default privileges reach a stream created later, as any table
ALTER DEFAULT PRIVILEGES IN SCHEMA mx GRANT SELECT ON TABLES TO regress_mx_heir;
\echo SQLSTATE :SQLSTATE
SET search_path = mx, public;
SELECT felix_create_stream('m3', shards => 1);
RESET search_path;
ALTER DEFAULT PRIVILEGES IN SCHEMA mx REVOKE SELECT ON TABLES FROM regress_mx_heir;
SELECT has_table_privilege('regress_mx_heir', 'mx.m3', 'SELECT') AS heir_reads_m3;
SELECT matrix_check.health('m3');

-- =====================================================================
-- 11. Objects that depend on a stream
-- =====================================================================
-- Views, functions, types and columns of its row type depend on the
-- stream; they work, and its drop is refused (2BP01) until they go, or
-- takes them along with CASCADE.  On stream m2:
SET search_path = mx, public;
SELECT felix_create_stream('m2', shards => 1);
RESET search_path;
GRANT SELECT, INSERT ON mx.m2 TO regress_mx_user;
CREATE VIEW mx.m1_view AS SELECT shard, seq, key, payload FROM mx.m1;
\echo SQLSTATE :SQLSTATE
INSERT INTO mx.m1_view (key, payload) VALUES ('view', '{"by": "view"}');
\echo SQLSTATE :SQLSTATE
UPDATE mx.m1_view SET key = 'changed';
\echo SQLSTATE :SQLSTATE
DELETE FROM mx.m1_view;
\echo SQLSTATE :SQLSTATE
SELECT key, payload FROM mx.m1_view WHERE key = 'view';
DROP VIEW mx.m1_view;
CREATE MATERIALIZED VIEW mx.m1_keys AS SELECT key, count(*) FROM mx.m1 GROUP BY key;
\echo SQLSTATE :SQLSTATE
INSERT INTO mx.m1 (key, payload) VALUES ('view', '{}');
REFRESH MATERIALIZED VIEW mx.m1_keys;
\echo SQLSTATE :SQLSTATE
SELECT * FROM mx.m1_keys WHERE key = 'view';
DROP MATERIALIZED VIEW mx.m1_keys;
SELECT matrix_check.health('m1');
-- on m2: a view of the role with SELECT, and the owner's objects
SET SESSION AUTHORIZATION regress_mx_user;
CREATE VIEW mxu.m2_view AS SELECT seq, payload FROM mx.m2;
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
CREATE FUNCTION mx.m2_all() RETURNS SETOF mx.m2 LANGUAGE sql AS 'SELECT * FROM mx.m2';
\echo SQLSTATE :SQLSTATE
CREATE PROCEDURE mx.m2_publish(k text) BEGIN ATOMIC
    INSERT INTO mx.m2 (key, payload) VALUES (k, '{"by": "procedure"}');
END;
\echo SQLSTATE :SQLSTATE
CALL mx.m2_publish('called');
\echo SQLSTATE :SQLSTATE
CREATE DOMAIN mx.m2_domain AS mx.m2;
\echo SQLSTATE :SQLSTATE
CREATE TYPE mx.m2_wrapper AS (record mx.m2);
\echo SQLSTATE :SQLSTATE
CREATE TABLE mx.m2_rows (r mx.m2);
\echo SQLSTATE :SQLSTATE
CREATE SEQUENCE mx.m2_counter OWNED BY mx.m2.seq;
\echo SQLSTATE :SQLSTATE
CREATE SEQUENCE mx.m1_counter;
ALTER SEQUENCE mx.m1_counter OWNED BY mx.m1.seq;
\echo SQLSTATE :SQLSTATE
SELECT key FROM mx.m2_all() WHERE key = 'called';
SELECT matrix_check.health('m2');
-- its drop is refused while they depend on it...
\set VERBOSITY terse
SELECT felix_drop_stream('m2');
\echo SQLSTATE :SQLSTATE
\set VERBOSITY default
SELECT matrix_check.health('m2');
-- ...and takes them along with CASCADE, cluster-wide
\set VERBOSITY terse
DROP TABLE mx.m2 CASCADE;
\echo SQLSTATE :SQLSTATE
\set VERBOSITY default
RESET SESSION AUTHORIZATION;
SELECT count(*) AS m2_left FROM felix.cluster_streams WHERE name = 'm2';
SELECT to_regclass('mxu.m2_view') AS user_view, to_regtype('mx.m2_wrapper') AS wrapper,
       to_regclass('mx.m2_counter') AS counter;
SET SESSION AUTHORIZATION regress_mx_owner;
-- a procedure that tries to move a stream
CREATE PROCEDURE mx.move_m1() LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'ALTER TABLE mx.m1 SET SCHEMA mx_other';
END $$;
CALL mx.move_m1();
\echo SQLSTATE :SQLSTATE
DROP PROCEDURE mx.move_m1();
-- the other relation kinds' DROP statements do not take a stream's table
DROP VIEW mx.m1;
\echo SQLSTATE :SQLSTATE
DROP MATERIALIZED VIEW mx.m1;
\echo SQLSTATE :SQLSTATE
DROP SEQUENCE mx.m1;
\echo SQLSTATE :SQLSTATE
DROP FOREIGN TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
DROP TYPE mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');

-- =====================================================================
-- 12. Extensions and tablespaces (superuser)
-- =====================================================================
RESET SESSION AUTHORIZATION;
-- A member of an extension is left out of pg_dump and is not dropped
-- alone: felix_drop_stream would be refused.
ALTER EXTENSION plpgsql ADD TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
ALTER EXTENSION felix ADD TABLE mx.m1;
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS extension_members FROM pg_depend
 WHERE classid = 'pg_class'::regclass AND objid = 'mx.m1'::regclass AND deptype = 'e';
-- ALTER TABLE ALL IN TABLESPACE moves a stream's empty relation file
-- along; its records stay in felix.data_directory
SET allow_in_place_tablespaces = on;
CREATE TABLESPACE mx_space LOCATION '';
ALTER TABLE ALL IN TABLESPACE pg_default OWNED BY regress_mx_owner SET TABLESPACE mx_space;
\echo SQLSTATE :SQLSTATE
SELECT spcname FROM pg_class c JOIN pg_tablespace t ON t.oid = c.reltablespace WHERE c.oid = 'mx.m1'::regclass;
SELECT matrix_check.health('m1');
ALTER TABLE ALL IN TABLESPACE mx_space SET TABLESPACE pg_default;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
DROP TABLESPACE mx_space;
RESET allow_in_place_tablespaces;
DROP SERVER mx_server;
DROP FOREIGN DATA WRAPPER mx_fdw;

-- =====================================================================
-- 13. Event triggers (superuser)
-- =====================================================================
-- Event triggers see the statements that reach a stream; what they run
-- passes the same checks; one that refuses a drop leaves the stream whole.
CREATE FUNCTION matrix_check.show_command() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        RAISE NOTICE 'event trigger: % %', c.command_tag, c.object_identity;
    END LOOP;
END $$;
CREATE EVENT TRIGGER mx_show ON ddl_command_end EXECUTE FUNCTION matrix_check.show_command();
\echo SQLSTATE :SQLSTATE
SET SESSION AUTHORIZATION regress_mx_owner;
COMMENT ON TABLE mx.m1 IS 'seen';
GRANT SELECT ON mx.m1 TO regress_mx_heir;
ALTER TABLE mx.m1 ALTER COLUMN key SET STATISTICS 100;
ALTER TABLE mx.m1 ADD COLUMN extra int;
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m1');
RESET SESSION AUTHORIZATION;
ALTER EVENT TRIGGER mx_show DISABLE;
\echo SQLSTATE :SQLSTATE
-- an event trigger that tries to move the stream after each command
CREATE FUNCTION matrix_check.move_stream() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    IF tg_tag = 'COMMENT' THEN
        EXECUTE 'ALTER TABLE mx.m1 SET SCHEMA mx_other';
    END IF;
END $$;
CREATE EVENT TRIGGER mx_move ON ddl_command_end EXECUTE FUNCTION matrix_check.move_stream();
COMMENT ON TABLE mx.m1 IS 'moved?';
\echo SQLSTATE :SQLSTATE
DROP EVENT TRIGGER mx_move;
-- an event trigger that refuses drops
CREATE FUNCTION matrix_check.no_drops() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'no drops today' USING ERRCODE = 'object_in_use';
END $$;
CREATE EVENT TRIGGER mx_no_drops ON sql_drop EXECUTE FUNCTION matrix_check.no_drops();
SELECT felix_drop_stream('m3');
\echo SQLSTATE :SQLSTATE
SELECT matrix_check.health('m3');
DROP EVENT TRIGGER mx_no_drops;
DROP EVENT TRIGGER mx_show;
\echo SQLSTATE :SQLSTATE
SELECT felix_drop_stream('m3');
SELECT count(*) AS m3_left FROM felix.cluster_streams WHERE name = 'm3';

-- =====================================================================
-- 14. Schemas
-- =====================================================================
-- DROP SCHEMA ... CASCADE drops the streams in it, cluster-wide.
CREATE SCHEMA mx_drop AUTHORIZATION regress_mx_owner;
SET SESSION AUTHORIZATION regress_mx_owner;
SET search_path = mx_drop, public;
SELECT felix_create_stream('d1', shards => 2);
RESET search_path;
SELECT matrix_check.health('d1');
ALTER SCHEMA mx_drop RENAME TO mx_dropped;
\echo SQLSTATE :SQLSTATE
\set VERBOSITY terse
DROP SCHEMA mx_drop CASCADE;
\echo SQLSTATE :SQLSTATE
\set VERBOSITY default
SELECT count(*) AS d1_left FROM felix_streams WHERE stream = 'd1';
RESET SESSION AUTHORIZATION;
SELECT count(*) AS d1_left FROM felix.cluster_streams WHERE name = 'd1';

-- =====================================================================
-- Afterwards: m1 is healthy, and drops cluster-wide
-- =====================================================================
SET SESSION AUTHORIZATION regress_mx_owner;
SELECT matrix_check.health('m1');
SELECT felix_drop_stream('m1');
RESET SESSION AUTHORIZATION;
SELECT count(*) AS left_behind FROM felix.cluster_streams
 WHERE name IN ('m1', 'm2', 'm3', 'm4', 'h1', 'h2', 'l1', 'l2', 'd1');
SELECT count(*) AS left_behind FROM felix.streams
 WHERE name IN ('m1', 'm2', 'm3', 'm4', 'h1', 'h2', 'l1', 'l2', 'd1');
REVOKE CREATE ON DATABASE :"DBNAME" FROM regress_mx_owner;
\set VERBOSITY terse
DROP SCHEMA mx, mx_other, mxu, matrix_check CASCADE;
\set VERBOSITY default
DROP OWNED BY regress_mx_owner, regress_mx_user, regress_mx_heir, regress_mx_leaver;
DROP ROLE regress_mx_owner, regress_mx_user, regress_mx_heir, regress_mx_leaver;
