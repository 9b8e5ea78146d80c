package pgcore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

var _ driver.WorkLister = (*Core)(nil)

// ListWork lists the unprocessed rows of q's categories (see
// driver.WorkLister) on the core's own connections: committed rows only.
func (c *Core) ListWork(ctx context.Context, q driver.WorkQuery) ([]driver.WorkState, error) {
	return c.ListWorkOn(ctx, c.db, q)
}

// ListWorkOn lists as ListWork does through qr, normally the caller's
// open transaction, so a test sees the items that transaction enqueued
// before it commits (workpumptest's Tx assertions).
func (c *Core) ListWorkOn(ctx context.Context, qr Querier, q driver.WorkQuery) ([]driver.WorkState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if qr == nil {
		return nil, fmt.Errorf("%w: tx: nil", driver.ErrInvalidArgument)
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	schema, err := migrations.QuoteSchema(c.opts.Schema)
	if err != nil {
		return nil, err
	}
	var out []driver.WorkState
	for _, cat := range q.CategoriesOrAll() {
		done := "processed_at"
		if cat == driver.Receptor {
			// The only table whose done column has another name
			// (migrations' category table).
			done = "completed_at"
		}
		text := "SELECT " + migrations.KeyColumn(string(cat)) + ", stream_id, partition_number, name, message_type, payload, metadata," +
			" attempts, seq, scheduled_for, created_at, lease_expiry, instance_id, last_error" +
			" FROM " + schema + "." + migrations.Table(string(cat)) + " WHERE " + done + " IS NULL"
		var args []any
		if q.StreamID != "" {
			// A stream's rows share its partition: the second condition
			// is for the planner, whose estimate it sharpens.
			args = append(args, q.StreamID, int32(driver.PartitionOf(q.StreamID, c.opts.PartitionCount)))
			text += " AND stream_id = " + c.d.ph(1) + "::text AND partition_number = " + c.d.ph(2) + "::integer"
		}
		text += " ORDER BY seq"
		if q.Limit > 0 {
			args = append(args, q.Limit)
			text += " LIMIT " + c.d.ph(len(args)) + "::bigint"
		}
		rows, err := qr.Query(ctx, text, args...)
		if err != nil {
			return nil, c.mapError("ListWork", err)
		}
		for rows.Next() {
			var (
				ws                   driver.WorkState
				part, att            int32
				meta                 []byte
				sched, created, leas sql.NullTime
				inst                 uuid.NullUUID
				lastErr              sql.NullString
			)
			if err := rows.Scan(&ws.ID, &ws.StreamID, &part, &ws.Name, &ws.MessageType, &ws.Payload, &meta,
				&att, &ws.Seq, &sched, &created, &leas, &inst, &lastErr); err != nil {
				_ = rows.Close()
				return nil, c.mapError("ListWork", err)
			}
			ws.Category = cat
			ws.Partition = int(part)
			ws.Attempts = int(att)
			ws.Metadata = json.RawMessage(meta)
			ws.ScheduledFor = nullTime(sched)
			ws.CreatedAt = nullTime(created)
			ws.LeaseExpiry = nullTime(leas)
			if inst.Valid {
				ws.InstanceID = inst.UUID
			}
			ws.LastError = lastErr.String
			out = append(out, ws)
		}
		err = rows.Err()
		_ = rows.Close()
		if err != nil {
			return nil, c.mapError("ListWork", err)
		}
	}
	return out, nil
}
