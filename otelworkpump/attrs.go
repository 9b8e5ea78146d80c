package otelworkpump

import (
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/workpump/workpump/driver"
)

// Attribute keys.
const (
	// AttrCategory is the item's category (outbox, inbox, ...).
	AttrCategory = attribute.Key("workpump.category")
	// AttrName is the item's name: destination, handler, perspective or
	// receptor.
	AttrName = attribute.Key("workpump.name")
	// AttrState is a backlog gauge's state.
	AttrState = attribute.Key("workpump.state")
	// AttrOutcome is what a handler's error asks for.
	AttrOutcome = attribute.Key("workpump.handler.outcome")
	// AttrStream, AttrAttempt, AttrInstance, AttrItemID and
	// AttrMessageType are the handler span's attributes besides category
	// and name.
	AttrStream      = attribute.Key("workpump.stream_id")
	AttrAttempt     = attribute.Key("workpump.attempt")
	AttrInstance    = attribute.Key("workpump.instance_id")
	AttrItemID      = attribute.Key("workpump.item_id")
	AttrMessageType = attribute.Key("workpump.message_type")
)

// attrCache keeps the measurement options of each attribute combination,
// and the span name of each category and name: building an attribute set
// sorts and allocates, and the hooks run once or twice per item on the
// pump's goroutines. Names are bounded by the registered handlers, so the
// cache stays small. Lookups read an immutable map through an atomic
// pointer: no lock, and a struct key, unlike a sync.Map's interface key,
// is not allocated per lookup. A miss copies the map under mu.
type attrCache struct {
	m  atomic.Pointer[map[attrKey]cached]
	mu sync.Mutex
}

type attrKey struct {
	c       driver.Category
	name    string
	named   bool
	outcome string
	state   string
	span    bool // the entry's spanName (c and name), not a measurement option
}

// cached is one combination's options, also as the one-element slices a
// variadic Add or Record takes: passing a slice that exists already spares
// the allocation of a new one per measurement.
type cached struct {
	opt      metric.MeasurementOption
	add      []metric.AddOption
	rec      []metric.RecordOption
	spanName string
}

func (a *attrCache) get(k attrKey) cached {
	if m := a.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	var v cached
	if k.span {
		v.spanName = spanName(k.c, k.name)
	} else {
		kv := []attribute.KeyValue{AttrCategory.String(string(k.c))}
		if k.named {
			kv = append(kv, AttrName.String(k.name))
		}
		if k.outcome != "" {
			kv = append(kv, AttrOutcome.String(k.outcome))
		}
		if k.state != "" {
			kv = append(kv, AttrState.String(k.state))
		}
		v.opt = metric.WithAttributeSet(attribute.NewSet(kv...))
		v.add = []metric.AddOption{v.opt}
		v.rec = []metric.RecordOption{v.opt}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.m.Load()
	next := make(map[attrKey]cached, 1)
	if old != nil {
		if have, ok := (*old)[k]; ok {
			return have
		}
		next = make(map[attrKey]cached, len(*old)+1)
		for kk, vv := range *old {
			next[kk] = vv
		}
	}
	next[k] = v
	a.m.Store(&next)
	return v
}

func (a *attrCache) category(c driver.Category) []metric.AddOption {
	return a.get(attrKey{c: c}).add
}

func (a *attrCache) namedAdd(c driver.Category, name string) []metric.AddOption {
	return a.get(attrKey{c: c, name: name, named: true}).add
}

func (a *attrCache) named(c driver.Category, name string) []metric.RecordOption {
	return a.get(attrKey{c: c, name: name, named: true}).rec
}

func (a *attrCache) outcome(c driver.Category, name, outcome string) []metric.RecordOption {
	return a.get(attrKey{c: c, name: name, named: true, outcome: outcome}).rec
}

func (a *attrCache) state(c driver.Category, state string) metric.MeasurementOption {
	return a.get(attrKey{c: c, state: state}).opt
}

func (a *attrCache) spanName(c driver.Category, name string) string {
	return a.get(attrKey{c: c, name: name, span: true}).spanName
}
