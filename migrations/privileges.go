package migrations

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrInvalidRole is wrapped by every error about a bad role name.
var ErrInvalidRole = errors.New("workpump migrations: invalid role name")

var roleRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// SettingsTable is the name of the one-row table (inside the schema) that
// records what every process sharing the schema must agree on: its
// partition count (version 5).
const SettingsTable = "wp_settings"

// PrivilegesSQL renders the statements that give role what a pump needs on
// schema, and nothing more, for a deployment where the migrations run as an
// owner role and the application connects as a separate, unprivileged one.
// Run the script as the owner of the schema's objects (the role that ran
// Up), and again after every Up: the grants name the objects that exist
// when the script runs.
//
// The pump's role gets USAGE on the schema; SELECT, INSERT, UPDATE and
// DELETE on the wp_ tables (the wp_ functions run with the caller's rights
// and write every table); SELECT only on the version table (CheckSchema
// reads it); SELECT and INSERT only on the settings table (the first pump
// to start records its partition count there when migrate did not, and no
// pump may change a recorded count); USAGE on the work sequence (enqueue draws Work.Seq from it);
// and EXECUTE on the wp_ functions, so the script still works where
// EXECUTE has been revoked from PUBLIC. Nothing else is needed: the
// alive-lock is a session advisory lock, LISTEN/NOTIFY and pg_locks need no
// grant, and the identity column of the dead letters needs no sequence
// grant. The role also needs CONNECT on the database, which PUBLIC has
// unless the database was locked down.
//
// Both names must match ^[a-z_][a-z0-9_]{0,62}$ (and the schema must not be
// reserved); they are quoted in the SQL.
func PrivilegesSQL(schema, role string) (string, error) {
	q, err := QuoteSchema(schema)
	if err != nil {
		return "", err
	}
	if !roleRE.MatchString(role) {
		return "", fmt.Errorf("%w: %q: want ^[a-z_][a-z0-9_]{0,62}$", ErrInvalidRole, role)
	}
	r := `"` + role + `"`
	lit := "'" + schema + "'"
	return fmt.Sprintf(`-- workpump: privileges of the pump's role %[2]s on schema %[1]s.
-- Rendered by migrations.PrivilegesSQL; run as the owner of the schema's
-- objects (the role that ran the migrations), again after every migrate up.

GRANT USAGE ON SCHEMA %[1]s TO %[2]s;

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
         WHERE c.relnamespace = %[3]s::regnamespace
           AND c.relkind IN ('r', 'p')
           AND c.relname LIKE 'wp\_%%'
         ORDER BY c.relname
    LOOP
        IF o.relname = %[4]s THEN
            EXECUTE format('GRANT SELECT ON TABLE %%s TO %%I', o.rel, %[5]s);
        ELSIF o.relname = %[6]s THEN
            EXECUTE format('GRANT SELECT, INSERT ON TABLE %%s TO %%I', o.rel, %[5]s);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %%s TO %%I', o.rel, %[5]s);
        END IF;
    END LOOP;
    -- Sequences: USAGE (nextval) on the plain wp_ sequences; identity
    -- sequences need no grant.
    FOR o IN
        SELECT c.oid::regclass AS rel
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = %[3]s::regnamespace
           AND c.relkind = 'S'
           AND c.relname LIKE 'wp\_%%'
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                            WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
         ORDER BY c.relname
    LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %%s TO %%I', o.rel, %[5]s);
    END LOOP;
    -- Functions: every wp_ function (the coordinator's calls and the
    -- helpers they call).
    FOR o IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = %[3]s::regnamespace
           AND p.proname LIKE 'wp\_%%'
         ORDER BY p.proname
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %%s TO %%I', o.fn, %[5]s);
    END LOOP;
END
$grant$;
`, q, r, lit, "'"+VersionTable+"'", "'"+role+"'", "'"+SettingsTable+"'"), nil
}
