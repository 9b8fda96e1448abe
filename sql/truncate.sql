-- truncate: felix.truncate_after never removes a record at or below the
-- high-water mark (on a leader every acknowledged record is at or below
-- it), and refuses bad positions.  Truncation above the mark is how a
-- follower drops a leader's unadopted proposals.
\set VERBOSITY default
SELECT felix_create_stream('cut');
SELECT count(*) AS published
  FROM felix_publish_batch('cut', ARRAY['{"n": 0}', '{"n": 1}', '{"n": 2}']::jsonb[]);
SELECT hwm, next_seq FROM felix_shards WHERE stream = 'cut';
-- Cutting after seq 0 would remove seqs 1 and 2, both acknowledged.
SELECT felix.truncate_after('cut', 0, 0);
\echo SQLSTATE :SQLSTATE
-- Keeping everything up to the mark removes nothing: allowed.
SELECT felix.truncate_after('cut', 0, 2);
\echo SQLSTATE :SQLSTATE
SELECT seq, payload FROM cut;
-- Bad positions.
SELECT felix.truncate_after('cut', 0, -1);
\echo SQLSTATE :SQLSTATE
SELECT felix.truncate_after('cut', 1, 0);
\echo SQLSTATE :SQLSTATE
-- The log is intact and publishing goes on from next_seq.
SELECT * FROM felix_publish('cut', '{"n": 3}'::jsonb);
SELECT seq, payload FROM cut;
SELECT felix_drop_stream('cut');
