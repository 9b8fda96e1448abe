--
-- setup: the extension installs into the test database with felix
-- preloaded (test/regress.conf), and installs exactly the documented API.
--
CREATE EXTENSION felix;
SELECT extname, extversion, extrelocatable FROM pg_extension WHERE extname = 'felix';

-- The table access method streams use.
SELECT amname, amtype FROM pg_am WHERE amname = 'felix';

-- The SQL API in schema public (names are a contract).
SELECT p.oid::regprocedure AS function
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public' AND p.proname LIKE 'felix%'
 ORDER BY p.oid::regprocedure::text;

SELECT c.relname, c.relkind
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relname LIKE 'felix%'
 ORDER BY c.relname;

-- Internal functions are not for PUBLIC.
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'felix' AND p.proname IN ('truncate_after', 'require_preload', 'on_sql_drop')
 ORDER BY p.proname;

-- Settings and their defaults (felix.database comes from test/regress.conf).
SELECT name, setting, unit, context
  FROM pg_settings WHERE name LIKE 'felix.%' ORDER BY name;

-- Nothing exists yet.
SELECT count(*) AS streams FROM felix_streams;
SELECT count(*) AS shards FROM felix_shards;
