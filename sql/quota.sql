--
-- quota: felix.max_bytes_per_role, the bytes the streams a role owns may
-- hold on this node (felix_shards.bytes over their shards).  It is checked
-- when records are published -- felix_publish, felix_publish_batch, the
-- commit of INSERT and COPY -- and the stream's owner pays, whoever
-- publishes.  A role cannot raise its own cap, dropping a stream gives its
-- bytes back, and superusers are exempt.  Records are 200000, 30000,
-- 20000 or 10000 bytes, so that what a batch's framing adds never decides
-- a case.  Refusals are shown terse: their detail counts bytes, which
-- depend on the segment format.
--
\set VERBOSITY terse
CREATE ROLE regress_quota_owner LOGIN;
CREATE ROLE regress_quota_writer LOGIN;
GRANT CREATE ON SCHEMA public TO regress_quota_owner;
SELECT current_user AS quota_superuser \gset
-- no cap by default
SHOW felix.max_bytes_per_role;

-- Without a cap the owner publishes as much as it likes: 600000 bytes in qb.
SET SESSION AUTHORIZATION regress_quota_owner;
SELECT felix_create_stream('qa', payload_type => 'text');
SELECT felix_create_stream('qb', payload_type => 'text');
SELECT count(*) FROM felix_publish_batch('qb', array_fill(repeat('b', 200000), ARRAY[3]));
GRANT INSERT ON qa TO regress_quota_writer;
RESET SESSION AUTHORIZATION;

-- A superuser sets the cap for the session it hands over (SET SESSION
-- AUTHORIZATION keeps it); a non-superuser cannot raise or lift it.
SET felix.max_bytes_per_role = '1MB';
SET SESSION AUTHORIZATION regress_quota_owner;
SHOW felix.max_bytes_per_role;
SET felix.max_bytes_per_role = '1GB';
\echo SQLSTATE :SQLSTATE
SET felix.max_bytes_per_role = 0;
\echo SQLSTATE :SQLSTATE
RESET felix.max_bytes_per_role;
\echo SQLSTATE :SQLSTATE
ALTER ROLE regress_quota_owner SET felix.max_bytes_per_role = 0;
\echo SQLSTATE :SQLSTATE

-- Under the cap, publishing works: 400000 more bytes, in qa.
SELECT shard, seq FROM felix_publish('qa', repeat('a', 200000));
SELECT shard, seq FROM felix_publish('qa', repeat('a', 200000));
-- About 48000 bytes are left.  felix_publish is refused past the cap ...
SELECT shard, seq FROM felix_publish('qa', repeat('a', 200000));
\echo SQLSTATE :SQLSTATE
-- ... and so is felix_publish_batch, as a whole ...
SELECT count(*) FROM felix_publish_batch('qa', array_fill(repeat('a', 30000), ARRAY[2]));
\echo SQLSTATE :SQLSTATE
-- ... while a batch that fits goes in (about 28000 bytes left)
SELECT count(*) FROM felix_publish_batch('qa', array_fill(repeat('a', 10000), ARRAY[2]));
-- INSERT is refused at COMMIT, with nothing published
BEGIN;
INSERT INTO qa (payload) VALUES (repeat('c', 30000));
COMMIT;
\echo SQLSTATE :SQLSTATE
INSERT INTO qa (payload) VALUES (repeat('c', 30000));
\echo SQLSTATE :SQLSTATE
-- the refusal names the stream, the owner and the cap, and says what to do
DO $$
DECLARE
    msg text;
    hint text;
BEGIN
    PERFORM felix_publish('qa', repeat('a', 200000));
EXCEPTION WHEN configuration_limit_exceeded THEN
    GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RAISE NOTICE 'refused: %', msg;
    RAISE NOTICE 'hint: %', hint;
END
$$;
-- nothing refused was appended: qa holds 2 + 2 records
SELECT shard, next_seq FROM felix_shards WHERE stream = 'qa';
RESET SESSION AUTHORIZATION;

-- Another role publishing into the owner's stream fills the owner's quota:
-- 20000 bytes go in (about 8000 left) ...
SET SESSION AUTHORIZATION regress_quota_writer;
SELECT shard, seq FROM felix_publish('qa', repeat('w', 20000));
-- ... and the next 10000 are refused, to the writer ...
SELECT shard, seq FROM felix_publish('qa', repeat('w', 10000));
\echo SQLSTATE :SQLSTATE
INSERT INTO qa (payload) VALUES (repeat('w', 10000));
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
-- ... and to the owner alike
SET SESSION AUTHORIZATION regress_quota_owner;
SELECT shard, seq FROM felix_publish('qa', repeat('a', 10000));
\echo SQLSTATE :SQLSTATE

-- Dropping a stream gives its bytes back: publishing works again.
SELECT felix_drop_stream('qb');
SELECT shard, seq FROM felix_publish('qa', repeat('a', 200000));
SELECT count(*) FROM felix_publish_batch('qa', array_fill(repeat('a', 10000), ARRAY[2]));
INSERT INTO qa (payload) VALUES (repeat('c', 30000));
SELECT shard, next_seq FROM felix_shards WHERE stream = 'qa';
SELECT sum(bytes) <= 1024 * 1024 AS within_cap FROM felix_shards WHERE stream = 'qa';
RESET SESSION AUTHORIZATION;

-- Superusers are exempt: one publishes past the owner's cap ...
SELECT count(*) FROM felix_publish_batch('qa', array_fill(repeat('s', 200000), ARRAY[3]));
SELECT sum(bytes) > 1024 * 1024 AS past_cap FROM felix_shards WHERE stream = 'qa';
-- ... which then refuses the owner even a record of a few bytes, whichever
-- way it comes (COPY, like INSERT, at its commit) ...
SET SESSION AUTHORIZATION regress_quota_owner;
SELECT shard, seq FROM felix_publish('qa', 'tiny');
\echo SQLSTATE :SQLSTATE
COPY qa (payload) FROM stdin;
tiny
\.
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
-- ... and a superuser's stream is never capped, whoever publishes to it.
SELECT felix_create_stream('qs', payload_type => 'text');
GRANT INSERT ON qs TO regress_quota_writer;
SET SESSION AUTHORIZATION regress_quota_writer;
SELECT count(*) FROM felix_publish_batch('qs', array_fill(repeat('s', 200000), ARRAY[6]));
INSERT INTO qs (payload) VALUES (repeat('s', 200000));
RESET SESSION AUTHORIZATION;
SELECT shard, next_seq FROM felix_shards WHERE stream = 'qs';

-- A per-role setting applies when the role logs in.
ALTER ROLE regress_quota_owner SET felix.max_bytes_per_role = '1MB';
\c - regress_quota_owner
\set VERBOSITY terse
SHOW felix.max_bytes_per_role;
SELECT shard, seq FROM felix_publish('qa', repeat('a', 10000));
\echo SQLSTATE :SQLSTATE
\c - :quota_superuser
\set VERBOSITY terse
SHOW felix.max_bytes_per_role;

-- Tidy up.
SELECT felix_drop_stream('qa');
SELECT felix_drop_stream('qs');
REVOKE CREATE ON SCHEMA public FROM regress_quota_owner;
DROP ROLE regress_quota_owner, regress_quota_writer;
