-- Least-privilege set-up for workpump on Postgres.
--
-- Two roles: an owner that runs the migrations (workpump migrate up, or
-- migrations.Up) and owns the schema's objects, and the role the
-- application's pool logs in as, which gets only what the pump needs. The
-- script below is migrations.PrivilegesSQL("public", "workpump_app"); call
-- that function for another schema or role. TestLeastPrivilege_Postgres
-- (internal/faulttest) runs a pump end to end under exactly these grants.
--
-- One-time, as a superuser (names are examples):
--   CREATE ROLE workpump_owner LOGIN;
--   CREATE ROLE workpump_app LOGIN;
--   GRANT CREATE ON DATABASE <db> TO workpump_owner;  -- migrations.Up runs CREATE SCHEMA IF NOT EXISTS,
--                                                     -- which checks it even when the schema exists
--   CREATE SCHEMA <schema> AUTHORIZATION workpump_owner;  -- for a schema other than public
--   -- (for public on Postgres 15+: GRANT CREATE ON SCHEMA public TO workpump_owner)
--   -- The app role needs CONNECT on <db>; PUBLIC has it unless it was revoked.
--
-- Optional hardening, as the owner: REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
--
-- Then, as the owner, after every migrate up:

-- workpump: privileges of the pump's role "workpump_app" on schema "public".
-- Rendered by migrations.PrivilegesSQL; run as the owner of the schema's
-- objects (the role that ran the migrations), again after every migrate up.

GRANT USAGE ON SCHEMA "public" TO "workpump_app";

DO $grant$
DECLARE
    o record;
BEGIN
    -- Tables: full DML on the work, instance, stream and dead-letter
    -- tables; read-only on the version table; read and record-once on the
    -- settings table.
    FOR o IN
        SELECT c.oid::regclass AS rel, c.relname
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'public'::regnamespace
           AND c.relkind IN ('r', 'p')
           AND c.relname LIKE 'wp\_%'
         ORDER BY c.relname
    LOOP
        IF o.relname = 'wp_schema_migrations' THEN
            EXECUTE format('GRANT SELECT ON TABLE %s TO %I', o.rel, 'workpump_app');
        ELSIF o.relname = 'wp_settings' THEN
            EXECUTE format('GRANT SELECT, INSERT ON TABLE %s TO %I', o.rel, 'workpump_app');
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s TO %I', o.rel, 'workpump_app');
        END IF;
    END LOOP;
    -- Sequences: USAGE (nextval) on the plain wp_ sequences; identity
    -- sequences need no grant.
    FOR o IN
        SELECT c.oid::regclass AS rel
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'public'::regnamespace
           AND c.relkind = 'S'
           AND c.relname LIKE 'wp\_%'
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                            WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
         ORDER BY c.relname
    LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I', o.rel, 'workpump_app');
    END LOOP;
    -- Functions: every wp_ function (the coordinator's calls and the
    -- helpers they call).
    FOR o IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace
           AND p.proname LIKE 'wp\_%'
         ORDER BY p.proname
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', o.fn, 'workpump_app');
    END LOOP;
END
$grant$;
