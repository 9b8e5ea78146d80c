// Package pgcall is what the Postgres drivers share about calling the SQL
// functions of package migrations: the call texts (one per function, with
// explicitly cast parameters), the argument arrays built from the driver
// package's values, the binary COPY rows of a large enqueue (copy.go), the
// mapping of the functions' SQLSTATEs to the driver sentinels, and the
// turning of applied (category, id) rows into results.
//
// The semantics live in the SQL functions; a driver only moves values in
// and out. Keeping those moves in one place means pgxdriver and bundriver
// cannot drift apart in how they call the same function: a driver picks its
// placeholder style (Dollar for pgx, Question for bun's client-side
// interpolation) and converts the typed argument slices to its own
// parameter types.
package pgcall

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/internal/uuidv7"
	"github.com/workpump/workpump/migrations"
)

// Placeholder renders the i-th (1-based) parameter of a call.
type Placeholder func(i int) string

// Dollar is Postgres' native placeholder style ($1, $2, ...).
func Dollar(i int) string { return "$" + strconv.Itoa(i) }

// Question is the style of client-side interpolating layers such as bun (?).
func Question(int) string { return "?" }

// Call is one SQL function call: its name, its parameters' SQL types (each
// parameter is cast to it, so the text works with any protocol and with
// client-side interpolation), and whether it returns a set (SELECT * FROM f()
// rather than SELECT f()).
type Call struct {
	Func   string
	Params []string
	Set    bool
}

// The calls the drivers make, in the SQL functions' parameter order. p_now
// follows the original parameters; parameters added later follow p_now
// (with defaults in SQL, so older call texts keep working).
var (
	Enqueue        = Call{"wp_enqueue", []string{"text[]", "uuid[]", "text[]", "integer[]", "text[]", "text[]", "bytea[]", "text[]", "timestamptz[]", "timestamptz", "boolean"}, false}
	EnqueuePrepare = Call{"wp_enqueue_prepare", []string{"text[]", "text[]", "integer[]", "timestamptz[]", "timestamptz"}, false}
	Claim          = Call{"wp_claim_work", []string{"uuid", "text[]", "bigint", "integer", "timestamptz"}, true}
	Renew          = Call{"wp_renew_leases", []string{"uuid", "text", "uuid[]", "bigint", "timestamptz"}, true}
	Complete       = Call{"wp_complete", []string{"uuid", "text[]", "uuid[]", "integer[]", "timestamptz"}, true}
	Fail           = Call{"wp_fail", []string{"uuid", "text[]", "uuid[]", "integer[]", "text[]", "bigint[]", "integer", "bigint", "bigint", "timestamptz"}, true}
	Release        = Call{"wp_release", []string{"uuid", "text[]", "uuid[]", "integer[]", "timestamptz"}, true}
	Heartbeat      = Call{"wp_record_heartbeat", []string{"uuid", "text", "text", "integer", "text", "bigint", "bigint", "timestamptz", "boolean", "bigint", "boolean", "bigint"}, true}
	Cleanup        = Call{"wp_cleanup_stale_instances", []string{"bigint", "bigint", "timestamptz", "bigint"}, true}
	Deregister     = Call{"wp_deregister", []string{"uuid", "timestamptz"}, false}
	Purge          = Call{"wp_purge", []string{"bigint", "bigint", "bigint", "timestamptz"}, true}
	GetWork        = Call{"wp_get_work", []string{"text", "uuid"}, true}
	InstanceStates = Call{"wp_instance_states", nil, true}
	ListDead       = Call{"wp_list_dead_letters", []string{"integer"}, true}
	StreamOwner    = Call{"wp_get_stream_owner", []string{"text"}, true}
	Stats          = Call{"wp_stats", []string{"timestamptz"}, true}
	StatsLeases    = Call{"wp_stats_leases", []string{"timestamptz"}, true}
)

// SQL renders c for schema (which the caller has validated) with the given
// placeholder style.
func (c Call) SQL(schema string, ph Placeholder) string {
	var b strings.Builder
	if c.Set {
		b.WriteString("SELECT * FROM ")
	} else {
		b.WriteString("SELECT ")
	}
	b.WriteString(`"` + schema + `".` + c.Func + "(")
	for i, t := range c.Params {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ph(i+1) + "::" + t)
	}
	b.WriteString(")")
	return b.String()
}

// AsyncCommitSQL renders a set-returning c like SQL, with the statement's
// transaction set to commit without waiting for its WAL flush
// (synchronous_commit = off, transaction-local). The drivers use it for the
// acknowledgements they send in a transaction of their own (Complete, Fail,
// Release, RenewLeases), never inside a caller's transaction. A database
// crash can lose the last such commits (well under a second of them); the
// rows are then delivered again, which at-least-once delivery allows, and
// stream order still holds: claims commit synchronously, and a claim's WAL
// flush makes every earlier acknowledgement durable, so no row runs after
// a later row of its stream was claimed on a completion that was lost.
func (c Call) AsyncCommitSQL(schema string, ph Placeholder) string {
	return "SELECT f.* FROM set_config('synchronous_commit', 'off', true) AS sc, " +
		strings.TrimPrefix(c.SQL(schema, ph), "SELECT * FROM ") + " AS f"
}

// Renderer renders a Call for a schema and placeholder style.
type Renderer func(c Call, schema string, ph Placeholder) string

// CommitModes picks how the pump's own calls commit: acknowledgements
// asynchronously unless syncAcks, claims synchronously unless asyncClaims
// (the drivers' SynchronousAcks and AsynchronousClaims options).
func CommitModes(syncAcks, asyncClaims bool) (ack, claim Renderer) {
	ack, claim = Call.AsyncCommitSQL, Call.SQL
	if syncAcks {
		ack = Call.SQL
	}
	if asyncClaims {
		claim = Call.AsyncCommitSQL
	}
	return ack, claim
}

// gatedClaimSQL renders the claim call with r (the CommitModes claim
// renderer) and Dollar placeholders, followed by migrations.ClaimableSQL
// for cats as a WHERE clause: on idle queues Postgres answers from the
// clause's index probes and never starts the PL/pgSQL function. The text
// is for claims whose categories argument ($2) names exactly cats (see
// ClaimStatements). It pays only for a statement prepared once with its
// plan cached (see pgxdriver's newStatements); bundriver, whose statements
// bun interpolates and Postgres plans on every call, keeps the plain call.
func gatedClaimSQL(r Renderer, schema string, cats []driver.Category) string {
	names := make([]string, len(cats))
	for i, c := range cats {
		names[i] = string(c)
	}
	arg := func(i int) string { return Dollar(i) + "::" + Claim.Params[i-1] }
	return r(Claim, schema, Dollar) + " WHERE " + migrations.ClaimableSQL(schema, arg(1), arg(5), names...)
}

// ClaimStatements holds a gated claim text for every non-empty set of
// categories, indexed by the set's bit mask (bit i: driver.Categories[i]),
// since each set needs a text of its own (gatedClaimSQL).
type ClaimStatements []string

// NewClaimStatements renders the gated claim texts of every category set.
func NewClaimStatements(r Renderer, schema string) ClaimStatements {
	st := make(ClaimStatements, 1<<len(driver.Categories))
	for mask := 1; mask < len(st); mask++ {
		st[mask] = gatedClaimSQL(r, schema, categorySet(mask))
	}
	return st
}

// For returns the text for cats (a claim's CategoriesOrAll), or "" when
// one is unknown (a request ClaimRequest.Validate rejects).
func (st ClaimStatements) For(cats []driver.Category) string {
	mask := 0
	for _, c := range cats {
		i := slices.Index(driver.Categories, c)
		if i < 0 {
			return ""
		}
		mask |= 1 << i
	}
	return st[mask]
}

// categorySet lists the categories of mask (bit i: driver.Categories[i]).
func categorySet(mask int) []driver.Category {
	var out []driver.Category
	for i, c := range driver.Categories {
		if mask&(1<<i) != 0 {
			out = append(out, c)
		}
	}
	return out
}

// DeadCountSQL counts the dead letters of schema.
func DeadCountSQL(schema string) string {
	return `SELECT count(*) FROM "` + schema + `".wp_dead_letters`
}

// SelfPollSQL renders the statements of a self-polling period
// (driver.SelfPolling; see wp_wakeup_needed), each taking the instance id:
// begin try-locks the polling lock, stop releases it, settle try-locks the
// hand-shake exclusively. All return one boolean.
func SelfPollSQL(schema string, ph Placeholder) (begin, stop, settle string) {
	key := func(lock string) string {
		return `"` + schema + `".wp_wake_lock_key(` + ph(1) + `::uuid, '` + lock + `')`
	}
	return "SELECT pg_try_advisory_lock(" + key("polling") + ")",
		"SELECT pg_advisory_unlock(" + key("polling") + ")",
		"SELECT pg_try_advisory_lock(" + key("handshake") + ")"
}

// VersionSQL reads the applied schema version of schema.
func VersionSQL(schema string) string {
	return `SELECT max(version) FROM "` + schema + `".` + migrations.VersionTable
}

// Now truncates a test clock's reading to the database's precision; the
// zero time stands for "no clock: the database's now()".
func Now(now func() time.Time) time.Time {
	if now == nil {
		return time.Time{}
	}
	return now().UTC().Truncate(time.Microsecond)
}

// ---- enqueue ----

// EnqueueArgs are wp_enqueue's parallel arrays, without the ids (returned
// apart: each driver encodes them its own way). A nil ScheduledFor element
// means due now; a nil Payloads element stores NULL.
type EnqueueArgs struct {
	Categories   []string
	Streams      []string
	Partitions   []int32
	Names        []string
	Types        []string
	Payloads     [][]byte
	Metadata     []string
	ScheduledFor []*time.Time
	// NewIDs is true when every id was generated here (no item carried
	// one): wp_enqueue then skips its duplicate check.
	NewIDs bool
}

// BuildEnqueue validates items (driver.ValidateNewWork), assigns UUIDv7 ids
// to zero-ID items, computes partitions, and returns the ids in input order
// with the call's arguments.
func BuildEnqueue(items []driver.NewWork, partitionCount int) ([]uuid.UUID, EnqueueArgs, error) {
	if err := driver.ValidateNewWork(items); err != nil {
		return nil, EnqueueArgs{}, err
	}
	n := len(items)
	ids := make([]uuid.UUID, n)
	a := EnqueueArgs{
		Categories: make([]string, n), Streams: make([]string, n),
		Partitions: make([]int32, n), Names: make([]string, n), Types: make([]string, n),
		Payloads: make([][]byte, n), Metadata: make([]string, n), ScheduledFor: make([]*time.Time, n),
		NewIDs: true,
	}
	for i, it := range items {
		ids[i] = it.ID
	}
	if err := uuidv7.FillNil(ids); err != nil {
		return nil, EnqueueArgs{}, fmt.Errorf("assign ids: %w", err)
	}
	for i, it := range items {
		id := ids[i]
		if it.ID != uuid.Nil {
			a.NewIDs = false
		}
		a.Categories[i] = string(it.Category)
		a.Streams[i] = it.StreamID
		a.Partitions[i] = int32(driver.PartitionOf(driver.PartitionKey(it.StreamID, id), partitionCount))
		a.Names[i] = it.Name
		a.Types[i] = it.MessageType
		a.Payloads[i] = it.Payload
		a.Metadata[i] = string(it.Metadata)
		if !it.ScheduledFor.IsZero() {
			t := it.ScheduledFor.UTC()
			a.ScheduledFor[i] = &t
		}
	}
	return ids, a, nil
}

// ---- claim ----

// CategoryNames returns the claim's categories (all four when none are
// named) as the text[] argument of wp_claim_work.
func CategoryNames(req driver.ClaimRequest) []string {
	cats := req.CategoriesOrAll()
	out := make([]string, len(cats))
	for i, c := range cats {
		out[i] = string(c)
	}
	return out
}

// SortClaimed puts claimed rows in the contract's order: grouped by category
// (in driver.Categories order), by Seq within each. wp_claim_work returns
// each category's rows in update order; sorting them here is cheaper than a
// sort step in the claim's statement (1.5 ms per 1000 rows, measured).
func SortClaimed(work []driver.Work) {
	rank := func(c driver.Category) int { return slices.Index(driver.Categories, c) }
	slices.SortFunc(work, func(a, b driver.Work) int {
		if a.Category != b.Category {
			return rank(a.Category) - rank(b.Category)
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
}

// HasMore reports whether some category of work filled the per-category cap.
func HasMore(work []driver.Work, max int) bool {
	per := map[driver.Category]int{}
	for _, w := range work {
		per[w.Category]++
		if per[w.Category] >= max {
			return true
		}
	}
	return false
}

// ---- renew ----

// IDStrings renders ids as the text form the calls cast to uuid[].
func IDStrings(ids []uuid.UUID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// RenewResult reports the requested ids that were not renewed as Lost, each
// once, in request order.
func RenewResult(requested, renewed []uuid.UUID) driver.RenewResult {
	got := make(map[uuid.UUID]bool, len(renewed))
	for _, id := range renewed {
		got[id] = true
	}
	res := driver.RenewResult{Renewed: len(renewed)}
	for _, id := range requested {
		if !got[id] {
			got[id] = true
			res.Lost = append(res.Lost, id)
		}
	}
	return res
}

// ---- complete, fail, release ----

// RefArgs are the parallel (category, id, attempts) arrays of the fenced calls.
type RefArgs struct {
	Categories []string
	IDs        []string
	Attempts   []int32
}

// NewRefArgs builds the fenced calls' arrays from refs.
func NewRefArgs(refs []driver.Ref) RefArgs {
	a := RefArgs{Categories: make([]string, len(refs)), IDs: make([]string, len(refs)), Attempts: make([]int32, len(refs))}
	for i, r := range refs {
		a.Categories[i], a.IDs[i], a.Attempts[i] = string(r.Category), r.ID.String(), int32(r.Attempts)
	}
	return a
}

// FailArgs are wp_fail's per-failure arrays beyond the refs.
type FailArgs struct {
	Refs       []driver.Ref
	Errors     []string
	RetryAfter []int64
}

// NewFailArgs splits req's failures into refs, sanitized error texts and
// retry overrides (nanoseconds).
func NewFailArgs(req driver.FailRequest) FailArgs {
	a := FailArgs{Refs: make([]driver.Ref, len(req.Failures)), Errors: make([]string, len(req.Failures)), RetryAfter: make([]int64, len(req.Failures))}
	for i, f := range req.Failures {
		a.Refs[i] = f.Ref
		a.Errors[i] = driver.SanitizeErrorText(f.Error)
		a.RetryAfter[i] = f.RetryAfter.Nanoseconds()
	}
	return a
}

// Int32 clamps n to the int32 range the SQL integer parameters take.
func Int32(n int) int32 { return int32(max(min(n, 1<<31-1), -1<<31)) }

// Key identifies a row in the applied sets.
type Key struct {
	Category driver.Category
	ID       uuid.UUID
}

// Applied collects the (category, id[, dead]) rows a fenced call returned.
type Applied struct {
	applied, dead map[Key]bool
}

// NewApplied returns an empty set.
func NewApplied() *Applied { return &Applied{applied: map[Key]bool{}, dead: map[Key]bool{}} }

// Add records one returned row.
func (a *Applied) Add(category string, id uuid.UUID, dead bool) {
	k := Key{driver.Category(category), id}
	if dead {
		a.dead[k] = true
	} else {
		a.applied[k] = true
	}
}

// Result turns the returned rows into the AckResult of refs: applied,
// dead-lettered, or lost (not returned).
func (a *Applied) Result(refs []driver.Ref) driver.AckResult {
	var res driver.AckResult
	for _, r := range refs {
		k := Key{r.Category, r.ID}
		switch {
		case a.dead[k]:
			res.Applied++
			res.DeadLettered = append(res.DeadLettered, r)
		case a.applied[k]:
			res.Applied++
		default:
			res.Lost = append(res.Lost, r)
		}
	}
	return res
}

// HeartbeatResult turns the ids wp_record_heartbeat returned into the
// driver's result: the caller's own id among them means it had said it was
// registered but had no row, so it was registered anew (a sweep never
// evicts the caller); every other id is a peer the sweep evicted.
func HeartbeatResult(self uuid.UUID, ids []uuid.UUID) driver.HeartbeatResult {
	var res driver.HeartbeatResult
	for _, id := range ids {
		if id == self {
			res.Reregistered = true
			continue
		}
		res.Evicted = append(res.Evicted, id)
	}
	return res
}

// CheckInstance rejects the nil instance id.
func CheckInstance(id uuid.UUID) error {
	if id == uuid.Nil {
		return fmt.Errorf("%w: instanceID: nil UUID", driver.ErrInvalidArgument)
	}
	return nil
}

// ---- errors ----

// SQLState returns the SQLSTATE of a Postgres error from any of the common
// Go drivers: pgx (*pgconn.PgError) and lib/pq have SQLState(); bun's
// pgdriver has Field('C'). It returns "" for other errors.
func SQLState(err error) (code, msg string) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code, pe.Message
	}
	var st interface {
		SQLState() string
		Error() string
	}
	if errors.As(err, &st) {
		return st.SQLState(), st.Error()
	}
	var f interface{ Field(byte) string }
	if errors.As(err, &f) {
		return f.Field('C'), f.Field('M')
	}
	return "", ""
}

// MapError maps a database error to the driver sentinels: the SQL functions
// raise custom SQLSTATEs for the contract's errors (WP001 unknown instance,
// WP002 unknown category, WP003 not renewable, 22023 invalid argument), and a
// missing function, table or schema means the schema is not installed.
// prefix names the driver ("bundriver").
func MapError(prefix, op, schema string, err error) error {
	if err == nil {
		return nil
	}
	code, msg := SQLState(err)
	switch code {
	case "WP001":
		return fmt.Errorf("%s: %s: %w: %s (record a heartbeat first)", prefix, op, driver.ErrUnknownInstance, msg)
	case "WP002":
		return fmt.Errorf("%s: %s: %w: %s", prefix, op, driver.ErrUnknownCategory, msg)
	case "WP003":
		return fmt.Errorf("%s: %s: %w: %s", prefix, op, driver.ErrNotRenewable, msg)
	case "22023":
		return fmt.Errorf("%s: %s: %w: %s", prefix, op, driver.ErrInvalidArgument, msg)
	case "42883", "42P01", "3F000":
		return fmt.Errorf("%s: %s: %w: schema %q lacks workpump objects (%s); %s",
			prefix, op, driver.ErrSchemaNotReady, schema, msg, migrations.HowToMigrate(schema))
	}
	return fmt.Errorf("%s: %s: %w", prefix, op, err)
}

// IsUndefinedTable reports whether err says the table or schema does not
// exist (CheckSchema treats that as version 0).
func IsUndefinedTable(err error) bool {
	code, _ := SQLState(err)
	return code == "42P01" || code == "3F000"
}

// SchemaVersionError returns nil when the recorded version have (0 when
// none) is what this build needs, an error wrapping driver.ErrSchemaNotReady
// when it is missing or older, and ahead=true when the database is newer
// (accepted: a rolling upgrade runs the old build against the new schema).
func SchemaVersionError(schema string, have int) (ahead bool, err error) {
	want := migrations.Latest()
	switch {
	case have == 0:
		return false, fmt.Errorf("%w: schema %q has no workpump tables (want version %d); %s",
			driver.ErrSchemaNotReady, schema, want, migrations.HowToMigrate(schema))
	case have < want:
		return false, fmt.Errorf("%w: schema %q is at version %d, this build needs %d; %s",
			driver.ErrSchemaNotReady, schema, have, want, migrations.HowToMigrate(schema))
	case have > want:
		return true, nil
	}
	return false, nil
}
