package pgcore

import (
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// call is one SQL function call: its name, its parameters' SQL types (each
// parameter is cast to it, so the text works with any protocol and with
// client-side interpolation), and whether it returns a set (SELECT * FROM
// f() rather than SELECT f()).
type call struct {
	fn     string
	params []string
	set    bool
}

// The calls, in the SQL functions' parameter order. p_now follows the
// original parameters; parameters added later follow p_now (with defaults
// in SQL, so older call texts keep working).
var (
	callEnqueue        = call{"wp_enqueue", []string{"text[]", "uuid[]", "text[]", "integer[]", "text[]", "text[]", "bytea[]", "text[]", "timestamptz[]", "timestamptz", "boolean"}, false}
	callEnqueuePrepare = call{"wp_enqueue_prepare", []string{"text[]", "text[]", "integer[]", "timestamptz[]", "timestamptz"}, false}
	callClaim          = call{"wp_claim_work", []string{"uuid", "text[]", "bigint", "integer", "timestamptz"}, true}
	callClaimRead      = call{"wp_claim_work", []string{"uuid", "text[]", "bigint", "integer", "timestamptz", "integer"}, true} // version 16's bounded read
	callRenew          = call{"wp_renew_leases", []string{"uuid", "text", "uuid[]", "bigint", "timestamptz"}, true}
	callComplete       = call{"wp_complete", []string{"uuid", "text[]", "uuid[]", "integer[]", "timestamptz"}, true}
	callFail           = call{"wp_fail", []string{"uuid", "text[]", "uuid[]", "integer[]", "text[]", "bigint[]", "integer", "bigint", "bigint", "timestamptz", "text[]", "boolean[]"}, true}
	callFailPlain      = call{"wp_fail", callFail.params[:10], true} // version 7's arguments
	callRelease        = call{"wp_release", []string{"uuid", "text[]", "uuid[]", "integer[]", "timestamptz"}, true}
	callHeartbeat      = call{"wp_record_heartbeat", []string{"uuid", "text", "text", "integer", "text", "bigint", "bigint", "timestamptz", "boolean", "bigint", "boolean", "bigint"}, true}
	callCleanup        = call{"wp_cleanup_stale_instances", []string{"bigint", "bigint", "timestamptz", "bigint"}, true}
	callDeregister     = call{"wp_deregister", []string{"uuid", "timestamptz"}, false}
	callPurge          = call{"wp_purge", []string{"bigint", "bigint", "bigint", "timestamptz"}, true}
	callGetWork        = call{"wp_get_work", []string{"text", "uuid"}, true}
	callInstanceStates = call{"wp_instance_states", nil, true}
	callFindDead       = call{"wp_find_dead_letters", []string{"text", "text", "text", "text", "timestamptz", "timestamptz", "uuid[]", "bigint", "integer"}, true}
	callActDead        = call{"wp_act_on_dead_letters", []string{"text", "text", "text", "text", "text", "timestamptz", "timestamptz", "uuid[]", "boolean", "timestamptz"}, true}
	callStreamOwner    = call{"wp_get_stream_owner", []string{"text"}, true}
	callStats          = call{"wp_stats", []string{"timestamptz"}, true}
	callStatsLeases    = call{"wp_stats_leases", []string{"timestamptz"}, true}
	callStatsHeld      = call{"wp_stats_held", nil, true}
	callCancel         = call{"wp_cancel_work", []string{"text", "uuid[]", "text", "timestamptz"}, true}
	callPause          = call{"wp_pause_work", []string{"text", "boolean", "text", "timestamptz"}, false}
	callResume         = call{"wp_resume_work", []string{"text", "boolean", "text"}, false}
	callPaused         = call{"wp_paused", nil, true}
	callPartitionCount = call{"wp_partition_count", []string{"integer", "timestamptz"}, false}
)

// sql renders c for schema (validated by the caller) with ph.
func (c call) sql(schema string, ph func(int) string) string {
	var b strings.Builder
	if c.set {
		b.WriteString("SELECT * FROM ")
	} else {
		b.WriteString("SELECT ")
	}
	b.WriteString(`"` + schema + `".` + c.fn + "(")
	for i, t := range c.params {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ph(i+1) + "::" + t)
	}
	b.WriteString(")")
	return b.String()
}

// asyncCommitSQL renders a set-returning c like sql, with the statement's
// transaction set to commit without waiting for its WAL flush
// (synchronous_commit = off, transaction-local). It is used for the
// acknowledgements the core sends in a transaction of its own (Complete,
// Fail, Release, RenewLeases), never inside a caller's transaction. A
// database crash can lose the last such commits; the rows are then
// delivered again, which at-least-once delivery allows, and stream order
// still holds: claims commit synchronously, and a claim's WAL flush makes
// every earlier acknowledgement durable, so no row runs after a later row
// of its stream was claimed on a completion that was lost.
func (c call) asyncCommitSQL(schema string, ph func(int) string) string {
	return "SELECT f.* FROM " + asyncCommit + " AS sc, " +
		strings.TrimPrefix(c.sql(schema, ph), "SELECT * FROM ") + " AS f"
}

// asyncCommit sets the statement's transaction to commit without waiting
// for its WAL flush.
const asyncCommit = "set_config('synchronous_commit', 'off', true)"

// renderer renders a call for a schema and placeholder style.
type renderer func(c call, schema string, ph func(int) string) string

// commitModes picks how the core's own calls commit: acknowledgements
// asynchronously unless syncAcks, claims synchronously unless asyncClaims.
func commitModes(syncAcks, asyncClaims bool) (ack, claim renderer) {
	ack = call.asyncCommitSQL
	if syncAcks {
		ack = call.sql
	}
	claim = func(c call, schema string, ph func(int) string) string {
		return overlapClaimSQL(asyncClaims, c, schema, ph)
	}
	return ack, claim
}

// overlapClaimSQL renders the claim call c (committing asynchronously
// when async; see asyncCommitSQL) so that the statement first tries the store's claim marker (a
// transaction-scoped advisory lock, taken without waiting) and returns
// after the function's columns whether another claim held it
// (driver.ClaimResult.Overlapped). The function takes its instance id
// from the marker's subquery, a lateral reference that makes Postgres try
// the marker before the claim starts. Nothing waits on the marker: it
// only tells a claim that it runs beside another.
func overlapClaimSQL(async bool, c call, schema string, ph func(int) string) string {
	var b strings.Builder
	b.WriteString("SELECT f.*, m.overlapped FROM ")
	if async {
		b.WriteString(asyncCommit + " AS sc, ")
	}
	b.WriteString("(SELECT " + ph(1) + "::" + c.params[0] + " AS id, NOT pg_try_advisory_xact_lock(" +
		claimMarker(schema) + ") AS overlapped OFFSET 0) AS m, LATERAL ")
	b.WriteString(`"` + schema + `".` + c.fn + "(m.id")
	for i, t := range c.params[1:] {
		b.WriteString(", " + ph(i+2) + "::" + t)
	}
	b.WriteString(") AS f")
	return b.String()
}

// claimMarker is the advisory lock key of schema's claim marker, as a
// bigint literal: fixed for the schema, so that every instance of it
// tries the same lock.
func claimMarker(schema string) string {
	h := fnv.New64a()
	h.Write([]byte("workpump claim marker\x00" + schema))
	return strconv.FormatInt(int64(h.Sum64()>>1), 10) + "::bigint" // (non-negative: no sign to parse)
}

// gatedClaimSQL renders the claim call with r and $n placeholders,
// followed by migrations.ClaimableSQL for cats as a WHERE clause: on idle
// queues Postgres answers from the clause's index probes and never starts
// the PL/pgSQL function. The text is for claims whose categories argument
// ($2) names exactly cats (see claimTexts).
func gatedClaimSQL(r renderer, schema string, cats []driver.Category) string {
	names := make([]string, len(cats))
	for i, c := range cats {
		names[i] = string(c)
	}
	arg := func(i int) string { return dollar(i) + "::" + callClaim.params[i-1] }
	return r(callClaim, schema, dollar) + " WHERE " + migrations.ClaimableSQL(schema, arg(1), arg(5), names...)
}

// claimTexts holds a gated claim text for every non-empty set of
// categories, indexed by the set's bit mask (bit i: driver.Categories[i]):
// each set needs a text of its own, so that every text keeps one cached
// plan.
type claimTexts []string

func newClaimTexts(r renderer, schema string) claimTexts {
	st := make(claimTexts, 1<<len(driver.Categories))
	for mask := 1; mask < len(st); mask++ {
		var set []driver.Category
		for i, c := range driver.Categories {
			if mask&(1<<i) != 0 {
				set = append(set, c)
			}
		}
		st[mask] = gatedClaimSQL(r, schema, set)
	}
	return st
}

// forCategories returns the text for cats (a claim's CategoriesOrAll), or
// "" when one is unknown.
func (st claimTexts) forCategories(cats []driver.Category) string {
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

// statements holds every SQL text a Core runs, rendered once for its
// schema and dialect. Parameters carry explicit casts so the same text
// works in the extended and the simple protocol and under client-side
// interpolation.
type statements struct {
	enqueue, enqueuePrepare, completeInTx         string
	claim, renew, complete, fail, release         string
	claimRead                                     string // bounded (ClaimRequest.ReadLimit)
	failPlain                                     string
	heartbeat, cleanup, deregister, purge         string
	getWork, listInstances, findDead, streamOwner string
	actDead, statsHeld, heldStreams, cancel       string
	pause, resume, paused                         string
	stats, statsLeases, version, counts           string
	oldestReady, deadByCategory                   string
	functions                                     string // migrations.FunctionsSQL
	applied                                       string // the version table's rows
	copyInto                                      copyStatements
	gated                                         claimTexts // nil: claims use claim

	// The listener and poll sessions' texts, always with $n placeholders.
	tryLock, unlock                 string
	pollBegin, pollStop, pollSettle string
}

func newStatements(schema string, d Dialect, syncAcks, asyncClaims bool) statements {
	ph := d.ph
	ack, claim := commitModes(syncAcks, asyncClaims)
	s := `"` + schema + `"`
	key := func(lock string) string {
		return s + `.wp_wake_lock_key($1::uuid, '` + lock + `')`
	}
	st := statements{
		enqueue:        callEnqueue.sql(schema, ph),
		enqueuePrepare: callEnqueuePrepare.sql(schema, ph),
		completeInTx:   callComplete.sql(schema, ph),
		claim:          claim(callClaim, schema, ph),
		claimRead:      claim(callClaimRead, schema, ph),
		renew:          ack(callRenew, schema, ph),
		complete:       ack(callComplete, schema, ph),
		fail:           ack(callFail, schema, ph),
		failPlain:      ack(callFailPlain, schema, ph),
		release:        ack(callRelease, schema, ph),
		heartbeat:      callHeartbeat.sql(schema, ph),
		cleanup:        callCleanup.sql(schema, ph),
		deregister:     callDeregister.sql(schema, ph),
		purge:          callPurge.sql(schema, ph),
		getWork:        callGetWork.sql(schema, ph),
		listInstances:  callInstanceStates.sql(schema, ph),
		findDead:       callFindDead.sql(schema, ph),
		actDead:        callActDead.sql(schema, ph),
		streamOwner:    callStreamOwner.sql(schema, ph),
		stats:          callStats.sql(schema, ph),
		statsLeases:    callStatsLeases.sql(schema, ph),
		statsHeld:      callStatsHeld.sql(schema, ph),
		heldStreams:    heldStreamsSQL(schema, ph),
		cancel:         callCancel.sql(schema, ph),
		pause:          callPause.sql(schema, ph),
		resume:         callResume.sql(schema, ph),
		paused:         callPaused.sql(schema, ph),
		counts:         callPartitionCount.sql(schema, ph),
		// On the (category, id) index: an index-only scan once vacuumed.
		deadByCategory: `SELECT category, count(*) FROM ` + s + `.wp_dead_letters GROUP BY category`,
		oldestReady:    oldestReadySQL(schema, ph),
		version:        `SELECT max(version) FROM ` + s + `.` + migrations.VersionTable,
		pollBegin:      "SELECT pg_try_advisory_lock(" + key("polling") + ")",
		pollStop:       "SELECT pg_advisory_unlock(" + key("polling") + ")",
		pollSettle:     "SELECT pg_try_advisory_lock(" + key("handshake") + ")",
		copyInto:       newCopyStatements(schema),
		tryLock:        `SELECT pg_try_advisory_lock(` + s + `.wp_alive_lock_key($1::uuid))`,
		unlock:         `SELECT pg_advisory_unlock(` + s + `.wp_alive_lock_key($1::uuid))`,
	}
	if d.PreparesStatements {
		st.gated = newClaimTexts(claim, schema)
	}
	// The schema is valid here (Options.WithDefaults checked it).
	st.functions, _ = migrations.FunctionsSQL(schema)
	st.applied = `SELECT version, name FROM ` + s + `.` + migrations.VersionTable + ` ORDER BY version`
	return st
}

// claimSQL returns the claim text for cats: the gated one when the
// dialect prepares statements, else the plain call.
func (st *statements) claimSQL(cats []driver.Category) string {
	if st.gated != nil {
		if q := st.gated.forCategories(cats); q != "" {
			return q
		}
	}
	return st.claim
}
