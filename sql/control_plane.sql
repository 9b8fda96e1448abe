--
-- control_plane: the control plane's tables and functions (felix.cp_*),
-- driven by hand with made-up nodes.  It runs in a database of its own so
-- that the test server's heartbeat worker, which uses the control plane in
-- contrib_regression, stays out of it.  Time is moved by backdating rows (a
-- lease lapses when its grant is pushed an hour into the past, a node dies
-- when its last heartbeat is), so no step sleeps and nothing depends on the
-- lease settings.  Errors are followed by their SQLSTATE (\echo).
--
CREATE DATABASE felix_cp_regress;
\c felix_cp_regress
CREATE EXTENSION felix;
\set SHOW_CONTEXT never
-- Made-up nodes: each has an incarnation of its own, derived from its
-- name, and an address of its own unless the test gives one.
CREATE FUNCTION pg_temp.inc(node text) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT md5(node)::uuid::text $$;
CREATE FUNCTION pg_temp.hb(node text, conninfo text)
    RETURNS TABLE (stream text, shard integer, generation bigint, leader text,
                   leader_conninfo text, replicas text[], lease_granted boolean,
                   lease_ms integer, unplaced_reason text, shards integer,
                   replication_factor integer, consistency text, payload_type text,
                   retention_bytes bigint, retention interval, schema text, creation_id uuid,
                   joining text, leaving text, leader_incarnation text)
    LANGUAGE sql
    AS $$ SELECT * FROM felix.cp_heartbeat(node,
                 CASE WHEN conninfo = 'host=x' THEN 'host=' || node ELSE conninfo END,
                 pg_temp.inc(node), 1, pg_temp.inc('boot')) $$;

-- ---------------------------------------------------------------------
-- Interface: tables and functions other parts of felix code against
-- ---------------------------------------------------------------------
SELECT table_name, column_name, data_type, is_nullable
  FROM information_schema.columns
 WHERE table_schema = 'felix'
   AND table_name IN ('nodes', 'cluster_streams', 'assignments', 'replica_reports')
 ORDER BY table_name, ordinal_position;

SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result, p.prosecdef AS security_definer,
       p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'felix'::regnamespace AND p.proname LIKE 'cp\_%'
 ORDER BY p.proname;

-- felix_replication is the group the nodes' roles belong to: it cannot log
-- in; a node logs in as felix_node_<name>, which inherits its grants.
SELECT rolname, rolcanlogin, rolinherit, rolsuper FROM pg_roles
 WHERE rolname = 'felix_replication';
SELECT r.rolname, r.rolcanlogin, r.rolinherit, r.rolsuper,
       pg_has_role(r.rolname, 'felix_replication', 'USAGE') AS in_group
  FROM pg_roles r WHERE r.rolname = felix.node_role(felix.node_name());

-- ---------------------------------------------------------------------
-- Heartbeats register nodes; passwords never show
-- ---------------------------------------------------------------------
SELECT count(*) FROM pg_temp.hb('node_a', 'host=/tmp port=1 user=felix_replication password=s3cret');
SELECT count(*) FROM pg_temp.hb('node_b', 'postgresql://felix_replication:pw@hostb:5432/db?password=x&sslmode=disable');
SELECT count(*) FROM pg_temp.hb('node_c', 'host=hostc password = ''a b\'' c'' port=3');
SELECT count(*) FROM pg_temp.hb('node_d', 'host=hostd');
SELECT count(*) FROM pg_temp.hb('node_e', 'host=hoste sslpassword=k3y sslmode=require');
SELECT name, conninfo, alive, last_heartbeat IS NOT NULL AS seen FROM felix.cp_nodes();
-- The control plane keeps no secret: conninfo is stored masked.
SELECT name, conninfo FROM felix.nodes ORDER BY name;
DELETE FROM felix.nodes WHERE name = 'node_e';
-- A later heartbeat updates the conninfo, keeps the registration.
SELECT registered_at AS a_registered FROM felix.nodes WHERE name = 'node_a' \gset
SELECT count(*) FROM pg_temp.hb('node_a', 'host=hosta port=1 user=felix_replication');
SELECT conninfo, registered_at = :'a_registered' AS same_registration,
       last_heartbeat > registered_at AS heartbeat_moved
  FROM felix.nodes WHERE name = 'node_a';
SELECT * FROM felix.cp_heartbeat(NULL, 'host=x', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('', 'host=x', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', NULL, pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', 'host=x', NULL, 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat(repeat('n', 64), 'host=x', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', 'host=x', 'not-a-uuid', 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', 'host=x', pg_temp.inc('x'), 1, 'not-a-uuid');
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', 'host=x', pg_temp.inc('x'), 0, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
-- One address, one node: a second node claiming an alive node's conninfo
-- is refused (shipments meant for it would reach the other).
SELECT * FROM felix.cp_heartbeat('node_x', 'host=hosta port=1 user=felix_replication', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
-- A data directory that has been started more often than this one says,
-- or as often by another boot, is an older copy of it: refused, so that
-- the node takes a new identity.
SELECT count(*) FROM felix.cp_heartbeat('node_a', 'host=hosta port=1', pg_temp.inc('node_a'), 5, pg_temp.inc('boot'));
SELECT * FROM felix.cp_heartbeat('node_a', 'host=hosta port=1', pg_temp.inc('node_a'), 4, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_a', 'host=hosta port=1', pg_temp.inc('node_a'), 5, pg_temp.inc('another boot'));
\echo SQLSTATE :SQLSTATE
SELECT name, incarnation = pg_temp.inc('node_a') AS same_incarnation, starts
  FROM felix.nodes WHERE name = 'node_a';
SELECT count(*) FROM felix.cp_heartbeat('node_a', 'host=hosta port=1', pg_temp.inc('node_a renewed'), 1, pg_temp.inc('boot'));
SELECT name, incarnation = pg_temp.inc('node_a renewed') AS new_incarnation, starts
  FROM felix.nodes WHERE name = 'node_a';
UPDATE felix.nodes SET incarnation = pg_temp.inc('node_a'), starts = 1 WHERE name = 'node_a';

-- node_d dies: its last heartbeat is an hour old.
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = 'node_d';
SELECT name, alive FROM felix.cp_nodes();

-- ---------------------------------------------------------------------
-- cp_create_stream: refusals, same SQLSTATEs and words as felix_create_stream
-- ---------------------------------------------------------------------
SELECT felix.cp_create_stream(NULL);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream(repeat('x', 64));
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', shards => NULL);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', storage => NULL);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', shards => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', shards => 100000);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', replication_factor => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', replication_factor => 8);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', consistency => 'majority');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', payload_type => 'xml');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', storage => 'tape');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', retention_bytes => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', retention => '-1 day');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', storage => 'object');
\echo SQLSTATE :SQLSTATE
-- Three nodes are alive (node_d is not): a fourth copy has nowhere to go.
SELECT felix.cp_create_stream('bad', replication_factor => 4);
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS streams FROM felix.cluster_streams;

-- ---------------------------------------------------------------------
-- Placement: the replication_factor alive nodes scoring highest, the
-- first of them leading generation 1; no lease until the leader's
-- heartbeat takes it
-- ---------------------------------------------------------------------
SELECT count(*) FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) AS n, LATERAL pg_temp.hb(n, 'host=' || n) AS h;
SELECT felix.cp_create_stream('orders', shards => 4, replication_factor => 3,
                              consistency => 'quorum', retention => '7 days') IS NOT NULL AS created;
SELECT felix.cp_create_stream('solo') IS NOT NULL AS created;
SELECT felix.cp_create_stream('pair', replication_factor => 2, payload_type => 'text',
                              retention_bytes => 1048576, schema => 'app') IS NOT NULL AS created;
SELECT felix.cp_create_stream('orders');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', schema => NULL);
\echo SQLSTATE :SQLSTATE
-- Each stream gets an identity of its own: a drop names it.
SELECT name, schema, shards, replication_factor, consistency, payload_type, storage,
       retention_bytes, retention
  FROM felix.cluster_streams ORDER BY name;
SELECT count(DISTINCT creation_id) AS identities FROM felix.cluster_streams;
SELECT stream, shard, generation, leader, replicas, lease_granted_at IS NULL AS no_lease_yet,
       unplaced_reason
  FROM felix.assignments ORDER BY stream, shard;
-- The replica sets are exactly the top scores among the alive nodes.
SELECT bool_and(x.replicas = (SELECT array_agg(n ORDER BY felix.cp_score(n, x.stream, x.shard) DESC, n)
                                FROM (SELECT n FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) AS n
                                       ORDER BY felix.cp_score(n, x.stream, x.shard) DESC, n
                                       LIMIT cardinality(x.replicas)) AS top))
         AS placed_by_score,
       bool_and(x.leader = x.replicas[1]) AS first_leads,
       bool_and(NOT 'node_d' = ANY (x.replicas)) AS dead_node_unused
  FROM felix.assignments x;

-- ---------------------------------------------------------------------
-- Leases: taken by the leader's heartbeat, renewed while not lapsed,
-- never renewed once lapsed
-- ---------------------------------------------------------------------
SELECT stream, shard, generation, leader, leader_conninfo, replicas, lease_granted, lease_ms > 0 AS has_lease_ms,
       unplaced_reason, shards, replication_factor, consistency, payload_type, retention_bytes, retention
  FROM pg_temp.hb('node_b', 'host=hostb');
SELECT stream, shard, lease_granted FROM pg_temp.hb('node_a', 'host=hosta') WHERE lease_granted;
SELECT stream, shard, lease_granted FROM pg_temp.hb('node_c', 'host=hostc') WHERE lease_granted;
SELECT count(*) AS leases_held FROM felix.assignments WHERE lease_granted_at IS NOT NULL;

-- Renewal moves the grant forward.
SELECT lease_granted_at AS granted FROM felix.assignments WHERE stream = 'orders' AND shard = 0 \gset
SELECT leader AS orders0_leader FROM felix.assignments WHERE stream = 'orders' AND shard = 0 \gset
SELECT stream, shard, lease_granted FROM pg_temp.hb(:'orders0_leader', 'host=x')
 WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted_at > :'granted' AS renewed FROM felix.assignments WHERE stream = 'orders' AND shard = 0;

-- While every lease is fresh the tick has nothing to do.
SELECT felix.cp_tick() AS promoted;

-- A lapsed lease is not renewed: the heartbeat says so and leaves the
-- grant where it was.
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 0
RETURNING lease_granted_at AS lapsed_grant \gset
SELECT stream, shard, lease_granted FROM pg_temp.hb(:'orders0_leader', 'host=x')
 WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted_at = :'lapsed_grant' AS untouched FROM felix.assignments
 WHERE stream = 'orders' AND shard = 0;

-- Lapsed but inside the margin: nothing happens yet, although the leader
-- is alive and would be re-granted (it may still be finishing its lease by
-- its own clock, so nothing may be granted at the next generation).
UPDATE felix.assignments x
   SET lease_granted_at = clock_timestamp()
                          - (x.lease_ms + (SELECT margin_ms FROM felix.cp_settings()) / 2) * interval '1 ms'
 WHERE stream = 'orders' AND shard = 0;
SELECT felix.cp_tick() AS promoted;
SELECT generation, leader, unplaced_reason FROM felix.assignments WHERE stream = 'orders' AND shard = 0;

-- ---------------------------------------------------------------------
-- cp_report: compare-and-set on (leader, generation)
-- ---------------------------------------------------------------------
SELECT replicas[2] AS f1, replicas[3] AS f2 FROM felix.assignments
 WHERE stream = 'orders' AND shard = 0 \gset
-- Not the leader: nothing lands.
SELECT felix.cp_report(:'f1', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', :'f2', 'incarnation', pg_temp.inc(:'f2'), 'acked_end', 10, 'caught_up', true))) AS accepted;
-- Another generation: nothing lands.
SELECT felix.cp_report(:'orders0_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 10, 'caught_up', true))) AS accepted;
-- A follower outside the replica set, the leader itself, an unknown shard:
-- not recorded.
SELECT felix.cp_report(:'orders0_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', 'node_d', 'incarnation', pg_temp.inc('node_d'), 'acked_end', 10, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', :'orders0_leader', 'incarnation', pg_temp.inc(:'orders0_leader'), 'acked_end', 10, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', 9, 'generation', 1,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 10, 'caught_up', true),
         jsonb_build_object('stream', 'nope', 'shard', 0, 'generation', 1,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 10, 'caught_up', true))) AS accepted;
SELECT count(*) AS reports FROM felix.replica_reports;
-- Malformed calls are refused whole.
SELECT felix.cp_report(:'orders0_leader', '{"stream": "orders"}');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report(:'orders0_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 10, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', -1, 'generation', 1,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 10, 'caught_up', true)));
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report(NULL, '[]');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report(:'orders0_leader', '[]') AS accepted;
SELECT count(*) AS reports FROM felix.replica_reports;

-- ---------------------------------------------------------------------
-- cp_tick: no report, no promotion.  The leader dies; nobody was reported
-- caught up, so the shard stays unplaced and says why
-- ---------------------------------------------------------------------
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour'
 WHERE name = :'orders0_leader';
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 0;
SELECT felix.cp_tick() AS promoted;
SELECT generation, leader, unplaced_reason FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
SELECT unplaced_reason FROM pg_temp.hb(:'f1', 'host=x') WHERE stream = 'orders' AND shard = 0;
SELECT count(*) FROM pg_temp.hb(:'f2', 'host=x');

-- Reports that do not qualify: a lagging follower (caught_up false), a
-- halted one, one whose node has a new data directory since (another
-- incarnation), one that is not alive, one of an older generation than
-- the newest that reported.  Reports can only come from the current
-- leader, so they are written here as a superuser would, to pin what the
-- tick accepts.
INSERT INTO felix.replica_reports
       (stream, shard, generation, leader, follower, follower_incarnation, acked_end,
        caught_up, halted, halted_since, position, reported_at)
VALUES ('orders', 0, 1, :'orders0_leader', :'f1', pg_temp.inc(:'f1'), 100, false,
        NULL, NULL, NULL, clock_timestamp()),
       ('orders', 0, 1, :'orders0_leader', :'f2', pg_temp.inc(:'f2'), 100, false,
        'diverged', clock_timestamp(), 90, clock_timestamp());
-- Every node lists the halts of the current leaders (felix_halted).
SELECT stream, shard, node = :'f2' AS is_f2, generation, leader = :'orders0_leader' AS by_leader,
       halted_at_seq, reason, since IS NOT NULL AS has_since
  FROM felix.cp_halted();
SELECT felix.cp_tick() AS promoted;
SELECT generation, leader, unplaced_reason FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
UPDATE felix.replica_reports SET caught_up = true, halted = NULL, halted_since = NULL, position = NULL
 WHERE stream = 'orders' AND shard = 0;
UPDATE felix.replica_reports SET follower_incarnation = pg_temp.inc('another directory')
 WHERE follower = :'f2';
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = :'f1';
SELECT felix.cp_tick() AS promoted;
SELECT generation, leader, unplaced_reason FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
SELECT count(*) FROM pg_temp.hb(:'f1', 'host=x');
UPDATE felix.replica_reports SET generation = 0 WHERE follower = :'f1';
SELECT felix.cp_tick() AS promoted;
SELECT generation, leader, unplaced_reason FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
DELETE FROM felix.replica_reports;

-- ---------------------------------------------------------------------
-- Promotion: the dead leader's reports landed while it led (before its
-- lease ran out); the follower furthest ahead wins even against a better
-- score; on equal positions the score decides
-- ---------------------------------------------------------------------
UPDATE felix.nodes SET last_heartbeat = clock_timestamp() WHERE name = :'orders0_leader';
UPDATE felix.assignments SET lease_granted_at = clock_timestamp(), unplaced_reason = NULL
 WHERE stream = 'orders' AND shard = 0;
SELECT felix.cp_report(:'orders0_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 41, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', :'f2', 'incarnation', pg_temp.inc(:'f2'), 'acked_end', 42, 'caught_up', true))) AS accepted;
SELECT stream, shard, generation, leader = :'orders0_leader' AS by_leader, follower, acked_end, caught_up
  FROM felix.replica_reports ORDER BY follower;
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour'
 WHERE name = :'orders0_leader';
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 0;
-- (on a quorum stream a report counts however old it is: nothing was
-- acknowledged that the newest landed report does not cover)
-- (f2 scores below f1 here: it wins on position alone)
SELECT felix.cp_score(:'f1', 'orders', 0) > felix.cp_score(:'f2', 'orders', 0) AS f1_scores_higher;
SELECT count(*) FROM pg_temp.hb(:'f1', 'host=x');
SELECT count(*) FROM pg_temp.hb(:'f2', 'host=x');
SELECT felix.cp_tick() AS promoted;
SELECT generation, leader = :'f2' AS furthest_ahead_leads, replicas, lease_granted_at IS NULL AS no_lease_yet,
       unplaced_reason
  FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
-- The new leader takes the new generation's lease at its heartbeat.
SELECT generation, lease_granted FROM pg_temp.hb(:'f2', 'host=x') WHERE stream = 'orders' AND shard = 0;
-- The superseded leader's reports never land again.
SELECT felix.cp_report(:'orders0_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 1,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 50, 'caught_up', true))) AS accepted;
SELECT felix.cp_report(:'orders0_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 50, 'caught_up', true))) AS accepted;
-- The new leader's land; a follower it leaves out is no longer caught up.
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 42, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'orders0_leader', 'incarnation', pg_temp.inc(:'orders0_leader'), 'acked_end', 42, 'caught_up', true))) AS accepted;
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 43, 'caught_up', true))) AS accepted;
SELECT generation, leader = :'f2' AS by_leader, follower = :'f1' AS is_f1, acked_end, caught_up
  FROM felix.replica_reports ORDER BY follower = :'f1';

-- Tokens order one leader's requests.  A request that arrives after a
-- newer one (the leader gave up on it, it was held up) writes nothing and
-- says so; nor does it clear a follower the newer one named.  A request
-- without a token (a hand-made one) is not ordered.
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 60, 'caught_up', false)),
       token => 200) AS accepted;
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 44, 'caught_up', true)),
       token => 100) AS accepted_late;
SELECT acked_end, caught_up, token FROM felix.replica_reports WHERE follower = :'f1';
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 61, 'caught_up', true)),
       token => 300) AS accepted;
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'orders0_leader', 'incarnation', pg_temp.inc(:'orders0_leader'), 'acked_end', 61, 'caught_up', true)),
       token => 250) AS accepted_leaving_f1_alone;
SELECT follower = :'f1' AS is_f1, acked_end, caught_up, token
  FROM felix.replica_reports ORDER BY follower = :'f1';
SELECT felix.cp_report(:'f2', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 0, 'generation', 2,
                            'follower', :'f1', 'incarnation', pg_temp.inc(:'f1'), 'acked_end', 62, 'caught_up', true))) AS accepted_untokened;
SELECT acked_end, token FROM felix.replica_reports WHERE follower = :'f1';

-- Equal positions: the better score wins.  Shard 1's leader dies with
-- both followers reported level.
SELECT leader AS o1_leader, replicas[2] AS o1_f1, replicas[3] AS o1_f2
  FROM felix.assignments WHERE stream = 'orders' AND shard = 1 \gset
SELECT count(*) FROM pg_temp.hb(:'o1_leader', 'host=x');
SELECT felix.cp_report(:'o1_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 1, 'generation', 1,
                            'follower', :'o1_f2', 'incarnation', pg_temp.inc(:'o1_f2'), 'acked_end', 7, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', 1, 'generation', 1,
                            'follower', :'o1_f1', 'incarnation', pg_temp.inc(:'o1_f1'), 'acked_end', 7, 'caught_up', true))) AS accepted;
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = :'o1_leader';
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 1;
SELECT count(*) FROM pg_temp.hb(:'o1_f1', 'host=x');
SELECT count(*) FROM pg_temp.hb(:'o1_f2', 'host=x');
SELECT felix.cp_tick() >= 1 AS promoted;
SELECT generation, leader = :'o1_f1' AS best_score_leads FROM felix.assignments
 WHERE stream = 'orders' AND shard = 1;

-- ---------------------------------------------------------------------
-- The last leader, alive again after its lease lapsed, is re-granted at
-- the next generation (it holds everything its generation wrote)
-- ---------------------------------------------------------------------
SELECT leader AS o2_leader FROM felix.assignments WHERE stream = 'orders' AND shard = 2 \gset
SELECT count(*) FROM pg_temp.hb(:'o2_leader', 'host=x');
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 2;
SELECT count(*) FROM pg_temp.hb(:'o2_leader', 'host=x');
SELECT felix.cp_tick() >= 1 AS promoted;
SELECT generation, leader = :'o2_leader' AS same_leader FROM felix.assignments
 WHERE stream = 'orders' AND shard = 2;

-- ... but not once its felix data directory has been replaced: a new
-- incarnation holds nothing of the old one's.  It does not take the
-- generation granted to the old one, and once the grant expires nobody
-- can take over (no follower was reported caught up).
SELECT generation, lease_granted
  FROM felix.cp_heartbeat(:'o2_leader', 'host=' || :'o2_leader', pg_temp.inc('o2 wiped'), 1, pg_temp.inc('boot'))
 WHERE stream = 'orders' AND shard = 2;
UPDATE felix.assignments SET assigned_at = assigned_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 2;
SELECT count(*) FROM felix.cp_heartbeat(:'o2_leader', 'host=' || :'o2_leader', pg_temp.inc('o2 wiped'), 1, pg_temp.inc('boot'));
SELECT felix.cp_tick() >= 0 AS ticked;
SELECT generation, leader = :'o2_leader' AS same_leader,
       replace(unplaced_reason, :'o2_leader', '<leader>') ~ 'no replica was reported caught up' AS unplaced
  FROM felix.assignments WHERE stream = 'orders' AND shard = 2;
UPDATE felix.nodes SET incarnation = pg_temp.inc(:'o2_leader') WHERE name = :'o2_leader';

-- ---------------------------------------------------------------------
-- A granted leader that never takes its lease (it died first) is
-- replaced once the grant expires, by a replica the last landed report
-- counted caught up: the generation it never took wrote nothing
-- ---------------------------------------------------------------------
SELECT leader AS o3_leader, replicas[2] AS o3_f1, replicas[3] AS o3_f2
  FROM felix.assignments WHERE stream = 'orders' AND shard = 3 \gset
SELECT count(*) FROM pg_temp.hb(:'o3_leader', 'host=x');
SELECT felix.cp_report(:'o3_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 3, 'generation', 1,
                            'follower', :'o3_f1', 'incarnation', pg_temp.inc(:'o3_f1'), 'acked_end', 5, 'caught_up', true),
         jsonb_build_object('stream', 'orders', 'shard', 3, 'generation', 1,
                            'follower', :'o3_f2', 'incarnation', pg_temp.inc(:'o3_f2'), 'acked_end', 5, 'caught_up', true))) AS accepted;
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = :'o3_leader';
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 3;
SELECT count(*) FROM pg_temp.hb(:'o3_f1', 'host=x');
SELECT count(*) FROM pg_temp.hb(:'o3_f2', 'host=x');
SELECT felix.cp_tick() >= 1 AS promoted;
SELECT leader AS o3_granted, generation AS o3_gen FROM felix.assignments
 WHERE stream = 'orders' AND shard = 3 \gset
-- The grantee dies before its first heartbeat; the grant expires.
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = :'o3_granted';
UPDATE felix.assignments SET assigned_at = assigned_at - interval '1 hour'
 WHERE stream = 'orders' AND shard = 3;
SELECT felix.cp_tick() >= 1 AS promoted;
SELECT generation = :o3_gen + 1 AS next_generation, leader <> :'o3_granted' AS another_replica,
       leader IN (:'o3_f1', :'o3_f2') AS reported_caught_up, unplaced_reason
  FROM felix.assignments WHERE stream = 'orders' AND shard = 3;

-- ---------------------------------------------------------------------
-- A node outside the replica set is never promoted, alive or not
-- ---------------------------------------------------------------------
SELECT leader AS p_leader, replicas[2] AS p_follower,
       (SELECT n FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) AS n
         WHERE NOT n = ANY (x.replicas)) AS p_outsider
  FROM felix.assignments x WHERE stream = 'pair' AND shard = 0 \gset
SELECT count(*) FROM pg_temp.hb(:'p_leader', 'host=x');
SELECT count(*) FROM pg_temp.hb(:'p_outsider', 'host=x');
SELECT felix.cp_report(:'p_leader', jsonb_build_array(
         jsonb_build_object('stream', 'pair', 'shard', 0, 'generation', 1,
                            'follower', :'p_outsider', 'incarnation', pg_temp.inc(:'p_outsider'), 'acked_end', 9, 'caught_up', true))) AS accepted;
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour'
 WHERE name IN (:'p_leader', :'p_follower');
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour'
 WHERE stream = 'pair' AND shard = 0;
SELECT felix.cp_tick() >= 0 AS ticked;
SELECT generation, leader = :'p_leader' AS last_leader_kept,
       replace(replace(unplaced_reason, :'p_leader', '<leader>'), :'p_follower', '<follower>') AS unplaced_reason
  FROM felix.assignments WHERE stream = 'pair' AND shard = 0;

-- ---------------------------------------------------------------------
-- replication_factor = 1: the only copy.  Its node dies: unplaced; it
-- comes back: re-granted at the next generation
-- ---------------------------------------------------------------------
SELECT leader AS solo_node FROM felix.assignments WHERE stream = 'solo' \gset
SELECT count(*) FROM pg_temp.hb(:'solo_node', 'host=x');
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = :'solo_node';
UPDATE felix.assignments SET lease_granted_at = lease_granted_at - interval '1 hour' WHERE stream = 'solo';
SELECT felix.cp_tick() >= 0 AS ticked;
SELECT generation, replace(unplaced_reason, :'solo_node', '<node>') AS unplaced_reason
  FROM felix.assignments WHERE stream = 'solo';
SELECT generation, lease_granted, replace(unplaced_reason, :'solo_node', '<node>') AS unplaced_reason
  FROM pg_temp.hb(:'solo_node', 'host=x') WHERE stream = 'solo';
SELECT felix.cp_tick() >= 1 AS promoted;
SELECT generation, leader = :'solo_node' AS same_node, unplaced_reason
  FROM felix.assignments WHERE stream = 'solo';
SELECT generation, lease_granted FROM pg_temp.hb(:'solo_node', 'host=x') WHERE stream = 'solo';

-- A generation whose leader never takes its lease: after a lease and a
-- margin with its leader dead, it too is unplaced (nobody reported).
UPDATE felix.assignments SET generation = generation + 1, lease_granted_at = NULL,
       assigned_at = assigned_at - interval '1 hour'
 WHERE stream = 'solo';
UPDATE felix.nodes SET last_heartbeat = last_heartbeat - interval '1 hour' WHERE name = :'solo_node';
SELECT felix.cp_tick() >= 0 AS ticked;
SELECT generation, replace(unplaced_reason, :'solo_node', '<node>') AS unplaced_reason
  FROM felix.assignments WHERE stream = 'solo';
-- ... and its first heartbeat takes the lease it never took.
SELECT generation, lease_granted, unplaced_reason
  FROM pg_temp.hb(:'solo_node', 'host=x') WHERE stream = 'solo';

-- ---------------------------------------------------------------------
-- Planned moves.  cp_transfer: the leader of a generation, which has
-- stopped writing, hands the next one to another alive member of the
-- replica set at once.  cp_move_replica: a node joins a replica set to
-- replace another; the leaving one goes when the leader reports the
-- joining one caught up.
-- ---------------------------------------------------------------------
SELECT count(*) FROM unnest(ARRAY['node_a', 'node_b', 'node_c', 'node_d']) AS n, LATERAL pg_temp.hb(n, 'host=' || n) AS h;
SELECT x.leader AS t_leader, x.generation AS t_gen, f.followers[1] AS t_to, f.followers[2] AS t_other
  FROM felix.assignments x,
       LATERAL (SELECT array_agg(r ORDER BY r) AS followers FROM unnest(x.replicas) r
                 WHERE r <> x.leader) f
 WHERE x.stream = 'orders' AND x.shard = 1 \gset
SELECT felix.cp_transfer('orders', 1, :t_gen - 1, :'t_leader', :'t_to');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_transfer('orders', 1, :t_gen, :'t_to', :'t_other');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_transfer('orders', 1, :t_gen, :'t_leader', 'node_d');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_transfer('orders', 1, :t_gen, :'t_leader', :'t_leader');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_transfer('orders', 1, :t_gen, :'t_leader', :'t_to') = :t_gen + 1 AS next_generation;
SELECT generation = :t_gen + 1 AS next_generation, leader = :'t_to' AS handed_over,
       lease_granted_at IS NULL AS lease_not_taken_yet,
       leader_incarnation = pg_temp.inc(:'t_to') AS its_incarnation
  FROM felix.assignments WHERE stream = 'orders' AND shard = 1;
SELECT generation, lease_granted FROM pg_temp.hb(:'t_to', 'host=x') WHERE stream = 'orders' AND shard = 1;

-- The new leader :t_to is not moved (transfer it first); from_node must
-- be a replica, to_node must not be one.
SELECT felix.cp_move_replica('orders', 1, :'t_to', 'node_d');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_move_replica('orders', 1, 'node_d', :'t_other');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_move_replica('orders', 1, :'t_other', :'t_leader');
\echo SQLSTATE :SQLSTATE
SELECT cardinality(felix.cp_move_replica('orders', 1, :'t_other', 'node_d')) AS members;
SELECT replicas @> ARRAY[:'t_other', 'node_d'] AS both_in, cardinality(replicas) AS members,
       joining, leaving = :'t_other' AS leaving_ok
  FROM felix.assignments WHERE stream = 'orders' AND shard = 1;
SELECT joining, leaving = :'t_other' AS leaving_ok
  FROM pg_temp.hb(:'t_to', 'host=x') WHERE stream = 'orders' AND shard = 1;
SELECT felix.cp_move_replica('orders', 1, :'t_leader', 'node_d');
\echo SQLSTATE :SQLSTATE
-- Behind: the move goes on.  Caught up: the leaving node goes.
SELECT felix.cp_report(:'t_to', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 1, 'generation', :t_gen + 1,
                            'follower', 'node_d', 'incarnation', pg_temp.inc('node_d'),
                            'acked_end', 3, 'caught_up', false))) AS accepted;
SELECT joining FROM felix.assignments WHERE stream = 'orders' AND shard = 1;
SELECT felix.cp_report(:'t_to', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 1, 'generation', :t_gen + 1,
                            'follower', 'node_d', 'incarnation', pg_temp.inc('node_d'),
                            'acked_end', 9, 'caught_up', true))) AS accepted;
SELECT NOT (:'t_other' = ANY (replicas)) AS left, 'node_d' = ANY (replicas) AS joined,
       cardinality(replicas) AS members, joining, leaving
  FROM felix.assignments WHERE stream = 'orders' AND shard = 1;
SELECT count(*) AS reports_of_the_leaver FROM felix.replica_reports
 WHERE stream = 'orders' AND shard = 1 AND follower = :'t_other';

-- ---------------------------------------------------------------------
-- A report lands only from the incarnation its generation was granted
-- to; a node that starts again counts as caught up only once its leader
-- says so again
-- ---------------------------------------------------------------------
SELECT x.leader AS r_leader, x.generation AS r_gen,
       (SELECT r FROM unnest(x.replicas) r WHERE r <> x.leader ORDER BY r LIMIT 1) AS r_f
  FROM felix.assignments x WHERE x.stream = 'orders' AND x.shard = 1 \gset
SELECT felix.cp_report(:'r_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 1, 'generation', :r_gen,
                            'follower', :'r_f', 'incarnation', pg_temp.inc(:'r_f'),
                            'acked_end', 20, 'caught_up', true)),
       incarnation => pg_temp.inc('a wiped leader')) AS accepted;
SELECT felix.cp_report(:'r_leader', jsonb_build_array(
         jsonb_build_object('stream', 'orders', 'shard', 1, 'generation', :r_gen,
                            'follower', :'r_f', 'incarnation', pg_temp.inc(:'r_f'),
                            'acked_end', 20, 'caught_up', true)),
       incarnation => pg_temp.inc(:'r_leader')) AS accepted;
SELECT acked_end, caught_up FROM felix.replica_reports
 WHERE stream = 'orders' AND shard = 1 AND follower = :'r_f';
SELECT count(*) > 0 AS heartbeat FROM felix.cp_heartbeat(:'r_f', 'host=' || :'r_f', pg_temp.inc(:'r_f'), 2,
                                                          pg_temp.inc('its second boot'));
SELECT acked_end, caught_up FROM felix.replica_reports
 WHERE stream = 'orders' AND shard = 1 AND follower = :'r_f';

-- ---------------------------------------------------------------------
-- cp_drop_stream
-- ---------------------------------------------------------------------
-- Only the stream registered under that name with that creation id goes:
-- another identity of the same name (a table someone made by hand and
-- dropped, an older incarnation) forgets nothing.
SELECT felix.cp_drop_stream('orders', '00000000-0000-0000-0000-000000000000', true);
SELECT felix.cp_drop_stream('orders', '00000000-0000-0000-0000-000000000000');
\echo SQLSTATE :SQLSTATE
SELECT count(*) AS still_there FROM felix.cluster_streams WHERE name = 'orders';
SELECT creation_id AS orders_id FROM felix.cluster_streams WHERE name = 'orders' \gset
SELECT felix.cp_drop_stream('orders', :'orders_id');
SELECT (SELECT count(*) FROM felix.cluster_streams WHERE name = 'orders') AS streams,
       (SELECT count(*) FROM felix.assignments WHERE stream = 'orders') AS assignments,
       (SELECT count(*) FROM felix.replica_reports WHERE stream = 'orders') AS reports;
\set VERBOSITY terse
SELECT felix.cp_drop_stream('orders', :'orders_id');
\echo SQLSTATE :SQLSTATE
\set VERBOSITY default
SELECT felix.cp_drop_stream(NULL, NULL);
\echo SQLSTATE :SQLSTATE
SELECT DISTINCT stream FROM pg_temp.hb('node_a', 'host=hosta') ORDER BY 1;

-- ---------------------------------------------------------------------
-- Privileges: internal functions and tables are not for an ordinary role;
-- felix_replication may call the cp_* functions and read nothing else
-- ---------------------------------------------------------------------
CREATE ROLE regress_cp_ordinary;
SET ROLE regress_cp_ordinary;
SELECT * FROM felix.cp_heartbeat('node_z', 'host=z', pg_temp.inc('node_z'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('z');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_drop_stream('pair', '00000000-0000-0000-0000-000000000000');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report('node_a', '[]');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_tick();
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_nodes();
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.assignments;
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.nodes;
\echo SQLSTATE :SQLSTATE
RESET ROLE;
SET ROLE felix_replication;
SELECT name, alive FROM felix.cp_nodes() WHERE name = 'node_a';
SELECT felix.cp_tick() >= 0 AS ticked;
SELECT * FROM felix.replica_reports;
\echo SQLSTATE :SQLSTATE
RESET ROLE;

-- A node acts only for itself: node_a's role may not heartbeat (and so
-- register, or take or renew a lease) or report for node_b.  Any node's
-- role may tick and list; a role in felix_replication that is not a
-- node's may not.
SELECT felix_create_node_role('node_a'), felix_create_node_role('node_b');
SELECT felix_create_node_role(repeat('n', 53));
\echo SQLSTATE :SQLSTATE
CREATE ROLE regress_cp_member LOGIN IN ROLE felix_replication;
SET SESSION AUTHORIZATION felix_node_node_a;
SELECT count(*) > 0 AS own_heartbeat FROM felix.cp_heartbeat('node_a', 'host=hosta', pg_temp.inc('node_a'), 1, pg_temp.inc('boot'));
SELECT * FROM felix.cp_heartbeat('node_b', 'host=evil', pg_temp.inc('node_b'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report('node_b', '[]');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report('node_a', '[]') AS own_report;
SELECT felix.cp_tick() >= 0 AS ticked;
SELECT count(*) > 0 AS listed FROM felix.cp_nodes();
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_cp_member;
SELECT * FROM felix.cp_heartbeat('node_a', 'host=hosta', pg_temp.inc('node_a'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_tick();
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_drop_stream('pair', '00000000-0000-0000-0000-000000000000');
\echo SQLSTATE :SQLSTATE
RESET SESSION AUTHORIZATION;
SELECT conninfo FROM felix.nodes WHERE name = 'node_b';
DROP ROLE regress_cp_member;

SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute,
       has_function_privilege('felix_replication', p.oid, 'EXECUTE') AS replication_may_execute
  FROM pg_proc p
 WHERE p.pronamespace = 'felix'::regnamespace AND p.proname LIKE 'cp\_%'
 ORDER BY p.proname;
DROP ROLE regress_cp_ordinary;
DROP ROLE felix_node_node_a, felix_node_node_b;

\c contrib_regression
DROP DATABASE felix_cp_regress WITH (FORCE);
