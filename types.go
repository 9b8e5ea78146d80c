package workpump

import "github.com/workpump/workpump/driver"

// The portable types, re-exported so applications import one package.
type (
	// Work is a claimed item handed to a Handler.
	Work = driver.Work
	// NewWork is an item to enqueue.
	NewWork = driver.NewWork
	// Category is one of Outbox, Inbox, PerspectiveEvent, Receptor.
	Category = driver.Category
	// Instance identifies a running pump.
	Instance = driver.Instance
	// Coordinator is the driver contract a Pump runs on.
	Coordinator = driver.Coordinator
)

// The four categories.
const (
	Outbox           = driver.Outbox
	Inbox            = driver.Inbox
	PerspectiveEvent = driver.PerspectiveEvent
	Receptor         = driver.Receptor
)
