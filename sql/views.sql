--
-- views: felix_streams, felix_shards and felix_metrics after api.sql and
-- refusals.sql ran.  Columns whose values depend on timing (created_at,
-- counters bumped by the node worker) are checked, not printed.
--
\d felix_streams
\d felix_shards
\d felix_metrics

-- Every stream of this database, in name order.
SELECT stream, relation, shards, replication_factor, consistency, payload_type,
       storage, retention_bytes, retention
  FROM felix_streams;
SELECT count(*) AS streams, bool_and(created_at <= now()) AS created_in_the_past
  FROM felix_streams;

-- One row per shard of every stream; positions agree with the rows a scan
-- returns.  Keyless publishes spread over shards from a per-backend start,
-- so per-shard counts of multi-shard streams are compared, not printed.
SELECT stream, shard, role, generation, start_seq, next_seq, hwm, state, error
  FROM felix_shards
 WHERE stream IN ('notes', 'tx', 'bulk', 'seekme', 'copied', 'Mixed Case', 'r');
SELECT count(*) AS shard_rows,
       bool_and(role = 'leader') AS all_led_here,
       bool_and(state = 'open') AS all_open,
       bool_and(error IS NULL) AS no_errors,
       bool_and(start_seq = 0) AS nothing_trimmed,
       bool_and(bytes >= 0) AS bytes_known,
       bool_and((bytes > 0) = (next_seq > 0)) AS bytes_iff_records
  FROM felix_shards;
SELECT (SELECT sum(shards) FROM felix_streams) = (SELECT count(*) FROM felix_shards)
       AS one_row_per_shard;
-- next_seq - start_seq of each shard equals the records a scan of it
-- returns (no rows: every shard agrees).
CREATE FUNCTION shard_count(stream regclass, shard int) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %s WHERE shard = $1', stream) INTO n USING shard;
    RETURN n;
END $$;
SELECT fs.stream, fs.shard, fs.next_seq, shard_count(s.relation, fs.shard) AS scanned
  FROM felix_shards fs JOIN felix_streams s USING (stream)
 WHERE fs.next_seq - fs.start_seq <> shard_count(s.relation, fs.shard);
DROP FUNCTION shard_count(regclass, int);

-- Counters: every name, none negative.
SELECT name FROM felix_metrics ORDER BY name;
SELECT bool_and(value >= 0) AS none_negative FROM felix_metrics;
-- A publish moves records_published, batches_appended and bytes_appended.
SELECT value AS records_before FROM felix_metrics WHERE name = 'records_published' \gset
SELECT value AS batches_before FROM felix_metrics WHERE name = 'batches_appended' \gset
SELECT value AS bytes_before FROM felix_metrics WHERE name = 'bytes_appended' \gset
SELECT count(*) FROM felix_publish_batch('notes', ARRAY['m1', 'm2', 'm3']);
SELECT * FROM felix_publish('notes', 'm4'::text);
SELECT (SELECT value FROM felix_metrics WHERE name = 'records_published') - :records_before AS records,
       (SELECT value FROM felix_metrics WHERE name = 'batches_appended') - :batches_before AS batches,
       (SELECT value FROM felix_metrics WHERE name = 'bytes_appended') > :bytes_before AS bytes_grew;
-- felix_shards follows: notes has one shard and four more records.
SELECT stream, shard, next_seq, hwm FROM felix_shards WHERE stream = 'notes';

-- Retention of a stream without limits trims nothing.
SELECT felix_enforce_retention('notes');
SELECT felix_enforce_retention('kept');

-- Dropping a stream removes its rows from every view.
SELECT felix_drop_stream('Mixed Case');
SELECT count(*) AS rows_left FROM felix_streams WHERE stream = 'Mixed Case';
SELECT count(*) AS rows_left FROM felix_shards WHERE stream = 'Mixed Case';

-- Maintenance commands work on a database that holds streams.
VACUUM seekme;
ANALYZE seekme;
SELECT attname FROM pg_stats WHERE tablename = 'seekme' ORDER BY attname;
ANALYZE;
VACUUM;
