package otelworkpump

import (
	"sync"

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

// attrCache keeps the measurement options of each attribute combination:
// building an attribute set sorts and allocates, and the hooks run once or
// twice per item on the pump's goroutines. Names are bounded by the
// registered handlers, so the cache stays small.
type attrCache struct {
	m sync.Map // attrKey -> metric.MeasurementOption
}

type attrKey struct {
	c       driver.Category
	name    string
	named   bool
	outcome string
	state   string
}

func (a *attrCache) get(k attrKey) metric.MeasurementOption {
	if v, ok := a.m.Load(k); ok {
		return v.(metric.MeasurementOption)
	}
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
	opt := metric.WithAttributeSet(attribute.NewSet(kv...))
	v, _ := a.m.LoadOrStore(k, opt)
	return v.(metric.MeasurementOption)
}

func (a *attrCache) category(c driver.Category) metric.MeasurementOption {
	return a.get(attrKey{c: c})
}

func (a *attrCache) named(c driver.Category, name string) metric.MeasurementOption {
	return a.get(attrKey{c: c, name: name, named: true})
}

func (a *attrCache) outcome(c driver.Category, name, outcome string) metric.MeasurementOption {
	return a.get(attrKey{c: c, name: name, named: true, outcome: outcome})
}

func (a *attrCache) state(c driver.Category, state string) metric.MeasurementOption {
	return a.get(attrKey{c: c, state: state})
}
