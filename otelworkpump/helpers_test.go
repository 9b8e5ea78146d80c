package otelworkpump_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

func enqueue(t *testing.T, s *memdriver.Store, items ...driver.NewWork) []uuid.UUID {
	t.Helper()
	ids, err := s.Enqueue(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func stop(t *testing.T, p *workpump.Pump) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}
