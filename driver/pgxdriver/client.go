package pgxdriver

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/workpump/workpump/driver/pgcore"
)

// poolDB is the pool as the core's DB.
type poolDB struct{ p *pgxpool.Pool }

func (d poolDB) Query(ctx context.Context, text string, args ...any) (pgcore.Rows, error) {
	r, err := d.p.Query(ctx, text, args...)
	return wrapRows(r, err)
}

func (d poolDB) Exec(ctx context.Context, text string, args ...any) error {
	_, err := d.p.Exec(ctx, text, args...)
	return err
}

func (d poolDB) Begin(ctx context.Context) (pgcore.Tx, error) {
	tx, err := d.p.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return txQ{tx}, nil
}

func (d poolDB) Conn(ctx context.Context) (pgcore.Conn, error) {
	c, err := d.p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return connQ{c}, nil
}

// txQ is a pgx transaction, the core's or the caller's; it has COPY.
type txQ struct{ tx pgx.Tx }

func (t txQ) Query(ctx context.Context, text string, args ...any) (pgcore.Rows, error) {
	r, err := t.tx.Query(ctx, text, args...)
	return wrapRows(r, err)
}

func (t txQ) Exec(ctx context.Context, text string, args ...any) error {
	_, err := t.tx.Exec(ctx, text, args...)
	return err
}

func (t txQ) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t txQ) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

func (t txQ) CopyFrom(ctx context.Context, text string, data []byte) error {
	_, err := t.tx.Conn().PgConn().CopyFrom(ctx, bytesReader(data), text)
	return err
}

// connQ is a connection held out of the pool.
type connQ struct{ c *pgxpool.Conn }

func (c connQ) Query(ctx context.Context, text string, args ...any) (pgcore.Rows, error) {
	r, err := c.c.Query(ctx, text, args...)
	return wrapRows(r, err)
}

func (c connQ) Exec(ctx context.Context, text string, args ...any) error {
	_, err := c.c.Exec(ctx, text, args...)
	return err
}

func (c connQ) Release() { c.c.Release() }

func (c connQ) Discard() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.c.Conn().Close(ctx)
	c.c.Release()
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// rows reads uuid and timestamptz columns into pgx's own types, which
// decode the binary form directly, instead of through sql.Scanner (a
// text round trip per value).
type rows struct {
	pgx.Rows
	dest []any
	ids  []pgtype.UUID
	ts   []pgtype.Timestamptz
}

func wrapRows(r pgx.Rows, err error) (pgcore.Rows, error) {
	if err != nil {
		return nil, err
	}
	return &rows{Rows: r}, nil
}

func (r *rows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

func (r *rows) Scan(dest ...any) error {
	nid, nts := 0, 0
	for _, d := range dest {
		switch d.(type) {
		case *uuid.UUID, *uuid.NullUUID:
			nid++
		case *sql.NullTime:
			nts++
		}
	}
	if nid == 0 && nts == 0 {
		return r.Rows.Scan(dest...)
	}
	if cap(r.ids) < nid {
		r.ids = make([]pgtype.UUID, nid)
	}
	if cap(r.ts) < nts {
		r.ts = make([]pgtype.Timestamptz, nts)
	}
	r.ids, r.ts, r.dest = r.ids[:nid], r.ts[:nts], r.dest[:0]
	nid, nts = 0, 0
	for _, d := range dest {
		switch d.(type) {
		case *uuid.UUID, *uuid.NullUUID:
			r.dest = append(r.dest, &r.ids[nid])
			nid++
		case *sql.NullTime:
			r.dest = append(r.dest, &r.ts[nts])
			nts++
		default:
			r.dest = append(r.dest, d)
		}
	}
	if err := r.Rows.Scan(r.dest...); err != nil {
		return err
	}
	nid, nts = 0, 0
	for _, d := range dest {
		switch d := d.(type) {
		case *uuid.UUID:
			*d = r.ids[nid].Bytes
			nid++
		case *uuid.NullUUID:
			*d = uuid.NullUUID{UUID: r.ids[nid].Bytes, Valid: r.ids[nid].Valid}
			nid++
		case *sql.NullTime:
			*d = sql.NullTime{Time: r.ts[nts].Time, Valid: r.ts[nts].Valid}
			nts++
		}
	}
	return nil
}
