package pgcore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// SQLState returns the SQLSTATE and message of a Postgres error from any
// of the common Go clients: pgx's *pgconn.PgError and lib/pq's *pq.Error
// have SQLState(); bun's pgdriver has Field('C'). It returns "" for other
// errors.
func SQLState(err error) (code, msg string) {
	var pq interface {
		SQLState() string
		Get(field byte) string
	}
	if errors.As(err, &pq) {
		// lib/pq: Error() adds a "pq: " prefix and the code.
		return pq.SQLState(), pq.Get('M')
	}
	var st interface {
		SQLState() string
		Error() string
	}
	if errors.As(err, &st) {
		// pgx renders "SEVERITY: message (SQLSTATE code)"; keep the message.
		code := st.SQLState()
		msg := strings.TrimSuffix(st.Error(), " (SQLSTATE "+code+")")
		for _, sev := range []string{"ERROR: ", "FATAL: ", "PANIC: "} {
			msg = strings.TrimPrefix(msg, sev)
		}
		return code, msg
	}
	var f interface{ Field(byte) string }
	if errors.As(err, &f) {
		return f.Field('C'), f.Field('M')
	}
	return "", ""
}

// mapError maps a database error to the driver sentinels: the SQL
// functions raise custom SQLSTATEs for the contract's errors (WP001
// unknown instance, WP002 unknown category, WP003 not renewable, 22023
// invalid argument), and a missing function, table or schema means the
// schema is not installed.
func (c *Core) mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	code, msg := SQLState(err)
	if code != "" && msg == "" {
		msg = err.Error()
	}
	switch code {
	case "WP001":
		return fmt.Errorf("%s: %s: %w: %s (record a heartbeat first)", c.name, op, driver.ErrUnknownInstance, msg)
	case "WP002":
		return fmt.Errorf("%s: %s: %w: %s", c.name, op, driver.ErrUnknownCategory, msg)
	case "WP003":
		return fmt.Errorf("%s: %s: %w: %s", c.name, op, driver.ErrNotRenewable, msg)
	case "22023":
		return fmt.Errorf("%s: %s: %w: %s", c.name, op, driver.ErrInvalidArgument, msg)
	case "42883", "42P01", "3F000":
		return fmt.Errorf("%s: %s: %w: schema %q lacks workpump objects (%s); %s",
			c.name, op, driver.ErrSchemaNotReady, c.opts.Schema, msg, migrations.HowToMigrate(c.opts.Schema))
	}
	return fmt.Errorf("%s: %s: %w", c.name, op, err)
}

// rolledBackRuns bounds how often a call runs when the database keeps
// rolling it back (againIfRolledBack).
const rolledBackRuns = 3

// againIfRolledBack runs f, a call that runs in a transaction of its own,
// and runs it again (up to rolledBackRuns in all) while it fails because
// the database rolled that transaction back to break a deadlock (40P01) or
// a serialization conflict (40001). Such a failure applied nothing, so
// running the call again at once is exact, and no caller (an application
// enqueueing, an admin tool, the pump's flushers with their backoff) has
// to treat the lost race as an error. Calls through the application's
// transaction are never run again here: the rollback ended that
// transaction, and only the application can run it again.
func againIfRolledBack[T any](ctx context.Context, f func() (T, error)) (T, error) {
	for run := 1; ; run++ {
		v, err := f()
		if err == nil || run == rolledBackRuns || ctx.Err() != nil {
			return v, err
		}
		if !rolledBack(err) {
			return v, err
		}
	}
}

// rolledBack reports whether err says the database rolled the call's
// transaction back to break a deadlock (40P01) or a serialization conflict
// (40001): the call applied nothing.
func rolledBack(err error) bool {
	code, _ := SQLState(err)
	return code == "40P01" || code == "40001"
}

// isUndefinedTable reports whether err says the table or schema does not
// exist (CheckSchema treats that as version 0).
func isUndefinedTable(err error) bool {
	code, _ := SQLState(err)
	return code == "42P01" || code == "3F000"
}

func checkInstance(id [16]byte) error {
	if id == [16]byte{} {
		return fmt.Errorf("%w: instanceID: nil UUID", driver.ErrInvalidArgument)
	}
	return nil
}
