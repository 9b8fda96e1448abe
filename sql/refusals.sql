--
-- refusals: every operation a stream does not support, and every bad
-- argument, fails with a SQLSTATE, a message naming the stream and a hint.
-- Each error is followed by its SQLSTATE (\echo); a statement that
-- wrongly succeeded would show 00000 there.
--
SELECT felix_create_stream('r', shards => 2);
SELECT * FROM felix_publish('r', '{"n": 1}'::jsonb, shard => 0);
SELECT felix_create_stream('rtext', payload_type => 'text');
SELECT felix_create_stream('rempty');

-- ---------------------------------------------------------------------
-- A stream is append-only
-- ---------------------------------------------------------------------
UPDATE r SET key = 'changed';
\echo SQLSTATE :SQLSTATE
UPDATE r SET payload = '{}' WHERE shard = 0 AND seq = 0;
\echo SQLSTATE :SQLSTATE
-- Refused even when no row would change: never a silent success.
UPDATE r SET key = 'changed' WHERE false;
\echo SQLSTATE :SQLSTATE
UPDATE rempty SET key = 'changed';
\echo SQLSTATE :SQLSTATE
DELETE FROM r;
\echo SQLSTATE :SQLSTATE
DELETE FROM r WHERE shard = 0 AND seq = 0;
\echo SQLSTATE :SQLSTATE
DELETE FROM r WHERE seq < 0;
\echo SQLSTATE :SQLSTATE
DELETE FROM rempty;
\echo SQLSTATE :SQLSTATE
TRUNCATE r;
\echo SQLSTATE :SQLSTATE
TRUNCATE rempty;
\echo SQLSTATE :SQLSTATE
-- Row locks.
SELECT shard, seq FROM r FOR UPDATE;
\echo SQLSTATE :SQLSTATE
SELECT shard, seq FROM r FOR NO KEY UPDATE;
\echo SQLSTATE :SQLSTATE
SELECT shard, seq FROM r FOR SHARE;
\echo SQLSTATE :SQLSTATE
SELECT shard, seq FROM r FOR KEY SHARE;
\echo SQLSTATE :SQLSTATE
SELECT shard, seq FROM r WHERE shard = 0 AND seq = 0 FOR UPDATE;
\echo SQLSTATE :SQLSTATE
-- Indexes.
CREATE INDEX ON r (seq);
\echo SQLSTATE :SQLSTATE
CREATE UNIQUE INDEX r_shard_seq ON r (shard, seq);
\echo SQLSTATE :SQLSTATE
CREATE INDEX ON rempty (key);
\echo SQLSTATE :SQLSTATE
-- Rows are addressed by (shard, seq), not by ctid.
SELECT shard, seq FROM r WHERE ctid = '(0,1)';
\echo SQLSTATE :SQLSTATE
-- The record is still there, unchanged.
SELECT shard, seq, key, payload FROM r;

-- ---------------------------------------------------------------------
-- Unknown streams, and tables that are not streams
-- ---------------------------------------------------------------------
SELECT * FROM felix_publish('nope', '{}'::jsonb);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish_batch('nope', ARRAY['{}']::jsonb[]);
\echo SQLSTATE :SQLSTATE
SELECT felix_drop_stream('nope');
\echo SQLSTATE :SQLSTATE
SELECT felix_enforce_retention('nope');
\echo SQLSTATE :SQLSTATE
CREATE TABLE heap_t (shard int, seq bigint, key text, payload jsonb, published_at timestamptz);
SELECT * FROM felix_publish('heap_t', '{}'::jsonb);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish_batch('heap_t', ARRAY['{}']::jsonb[]);
\echo SQLSTATE :SQLSTATE
SELECT felix_drop_stream('heap_t');
\echo SQLSTATE :SQLSTATE
SELECT felix_enforce_retention('heap_t');
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS heap_rows FROM heap_t;
-- NULL and empty stream names.
SELECT * FROM felix_publish(NULL, '{}'::jsonb);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish('', '{}'::jsonb);
\echo SQLSTATE :SQLSTATE
SELECT felix_drop_stream(NULL);
\echo SQLSTATE :SQLSTATE

-- ---------------------------------------------------------------------
-- felix_create_stream: bad arguments
-- ---------------------------------------------------------------------
SELECT felix_create_stream('bad', shards => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', shards => -1);
\echo SQLSTATE :SQLSTATE
SELECT current_setting('felix.max_shards_per_stream') AS max_shards_per_stream;
SELECT felix_create_stream('bad', shards => current_setting('felix.max_shards_per_stream')::int + 1);
\echo SQLSTATE :SQLSTATE
-- The limit itself is accepted.
SELECT felix_create_stream('widest', shards => current_setting('felix.max_shards_per_stream')::int);
SELECT shards FROM felix_streams WHERE stream = 'widest';
SELECT felix_drop_stream('widest');
SELECT felix_create_stream('bad', replication_factor => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', replication_factor => -2);
\echo SQLSTATE :SQLSTATE
-- A replicated stream needs replication_factor alive nodes; this server
-- is a cluster of one, so the control plane refuses it.
SELECT felix_create_stream('bad', replication_factor => 3);
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', replication_factor => 2, consistency => 'quorum');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', storage => 'object');
\echo SQLSTATE :SQLSTATE
-- Unknown options.
SELECT felix_create_stream('bad', consistency => 'eventual');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', consistency => 'Leader');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', payload_type => 'xml');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', payload_type => 'integer');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', storage => 's3');
\echo SQLSTATE :SQLSTATE
-- NULL where a value is needed.
SELECT felix_create_stream(NULL);
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', shards => NULL);
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', payload_type => NULL);
\echo SQLSTATE :SQLSTATE
-- A name longer than an identifier can be.
SELECT felix_create_stream(repeat('n', 64));
\echo SQLSTATE :SQLSTATE
-- Retention must be positive.
SELECT felix_create_stream('bad', retention_bytes => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', retention => '0 seconds');
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('bad', retention => '-1 day');
\echo SQLSTATE :SQLSTATE
-- Names already taken: by a stream, by a table, by a view.
SELECT felix_create_stream('r');
\echo SQLSTATE :SQLSTATE
CREATE TABLE taken (id int);
SELECT felix_create_stream('taken');
\echo SQLSTATE :SQLSTATE
CREATE VIEW taken_view AS SELECT 1 AS one;
SELECT felix_create_stream('taken_view');
\echo SQLSTATE :SQLSTATE
DROP VIEW taken_view;
DROP TABLE taken;
-- None of the refused calls left anything behind.
SELECT count(*) AS leftovers FROM felix_streams WHERE stream IN ('bad', 'taken', 'taken_view');
SELECT to_regclass('bad') IS NULL AS no_table;

-- ---------------------------------------------------------------------
-- Publishing: bad records and bad shards
-- ---------------------------------------------------------------------
-- NULL payloads.  (The message names the shard the record was routed to,
-- so every record here has an explicit shard or a key.)
SELECT * FROM felix_publish('r', NULL::jsonb, shard => 1);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish('rtext', NULL::text);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish_batch('r', ARRAY['{}', NULL]::jsonb[], ARRAY['a', 'b']);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish_batch('r', NULL::jsonb[]);
\echo SQLSTATE :SQLSTATE
INSERT INTO r (key, payload) VALUES ('k', NULL);
\echo SQLSTATE :SQLSTATE
INSERT INTO r (key) VALUES ('no payload column');
\echo SQLSTATE :SQLSTATE
-- A JSON null is a value, not a NULL.
SELECT * FROM felix_publish('r', 'null'::jsonb, shard => 1);
-- Shard out of range.
SELECT * FROM felix_publish('r', '{}'::jsonb, shard => 2);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish('r', '{}'::jsonb, shard => -1);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish('rtext', 'x'::text, shard => 1);
\echo SQLSTATE :SQLSTATE
INSERT INTO r (shard, payload) VALUES (2, '{}');
\echo SQLSTATE :SQLSTATE
INSERT INTO r (shard, payload) VALUES (-1, '{}');
\echo SQLSTATE :SQLSTATE
-- (psql does not set SQLSTATE after a failed COPY FROM STDIN: the
-- error's code is shown by VERBOSITY sqlstate instead.)
\set VERBOSITY sqlstate
COPY r (shard, payload) FROM STDIN;
9	{}
\.
\set VERBOSITY default
-- keys[] must match payloads[].
SELECT * FROM felix_publish_batch('r', ARRAY['{}', '{}']::jsonb[], ARRAY['only one']);
\echo SQLSTATE :SQLSTATE
-- Records over felix.max_record_bytes (key plus payload).
SET felix.max_record_bytes = 64;
SELECT * FROM felix_publish('rtext', repeat('x', 40));
SELECT * FROM felix_publish('rtext', repeat('x', 100));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish('rtext', repeat('x', 40), key => repeat('k', 40));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish_batch('rtext', ARRAY['small', repeat('y', 100)]);
\echo SQLSTATE :SQLSTATE
INSERT INTO rtext (payload) VALUES (repeat('z', 100));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish('r', jsonb_build_object('big', repeat('j', 100)), shard => 1);
\echo SQLSTATE :SQLSTATE
RESET felix.max_record_bytes;
SELECT * FROM felix_publish('rtext', repeat('x', 100));
-- Only the records that fit were published.
SELECT seq, length(payload) FROM rtext;
SELECT shard, seq, payload FROM r;

-- ---------------------------------------------------------------------
-- Privileges: publishing needs INSERT on the stream's table
-- ---------------------------------------------------------------------
CREATE ROLE regress_felix_reader;
GRANT SELECT ON r TO regress_felix_reader;
SET ROLE regress_felix_reader;
SELECT count(*) AS readable FROM r;
SELECT * FROM felix_publish('r', '{}'::jsonb, shard => 0);
\echo SQLSTATE :SQLSTATE
INSERT INTO r (shard, payload) VALUES (0, '{}');
\echo SQLSTATE :SQLSTATE
SELECT felix_drop_stream('r');
\echo SQLSTATE :SQLSTATE
RESET ROLE;
REVOKE ALL ON r FROM regress_felix_reader;
DROP ROLE regress_felix_reader;
SELECT count(*) AS records FROM r;

-- ---------------------------------------------------------------------
-- SQL of another felix version bound to this library: felix 1.0 declared
-- felix.replicate with 6 arguments and felix_publish_batch with 3.  Until
-- ALTER EXTENSION felix UPDATE runs, such declarations call this library,
-- which refuses rather than read arguments that were never passed.
-- ---------------------------------------------------------------------
CREATE SCHEMA felix_1_0;
CREATE FUNCTION felix_1_0.replicate(stream text, shard integer, generation bigint,
                                    from_seq bigint, leader_hwm_end bigint, batches bytea,
                                    OUT status text, OUT seq bigint)
    AS 'felix', 'felix_replicate' LANGUAGE C;
CREATE FUNCTION felix_1_0.publish_batch(stream text, payloads jsonb[], keys text[] DEFAULT NULL)
RETURNS SETOF felix_position
    AS 'felix', 'felix_publish_batch' LANGUAGE C;
SELECT * FROM felix_1_0.replicate('r', 0, 1, 1, 1, '\x00');
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_1_0.publish_batch('r', ARRAY['{}'::jsonb]);
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS records FROM r;
DROP SCHEMA felix_1_0 CASCADE;

-- Tidy up what only this file uses.
SELECT felix_drop_stream('rempty');
DROP TABLE heap_t;
