package bundriver

import (
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"github.com/workpump/workpump/migrations"
)

// The bun models below map the pump's tables so an application can query
// and report on pump state with its own bun code. They are for reading:
// every change of pump state must go through the Coordinator (the SQL
// functions keep leases, streams and fencing consistent; a direct UPDATE
// does not). Their tags name the tables without a schema; query them with
// Coordinator.NewSelect, or pass TableExpr to bun's ModelTableExpr, so the
// query reads the coordinator's schema whatever the connection's
// search_path is.

// WorkColumns are the columns the four work tables share.
type WorkColumns struct {
	// Seq is the enqueue order (driver.Work.Seq).
	Seq             int64           `bun:"seq"`
	StreamID        string          `bun:"stream_id"`
	PartitionNumber int             `bun:"partition_number"`
	Name            string          `bun:"name"`
	MessageType     string          `bun:"message_type"`
	Payload         []byte          `bun:"payload,type:bytea"`
	Metadata        json.RawMessage `bun:"metadata,type:json"`
	// ScheduledFor is nil for work due at enqueue.
	ScheduledFor *time.Time `bun:"scheduled_for"`
	CreatedAt    time.Time  `bun:"created_at"`
	// InstanceID and LeaseExpiry are nil while the row is not leased.
	InstanceID  *uuid.UUID `bun:"instance_id,type:uuid"`
	LeaseExpiry *time.Time `bun:"lease_expiry"`
	// Attempts counts hand-outs (a release gives one back); ClaimCount
	// counts every claim.
	Attempts   int     `bun:"attempts"`
	ClaimCount int     `bun:"claim_count"`
	LastError  *string `bun:"last_error"`
}

// OutboxMessage is a row of wp_outbox (category outbox; Name is the
// destination). Completed rows are deleted.
type OutboxMessage struct {
	bun.BaseModel `bun:"table:wp_outbox,alias:wp_outbox"`

	MessageID uuid.UUID `bun:"message_id,pk,type:uuid"`
	WorkColumns
	ProcessedAt *time.Time `bun:"processed_at"`
}

// InboxMessage is a row of wp_inbox (category inbox; Name is the handler).
// Completed rows are kept with ProcessedAt set, for deduplication, until
// purged.
type InboxMessage struct {
	bun.BaseModel `bun:"table:wp_inbox,alias:wp_inbox"`

	MessageID uuid.UUID `bun:"message_id,pk,type:uuid"`
	WorkColumns
	ProcessedAt *time.Time `bun:"processed_at"`
}

// PerspectiveEvent is a row of wp_perspective_events (category
// perspective_event; Name is the perspective).
type PerspectiveEvent struct {
	bun.BaseModel `bun:"table:wp_perspective_events,alias:wp_perspective_events"`

	EventWorkID uuid.UUID `bun:"event_work_id,pk,type:uuid"`
	WorkColumns
	ProcessedAt *time.Time `bun:"processed_at"`
}

// ReceptorProcessing is a row of wp_receptor_processing (category receptor;
// Name is the receptor). Done-ness is CompletedAt.
type ReceptorProcessing struct {
	bun.BaseModel `bun:"table:wp_receptor_processing,alias:wp_receptor_processing"`

	ID uuid.UUID `bun:"id,pk,type:uuid"`
	WorkColumns
	CompletedAt *time.Time `bun:"completed_at"`
}

// ServiceInstance is a registered (live) pump instance; its rank is its
// position among all rows ordered by InstanceID.
type ServiceInstance struct {
	bun.BaseModel `bun:"table:wp_service_instances,alias:wp_service_instances"`

	InstanceID      uuid.UUID       `bun:"instance_id,pk,type:uuid"`
	ServiceName     string          `bun:"service_name"`
	HostName        string          `bun:"host_name"`
	ProcessID       int             `bun:"process_id"`
	Metadata        json.RawMessage `bun:"metadata,type:json"`
	StartedAt       time.Time       `bun:"started_at"`
	LastHeartbeatAt time.Time       `bun:"last_heartbeat_at"`
	// ReportedAliveLock is what the last heartbeat said about the
	// instance's alive-lock; LockMissingSince is when a lock-loss sweep
	// first found that lock missing (nil when it has not).
	ReportedAliveLock bool       `bun:"reported_alive_lock"`
	LockMissingSince  *time.Time `bun:"lock_missing_since"`
}

// ActiveStream is a claimed stream's ownership row; a released stream keeps
// its row, with no owner, until purged.
type ActiveStream struct {
	bun.BaseModel `bun:"table:wp_active_streams,alias:wp_active_streams"`

	StreamID           string     `bun:"stream_id,pk"`
	AssignedInstanceID *uuid.UUID `bun:"assigned_instance_id,type:uuid"`
	LeaseExpiry        *time.Time `bun:"lease_expiry"`
	// PartitionNumber is the stream's partition as its rows carry it (nil
	// if unknown): claims use it to find streams owned outside their
	// owner's rank.
	PartitionNumber *int `bun:"partition_number"`
}

// DeadLetter is a row that failed MaxAttempts times, moved out of its
// category's table with its last error.
type DeadLetter struct {
	bun.BaseModel `bun:"table:wp_dead_letters,alias:wp_dead_letters"`

	DeadLetterID    int64           `bun:"dead_letter_id,pk"`
	Category        string          `bun:"category"`
	ID              uuid.UUID       `bun:"id,type:uuid"`
	StreamID        string          `bun:"stream_id"`
	PartitionNumber int             `bun:"partition_number"`
	Name            string          `bun:"name"`
	MessageType     string          `bun:"message_type"`
	Payload         []byte          `bun:"payload,type:bytea"`
	Metadata        json.RawMessage `bun:"metadata,type:json"`
	Attempts        int             `bun:"attempts"`
	Seq             int64           `bun:"seq"`
	ScheduledFor    *time.Time      `bun:"scheduled_for"`
	CreatedAt       time.Time       `bun:"created_at"`
	InstanceID      *uuid.UUID      `bun:"instance_id,type:uuid"`
	Error           string          `bun:"error"`
	DeadLetteredAt  time.Time       `bun:"dead_lettered_at"`
}

// model is implemented by the pump's models: table returns the table name
// (also the alias).
type model interface{ table() string }

func (OutboxMessage) table() string      { return "wp_outbox" }
func (InboxMessage) table() string       { return "wp_inbox" }
func (PerspectiveEvent) table() string   { return "wp_perspective_events" }
func (ReceptorProcessing) table() string { return "wp_receptor_processing" }
func (ServiceInstance) table() string    { return "wp_service_instances" }
func (ActiveStream) table() string       { return "wp_active_streams" }
func (DeadLetter) table() string         { return "wp_dead_letters" }

// modelTable finds the pump table of a model value: a model, a pointer to
// one, or a (pointer to a) slice of models or model pointers.
func modelTable(m any) (string, error) {
	t := reflect.TypeOf(m)
	for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		t = t.Elem()
	}
	if t != nil && t.Kind() == reflect.Struct {
		if pm, ok := reflect.Zero(t).Interface().(model); ok {
			return pm.table(), nil
		}
	}
	return "", fmt.Errorf("bundriver: %T is not one of the pump's models (OutboxMessage, InboxMessage, PerspectiveEvent, ReceptorProcessing, ServiceInstance, ActiveStream, DeadLetter)", m)
}

// TableExpr returns the schema-qualified table expression of a pump model
// for bun's ModelTableExpr, e.g. `"billing"."wp_outbox" AS "wp_outbox"`.
// model is a model value, pointer, or slice of them (what you pass to
// Model). The schema is validated.
func TableExpr(schema string, model any) (string, error) {
	q, err := migrations.QuoteSchema(schema)
	if err != nil {
		return "", err
	}
	t, err := modelTable(model)
	if err != nil {
		return "", err
	}
	return q + `."` + t + `" AS "` + t + `"`, nil
}

// NewSelect starts a bun SELECT of model (a pump model pointer or slice
// pointer) from the coordinator's schema, through db: pass the
// coordinator's DB or the application's own bun.Tx. It is db.NewSelect()
// with Model and ModelTableExpr set; add Where, Order, Limit as usual. A
// model that is not a pump model makes the query fail with an error.
func (c *Coordinator) NewSelect(db bun.IDB, model any) *bun.SelectQuery {
	q := db.NewSelect().Model(model)
	expr, err := TableExpr(c.Schema(), model)
	if err != nil {
		return q.Err(err)
	}
	return q.ModelTableExpr(expr)
}
