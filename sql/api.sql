--
-- api: the whole SQL API of a single-node felix, as architecture.md
-- documents it: creating streams of each payload type, publishing with
-- routing, batches, transactional INSERT and COPY, ordered reads that
-- seek, and dropping.  Errors show their SQLSTATE through \echo.
--
-- Nothing printed here may vary between runs: published_at is checked,
-- never printed, and publishes without key or shard (spread from a
-- per-backend starting point) print counts, never shard numbers.

-- ---------------------------------------------------------------------
-- Creating streams
-- ---------------------------------------------------------------------
SELECT felix_create_stream('orders', shards => 4);
\d orders
SELECT stream, relation, shards, replication_factor, consistency, payload_type,
       storage, retention_bytes, retention
  FROM felix_streams WHERE stream = 'orders';
-- The table uses the felix access method.
SELECT c.relname, a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam
 WHERE c.relname = 'orders';
-- Every shard starts empty, led by this node.
SELECT stream, shard, role, generation, start_seq, next_seq, hwm, state
  FROM felix_shards WHERE stream = 'orders';

-- Each payload type; retention settings are kept.
SELECT felix_create_stream('notes', payload_type => 'text');
SELECT felix_create_stream('blobs', shards => 2, payload_type => 'bytea');
SELECT felix_create_stream('kept', retention_bytes => 1048576, retention => '7 days');
SELECT felix_create_stream('quorum1', consistency => 'quorum');
SELECT stream, shards, replication_factor, consistency, payload_type, storage,
       retention_bytes, retention
  FROM felix_streams WHERE stream IN ('notes', 'blobs', 'kept', 'quorum1')
 ORDER BY stream;
\d notes
\d blobs

-- Names that need quoting: the name is taken as written (case-sensitive).
SELECT felix_create_stream('Mixed Case');
SELECT felix_create_stream('with space');
SELECT felix_create_stream('it''s "quoted"');
SELECT stream, relation FROM felix_streams
 WHERE stream IN ('Mixed Case', 'with space', 'it''s "quoted"') ORDER BY stream;
SELECT * FROM felix_publish('Mixed Case', '{"n": 1}'::jsonb);
SELECT * FROM felix_publish('with space', '{"n": 2}'::jsonb);
SELECT * FROM felix_publish('it''s "quoted"', '{"n": 3}'::jsonb);
INSERT INTO "Mixed Case" (payload) VALUES ('{"n": 4}');
INSERT INTO "with space" (payload) VALUES ('{"n": 5}');
INSERT INTO "it's ""quoted""" (payload) VALUES ('{"n": 6}');
SELECT shard, seq, payload FROM "Mixed Case";
SELECT shard, seq, payload FROM "with space";
SELECT shard, seq, payload FROM "it's ""quoted""";
-- A different case is a different (unknown) name.
SELECT * FROM felix_publish('mixed case', '{"n": 7}'::jsonb);
\echo SQLSTATE :SQLSTATE

-- ---------------------------------------------------------------------
-- felix_publish: routing
-- ---------------------------------------------------------------------
-- Explicit shard.
SELECT * FROM felix_publish('orders', '{"id": 1}'::jsonb, shard => 2);
SELECT * FROM felix_publish('orders', '{"id": 2}'::jsonb, shard => 2);
SELECT * FROM felix_publish('orders', '{"id": 3}'::jsonb, key => 'k', shard => 0);
-- Same key, same shard, consecutive seqs.
CREATE TEMP TABLE acks AS
SELECT i, (p).shard, (p).seq
  FROM (SELECT i, felix_publish('orders', jsonb_build_object('id', 100 + i), key => 'cust-7') AS p
          FROM generate_series(1, 5) i) x;
SELECT count(DISTINCT shard) AS shards_used, max(seq) - min(seq) + 1 AS seq_span,
       bool_and(seq = (SELECT min(seq) FROM acks) + i - 1) AS seqs_in_call_order
  FROM acks;
-- The key's shard is a stable function of the key: publish again, same shard.
SELECT (felix_publish('orders', '{"id": 200}'::jsonb, key => 'cust-7')).shard
     = (SELECT DISTINCT shard FROM acks) AS same_shard_again;
-- Many keys reach every shard.
SELECT count(DISTINCT (felix_publish('orders', jsonb_build_object('k', i), key => 'key-' || i)).shard)
       AS shards_used
  FROM generate_series(1, 64) i;
-- No key, no shard: spread across the shards (round-robin per backend).
SELECT count(DISTINCT (felix_publish('orders', jsonb_build_object('spread', i))).shard)
       AS shards_used
  FROM generate_series(1, 4) i;
-- What was read back is what was published, under the key's shard.
SELECT o.seq, o.key, o.payload
  FROM orders o JOIN acks a ON a.shard = o.shard AND a.seq = o.seq
 ORDER BY a.i;
-- published_at is set at publish time.
SELECT count(*) AS records, bool_and(published_at IS NOT NULL) AS stamped,
       bool_and(published_at <= clock_timestamp()) AS not_in_future
  FROM orders;

-- Payload types: each stream stores its own type; other payload types are
-- converted through their text form.
SELECT * FROM felix_publish('notes', 'hello'::text);
SELECT * FROM felix_publish('notes', 'world'::text, key => 'greeting');
SELECT * FROM felix_publish('notes', '{"as": "jsonb"}'::jsonb);
SELECT * FROM felix_publish('blobs', '\xdeadbeef'::bytea, shard => 1);
SELECT * FROM felix_publish('blobs', '\x00ff00'::bytea, shard => 1, key => 'bin');
SELECT * FROM felix_publish('orders', '{"from": "text"}'::text, shard => 3);
SELECT seq, key, payload, pg_typeof(payload) FROM notes;
SELECT shard, seq, key, payload, pg_typeof(payload) FROM blobs;
SELECT seq, payload, pg_typeof(payload) FROM orders WHERE shard = 3 AND payload ? 'from';
-- A text payload that is not JSON cannot go to a jsonb stream.
SELECT * FROM felix_publish('orders', 'not json'::text, shard => 3);
\echo SQLSTATE :SQLSTATE
-- An empty payload is a payload.
SELECT * FROM felix_publish('notes', ''::text);
SELECT seq, payload = '' AS empty FROM notes WHERE seq = 3;

-- A publish is not undone by a rollback (like nextval).
BEGIN;
SELECT * FROM felix_publish('notes', 'survives rollback'::text);
ROLLBACK;
SELECT seq, payload FROM notes WHERE payload = 'survives rollback';

-- ---------------------------------------------------------------------
-- felix_publish_batch: one row per record, in input order
-- ---------------------------------------------------------------------
SELECT felix_create_stream('batch1');
SELECT * FROM felix_publish_batch('batch1',
    ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}']::jsonb[]) WITH ORDINALITY AS r(shard, seq, n)
 ORDER BY n;
SELECT seq, key, payload FROM batch1;
SELECT felix_create_stream('batches', shards => 2);
-- With keys: each record goes to its key's shard; rows come back in input
-- order and each names where its record is.
CREATE TEMP TABLE batch_in AS
SELECT i, 'user-' || (i % 3) AS key, jsonb_build_object('b', 10 + i) AS payload
  FROM generate_series(1, 9) i;
CREATE TEMP TABLE batch_out AS
SELECT * FROM felix_publish_batch('batches',
        (SELECT array_agg(payload ORDER BY i) FROM batch_in),
        (SELECT array_agg(key ORDER BY i) FROM batch_in))
     WITH ORDINALITY AS r(shard, seq, i);
SELECT count(*) AS rows_returned FROM batch_out;
SELECT count(*) AS mismatched
  FROM batch_in i JOIN batch_out o USING (i)
  LEFT JOIN batches b ON b.shard = o.shard AND b.seq = o.seq
                     AND b.key = i.key AND b.payload = i.payload
 WHERE b.seq IS NULL;
-- Same key, same shard, also in a batch.
SELECT i.key, count(DISTINCT o.shard) AS shards
  FROM batch_in i JOIN batch_out o USING (i) GROUP BY i.key ORDER BY i.key;
-- The records a batch sends to one shard are one contiguous run, in input
-- order.
SELECT shard, count(*) AS records, max(seq) - min(seq) + 1 = count(*) AS contiguous,
       bool_and(in_order) AS in_input_order
  FROM (SELECT shard, seq,
               seq > lag(seq) OVER (PARTITION BY shard ORDER BY i) IS NOT FALSE AS in_order
          FROM batch_out) o
 GROUP BY shard ORDER BY shard;
-- Text and bytea batches; NULL keys mixed with keys.
SELECT * FROM felix_publish_batch('notes', ARRAY['t1', 't2']::text[], ARRAY['a', NULL]);
SELECT * FROM felix_publish_batch('blobs', ARRAY['\x01', '\x0203']::bytea[], ARRAY['x', 'x']);
SELECT seq, key, payload FROM notes WHERE payload IN ('t1', 't2');
-- An empty batch publishes nothing.
SELECT count(*) AS rows_returned FROM felix_publish_batch('notes', ARRAY[]::text[]);
-- shard => n: every record to that shard (the one whose leader the
-- caller is talking to), keys kept but not routed on, in input order.
SELECT shard, seq - min(seq) OVER () AS offset_in_batch
  FROM felix_publish_batch('batches', ARRAY['{"s": 1}', '{"s": 2}', '{"s": 3}']::jsonb[],
                           ARRAY['user-0', 'user-1', 'user-2'], shard => 1);
SELECT key, payload FROM batches WHERE shard = 1 AND payload ? 's' ORDER BY seq;
SELECT * FROM felix_publish_batch('batches', ARRAY['{}']::jsonb[], shard => 2);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix_publish_batch('batches', ARRAY['{}']::jsonb[], shard => -1);
\echo SQLSTATE :SQLSTATE

-- ---------------------------------------------------------------------
-- INSERT and COPY: transactional
-- ---------------------------------------------------------------------
SELECT felix_create_stream('tx');
-- Published at COMMIT: not visible before it, not even to the inserter.
BEGIN;
INSERT INTO tx (key, payload) VALUES ('a', '{"n": 1}'), ('b', '{"n": 2}');
SELECT count(*) AS visible_before_commit FROM tx;
COMMIT;
SELECT shard, seq, key, payload FROM tx;
-- Gone after ROLLBACK; the seqs stay contiguous.
BEGIN;
INSERT INTO tx (key, payload) VALUES ('rolled back', '{"n": 3}');
ROLLBACK;
INSERT INTO tx (key, payload) VALUES ('c', '{"n": 4}');
SELECT shard, seq, key, payload FROM tx;
-- ROLLBACK TO SAVEPOINT drops only the rows inserted since the savepoint.
BEGIN;
INSERT INTO tx (key, payload) VALUES ('before savepoint', '{"n": 5}');
SAVEPOINT sp1;
INSERT INTO tx (key, payload) VALUES ('in sp1, rolled back', '{"n": 6}');
SAVEPOINT sp2;
INSERT INTO tx (key, payload) VALUES ('in sp2, rolled back', '{"n": 7}');
ROLLBACK TO SAVEPOINT sp1;
INSERT INTO tx (key, payload) VALUES ('after rollback to sp1', '{"n": 8}');
SAVEPOINT sp3;
INSERT INTO tx (key, payload) VALUES ('in sp3, released', '{"n": 9}');
RELEASE SAVEPOINT sp3;
SAVEPOINT sp4;
INSERT INTO tx (key, payload) VALUES ('in sp4, released (kept)', '{"n": 10}');
RELEASE SAVEPOINT sp4;
SAVEPOINT sp5;
INSERT INTO tx (key, payload) VALUES ('in sp5, rolled back', '{"n": 11}');
ROLLBACK TO SAVEPOINT sp5;
COMMIT;
SELECT seq, key, payload FROM tx WHERE seq >= 3;
-- A failed statement inside a savepoint: its earlier rows stay, and the
-- rows of the failed savepoint go.
BEGIN;
INSERT INTO tx (key, payload) VALUES ('kept', '{"n": 12}');
SAVEPOINT s;
INSERT INTO tx (key, payload) VALUES ('dropped with the savepoint', '{"n": 13}');
INSERT INTO tx (key, payload) VALUES ('null payload', NULL);
\echo SQLSTATE :SQLSTATE
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT seq, key, payload FROM tx WHERE seq >= 7;
-- A transaction that fails as a whole publishes nothing.
BEGIN;
INSERT INTO tx (key, payload) VALUES ('aborted by an error', '{"n": 14}');
SELECT 1 / 0;
\echo SQLSTATE :SQLSTATE
COMMIT;
SELECT count(*) AS records, max(seq) AS last_seq FROM tx;
-- INSERT ... SELECT, with explicit shards on a sharded stream; one INSERT
-- appends one batch per shard, so each shard's seqs are contiguous.
SELECT felix_create_stream('bulk', shards => 3);
INSERT INTO bulk (shard, key, payload)
SELECT i % 3, 'k' || i, jsonb_build_object('i', i) FROM generate_series(1, 300) i;
SELECT shard, count(*), min(seq), max(seq), count(DISTINCT seq) FROM bulk GROUP BY shard ORDER BY shard;
-- Keys route INSERTed rows exactly as felix_publish routes them.
INSERT INTO bulk (key, payload) VALUES ('route-me', '{"via": "insert"}');
SELECT (felix_publish('bulk', '{"via": "publish"}'::jsonb, key => 'route-me')).shard
     = (SELECT shard FROM bulk WHERE key = 'route-me' AND payload->>'via' = 'insert') AS same_shard;
-- RETURNING shows the shard a row goes to (given, or routed by its key);
-- seq and published_at are assigned at commit, so they are NULL there.
BEGIN;
INSERT INTO bulk (shard, key, payload) VALUES (2, 'given', '{}') RETURNING shard, seq, published_at;
INSERT INTO bulk (key, payload) VALUES ('route-me', '{"via": "returning"}') RETURNING shard
     = (SELECT shard FROM bulk WHERE key = 'route-me' AND payload->>'via' = 'insert') AS routed_alike;
ROLLBACK;
-- Text and bytea streams take INSERTs too.
INSERT INTO notes (key, payload) VALUES ('ins', 'inserted text');
INSERT INTO blobs (shard, payload) VALUES (0, '\xcafe');
SELECT seq, key, payload FROM notes WHERE key = 'ins';
SELECT shard, seq, payload FROM blobs WHERE shard = 0;
-- seq and published_at are assigned by felix.  A row that brings its seq
-- is a restored record (pg_dump's COPY): it needs its shard and
-- published_at too, lands only in a shard that holds no records, and only
-- with contiguous seqs.
INSERT INTO tx (seq, payload) VALUES (1000, '{}');
\echo SQLSTATE :SQLSTATE
INSERT INTO tx (published_at, payload) VALUES (now(), '{}');
\echo SQLSTATE :SQLSTATE
INSERT INTO tx (shard, seq, payload, published_at) VALUES (0, 0, '{}', now());
\echo SQLSTATE :SQLSTATE
SELECT felix_create_stream('restored', shards => 2);
INSERT INTO restored (shard, seq, key, payload, published_at) VALUES
    (0, 0, 'a', '{"r": 0}', '2026-01-01 00:00:00+00'),
    (1, 0, 'b', '{"r": 1}', '2026-01-01 00:00:01+00'),
    (0, 1, 'c', '{"r": 2}', '2026-01-01 00:00:02+00');
SELECT shard, seq, key, payload, published_at FROM restored;
INSERT INTO restored (shard, seq, payload, published_at) VALUES (1, 1, '{}', now());
\echo SQLSTATE :SQLSTATE
INSERT INTO restored (shard, seq, payload, published_at) VALUES (1, 2, '{}', now()), (1, 1, '{}', now());
\echo SQLSTATE :SQLSTATE
BEGIN;
INSERT INTO restored (shard, payload) VALUES (0, '{"new": true}');
INSERT INTO restored (shard, seq, payload, published_at) VALUES (0, 2, '{}', now());
\echo SQLSTATE :SQLSTATE
ROLLBACK;
SELECT felix_publish('restored', '{"after": "restore"}'::jsonb, shard => 1);
-- The stream's settings travel through pg_dump as its label FOR felix; the
-- label can be set again only to what it states.
SELECT label FROM pg_seclabel WHERE objoid = 'restored'::regclass AND provider = 'felix';
SECURITY LABEL FOR felix ON TABLE restored IS '{"shards": 2, "replication_factor": 1, "consistency": "leader", "storage": "local"}';
SECURITY LABEL FOR felix ON TABLE restored IS '{"shards": 3, "replication_factor": 1, "consistency": "leader", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
SECURITY LABEL FOR felix ON TABLE restored IS 'not json';
\echo SQLSTATE :SQLSTATE
SECURITY LABEL FOR felix ON TABLE restored IS NULL;
\echo SQLSTATE :SQLSTATE
CREATE TABLE not_a_stream (id int);
SECURITY LABEL FOR felix ON TABLE not_a_stream IS '{"shards": 1, "replication_factor": 1, "consistency": "leader", "storage": "local"}';
\echo SQLSTATE :SQLSTATE
DROP TABLE not_a_stream;
SELECT felix_drop_stream('restored');
-- COPY FROM STDIN: also transactional.
SELECT felix_create_stream('copied', shards => 2);
COPY copied (key, payload) FROM STDIN;
alpha	{"c": 1}
beta	{"c": 2}
alpha	{"c": 4}
\.
SELECT count(*) AS records FROM copied;
SELECT key, payload FROM copied WHERE key = 'alpha';
SELECT count(DISTINCT shard) AS alpha_shards FROM copied WHERE key = 'alpha';
COPY copied (shard, key, payload) FROM STDIN (FORMAT csv);
1,gamma,"{""c"": 5}"
1,delta,"{""c"": 6}"
0,,"{""c"": 3}"
\.
SELECT seq, key, payload FROM copied WHERE (shard = 1 AND key IN ('gamma', 'delta')) OR key IS NULL;
BEGIN;
COPY copied (key, payload) FROM STDIN;
rolled	{"c": 7}
back	{"c": 8}
\.
ROLLBACK;
SELECT count(*) AS records FROM copied;
-- A bad row fails the whole COPY: nothing of it is published.
COPY copied (key, payload) FROM STDIN;
good	{"c": 9}
bad	not json
\.
SELECT count(*) AS records FROM copied;
-- COPY out of a stream reads it in order.
COPY (SELECT shard, seq, key, payload FROM copied) TO STDOUT;

-- SERIALIZABLE: refused, since PostgreSQL's serialization check comes
-- after the commit's records were published (a retry would publish them
-- again); nothing is buffered or published.
BEGIN ISOLATION LEVEL SERIALIZABLE;
INSERT INTO tx (key, payload) VALUES ('serializable', '{"n": 15}');
\echo SQLSTATE :SQLSTATE
ROLLBACK;
SELECT count(*) AS published FROM tx WHERE key = 'serializable';

-- PREPARE TRANSACTION: refused when the transaction buffered stream rows
-- (they could not be published at COMMIT PREPARED), allowed otherwise.
BEGIN;
INSERT INTO tx (key, payload) VALUES ('prepared', '{"n": 16}');
PREPARE TRANSACTION 'felix_pending';
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT count(*) AS published FROM tx WHERE key = 'prepared';
CREATE TABLE plain_heap (id int);
BEGIN;
INSERT INTO plain_heap VALUES (1);
SELECT count(*) AS reads_are_fine FROM tx;
PREPARE TRANSACTION 'felix_no_pending';
COMMIT PREPARED 'felix_no_pending';
-- Rows buffered then rolled back to a savepoint leave nothing to refuse.
BEGIN;
SAVEPOINT s;
INSERT INTO tx (key, payload) VALUES ('rolled back before prepare', '{"n": 17}');
ROLLBACK TO SAVEPOINT s;
INSERT INTO plain_heap VALUES (2);
PREPARE TRANSACTION 'felix_emptied';
COMMIT PREPARED 'felix_emptied';
SELECT count(*) AS published FROM tx WHERE key = 'rolled back before prepare';
DROP TABLE plain_heap;

-- ---------------------------------------------------------------------
-- Reading: (shard, seq) order, and seeks
-- ---------------------------------------------------------------------
SELECT felix_create_stream('seekme', shards => 2);
SELECT count(felix_publish('seekme', jsonb_build_object('i', i), shard => i % 2)) AS published
  FROM generate_series(0, 19) i;
INSERT INTO seekme (shard, payload) SELECT i % 2, jsonb_build_object('ins', i) FROM generate_series(0, 9) i;
SELECT shard, count(*), min(seq), max(seq) FROM seekme GROUP BY shard ORDER BY shard;
-- A plain scan returns every shard in order, each in seq order.
SELECT shard, seq FROM seekme;
-- Seeks: EXPLAIN shows the custom scan, and the rows are right.  These
-- streams are tiny, so a plain scan would cost about the same; plain scans
-- are turned off to show the plan shape (test/t/006_index.pl checks the
-- planner picks seeks on its own on a large stream).
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT seq, payload FROM seekme WHERE shard = 1 AND seq >= 5 LIMIT 3;
SELECT seq, payload FROM seekme WHERE shard = 1 AND seq >= 5 LIMIT 3;
EXPLAIN (COSTS OFF) SELECT seq, payload FROM seekme WHERE shard = 0 AND seq = 7;
SELECT seq, payload FROM seekme WHERE shard = 0 AND seq = 7;
EXPLAIN (COSTS OFF) SELECT seq FROM seekme WHERE shard = 0 AND seq BETWEEN 3 AND 6;
SELECT seq FROM seekme WHERE shard = 0 AND seq BETWEEN 3 AND 6;
EXPLAIN (COSTS OFF) SELECT seq FROM seekme WHERE shard = 1 AND seq > 10 AND seq < 13;
SELECT seq FROM seekme WHERE shard = 1 AND seq > 10 AND seq < 13;
EXPLAIN (COSTS OFF) SELECT seq FROM seekme WHERE shard = 1 AND seq <= 2;
SELECT seq FROM seekme WHERE shard = 1 AND seq <= 2;
-- Past the end, and an empty range: no rows.
SELECT seq FROM seekme WHERE shard = 0 AND seq >= 1000;
SELECT seq FROM seekme WHERE shard = 0 AND seq BETWEEN 6 AND 3;
-- A shard that does not exist has no rows (a filter, not an error).
SELECT seq FROM seekme WHERE shard = 7 AND seq >= 0;
-- Other conditions still filter correctly on top of a seek.
SELECT seq, payload FROM seekme WHERE shard = 1 AND seq >= 8 AND payload ? 'ins';
-- Parameters (a generic plan) give the same rows.
PREPARE seek(int, bigint) AS SELECT seq FROM seekme WHERE shard = $1 AND seq >= $2 LIMIT 2;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE seek(1, 12);
EXECUTE seek(1, 12);
EXECUTE seek(0, 0);
RESET plan_cache_mode;
DEALLOCATE seek;
-- No shard condition: a full scan, still in order.
RESET enable_seqscan;
EXPLAIN (COSTS OFF) SELECT shard, seq FROM seekme WHERE seq >= 13;
SELECT shard, seq FROM seekme WHERE seq >= 13;
-- ORDER BY the natural order, and aggregates, joins, subqueries.
SELECT shard, seq FROM seekme ORDER BY shard DESC, seq DESC LIMIT 3;
SELECT shard, max(seq) FROM seekme GROUP BY shard ORDER BY shard;
SELECT count(*) FROM seekme a JOIN seekme b USING (shard, seq);
-- A cursor reads forward; a SCROLL cursor can also move back (the rows
-- are kept as they are read); a plain scan cannot be read backward.
BEGIN;
DECLARE c CURSOR FOR SELECT shard, seq FROM seekme WHERE shard = 0 AND seq >= 10;
FETCH 2 FROM c;
FETCH 2 FROM c;
FETCH ALL FROM c;
COMMIT;
BEGIN;
DECLARE c SCROLL CURSOR FOR SELECT shard, seq FROM seekme WHERE shard = 0 AND seq >= 10;
FETCH 2 FROM c;
FETCH PRIOR FROM c;
\echo SQLSTATE :SQLSTATE
ROLLBACK;
BEGIN;
DECLARE c CURSOR FOR SELECT shard, seq FROM seekme;
FETCH 2 FROM c;
FETCH PRIOR FROM c;
\echo SQLSTATE :SQLSTATE
ROLLBACK;

-- ---------------------------------------------------------------------
-- Dropping
-- ---------------------------------------------------------------------
SELECT felix_create_stream('to_drop', shards => 2);
SELECT * FROM felix_publish('to_drop', '{"x": 1}'::jsonb, shard => 1);
-- Its files exist under felix.data_directory/<dboid>/<relid>.
SELECT format('felix/%s/%s', d.oid, 'to_drop'::regclass::oid) AS dir
  FROM pg_database d WHERE d.datname = current_database() \gset
SELECT (pg_stat_file(:'dir', true)).isdir AS dir_exists;
SELECT felix_drop_stream('to_drop');
SELECT count(*) AS catalog_rows FROM felix_streams WHERE stream = 'to_drop';
SELECT count(*) AS shard_rows FROM felix_shards WHERE stream = 'to_drop';
SELECT to_regclass('to_drop') IS NULL AS table_gone;
SELECT pg_stat_file(:'dir', true) IS NULL AS dir_gone;
-- Dropping in a transaction that rolls back keeps everything.
SELECT felix_create_stream('kept_by_rollback');
SELECT * FROM felix_publish('kept_by_rollback', '{"x": 2}'::jsonb);
SELECT format('felix/%s/%s', d.oid, 'kept_by_rollback'::regclass::oid) AS dir
  FROM pg_database d WHERE d.datname = current_database() \gset
BEGIN;
SELECT felix_drop_stream('kept_by_rollback');
ROLLBACK;
SELECT (pg_stat_file(:'dir', true)).isdir AS dir_exists;
SELECT seq, payload FROM kept_by_rollback;
-- DROP TABLE on a stream is a drop of the stream.
DROP TABLE kept_by_rollback;
SELECT count(*) AS catalog_rows FROM felix_streams WHERE stream = 'kept_by_rollback';
SELECT pg_stat_file(:'dir', true) IS NULL AS dir_gone;
-- A dropped name can be created again, and starts from seq 0.
SELECT felix_create_stream('to_drop');
SELECT * FROM felix_publish('to_drop', '{"again": true}'::jsonb);
SELECT shard, seq, payload FROM to_drop;
SELECT felix_drop_stream('to_drop');
-- Dropping a stream that does not exist.
SELECT felix_drop_stream('to_drop');
\echo SQLSTATE :SQLSTATE
-- A creation that rolls back is undone at the control plane too: the node
-- agent does not bring the stream back (several heartbeats pass here), and
-- the name is free again.  The same for a savepoint rolled back.
BEGIN;
SELECT felix_create_stream('never') IS NOT NULL AS created;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT felix_create_stream('never_either') IS NOT NULL AS created;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS at_control_plane FROM felix.cluster_streams WHERE name IN ('never', 'never_either');
SELECT pg_sleep(1);
SELECT count(*) AS here FROM felix_streams WHERE stream IN ('never', 'never_either');
SELECT to_regclass('never') IS NULL AND to_regclass('never_either') IS NULL AS no_tables;
SELECT felix_create_stream('never') IS NOT NULL AS created_again;
SELECT felix_drop_stream('never');
-- A creation cannot be prepared.
BEGIN;
SELECT felix_create_stream('create_prepared') IS NOT NULL AS created;
PREPARE TRANSACTION 'felix_create';
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS at_control_plane FROM felix.cluster_streams WHERE name = 'create_prepared';
-- A drop cannot be prepared.
SELECT felix_create_stream('drop_prepared');
BEGIN;
SELECT felix_drop_stream('drop_prepared');
PREPARE TRANSACTION 'felix_drop';
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS still_there FROM felix_streams WHERE stream = 'drop_prepared';
SELECT felix_drop_stream('drop_prepared');
-- felix.read_shard, the replica's side of a read of a shard a node holds
-- no copy of: this node's copy, within the range asked for, at most
-- max_records; the stream must be the one of that creation.
SELECT creation_id AS blobs_id FROM felix.streams WHERE name = 'blobs' \gset
SELECT seq, key, payload, visible_end > seq AS below_end
  FROM felix.read_shard('blobs', :'blobs_id', 0, 0, 1000, 1);
SELECT count(*) = (SELECT count(*) FROM blobs WHERE shard = 1) AS whole_shard
  FROM felix.read_shard('blobs', :'blobs_id', 1, 0, 1000, 1000);
SELECT * FROM felix.read_shard('blobs', '00000000-0000-4000-8000-000000000000', 0, 0, 10, 10);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.read_shard('blobs', :'blobs_id', 2, 0, 10, 10);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.read_shard('blobs', :'blobs_id', 0, 5, 1, 10);
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.read_shard('blobs', :'blobs_id', 0, 0, 10, NULL);
\echo SQLSTATE :SQLSTATE
