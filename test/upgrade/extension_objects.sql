-- Every object of the felix extension in this database, one line each,
-- with what defines it: two installations that print the same lines have
-- the same objects (test/t/131_upgrade.pl compares an updated one with a
-- fresh one).  OIDs, and so creation order, do not show.
WITH ext AS (
    SELECT d.classid, d.objid
      FROM pg_depend d
      JOIN pg_extension e ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
     WHERE e.extname = 'felix' AND d.deptype = 'e'
), described AS (
    SELECT pg_describe_object(x.classid, x.objid, 0) AS object,
           CASE x.classid
           WHEN 'pg_proc'::regclass THEN
               (SELECT pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, '-')
                  FROM pg_proc p WHERE p.oid = x.objid)
           WHEN 'pg_class'::regclass THEN
               (SELECT c.relkind::text || ' acl ' || coalesce(c.relacl::text, '-')
                       || ' options ' || coalesce(c.reloptions::text, '-')
                       || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
                       || CASE WHEN c.relkind = 'v' THEN ' view ' || pg_get_viewdef(c.oid) ELSE '' END
                       || ' columns ' || coalesce((
                            SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                              || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                              || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
                                              || coalesce(' collate ' || co.collname, ''),
                                              ', ' ORDER BY a.attnum)
                              FROM pg_attribute a
                              LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                              LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
                             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '-')
                       || ' constraints ' || coalesce((
                            SELECT string_agg(k.conname || ' ' || pg_get_constraintdef(k.oid), ', ' ORDER BY k.conname)
                              FROM pg_constraint k WHERE k.conrelid = c.oid), '-')
                       || ' indexes ' || coalesce((
                            SELECT string_agg(pg_get_indexdef(i.indexrelid), ', ' ORDER BY 1)
                              FROM pg_index i WHERE i.indrelid = c.oid), '-')
                  FROM pg_class c WHERE c.oid = x.objid)
           WHEN 'pg_type'::regclass THEN
               (SELECT t.typtype::text || ' ' || coalesce((
                    SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                      FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0), '-')
                  FROM pg_type t WHERE t.oid = x.objid)
           WHEN 'pg_event_trigger'::regclass THEN
               (SELECT t.evtevent::text || ' ' || t.evtfoid::regprocedure || ' ' || t.evtenabled::text
                  FROM pg_event_trigger t WHERE t.oid = x.objid)
           WHEN 'pg_am'::regclass THEN
               (SELECT a.amtype::text || ' ' || a.amhandler::regprocedure || ' comment '
                       || coalesce(obj_description(a.oid, 'pg_am'), '-')
                  FROM pg_am a WHERE a.oid = x.objid)
           WHEN 'pg_namespace'::regclass THEN
               (SELECT coalesce(n.nspacl::text, '-') FROM pg_namespace n WHERE n.oid = x.objid)
           ELSE '' END AS definition
      FROM ext x
)
SELECT object || ' | ' || regexp_replace(coalesce(definition, '?'), '\s+', ' ', 'g')
  FROM described
 ORDER BY 1;
