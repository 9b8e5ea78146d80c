package workpump_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workpump/workpump"
	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/memdriver"
)

type ctxMark struct{}

// TestHandlerHooksAndContext runs two items of one stream, a slow success
// and a failure, and a panicking item, and checks what HandlerStarted,
// HandlerFinished and HandlerContext saw: the items in order, exact
// durations on the bubble's clock, the handlers' own errors, the wrapped
// context reaching the handler with the pump's delivery still on it.
func TestHandlerHooksAndContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		boom := errors.New("boom")
		var (
			mu               sync.Mutex
			started, finish  []workpump.HandlerEvent
			finishedWith     = map[string]error{}
			sawMark, sawDeli = map[string]bool{}, map[string]bool{}
		)
		opts := quietOptions()
		opts.MaxAttempts = 1
		opts.HandlerContext = func(ctx context.Context, w workpump.Work) (context.Context, func(error)) {
			return context.WithValue(ctx, ctxMark{}, w.MessageType), func(err error) {
				mu.Lock()
				finishedWith[w.MessageType] = err
				mu.Unlock()
			}
		}
		opts.Hooks.HandlerStarted = func(e workpump.HandlerEvent) {
			mu.Lock()
			started = append(started, e)
			mu.Unlock()
		}
		opts.Hooks.HandlerFinished = func(e workpump.HandlerEvent) {
			mu.Lock()
			finish = append(finish, e)
			mu.Unlock()
		}
		p := newPump(t, s, opts)
		done := make(chan struct{}, 3)
		_ = p.Handle(workpump.Inbox, "", func(ctx context.Context, w workpump.Work) error {
			defer func() { done <- struct{}{} }()
			mu.Lock()
			sawMark[w.MessageType] = ctx.Value(ctxMark{}) == w.MessageType
			d := workpump.DeliveryFrom(ctx)
			sawDeli[w.MessageType] = d != nil && d.Work.ID == w.ID
			mu.Unlock()
			switch w.MessageType {
			case "slow":
				time.Sleep(3 * time.Second)
				return nil
			case "fails":
				return boom
			default:
				panic("handler bug")
			}
		})
		enqueue(t, s,
			driver.NewWork{Category: workpump.Inbox, StreamID: "s1", Name: "n", MessageType: "slow"},
			driver.NewWork{Category: workpump.Inbox, StreamID: "s1", Name: "n", MessageType: "fails"},
		)
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-done
		<-done
		enqueue(t, s, driver.NewWork{Category: workpump.Inbox, Name: "p", MessageType: "panics"})
		<-done
		stop(t, p)

		mu.Lock()
		defer mu.Unlock()
		if len(started) != 3 || len(finish) != 3 {
			t.Fatalf("started %d, finished %d handler calls, want 3 and 3", len(started), len(finish))
		}
		for i, want := range []string{"slow", "fails", "panics"} {
			st, fin := started[i], finish[i]
			if st.Work.MessageType != want || fin.Work.MessageType != want {
				t.Errorf("call %d: started %q, finished %q, want %q", i, st.Work.MessageType, fin.Work.MessageType, want)
			}
			if st.InstanceID != p.ID() || fin.InstanceID != p.ID() {
				t.Errorf("%s: instance %v/%v, want %v", want, st.InstanceID, fin.InstanceID, p.ID())
			}
			if st.Duration != 0 || st.Err != nil {
				t.Errorf("%s: HandlerStarted has Duration %v, Err %v; want zero", want, st.Duration, st.Err)
			}
			if !fin.Started.Equal(st.Started) {
				t.Errorf("%s: Finished.Started %v differs from Started.Started %v", want, fin.Started, st.Started)
			}
			if st.Work.Attempts != 1 || st.Work.Ref() != fin.Work.Ref() {
				t.Errorf("%s: refs %v and %v, want one attempt 1", want, st.Work.Ref(), fin.Work.Ref())
			}
			if !sawMark[want] || !sawDeli[want] {
				t.Errorf("%s: handler saw the wrapped context %v, its delivery %v; want both", want, sawMark[want], sawDeli[want])
			}
			if fin.Err != finishedWith[want] {
				t.Errorf("%s: HandlerFinished.Err %v, finish func got %v; want the same error", want, fin.Err, finishedWith[want])
			}
		}
		if d := finish[0].Duration; d != 3*time.Second {
			t.Errorf("slow handler's Duration %v, want 3s", d)
		}
		if finish[0].Err != nil {
			t.Errorf("slow handler's Err %v, want nil", finish[0].Err)
		}
		if finish[1].Err != boom {
			t.Errorf("failing handler's Err %v, want the handler's own error value", finish[1].Err)
		}
		if d := finish[1].Duration; d != 0 {
			t.Errorf("failing handler's Duration %v, want 0 on the bubble's clock", d)
		}
		if got := started[1].Started.Sub(started[0].Started); got != 3*time.Second {
			t.Errorf("second item of the stream started %v after the first, want 3s", got)
		}
		if err := finish[2].Err; err == nil || !strings.Contains(err.Error(), "handler panic: handler bug") {
			t.Errorf("panicking handler's Err %v, want the pump's panic error", err)
		}
		if st := p.Stats(); st.Completed != 1 || st.Failed != 2 || st.DeadLettered != 2 {
			t.Errorf("stats completed %d failed %d dead %d, want 1, 2, 2 (hooks must not change outcomes)", st.Completed, st.Failed, st.DeadLettered)
		}
	})
}

// TestHandlerEventDueAt: pickup latency is measured from when the item
// became due, so a delayed item's schedule does not count as waiting.
func TestHandlerEventDueAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		events := make(chan workpump.HandlerEvent, 2)
		opts := quietOptions()
		opts.Hooks.HandlerStarted = func(e workpump.HandlerEvent) { events <- e }
		p := newPump(t, s, opts)
		_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer stop(t, p)
		enqueued := time.Now()
		enqueue(t, s, driver.NewWork{Category: workpump.Outbox, Name: "later", ScheduledFor: enqueued.Add(time.Minute)})
		e := <-events
		if !e.Work.CreatedAt.Equal(enqueued.Truncate(time.Microsecond)) {
			t.Errorf("CreatedAt %v, want the enqueue time %v", e.Work.CreatedAt, enqueued)
		}
		if due := e.DueAt(); !due.Equal(enqueued.Add(time.Minute).Truncate(time.Microsecond)) {
			t.Errorf("DueAt %v, want the schedule %v", due, enqueued.Add(time.Minute))
		}
		if lat := e.Started.Sub(e.DueAt()); lat < 0 || lat > time.Second {
			t.Errorf("pickup latency %v, want the poll delay after the schedule (under the 1s max poll interval)", lat)
		}
		now := time.Now()
		enqueue(t, s, driver.NewWork{Category: workpump.Outbox, Name: "now"})
		if e := <-events; !e.DueAt().Equal(now.Truncate(time.Microsecond)) {
			t.Errorf("DueAt of an item due at once %v, want its CreatedAt %v", e.DueAt(), now)
		}
	})
}

// TestClaimFinishedHook: every claim round trip is reported, the one that
// found the items with their count.
func TestClaimFinishedHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		var mu sync.Mutex
		var claims []workpump.ClaimEvent
		opts := quietOptions()
		opts.Hooks.ClaimFinished = func(e workpump.ClaimEvent) {
			mu.Lock()
			claims = append(claims, e)
			mu.Unlock()
		}
		p := newPump(t, s, opts)
		done := make(chan struct{}, 3)
		_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { done <- struct{}{}; return nil })
		enqueue(t, s,
			driver.NewWork{Category: workpump.Outbox, Name: "a"},
			driver.NewWork{Category: workpump.Outbox, Name: "b"},
			driver.NewWork{Category: workpump.Outbox, Name: "c"},
		)
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-done
		<-done
		<-done
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		items := 0
		for _, c := range claims {
			if c.Err != nil {
				t.Errorf("claim failed: %v", c.Err)
			}
			if c.Duration != 0 {
				t.Errorf("claim took %v on the bubble's clock, want 0 (memdriver does not sleep)", c.Duration)
			}
			items += c.Items
		}
		if items != 3 || claims[0].Items != 3 {
			t.Errorf("claims %+v, want the first to return all 3 items and no other any", claims)
		}
		if st := p.Stats(); uint64(len(claims)) != st.Claim.Polls {
			t.Errorf("%d ClaimFinished calls, %d polls counted", len(claims), st.Claim.Polls)
		}
	})
}

// turnStore reports every claim with rows as run beside another, and the
// first such claim as contended (its turn went to a waiting claim); each
// claim takes 10 ms.
type turnStore struct {
	*memdriver.Store
	withRows int
}

func (s *turnStore) ClaimWork(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	time.Sleep(10 * time.Millisecond)
	res, err := s.Store.ClaimWork(ctx, req)
	if err == nil && len(res.Work) > 0 {
		s.withRows++ // (one claim at a time: the pump's claim loop)
		res.Overlapped = true
		res.Contended = s.withRows == 1
	}
	return res, err
}

// TestClaimFinishedHookReportsPacing: ClaimFinished says whether a claim
// that ran beside another was contended, and paces only one that was not.
func TestClaimFinishedHookReportsPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &turnStore{Store: memdriver.New(memdriver.Options{})}
		var mu sync.Mutex
		var withRows []workpump.ClaimEvent
		opts := quietOptions()
		opts.Hooks.ClaimFinished = func(e workpump.ClaimEvent) {
			if e.Items > 0 {
				mu.Lock()
				withRows = append(withRows, e)
				mu.Unlock()
			}
		}
		p, err := workpump.New(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{}, 2)
		_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { done <- struct{}{}; return nil })
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"a", "b"} {
			if _, err := p.Enqueue(context.Background(), workpump.NewWork{Category: workpump.Outbox, Name: name}); err != nil {
				t.Fatal(err)
			}
			<-done
		}
		stop(t, p)
		mu.Lock()
		defer mu.Unlock()
		if len(withRows) != 2 {
			t.Fatalf("%d claims with rows, want 2: %+v", len(withRows), withRows)
		}
		if e := withRows[0]; !e.Contended || e.Paced != 0 {
			t.Errorf("the contended claim: contended %v, paced %v; want true, 0", e.Contended, e.Paced)
		}
		// Paced: the claim's 10 ms times a factor from 1 to 3.
		if e := withRows[1]; e.Contended || e.Paced < 10*time.Millisecond || e.Paced > 30*time.Millisecond {
			t.Errorf("the other claim: contended %v, paced %v; want false, 10-30 ms", e.Contended, e.Paced)
		}
	})
}

// TestEnqueueMetadataHook: Pump.Enqueue stores what EnqueueMetadata
// returns and leaves the caller's items alone.
func TestEnqueueMetadataHook(t *testing.T) {
	s := memdriver.New(memdriver.Options{})
	type key struct{}
	opts := quietOptions()
	opts.EnqueueMetadata = func(ctx context.Context, md json.RawMessage) json.RawMessage {
		m := map[string]any{}
		if len(md) > 0 {
			if err := json.Unmarshal(md, &m); err != nil {
				return md
			}
		}
		m["caller"] = ctx.Value(key{})
		out, _ := json.Marshal(m)
		return out
	}
	p := newPump(t, s, opts)
	ctx := context.WithValue(context.Background(), key{}, "alice")
	items := []workpump.NewWork{
		{Category: workpump.Outbox, Name: "a", Metadata: json.RawMessage(`{"k":1}`)},
		{Category: workpump.Outbox, Name: "b"},
	}
	ids, err := p.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	if string(items[0].Metadata) != `{"k":1}` || items[1].Metadata != nil {
		t.Errorf("caller's items changed: %s, %s", items[0].Metadata, items[1].Metadata)
	}
	for i, want := range []string{`{"caller":"alice","k":1}`, `{"caller":"alice"}`} {
		ws, ok, err := s.GetWork(context.Background(), workpump.Outbox, ids[i])
		if err != nil || !ok {
			t.Fatalf("GetWork %d: %v %v", i, ok, err)
		}
		var got, exp any
		_ = json.Unmarshal(ws.Metadata, &got)
		_ = json.Unmarshal([]byte(want), &exp)
		gb, _ := json.Marshal(got)
		eb, _ := json.Marshal(exp)
		if !bytes.Equal(gb, eb) {
			t.Errorf("item %d metadata %s, want %s", i, ws.Metadata, want)
		}
	}
	// Metadata the hook cannot read comes back unchanged and is refused
	// as without the hook, naming the field.
	_, err = p.Enqueue(ctx, workpump.NewWork{Category: workpump.Outbox, Name: "c", Metadata: json.RawMessage(`[1]`)})
	if !errors.Is(err, workpump.ErrInvalidArgument) || !strings.Contains(err.Error(), "Metadata") {
		t.Errorf("Enqueue of array metadata: %v, want ErrInvalidArgument naming Metadata", err)
	}
}

// TestHandlerContextNilFallsBack: a wrapper returning no context leaves the
// handler on the pump's context rather than crashing it.
func TestHandlerContextNilFallsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		opts := quietOptions()
		opts.HandlerContext = func(context.Context, workpump.Work) (context.Context, func(error)) { return nil, nil }
		p := newPump(t, s, opts)
		got := make(chan bool, 1)
		_ = p.Handle(workpump.Outbox, "", func(ctx context.Context, w workpump.Work) error {
			got <- ctx != nil && workpump.DeliveryFrom(ctx) != nil
			return nil
		})
		enqueue(t, s, driver.NewWork{Category: workpump.Outbox, Name: "a"})
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !<-got {
			t.Error("handler did not get the pump's context with its delivery")
		}
		stop(t, p)
	})
}

// TestSignalGate: the gate's state is readable at any time, not only on
// transitions.
func TestSignalGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memdriver.New(memdriver.Options{})
		p := newPump(t, s, quietOptions())
		if up, listening := p.SignalGate(); up || listening {
			t.Errorf("before Start: available %v listening %v, want false false", up, listening)
		}
		_ = p.Handle(workpump.Outbox, "", func(context.Context, workpump.Work) error { return nil })
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer stop(t, p)
		if up, listening := p.SignalGate(); !up || !listening {
			t.Errorf("started: available %v listening %v, want true true", up, listening)
		}
		s.DropListener(p.ID())
		synctest.Wait()
		if up, listening := p.SignalGate(); up || !listening {
			t.Errorf("listener dropped: available %v listening %v, want false true", up, listening)
		}
		s.RestoreListener(p.ID())
		synctest.Wait()
		if up, _ := p.SignalGate(); !up {
			t.Error("listener restored: gate still down")
		}
	})
}
