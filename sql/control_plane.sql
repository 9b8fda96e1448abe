--
-- control_plane: the control plane's rules (control/cp_*.c) over the
-- embedded store, driven by hand through the felix.cp_* functions with
-- made-up nodes.  It runs in a database of its own so that the test
-- server's own heartbeat worker, which uses the store in
-- contrib_regression, stays out of it.  This session is the only one
-- running the duties here (felix.cp_tick as node_a), so what the duty
-- holder observes is what this script does; leases lapse by waiting
-- (pg_sleep) past a lease and margin.  Errors are followed by their
-- SQLSTATE (\echo).
--
SELECT current_user AS regress_user \gset
CREATE DATABASE felix_cp_regress;
\c felix_cp_regress
CREATE EXTENSION felix;
\set SHOW_CONTEXT never
-- Made-up nodes: an incarnation and a boot of their own, derived from
-- their names, and an address of their own unless the test gives one.
CREATE FUNCTION pg_temp.inc(node text) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT md5(node)::uuid::text $$;
CREATE FUNCTION pg_temp.hb(node text, conninfo text DEFAULT 'host=x', boot text DEFAULT 'boot',
                           starts bigint DEFAULT 1, ends text[] DEFAULT NULL)
    RETURNS TABLE (stream text, shard integer, generation bigint, leader text,
                   lease_granted boolean, unplaced_reason text)
    LANGUAGE sql
    AS $$ SELECT h.stream, h.shard, h.generation, h.leader, h.lease_granted, h.unplaced_reason
            FROM felix.cp_heartbeat(node,
                 CASE WHEN conninfo = 'host=x' THEN 'host=' || node ELSE conninfo END,
                 pg_temp.inc(node), starts, pg_temp.inc(boot), lease_ms => 100, ends => ends) h
           WHERE h.stream IS NOT NULL $$;
-- One round of the duties, as node_a (this session).
CREATE FUNCTION pg_temp.tick() RETURNS integer LANGUAGE sql
    AS $$ SELECT promoted FROM felix.cp_tick('node_a', pg_temp.inc('duty')) $$;
-- Past every lease and margin the duty holder could be waiting out while
-- node `silent` says nothing: the other nodes heartbeat and the duties
-- tick every 100 ms, as running nodes do (a holder that stops ticking for
-- a lease gives the duties up, as if it had been paused).
CREATE FUNCTION pg_temp.lapse(silent text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    WHILE clock_timestamp() < t0 + current_setting('felix.lease_duration')::interval
                                 + current_setting('felix.lease_margin')::interval
                                 + interval '600 ms' LOOP
        PERFORM count(*) FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) n, pg_temp.hb(n)
          WHERE n <> silent;
        PERFORM pg_temp.tick();
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;

-- ---------------------------------------------------------------------
-- Interface
-- ---------------------------------------------------------------------
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result
  FROM pg_proc p
 WHERE p.pronamespace = 'felix'::regnamespace
   AND (p.proname LIKE 'cp\_%' OR p.proname = 'store_read')
 ORDER BY p.proname;
SELECT table_name, column_name, data_type
  FROM information_schema.columns
 WHERE table_schema = 'felix'
   AND table_name IN ('cp_store', 'nodes', 'cluster_streams', 'assignments', 'replica_reports')
 ORDER BY table_name, ordinal_position;

-- ---------------------------------------------------------------------
-- Heartbeats register nodes; no secret is kept
-- ---------------------------------------------------------------------
SELECT count(*) FROM pg_temp.hb('node_a', 'host=/tmp port=1 password=s3cret');
SELECT count(*) FROM pg_temp.hb('node_b', 'postgresql://u:pw@hostb:5432/db?password=x&sslmode=disable');
SELECT count(*) FROM pg_temp.hb('node_c', 'host=hostc sslpassword=k3y port=3');
SELECT count(*) FROM pg_temp.hb('node_d');
SELECT name, conninfo, incarnation = pg_temp.inc(name) AS own_incarnation, starts, beat, claims
  FROM felix.nodes ORDER BY name;
SELECT count(*) AS keys_with_a_secret FROM felix.cp_store WHERE value ~ 's3cret|pw@|k3y';
-- A later heartbeat of the same boot counts a beat and keeps the registration.
SELECT count(*) FROM pg_temp.hb('node_a', 'host=hosta port=1');
SELECT conninfo, beat, registered_at < last_heartbeat AS seen_again FROM felix.nodes WHERE name = 'node_a';
-- Refusals.
SELECT * FROM felix.cp_heartbeat(NULL, 'host=x', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('', 'host=x', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', NULL, pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat(repeat('n', 64), 'host=x', pg_temp.inc('x'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', 'host=x', 'not-a-uuid', 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_x', 'host=x', pg_temp.inc('x'), 0, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
-- The same data directory seen started more often: an older copy (55F06).
SELECT count(*) FROM felix.cp_heartbeat('node_d', 'host=node_d', pg_temp.inc('node_d'), 2, pg_temp.inc('boot2'));
SELECT * FROM felix.cp_heartbeat('node_d', 'host=node_d', pg_temp.inc('node_d'), 1, pg_temp.inc('boot3'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM felix.cp_heartbeat('node_d', 'host=node_d', pg_temp.inc('node_d'), 2, pg_temp.inc('boot3'));
\echo SQLSTATE :SQLSTATE
SELECT starts, boot = pg_temp.inc('boot2') AS same_boot FROM felix.nodes WHERE name = 'node_d';

-- ---------------------------------------------------------------------
-- The duties: node_a takes them; the alive list follows heartbeats
-- ---------------------------------------------------------------------
SELECT pg_temp.tick() AS promoted;
SELECT key, value::jsonb ->> 'node' AS holder FROM felix.cp_store WHERE key = 'duty';
SELECT count(*) FROM pg_temp.hb('node_a');
SELECT count(*) FROM pg_temp.hb('node_b');
SELECT count(*) FROM pg_temp.hb('node_c');
SELECT pg_temp.tick() AS promoted;
SELECT name, alive, duty FROM felix.cp_nodes() ORDER BY name;
-- One address, one node: node_e may not register node_b's (42710).
SELECT * FROM pg_temp.hb('node_e', 'host=node_b');
\echo SQLSTATE :SQLSTATE
-- One name, one server: another data directory under node_b's name, at
-- another address, while node_b is alive (42710); node_b keeps its record.
SELECT * FROM felix.cp_heartbeat('node_b', 'host=elsewhere', pg_temp.inc('node_b2'), 1, pg_temp.inc('boot'));
\echo SQLSTATE :SQLSTATE
SELECT conninfo, incarnation = pg_temp.inc('node_b') AS kept FROM felix.nodes WHERE name = 'node_b';
-- The refused server records that it tried (no secret kept); every node's
-- felix_nodes shows it on node_b's row.  A note naming the holder's own
-- incarnation, or a node not alive, records nothing.
SELECT felix.cp_name_clash('node_b', pg_temp.inc('node_b2'), 'host=elsewhere password=s3cret');
SELECT felix.cp_name_clash('node_c', pg_temp.inc('node_c'), 'host=nowhere');
SELECT felix.cp_name_clash('node_x', pg_temp.inc('node_x2'), 'host=nowhere');
SELECT name, clash_incarnation = pg_temp.inc('node_b2') AS the_refused_one, clash_conninfo,
       clash_at IS NOT NULL AS dated
  FROM felix.cp_nodes() WHERE clash_incarnation IS NOT NULL;
SELECT felix.cp_name_clash('node_b', 'not-a-uuid', 'host=elsewhere');
\echo SQLSTATE :SQLSTATE

-- ---------------------------------------------------------------------
-- Streams: validation, placement, identity
-- ---------------------------------------------------------------------
SELECT felix.cp_create_stream(NULL);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream(repeat('s', 64));
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', shards => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', replication_factor => 8);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', consistency => 'strong');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', payload_type => 'xml');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', storage => 'object');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', retention_bytes => 0);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('bad', replication_factor => 5);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_create_stream('orders', 2, 3, 'quorum', retention => '1 day') IS NOT NULL AS created;
SELECT felix.cp_create_stream('orders');
\echo SQLSTATE :SQLSTATE
SELECT name, shards, replication_factor, consistency, payload_type, storage, retention
  FROM felix.cluster_streams;
-- Each replica set is the top scores among the alive nodes, leader first.
SELECT a.shard, a.generation, a.replicas,
       a.replicas = ARRAY(SELECT n FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) n
                           ORDER BY felix.cp_score(n, 'orders', a.shard) DESC, n COLLATE "C"
                           LIMIT 3) AS by_score,
       a.leader = a.replicas[1] AS leader_first, a.taken_generation
  FROM felix.assignments a WHERE a.stream = 'orders' ORDER BY a.shard;
SELECT leader AS l0 FROM felix.assignments WHERE stream = 'orders' AND shard = 0 \gset
SELECT replicas[2] AS f0, replicas[3] AS g0 FROM felix.assignments WHERE stream = 'orders' AND shard = 0 \gset

-- ---------------------------------------------------------------------
-- Leases: claimed by the leader's heartbeat, only by the boot that took them
-- ---------------------------------------------------------------------
SELECT shard, generation, lease_granted FROM pg_temp.hb(:'l0') WHERE stream = 'orders' ORDER BY shard;
SELECT taken_generation, taken_boot = pg_temp.inc('boot') AS taken_by_this_boot
  FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
SELECT jsonb_path_query_array(claims, '$[*] ? (@.stream == "orders").shard') AS claimed
  FROM felix.nodes WHERE name = :'l0';
-- A follower's heartbeat claims nothing of shard 0.
SELECT lease_granted FROM pg_temp.hb(:'f0') WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted FROM pg_temp.hb(:'l0') WHERE stream = 'orders' AND shard = 0;

-- ---------------------------------------------------------------------
-- Reports land only from the leader at the reported generation
-- ---------------------------------------------------------------------
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":10,"caught_up":true},{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":4,"caught_up":false}]',
       :'f0', pg_temp.inc(:'f0'), :'g0', pg_temp.inc(:'g0'))::jsonb, 100, pg_temp.inc(:'l0')) AS accepted;
SELECT follower = :'f0' AS is_f0, generation, acked_end, caught_up FROM felix.replica_reports
 WHERE stream = 'orders' AND shard = 0 ORDER BY acked_end DESC;
-- Not the leader, another generation, the leader itself, a non-member: nothing lands.
SELECT felix.cp_report(:'f0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":99,"caught_up":true}]',
       :'g0', pg_temp.inc(:'g0'))::jsonb, 101) AS accepted_from_follower;
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":2,"follower":"%s","incarnation":"%s","acked_end":99,"caught_up":true}]',
       :'g0', pg_temp.inc(:'g0'))::jsonb, 102) AS accepted_other_generation;
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":99,"caught_up":true},{"stream":"orders","shard":0,"generation":1,"follower":"node_zz","incarnation":"%s","acked_end":99,"caught_up":true}]',
       :'l0', pg_temp.inc(:'l0'), pg_temp.inc('zz'))::jsonb, 103) AS accepted_self_or_stranger;
-- An older token does not undo a newer report.
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":1,"caught_up":false}]',
       :'f0', pg_temp.inc(:'f0'))::jsonb, 50) AS accepted_older_token;
SELECT acked_end, caught_up FROM felix.replica_reports WHERE stream = 'orders' AND shard = 0 AND follower = :'f0';
-- A quorum shard's report that says what the store holds lands without a
-- write (the leader's periodic refresh).  A call's rows on one shard are
-- taken together wherever they are in it: here another shard's row comes
-- between them (taken apart, the first row's follower would count as left
-- out of the second's report, no longer caught up, and be rewritten).
SELECT mod_revision AS rr FROM felix.store_read('reports/orders/000000') \gset
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":10,"caught_up":true},{"stream":"orders","shard":1,"generation":1,"follower":"%s","incarnation":"%s","acked_end":0,"caught_up":false},{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":4,"caught_up":false}]',
       :'f0', pg_temp.inc(:'f0'), :'f0', pg_temp.inc(:'f0'), :'g0', pg_temp.inc(:'g0'))::jsonb, 110, pg_temp.inc(:'l0')) AS accepted_same;
SELECT follower = :'f0' AS is_f0, acked_end, caught_up FROM felix.replica_reports
 WHERE stream = 'orders' AND shard = 0 ORDER BY acked_end DESC;
SELECT mod_revision = :rr AS not_rewritten FROM felix.store_read('reports/orders/000000');
-- Malformed calls are refused whole (22023).
SELECT felix.cp_report(:'l0', '{}'::jsonb);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report(:'l0', '[{"stream":"orders","shard":0}]'::jsonb);
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":5,"caught_up":true,"halted":"diverged"}]',
       :'g0', pg_temp.inc(:'g0'))::jsonb);
\echo SQLSTATE :SQLSTATE
-- A halted follower is listed by cp_halted, never caught up.
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":10,"caught_up":true},{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":3,"caught_up":false,"halted":"diverged","position":3}]',
       :'f0', pg_temp.inc(:'f0'), :'g0', pg_temp.inc(:'g0'))::jsonb, 200, pg_temp.inc(:'l0')) AS accepted;
SELECT stream, shard, node = :'g0' AS is_g0, generation, halted_at_seq, reason FROM felix.cp_halted();

-- ---------------------------------------------------------------------
-- Promotion: the leader stops heartbeating; the caught-up follower leads
-- ---------------------------------------------------------------------
-- f0's heartbeats give where its log ends, as running nodes' do: at 10,
-- what the report says it holds (its first claim compares it with the
-- acknowledged end its promotion is based on).
SELECT count(*) > 0 AS beat FROM pg_temp.hb(:'f0', ends => ARRAY['orders/0=10']);
-- ends_beat counts the heartbeats that gave log ends: one without them
-- (a backend's) keeps the ends and the count, one with them adds one.
SELECT (value::jsonb->>'beat')::bigint AS b, (value::jsonb->>'ends_beat')::bigint AS e
  FROM felix.store_read('nodes/' || :'f0') \gset
SELECT count(*) > 0 AS beat FROM pg_temp.hb(:'f0');
SELECT (value::jsonb->>'beat')::bigint - :b AS beats, (value::jsonb->>'ends_beat')::bigint - :e AS ends_beats,
       (SELECT ends FROM felix.nodes WHERE name = :'f0') AS ends
  FROM felix.store_read('nodes/' || :'f0');
SELECT count(*) > 0 AS beat FROM pg_temp.hb(:'f0', ends => ARRAY['orders/0=10']);
SELECT (value::jsonb->>'beat')::bigint - :b AS beats, (value::jsonb->>'ends_beat')::bigint - :e AS ends_beats
  FROM felix.store_read('nodes/' || :'f0');
SELECT pg_temp.tick() AS promoted_while_the_lease_runs;
SELECT pg_temp.lapse(:'l0');
SELECT pg_temp.tick() AS promoted;
SELECT generation, leader = :'f0' AS f0_leads, leader_incarnation = pg_temp.inc(:'f0') AS its_incarnation,
       unplaced_reason FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
-- The superseded leader's reports no longer land; the new leader's do.
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":1,"follower":"%s","incarnation":"%s","acked_end":11,"caught_up":true}]',
       :'g0', pg_temp.inc(:'g0'))::jsonb, 300) AS accepted_from_old_leader;
SELECT lease_granted FROM pg_temp.hb(:'f0') WHERE stream = 'orders' AND shard = 0;
SELECT felix.cp_report(:'f0', format('[{"stream":"orders","shard":0,"generation":2,"follower":"%s","incarnation":"%s","acked_end":10,"caught_up":true}]',
       :'l0', pg_temp.inc(:'l0'))::jsonb, 1, pg_temp.inc(:'f0')) AS accepted_from_new_leader;
-- Its report is of generation 2: the rows of generation 1 no longer count.
SELECT follower = :'l0' AS is_l0, generation, caught_up FROM felix.replica_reports
 WHERE stream = 'orders' AND shard = 0 ORDER BY generation DESC, follower;

-- ---------------------------------------------------------------------
-- Unplaced: the only copy's node is gone
-- ---------------------------------------------------------------------
-- A single copy on g0, which leads nothing else.
SELECT 'solo_' || i AS solo FROM generate_series(0, 99) i
 WHERE (SELECT n FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) n
         ORDER BY felix.cp_score(n, 'solo_' || i, 0) DESC, n COLLATE "C" LIMIT 1) = :'g0'
 ORDER BY i LIMIT 1 \gset
SELECT count(*) FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) n, pg_temp.hb(n);
SELECT pg_temp.tick() AS promoted;
SELECT felix.cp_create_stream(:'solo', 1, 1) IS NOT NULL AS created;
SELECT leader = :'g0' AS on_g0 FROM felix.assignments WHERE stream = :'solo';
SELECT lease_granted FROM pg_temp.hb(:'g0') WHERE stream = :'solo';
SELECT pg_temp.lapse(:'g0');
SELECT pg_temp.tick() AS promoted;
SELECT generation, unplaced_reason = format('the only copy is on %s, which lost its lease at generation 1 and is not alive', :'g0') AS says_why
  FROM felix.assignments WHERE stream = :'solo';
-- It comes back, the same server (boot) as before: nobody else was
-- granted its lease meanwhile, so it claims it again at once.
SELECT lease_granted, unplaced_reason FROM pg_temp.hb(:'g0') WHERE stream = :'solo';

-- ---------------------------------------------------------------------
-- Planned moves
-- ---------------------------------------------------------------------
SELECT count(*) FROM unnest(ARRAY['node_a', 'node_b', 'node_c']) n, pg_temp.hb(n);
SELECT pg_temp.tick() >= 0 AS holding;
-- A transfer by the leader of the generation: the next one at once.
SELECT felix.cp_transfer('orders', 0, 1, :'f0', :'l0');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_transfer('orders', 0, 2, :'f0', 'node_zz');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_transfer('orders', 0, 2, :'f0', :'l0') AS next_generation;
SELECT generation, leader = :'l0' AS l0_leads FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
-- The first claim of generation 3 needs l0's log, as its heartbeat gives
-- it, to hold the acknowledged floor (10): unknown, or shorter (a copy put
-- back since the grant), claims nothing.
SELECT value::jsonb->'acked_floor' AS acked_floor FROM felix.store_read('shards/orders/000000');
SELECT lease_granted FROM pg_temp.hb(:'l0') WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted FROM pg_temp.hb(:'l0', ends => ARRAY['orders/0=9']) WHERE stream = 'orders' AND shard = 0;
-- A log end comes with the generation of its last record, the copy's
-- epoch and whether that is its first in the boot (0 or 1; or without
-- it), or alone: anything else is not believed (no end, no claim).
SELECT lease_granted FROM pg_temp.hb(:'l0', ends => ARRAY['orders/0=10:2']) WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted FROM pg_temp.hb(:'l0', ends => ARRAY['orders/0=10:2:7:2']) WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted FROM pg_temp.hb(:'l0', ends => ARRAY['orders/0=10:2:7:1:1']) WHERE stream = 'orders' AND shard = 0;
SELECT lease_granted FROM pg_temp.hb(:'l0', ends => ARRAY['orders/0=10:-2:7']) WHERE stream = 'orders' AND shard = 0;
-- f0 gives its copy's token; then the claim that takes generation 3
-- records l0's log and the token of every copy the state holds; g0 gave
-- none, so its boot is recorded ("#0"): it counts for promotion by log
-- only with its copy's first epoch in that boot.
SELECT count(*) > 0 AS beat FROM pg_temp.hb(:'f0', ends => ARRAY['orders/0=10:2:3:1']);
SELECT lease_granted FROM pg_temp.hb(:'l0', ends => ARRAY['orders/0=10:2:7']) WHERE stream = 'orders' AND shard = 0;
SELECT v->'taken_end' AS taken_end, v->'taken_last_generation' AS taken_last_generation,
       ARRAY(SELECT n = :'l0' FROM jsonb_array_elements_text(v->'taken_copy_nodes') n) AS l0_first,
       (SELECT array_agg(split_part(t, '#', 2)) FROM jsonb_array_elements_text(v->'taken_copy_tokens') t) AS epochs
  FROM (SELECT value::jsonb AS v FROM felix.store_read('shards/orders/000000')) s;
-- A replica move: node_d (alive again) replaces g0 once reported caught up.
SELECT count(*) FROM pg_temp.hb('node_d', boot => 'boot2', starts => 2);
SELECT pg_temp.tick() >= 0 AS holding;
SELECT felix.cp_move_replica('orders', 0, :'l0', 'node_d');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_move_replica('orders', 0, :'g0', :'f0');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_move_replica('orders', 0, :'g0', 'node_d') IS NOT NULL AS moving;
SELECT felix.cp_move_replica('orders', 0, :'g0', 'node_d');
\echo SQLSTATE :SQLSTATE
SELECT joining, leaving = :'g0' AS g0_leaves, cardinality(replicas) FROM felix.assignments WHERE stream = 'orders' AND shard = 0;
SELECT felix.cp_report(:'l0', format('[{"stream":"orders","shard":0,"generation":3,"follower":"node_d","incarnation":"%s","acked_end":10,"caught_up":true},{"stream":"orders","shard":0,"generation":3,"follower":"%s","incarnation":"%s","acked_end":10,"caught_up":true}]',
       pg_temp.inc('node_d'), :'f0', pg_temp.inc(:'f0'))::jsonb, 400, pg_temp.inc(:'l0')) AS accepted;
SELECT joining, :'g0' = ANY (replicas) AS g0_still_there, 'node_d' = ANY (replicas) AS d_joined
  FROM felix.assignments WHERE stream = 'orders' AND shard = 0;

-- ---------------------------------------------------------------------
-- Drops name the stream's identity
-- ---------------------------------------------------------------------
SELECT creation_id AS orders_id FROM felix.cluster_streams WHERE name = 'orders' \gset
SELECT felix.cp_drop_stream('orders', '00000000-0000-4000-8000-000000000001');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_drop_stream('orders', gen_random_uuid(), missing_ok => true);
SELECT felix.cp_drop_stream('orders', :'orders_id');
SELECT count(*) AS left_of_orders FROM felix.cp_store WHERE key LIKE '%/orders%';

-- ---------------------------------------------------------------------
-- What a session read before stays true: a process keeps a copy of the
-- state and reads only what changed since (cpstate.c).  A deletion shows
-- in it, and so does a transaction of its own that rolled back.
-- ---------------------------------------------------------------------
SELECT count(*) AS orders_rows_after_the_drop FROM pg_temp.hb('node_b') WHERE stream = 'orders';
BEGIN;
SELECT felix.cp_create_stream('ghost', 1, 1) IS NOT NULL AS created_in_a_transaction;
SELECT count(*) AS ghost_rows_inside FROM pg_temp.hb('node_b') WHERE stream = 'ghost';
ROLLBACK;
SELECT count(*) AS ghost_rows_after_rollback FROM pg_temp.hb('node_b') WHERE stream = 'ghost';

-- A node says what it holds (the state and the commit of its last answer)
-- and is told what changed since: nothing, once nothing did.  A deletion
-- makes the answer full again.
CREATE FUNCTION pg_temp.hb_since(s bigint, c bigint, id text)
    RETURNS TABLE (stream text, state_revision bigint, store_revision bigint, store_id text,
                   full_answer boolean)
    LANGUAGE sql
    AS $$ SELECT h.stream, h.state_revision, h.store_revision, h.store_id, h.full_answer
            FROM felix.cp_heartbeat('node_b', 'host=node_b', pg_temp.inc('node_b'), 1,
                 pg_temp.inc('boot'), lease_ms => 100, seen_store_id => id,
                 known_state => s, known_commit => c) h $$;
SELECT felix.cp_create_stream('delta', 2, 3) IS NOT NULL AS created;
SELECT state_revision AS s1, store_revision AS c1, store_id AS sid
  FROM pg_temp.hb_since(NULL, NULL, NULL) WHERE stream IS NULL \gset
SELECT state_revision AS s2, store_revision AS c2
  FROM pg_temp.hb_since(:s1, :c1, :'sid') WHERE stream IS NULL \gset
SELECT count(*) FILTER (WHERE stream IS NOT NULL) AS rows_when_nothing_changed,
       bool_or(full_answer) AS full
  FROM pg_temp.hb_since(:s2, :c2, :'sid');
SELECT count(*) FILTER (WHERE stream IS NOT NULL) AS rows_from_another_store,
       bool_or(full_answer) AS full
  FROM pg_temp.hb_since(:s2, :c2, '00000000-0000-4000-8000-000000000000');
SELECT count(*) FILTER (WHERE stream IS NOT NULL) AS rows_from_nothing,
       bool_or(full_answer) AS full
  FROM pg_temp.hb_since(NULL, NULL, :'sid');
SELECT creation_id AS delta_id FROM felix.cluster_streams WHERE name = 'delta' \gset
SELECT felix.cp_drop_stream('delta', :'delta_id');
SELECT count(*) FILTER (WHERE stream = 'delta') AS rows_of_the_dropped_stream,
       bool_or(full_answer) AS full
  FROM pg_temp.hb_since(:s2, :c2, :'sid');

-- A worker's log ends, unchanged since the heartbeat whose answer it took
-- last, need not be given again: they count as given (ends_beat).  Ends
-- written after that answer are not taken so, and the answer is full.
CREATE FUNCTION pg_temp.hb_ends(s bigint, c bigint, id text, ends text[], same boolean)
    RETURNS TABLE (state_revision bigint, store_revision bigint, full_answer boolean)
    LANGUAGE sql
    AS $$ SELECT h.state_revision, h.store_revision, h.full_answer
            FROM felix.cp_heartbeat('node_b', 'host=node_b', pg_temp.inc('node_b'), 1,
                 pg_temp.inc('boot'), lease_ms => 100, ends => ends, seen_store_id => id,
                 known_state => s, known_commit => c, ends_unchanged => same) h
           WHERE h.stream IS NULL $$;
CREATE FUNCTION pg_temp.ends_beat() RETURNS bigint LANGUAGE sql
    AS $$ SELECT (value::jsonb->>'ends_beat')::bigint FROM felix.store_read('nodes/node_b')
           WHERE key = 'nodes/node_b' $$;
SELECT state_revision AS e_s, store_revision AS e_c
  FROM pg_temp.hb_ends(NULL, NULL, :'sid', ARRAY['x/0=5'], false) \gset
SELECT pg_temp.ends_beat() AS eb \gset
SELECT full_answer AS full_when_unchanged FROM pg_temp.hb_ends(:e_s, :e_c, :'sid', NULL, true);
SELECT pg_temp.ends_beat() - :eb AS ends_beats, (SELECT ends FROM felix.nodes WHERE name = 'node_b') AS ends;
SELECT count(*) AS header FROM pg_temp.hb_ends(NULL, NULL, :'sid', ARRAY['x/0=6'], false);
SELECT full_answer AS full_when_stale FROM pg_temp.hb_ends(:e_s, :e_c, :'sid', NULL, true);
SELECT pg_temp.ends_beat() - :eb AS ends_beats, (SELECT ends FROM felix.nodes WHERE name = 'node_b') AS ends;

-- A leader told what changed since its last answer: nothing while it
-- claims what it claimed then (however many shards it leads, the
-- heartbeat then looks only at what changed); a lease it stops claiming,
-- because it says it cannot serve the shard, and the same lease claimed
-- again are each in the answer, and nothing else is.
CREATE TEMP TABLE lead_known (s bigint, c bigint, id text);
INSERT INTO lead_known VALUES (NULL, NULL, NULL);
CREATE FUNCTION pg_temp.lead_beat(node text, unable text[])
    RETURNS TABLE (rows text, full_answer boolean) LANGUAGE plpgsql AS $$
DECLARE
    k lead_known;
    n record;
BEGIN
    SELECT * INTO k FROM lead_known;
    SELECT * INTO n FROM felix.nodes WHERE name = node;
    CREATE TEMP TABLE beat ON COMMIT DROP AS
      SELECT h.* FROM felix.cp_heartbeat(node, n.conninfo, n.incarnation, n.starts, n.boot,
                 unable, lease_ms => 100, seen_store_id => k.id,
                 known_state => k.s, known_commit => k.c) h;
    UPDATE lead_known SET s = b.state_revision, c = b.store_revision, id = b.store_id
      FROM beat b WHERE b.stream IS NULL;
    RETURN QUERY SELECT coalesce(string_agg(b.stream || '/' || b.shard || ' granted ' || b.lease_granted,
                                            ', ' ORDER BY b.stream, b.shard)
                                   FILTER (WHERE b.stream = 'lead2'), '') || ' of '
                        || count(*) FILTER (WHERE b.stream IS NOT NULL),
                        bool_or(b.full_answer)
                   FROM beat b;
    DROP TABLE beat;
END $$;
SELECT felix.cp_create_stream('lead2', 2, 1) IS NOT NULL AS created;
SELECT leader AS ll FROM felix.assignments WHERE stream = 'lead2' AND shard = 0 \gset
SELECT full_answer AS first_answer_full FROM pg_temp.lead_beat(:'ll', ARRAY[]::text[]);
SELECT full_answer FROM pg_temp.lead_beat(:'ll', NULL);
SELECT rows AS when_nothing_changed, full_answer FROM pg_temp.lead_beat(:'ll', NULL);
SELECT rows AS when_it_stops_claiming, full_answer FROM pg_temp.lead_beat(:'ll', ARRAY['lead2/0']);
SELECT rows AS when_nothing_changed, full_answer FROM pg_temp.lead_beat(:'ll', NULL);
SELECT rows AS when_it_claims_again, full_answer FROM pg_temp.lead_beat(:'ll', ARRAY[]::text[]);
SELECT rows AS when_nothing_changed, full_answer FROM pg_temp.lead_beat(:'ll', NULL);

-- A key rewritten by hand behind the copy of the state this session keeps
-- (node_b's record given an older revision, which a read of what changed
-- since does not bring back): the heartbeat's compare fails once, and a
-- failed compare under the embedded store's lock makes the next read a
-- whole one, so the next attempt succeeds -- rather than each one losing
-- to the same stale copy until the periodic whole read.
SELECT count(*) > 0 AS warm FROM pg_temp.hb('node_b');
UPDATE felix.cp_store SET mod_revision = mod_revision - 1 WHERE key = 'nodes/node_b';
SELECT count(*) > 0 AS heartbeat_after_a_hand_edit FROM pg_temp.hb('node_b');

-- A node started again doubts every report that says it is caught up.  A
-- node that follows hundreds of shards has hundreds: rewritten in one
-- transaction they were more than etcd takes, and the node never
-- registered again.  They are rewritten in transactions of at most 100
-- reports first (so, here, under several revisions), then the node
-- registers; none says caught up after.
SELECT felix.cp_create_stream('wide', 256, 3) IS NOT NULL AS created;
SELECT n AS wf FROM (SELECT unnest(replicas[2:]) n FROM felix.assignments WHERE stream = 'wide') f
 GROUP BY n ORDER BY count(*) DESC, n LIMIT 1 \gset
SELECT sum(felix.cp_report(leader, reports)) > 100 AS reported_caught_up
  FROM (SELECT a.leader, jsonb_agg(jsonb_build_object('stream', 'wide', 'shard', a.shard,
                 'generation', a.generation, 'follower', :'wf',
                 'incarnation', pg_temp.inc(:'wf'), 'acked_end', 0, 'caught_up', true)) AS reports
          FROM felix.assignments a
         WHERE a.stream = 'wide' AND :'wf' = ANY (a.replicas[2:])
         GROUP BY a.leader) r;
SELECT count(*) > 0 AS restarted
  FROM felix.nodes n, felix.cp_heartbeat(n.name, n.conninfo, n.incarnation, n.starts + 1,
                                         pg_temp.inc('boot-wide'), lease_ms => 100) h
 WHERE n.name = :'wf';
SELECT count(*) FILTER (WHERE r.caught_up) AS still_caught_up,
       count(DISTINCT s.mod_revision) > 1 AS rewritten_in_several_transactions
  FROM felix.replica_reports r
  JOIN felix.store_read('reports/wide/') s ON s.key = 'reports/wide/' || lpad(r.shard::text, 6, '0')
 WHERE r.stream = 'wide' AND r.follower = :'wf';

-- ---------------------------------------------------------------------
-- Removing a node
-- ---------------------------------------------------------------------
SELECT felix.cp_remove_node('node_zz');
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_remove_node('node_a');
\echo SQLSTATE :SQLSTATE

-- ---------------------------------------------------------------------
-- Privileges: an ordinary role calls nothing; a node acts for itself
-- ---------------------------------------------------------------------
CREATE ROLE cp_nobody LOGIN;
SELECT felix_create_node_role('node_a');
SET ROLE cp_nobody;
SELECT count(*) FROM felix.cp_nodes();
\echo SQLSTATE :SQLSTATE
SELECT felix.cp_tick('node_a', pg_temp.inc('x'));
\echo SQLSTATE :SQLSTATE
SELECT count(*) FROM felix.store_read('');
\echo SQLSTATE :SQLSTATE
SELECT count(*) FROM felix.cp_store;
\echo SQLSTATE :SQLSTATE
SELECT count(*) FROM felix.assignments;
\echo SQLSTATE :SQLSTATE
RESET ROLE;
\c felix_cp_regress felix_node_node_a
SELECT count(*) FROM felix.cp_heartbeat('node_b', 'host=node_b', md5('node_b')::uuid::text, 1, md5('boot')::uuid::text);
\echo SQLSTATE :SQLSTATE
SELECT count(*) > 0 AS listed FROM felix.cp_nodes();
\c contrib_regression :regress_user
DROP ROLE cp_nobody;
DROP DATABASE felix_cp_regress;
DROP ROLE felix_node_node_a;
