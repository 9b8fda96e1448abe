--
-- hostile: what an ordinary role with no grants (regress_hostile), and one
-- that may create objects (regress_hostile_owner, as the public schema let
-- everyone before PostgreSQL 15), can do against felix.  Every attempt to
-- reach past its grants is refused with a SQLSTATE (\echo after each), and
-- afterwards the server is up and every stream keeps its records, its
-- control-plane rows and its lease.  The numbered comments count the
-- distinct hostile inputs.
--
SELECT felix_create_stream('hx', shards => 2);
SELECT count(*) FROM felix_publish_batch('hx', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[],
                                         ARRAY['a', 'b', 'c']);
SELECT felix_create_stream('hx_text', payload_type => 'text');
SELECT * FROM felix_publish('hx_text', 'kept');
CREATE ROLE regress_hostile LOGIN;
CREATE ROLE regress_hostile_owner LOGIN;
CREATE SCHEMA evil AUTHORIZATION regress_hostile_owner;
GRANT CREATE ON SCHEMA public TO regress_hostile_owner;
-- What the control plane holds for hx, to compare with at the end.
SELECT creation_id AS hx_id FROM felix.cluster_streams WHERE name = 'hx' \gset
-- Limits a superuser sets for the session before it is handed over.
SET felix.max_transaction_bytes = '64kB';
SET felix.max_streams_per_role = 2;
SET felix.max_shards_per_role = 4;

-- =====================================================================
-- An ordinary role with no grants
-- =====================================================================
SET SESSION AUTHORIZATION regress_hostile;

-- Secrets: the connection settings are superuser-only.
-- 1
SHOW felix.node_conninfo;
\echo SQLSTATE :SQLSTATE
-- 2
SHOW felix.control_conninfo;
\echo SQLSTATE :SQLSTATE
-- 3
SELECT current_setting('felix.node_conninfo');
\echo SQLSTATE :SQLSTATE
-- 4
SELECT count(*) AS conninfo_settings_visible FROM pg_settings WHERE name LIKE 'felix.%conninfo';
-- 5: node addresses are for pg_read_all_stats only
SELECT name, conninfo IS NULL AS conninfo_hidden FROM felix_nodes;

-- Limits are not the user's to raise.
-- 6
SET felix.max_record_bytes = '64MB';
\echo SQLSTATE :SQLSTATE
-- 7
SET felix.max_transaction_bytes = '1GB';
\echo SQLSTATE :SQLSTATE
-- 8
SET felix.max_streams_per_role = 1000000;
\echo SQLSTATE :SQLSTATE
-- 9
SET felix.max_shards_per_role = 1000000;
\echo SQLSTATE :SQLSTATE
-- 10
SET felix.max_shards_per_stream = 65536;
\echo SQLSTATE :SQLSTATE

-- Creating streams needs CREATE on the schema; temporary ones never exist.
-- 11
SELECT felix_create_stream('hx_mine');
\echo SQLSTATE :SQLSTATE
-- 12: a temporary schema first in search_path, and a type of its own there
-- standing in for jsonb
CREATE DOMAIN pg_temp.jsonb AS integer;
SET search_path = pg_temp, public, pg_catalog;
SELECT felix_create_stream('hx_squat', shards => 256);
\echo SQLSTATE :SQLSTATE
RESET search_path;
-- (a temporary type shadows jsonb in this session's own statements too)
DROP DOMAIN pg_temp.jsonb;

-- A table made USING felix by hand, with a stream's name, is inert, and
-- dropping it reaches nobody.
CREATE TEMP TABLE hx (shard int, seq bigint, key text, payload jsonb,
                      published_at timestamptz) USING felix;
-- 13
INSERT INTO pg_temp.hx (payload) VALUES ('{}');
\echo SQLSTATE :SQLSTATE
-- 14
SELECT * FROM pg_temp.hx;
\echo SQLSTATE :SQLSTATE
-- 15
COPY pg_temp.hx (payload) FROM STDIN;
{}
\.
\echo SQLSTATE :SQLSTATE
-- 16
DROP TABLE pg_temp.hx;
-- 17: the same through default_table_access_method: inert, and its drop
-- tells nobody anything
SET default_table_access_method = felix;
CREATE TEMP TABLE hx_text (shard int, seq bigint, key text, payload text,
                           published_at timestamptz);
DROP TABLE hx_text;
RESET default_table_access_method;

-- Publishing needs INSERT, reading SELECT, maintenance ownership.
-- 18
SELECT * FROM felix_publish('hx', '{"evil": 1}'::jsonb);
\echo SQLSTATE :SQLSTATE
-- 19
SELECT * FROM felix_publish_batch('hx', ARRAY['{"evil": 1}']::jsonb[]);
\echo SQLSTATE :SQLSTATE
-- 20
INSERT INTO hx (payload) VALUES ('{"evil": 1}');
\echo SQLSTATE :SQLSTATE
-- 21
SELECT * FROM hx;
\echo SQLSTATE :SQLSTATE
-- 22
COPY hx TO STDOUT;
\echo SQLSTATE :SQLSTATE
-- 23
SELECT felix_enforce_retention('hx');
\echo SQLSTATE :SQLSTATE
-- 24
SELECT felix_drop_stream('hx');
\echo SQLSTATE :SQLSTATE
-- 25
DROP TABLE hx;
\echo SQLSTATE :SQLSTATE
-- 26
ALTER TABLE hx OWNER TO regress_hostile;
\echo SQLSTATE :SQLSTATE

-- felix's internal functions and catalogs.
-- 27
SELECT felix.truncate_after('hx', 0, 0);
\echo SQLSTATE :SQLSTATE
-- 28
SELECT * FROM felix.replicate('hx', 0, 99, 'regress', 'x', 'ship', 0, 0, ''::bytea);
\echo SQLSTATE :SQLSTATE
-- 29
SELECT count(*) FROM felix.cp_heartbeat('regress', 'host=/nowhere', '00000000-0000-4000-8000-000000000000', 1, '00000000-0000-4000-8000-000000000000');
\echo SQLSTATE :SQLSTATE
-- 30
SELECT felix.cp_drop_stream('hx', :'hx_id');
\echo SQLSTATE :SQLSTATE
-- 31
SELECT felix.cp_create_stream('hx_cp');
\echo SQLSTATE :SQLSTATE
-- 32
SELECT felix.cp_report('regress', '[]');
\echo SQLSTATE :SQLSTATE
-- 33
SELECT felix.cp_tick('regress', '00000000-0000-4000-8000-000000000000');
\echo SQLSTATE :SQLSTATE
-- 34
SELECT felix_create_node_role('evil');
\echo SQLSTATE :SQLSTATE
-- 35
SELECT count(*) FROM felix.streams;
\echo SQLSTATE :SQLSTATE
-- 36
SELECT count(*) FROM felix.cluster_streams;
\echo SQLSTATE :SQLSTATE
-- 37
SELECT count(*) FROM felix.assignments;
\echo SQLSTATE :SQLSTATE
-- 38
LOAD 'felix';
\echo SQLSTATE :SQLSTATE

-- The views show only streams the reader may SELECT -- called directly too.
-- 39
SELECT count(*) AS streams_seen FROM felix_streams;
SELECT count(*) AS shards_seen FROM felix_shards;
SELECT count(*) AS shards_seen_directly FROM felix.shard_states();
SELECT count(*) AS followers_seen FROM felix_replication;
RESET SESSION AUTHORIZATION;

-- With SELECT granted, the stream shows (and only that one).
GRANT SELECT ON hx TO regress_hostile;
SET SESSION AUTHORIZATION regress_hostile;
SELECT stream FROM felix_streams;
SELECT stream, shard, state FROM felix_shards;
SELECT count(*) AS readable FROM hx;
RESET SESSION AUTHORIZATION;

-- With INSERT granted: no more memory than felix.max_transaction_bytes,
-- no record larger than felix.max_record_bytes.
GRANT INSERT ON hx TO regress_hostile;
SET SESSION AUTHORIZATION regress_hostile;
-- 40
INSERT INTO hx (key, payload)
SELECT 'k', jsonb_build_object('pad', repeat('x', 1000)) FROM generate_series(1, 100);
\echo SQLSTATE :SQLSTATE
-- 41
SELECT * FROM felix_publish('hx', jsonb_build_object('big', repeat('x', 2 * 1024 * 1024)), shard => 0);
\echo SQLSTATE :SQLSTATE
-- 42: INSERT is not ownership: no record is restored at a seq and time of its choosing
INSERT INTO hx (shard, seq, key, payload, published_at) VALUES (0, 0, 'k', '{}', '2000-01-01');
\echo SQLSTATE :SQLSTATE
-- 43: nor is the stream's label (its settings) changed or removed
SECURITY LABEL FOR felix ON TABLE hx IS '{"shards": 1, "replication_factor": 1, "consistency": "leader", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
SECURITY LABEL FOR felix ON TABLE hx IS NULL;
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
REVOKE ALL ON hx FROM regress_hostile;

-- =====================================================================
-- A role that may create objects: its own schema, and CREATE on public
-- =====================================================================
-- A trap: an operator or function that, run by anyone but its owner (a
-- felix worker, or felix's catalog queries run as the extension's owner),
-- records it and tries to make its owner a superuser.
CREATE TABLE public.trap_log (who name, what text);
GRANT INSERT ON public.trap_log TO PUBLIC;
SET SESSION AUTHORIZATION regress_hostile_owner;
CREATE FUNCTION evil.trap_text_eq(a text, b text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'regress_hostile_owner' THEN
        INSERT INTO public.trap_log VALUES (current_user, 'text = text');
        EXECUTE 'ALTER ROLE regress_hostile_owner SUPERUSER';
    END IF;
    RETURN a OPERATOR(pg_catalog.=) b;
END
$$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.trap_text_eq);
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.trap_text_eq);
CREATE FUNCTION public.trap_mul(a numeric, b integer) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'regress_hostile_owner' THEN
        INSERT INTO public.trap_log VALUES (current_user, 'numeric * integer');
        EXECUTE 'ALTER ROLE regress_hostile_owner SUPERUSER';
    END IF;
    RETURN a OPERATOR(pg_catalog.*) b;
END
$$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.trap_mul);
-- A type of its own standing in for a payload type.
CREATE TYPE evil.jsonb AS (a integer, b integer);
CREATE TYPE evil.text AS (a integer);
SET search_path = evil, public, pg_catalog;

-- 42: its stream gets pg_catalog's jsonb, not evil.jsonb
SELECT felix_create_stream('ho_shadow', shards => 2);
SELECT a.atttypid OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype AS payload_is_jsonb
  FROM pg_catalog.pg_attribute a
 WHERE a.attrelid OPERATOR(pg_catalog.=) 'evil.ho_shadow'::pg_catalog.regclass
   AND a.attname OPERATOR(pg_catalog.=) 'payload';
SELECT * FROM felix_publish('ho_shadow', '{"a": 1}'::pg_catalog.jsonb, shard => 0);
SELECT seq, payload FROM ho_shadow;
-- 43: with a text stream too
SELECT felix_create_stream('ho_text', payload_type => 'text');
SELECT * FROM felix_publish('ho_text', 'plain'::pg_catalog.text);
SELECT seq, payload FROM ho_text;
-- 44: felix's own calls under that search_path run none of its operators
SELECT count(*) FROM felix_streams;
SELECT count(*) FROM felix_shards;
SELECT felix_enforce_retention('ho_text');
-- 45: no more streams than felix.max_streams_per_role ...
SELECT felix_create_stream('ho_third');
\echo SQLSTATE :SQLSTATE
SELECT felix_drop_stream('ho_text');
-- 46: ... and no more shards than felix.max_shards_per_role
SELECT felix_create_stream('ho_wide', shards => 3);
\echo SQLSTATE :SQLSTATE
-- 47: a stream name already taken is refused before the control plane is asked
SELECT felix_create_stream('hx');
\echo SQLSTATE :SQLSTATE
RESET search_path;
RESET SESSION AUTHORIZATION;

-- The workers (node, heartbeat) have gone over the streams meanwhile:
-- wait for one more pass of each, then look for the trap's traces.
SELECT pg_sleep(2.5);
SELECT count(*) AS trap_sprung FROM public.trap_log;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_hostile_owner';

-- 48: a stream whose table does not have the columns its definition says
-- (here by editing the catalog) is refused, never read into the wrong type.
UPDATE felix.streams SET payload_type = 'text' WHERE name = 'ho_shadow';
SELECT * FROM evil.ho_shadow;
\echo SQLSTATE :SQLSTATE
INSERT INTO evil.ho_shadow (payload) VALUES ('{}');
\echo SQLSTATE :SQLSTATE
UPDATE felix.streams SET payload_type = 'jsonb' WHERE name = 'ho_shadow';

-- Operations on someone else's streams.
SET SESSION AUTHORIZATION regress_hostile;
-- 49: rebuilding a follower of a stream the role does not own
SELECT felix_rebuild('hx', 0, 'regress');
\echo SQLSTATE :SQLSTATE
-- 50: ... or of nothing at all
SELECT felix_rebuild(NULL, NULL, NULL);
\echo SQLSTATE :SQLSTATE
-- 51: asking for every halted follower's rebuild touches none of others'
SELECT felix_rebuild_halted() AS asked;
-- 52: the halted listing shows only what the role may read
SELECT count(*) AS halted_visible FROM felix_halted;
-- 53: reading a stream it may not SELECT through the node-to-node read
SELECT count(*) FROM felix.read_shard('hx', :'hx_id', 0, 0, 10, 10);
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;

-- =====================================================================
-- Afterwards: the server is up, hx is intact everywhere it is known
-- =====================================================================
SELECT shard, seq, payload FROM hx ORDER BY shard, seq;
SELECT seq, payload FROM hx_text;
SELECT count(*) AS cluster_rows, bool_and(creation_id = :'hx_id') AS same_identity
  FROM felix.cluster_streams WHERE name = 'hx';
SELECT count(*) AS assignments, bool_and(taken_generation = generation) AS leased
  FROM felix.assignments WHERE stream = 'hx';
SELECT stream, shard, role, state FROM felix_shards WHERE stream IN ('hx', 'hx_text') ORDER BY 1, 2;
SELECT count(*) AS streams_named_by_the_attacker
  FROM felix.cluster_streams WHERE name IN ('hx_mine', 'hx_squat', 'hx_cp', 'ho_third', 'ho_wide');

-- Tidy up.
SELECT felix_drop_stream('hx');
SELECT felix_drop_stream('hx_text');
SELECT felix_drop_stream('ho_shadow');
DROP TABLE public.trap_log;
-- (public.= goes with the function it calls, in evil)
DROP SCHEMA evil CASCADE;
REVOKE CREATE ON SCHEMA public FROM regress_hostile_owner;
DROP OPERATOR public.* (numeric, integer);
DROP FUNCTION public.trap_mul(numeric, integer);
DROP ROLE regress_hostile, regress_hostile_owner;
RESET felix.max_transaction_bytes;
RESET felix.max_streams_per_role;
RESET felix.max_shards_per_role;
