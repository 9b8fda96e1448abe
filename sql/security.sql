--
-- security: the second round of hostile inputs (issue 17), each first seen
-- crashing or slipping past felix on the code before its fix.  An ordinary
-- role that owns a schema (regress_sec_owner) and one holding only the
-- grants it is given (regress_sec_user).  Each refusal is followed by
-- \echo SQLSTATE, so a statement that wrongly succeeds shows 00000.
--
CREATE ROLE regress_sec_owner LOGIN;
CREATE ROLE regress_sec_user LOGIN;
CREATE SCHEMA sec AUTHORIZATION regress_sec_owner;
GRANT USAGE ON SCHEMA sec TO regress_sec_user;

-- =====================================================================
-- 1. An adopted table keeps only a payload type a stream can have
-- =====================================================================
-- SECURITY LABEL FOR felix turns a table USING felix into a stream (that
-- is how pg_dump restores one).  The payload column's type must be
-- exactly jsonb, text or bytea: any other type, a domain over one of them
-- included, is refused, and the table stays inert.
SET SESSION AUTHORIZATION regress_sec_owner;
CREATE TABLE sec.adopt_int (shard int, seq bigint, key text, payload int4,
                            published_at timestamptz) USING felix;
SECURITY LABEL FOR felix ON TABLE sec.adopt_int IS '{"shards": 1, "replication_factor": 1, "consistency": "quorum", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
CREATE TABLE sec.adopt_uuid (shard int, seq bigint, key text, payload uuid,
                             published_at timestamptz) USING felix;
SECURITY LABEL FOR felix ON TABLE sec.adopt_uuid IS '{"shards": 1, "replication_factor": 1, "consistency": "quorum", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
CREATE DOMAIN sec.blob AS bytea;
CREATE TABLE sec.adopt_domain (shard int, seq bigint, key text, payload sec.blob,
                               published_at timestamptz) USING felix;
SECURITY LABEL FOR felix ON TABLE sec.adopt_domain IS '{"shards": 1, "replication_factor": 1, "consistency": "quorum", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
-- none of them became a stream: every write is refused, nothing crashes
SELECT count(*) AS adopted FROM felix_streams WHERE stream LIKE 'adopt_%';
INSERT INTO sec.adopt_int (payload) VALUES (42);
\echo SQLSTATE :SQLSTATE
SELECT felix_publish('adopt_int', '42'::text);
\echo SQLSTATE :SQLSTATE
INSERT INTO sec.adopt_uuid (payload) VALUES ('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11');
\echo SQLSTATE :SQLSTATE
-- a table of the right shape is still adopted
CREATE TABLE sec.adopt_ok (shard int, seq bigint, key text, payload bytea,
                           published_at timestamptz) USING felix;
SECURITY LABEL FOR felix ON TABLE sec.adopt_ok IS '{"shards": 1, "replication_factor": 1, "consistency": "quorum", "storage": "local"}';
SELECT * FROM felix_publish('adopt_ok', '\x00ff'::bytea);
SELECT seq, payload FROM sec.adopt_ok;
RESET SESSION AUTHORIZATION;

-- =====================================================================
-- 3. Rules: a stream never becomes a view, nor rewrites its statements
-- =====================================================================
SET SESSION AUTHORIZATION regress_sec_owner;
SET search_path = sec, public;
SELECT felix_create_stream('ruled', shards => 2);
RESET search_path;
-- the "_RETURN" rule that turns an empty table into a view
CREATE RULE "_RETURN" AS ON SELECT TO sec.ruled DO INSTEAD
  SELECT 0 AS shard, 0::bigint AS seq, NULL::text AS key, '{}'::jsonb AS payload,
         now() AS published_at;
\echo SQLSTATE :SQLSTATE
CREATE RULE swallow AS ON INSERT TO sec.ruled DO INSTEAD NOTHING;
\echo SQLSTATE :SQLSTATE
CREATE RULE elsewhere AS ON INSERT TO sec.ruled DO ALSO NOTIFY ruled;
\echo SQLSTATE :SQLSTATE
SELECT relkind FROM pg_class WHERE oid = 'sec.ruled'::regclass;
SELECT count(*) AS rules FROM pg_rewrite WHERE ev_class = 'sec.ruled'::regclass;
SELECT * FROM felix_publish('ruled', '{"still": "a stream"}'::jsonb, shard => 1);
SELECT felix_drop_stream('ruled');
RESET SESSION AUTHORIZATION;
SELECT count(*) AS cluster_rows FROM felix.cluster_streams WHERE name = 'ruled';

-- =====================================================================
-- 4. Row security and triggers apply to every way in
-- =====================================================================
-- INSERT and COPY go through the executor, which applies the stream's
-- policies and its BEFORE ROW and statement triggers.  felix_publish and
-- felix_publish_batch do not: they refuse a caller the policies apply to,
-- and any stream with an enabled INSERT trigger, and point to INSERT.
SET SESSION AUTHORIZATION regress_sec_owner;
SET search_path = sec, public;
SELECT felix_create_stream('guarded', shards => 1);
RESET search_path;
ALTER TABLE sec.guarded ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_key ON sec.guarded FOR INSERT WITH CHECK (key = current_user);
CREATE POLICY read_all ON sec.guarded FOR SELECT USING (true);
GRANT INSERT, SELECT ON sec.guarded TO regress_sec_user;
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_sec_user;
INSERT INTO sec.guarded (key, payload) VALUES ('regress_sec_user', '{"mine": true}');
INSERT INTO sec.guarded (key, payload) VALUES ('alice', '{"admin": true}');
\echo SQLSTATE :SQLSTATE
SELECT felix_publish('guarded', '{"admin": true}'::jsonb, key => 'alice');
\echo SQLSTATE :SQLSTATE
SELECT felix_publish('guarded', '{"mine": true}'::jsonb, key => 'regress_sec_user');
\echo SQLSTATE :SQLSTATE
SELECT felix_publish_batch('guarded', ARRAY['{"admin": true}']::jsonb[], ARRAY['alice']);
\echo SQLSTATE :SQLSTATE
COPY sec.guarded (key, payload) FROM STDIN;
alice	{"copied": true}
\.
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
-- the owner is not subject to its own policies (no FORCE): its calls pass
SET SESSION AUTHORIZATION regress_sec_owner;
SELECT * FROM felix_publish('guarded', '{"owner": true}'::jsonb, key => 'anyone');
-- ... until it forces them on itself
ALTER TABLE sec.guarded FORCE ROW LEVEL SECURITY;
SELECT felix_publish('guarded', '{"owner": true}'::jsonb, key => 'anyone');
\echo SQLSTATE :SQLSTATE
ALTER TABLE sec.guarded NO FORCE ROW LEVEL SECURITY;
-- a BEFORE INSERT trigger that rejects some payloads
CREATE FUNCTION sec.no_admin() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.payload ? 'admin' THEN
    RAISE EXCEPTION 'no admin payloads' USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER no_admin BEFORE INSERT ON sec.guarded FOR EACH ROW EXECUTE FUNCTION sec.no_admin();
INSERT INTO sec.guarded (key, payload) VALUES ('anyone', '{"admin": true}');
\echo SQLSTATE :SQLSTATE
SELECT felix_publish('guarded', '{"admin": true}'::jsonb, key => 'anyone');
\echo SQLSTATE :SQLSTATE
SELECT felix_publish_batch('guarded', ARRAY['{"admin": true}']::jsonb[]);
\echo SQLSTATE :SQLSTATE
-- a disabled trigger checks nothing, and the functions work again
ALTER TABLE sec.guarded DISABLE TRIGGER no_admin;
SELECT * FROM felix_publish('guarded', '{"trigger": "off"}'::jsonb, key => 'anyone');
-- what the stream holds: nothing from alice, nothing with admin
SELECT seq, key, payload FROM sec.guarded ORDER BY seq;
SELECT felix_drop_stream('guarded');
DROP FUNCTION sec.no_admin();
RESET SESSION AUTHORIZATION;

-- =====================================================================
-- 5. Only a stream's owner drops it: not the owner of its schema
-- =====================================================================
-- A drop reaches every node (the worker makes the table on every node, in
-- whatever schema of that name is there: TAP 142 tries it on two).  Here
-- regress_sec_user owns schema lent, where regress_sec_owner (granted
-- CREATE) made a stream.
CREATE SCHEMA lent AUTHORIZATION regress_sec_user;
GRANT USAGE, CREATE ON SCHEMA lent TO regress_sec_owner;
SET SESSION AUTHORIZATION regress_sec_owner;
SET search_path = lent, public;
SELECT felix_create_stream('borrowed', shards => 1);
SELECT * FROM felix_publish('borrowed', '{"kept": true}'::jsonb);
RESET search_path;
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_sec_user;
DROP SCHEMA lent CASCADE;
\echo SQLSTATE :SQLSTATE
DROP TABLE lent.borrowed;
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
SELECT count(*) AS cluster_rows FROM felix.cluster_streams WHERE name = 'borrowed';
SELECT payload FROM lent.borrowed;
-- its owner may
SET SESSION AUTHORIZATION regress_sec_owner;
SELECT felix_drop_stream('borrowed');
RESET SESSION AUTHORIZATION;
SELECT count(*) AS cluster_rows FROM felix.cluster_streams WHERE name = 'borrowed';
DROP SCHEMA lent;

-- =====================================================================
-- 6. Internal functions are not PUBLIC's; batches are one-dimensional
-- =====================================================================
SET SESSION AUTHORIZATION regress_sec_user;
SELECT felix.node_name();
\echo SQLSTATE :SQLSTATE
SELECT felix.node_role('x');
\echo SQLSTATE :SQLSTATE
SELECT felix.check_node_name('x');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_score('x', 'y', 0);
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
-- the functions of felix's schema that PUBLIC may still execute
SELECT p.oid::regprocedure AS public_function
  FROM pg_proc p
 WHERE p.pronamespace = 'felix'::regnamespace
   AND has_function_privilege('regress_sec_user', p.oid, 'EXECUTE')
 ORDER BY p.oid::regprocedure::text;
SELECT felix_create_stream('flat', shards => 1);
SELECT felix_publish_batch('flat', ARRAY[['{"a": 1}', '{"a": 2}'], ['{"a": 3}', '{"a": 4}']]::jsonb[]);
\echo SQLSTATE :SQLSTATE
SELECT felix_publish_batch('flat', ARRAY['{"a": 1}']::jsonb[], ARRAY[['k']]);
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS records FROM flat;
SELECT felix_drop_stream('flat');

-- =====================================================================
-- Afterwards: the tables that were never adopted drop without a trace
-- =====================================================================
SET SESSION AUTHORIZATION regress_sec_owner;
SELECT felix_drop_stream('adopt_ok');
RESET SESSION AUTHORIZATION;
DROP SCHEMA sec CASCADE;
SELECT count(*) AS left_behind FROM felix.cluster_streams
 WHERE name IN ('adopt_int', 'adopt_uuid', 'adopt_domain', 'adopt_ok', 'ruled', 'guarded', 'flat');
DROP ROLE regress_sec_owner, regress_sec_user;
