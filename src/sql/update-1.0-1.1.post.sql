
-- ---------------------------------------------------------------------
-- felix 1.0 -> 1.1, after objects.sql: the 1.0 control plane's state moves
-- into the embedded store, and every stream gets its label FOR felix.
-- ---------------------------------------------------------------------

-- The control plane's state.  Only the database that hosted the 1.0
-- control plane has rows here; every other node's tables are empty.
-- What 1.0 did not record is filled in so that no node's copy counts for
-- more than 1.0 made it count:
--  - a shard's leader and every report name the unknown incarnation (the
--    nil uuid, CP_INCARNATION_UNKNOWN in control/cpstate.h): no follower
--    qualifies for a promotion on a 1.0 report, and the named leader is
--    given its shard again, at the next generation, only with a log that
--    reaches what its reports say its followers held (cp_duty.c);
--  - each generation counts as taken by a boot that no longer runs, so
--    no node resumes a 1.0 generation after its restart into 1.1;
--  - nodes register again with their first heartbeat, as new nodes.
WITH rev AS (SELECT pg_catalog.nextval('felix.cp_store_revision') AS r)
INSERT INTO felix.cp_store (key, value, mod_revision)
SELECT 'streams/' OPERATOR(pg_catalog.||) cs.name,
       (pg_catalog.jsonb_build_object(
            'name', cs.name,
            'schema', coalesce((SELECT n.nspname FROM felix.streams s
                                  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) s.relid
                                  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                                 WHERE s.name OPERATOR(pg_catalog.=) cs.name), 'public'),
            'creation_id', pg_catalog.md5('felix 1.0 stream ' OPERATOR(pg_catalog.||) cs.name)::uuid::text,
            'shards', cs.shards,
            'replication_factor', cs.replication_factor,
            'consistency', cs.consistency,
            'payload_type', cs.payload_type,
            'storage', cs.storage,
            'created_ms', (extract(epoch FROM cs.created_at) OPERATOR(pg_catalog.*) 1000)::bigint)
        OPERATOR(pg_catalog.||) CASE WHEN cs.retention_bytes IS NULL THEN '{}'::jsonb
            ELSE pg_catalog.jsonb_build_object('retention_bytes', cs.retention_bytes) END
        OPERATOR(pg_catalog.||) CASE WHEN cs.retention IS NULL THEN '{}'::jsonb
            ELSE pg_catalog.jsonb_build_object('retention', pg_catalog.jsonb_build_object(
                'months', (extract(year FROM cs.retention) OPERATOR(pg_catalog.*) 12
                           OPERATOR(pg_catalog.+) extract(month FROM cs.retention))::integer,
                'days', extract(day FROM cs.retention)::integer,
                'usec', ((extract(hour FROM cs.retention) OPERATOR(pg_catalog.*) 3600
                          OPERATOR(pg_catalog.+) extract(minute FROM cs.retention) OPERATOR(pg_catalog.*) 60)
                         OPERATOR(pg_catalog.*) 1000000
                         OPERATOR(pg_catalog.+) extract(microseconds FROM cs.retention))::bigint)) END
       )::text,
       rev.r
  FROM felix.v1_0_cluster_streams cs, rev;

WITH rev AS (SELECT pg_catalog.nextval('felix.cp_store_revision') AS r)
INSERT INTO felix.cp_store (key, value, mod_revision)
SELECT pg_catalog.format('shards/%s/%s', a.stream, pg_catalog.lpad(a.shard::text, 6, '0')),
       (pg_catalog.jsonb_build_object(
            'stream', a.stream,
            'shard', a.shard,
            'generation', a.generation,
            'leader', a.leader,
            'leader_incarnation', '00000000-0000-0000-0000-000000000000',
            'replicas', pg_catalog.to_jsonb(a.replicas),
            'taken_generation', a.generation,
            'taken_boot', '00000000-0000-0000-0000-000000000000',
            'assigned_ms', (extract(epoch FROM a.assigned_at) OPERATOR(pg_catalog.*) 1000)::bigint)
        OPERATOR(pg_catalog.||) CASE WHEN a.unplaced_reason IS NULL THEN '{}'::jsonb
            ELSE pg_catalog.jsonb_build_object('unplaced_reason', a.unplaced_reason) END
       )::text,
       rev.r
  FROM felix.v1_0_assignments a, rev;

WITH rev AS (SELECT pg_catalog.nextval('felix.cp_store_revision') AS r)
INSERT INTO felix.cp_store (key, value, mod_revision)
SELECT pg_catalog.format('reports/%s/%s', r.stream, pg_catalog.lpad(r.shard::text, 6, '0')),
       pg_catalog.jsonb_build_object('rows', pg_catalog.jsonb_agg(
            pg_catalog.jsonb_build_object(
                'follower', r.follower,
                'incarnation', '00000000-0000-0000-0000-000000000000',
                'generation', r.generation,
                'leader', r.leader,
                'acked_end', r.acked_end,
                'caught_up', r.caught_up,
                'leader_beat', 0,
                'reported_ms', (extract(epoch FROM r.reported_at) OPERATOR(pg_catalog.*) 1000)::bigint)
            OPERATOR(pg_catalog.||) CASE WHEN r.token IS NULL THEN '{}'::jsonb
                ELSE pg_catalog.jsonb_build_object('token', r.token) END
            ORDER BY r.follower))::text,
       rev.r
  FROM felix.v1_0_replica_reports r, rev
 GROUP BY r.stream, r.shard, rev.r;

DROP TABLE felix.v1_0_replica_reports, felix.v1_0_assignments, felix.v1_0_cluster_streams,
    felix.v1_0_nodes;

-- Every stream's settings travel through pg_dump as its label FOR felix
-- (api/seclabel.c); 1.1 labels a stream when it creates it, and these
-- were created before.  The text is the one felix_stream_label writes.
DO $$
DECLARE
    s record;
    style text := pg_catalog.current_setting('intervalstyle');
BEGIN
    PERFORM pg_catalog.set_config('intervalstyle', 'iso_8601', true);
    FOR s IN SELECT * FROM felix.streams ORDER BY name LOOP
        EXECUTE pg_catalog.format('SECURITY LABEL FOR felix ON TABLE %s IS %L',
            s.relid::pg_catalog.regclass,
            pg_catalog.format('{"shards":%s,"replication_factor":%s,"consistency":%s,"storage":%s%s%s}',
                s.shards, s.replication_factor, pg_catalog.to_json(s.consistency),
                pg_catalog.to_json(s.storage),
                CASE WHEN s.retention_bytes IS NULL THEN ''
                     ELSE ',"retention_bytes":' OPERATOR(pg_catalog.||) s.retention_bytes END,
                CASE WHEN s.retention IS NULL THEN ''
                     ELSE ',"retention":' OPERATOR(pg_catalog.||) pg_catalog.to_json(s.retention::text) END));
    END LOOP;
    PERFORM pg_catalog.set_config('intervalstyle', style, true);
END
$$;
