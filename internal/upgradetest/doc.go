// Package upgradetest holds the upgrade test: a schema migrated to the
// baseline version holds work in flight (leased by an instance that
// vanished, scheduled, failed and waiting for its retry, dead-lettered,
// ready across several streams); it is migrated to the newest version and
// a pump must then handle every item exactly once, in stream order, and
// leave the dead letters in place.
package upgradetest
