package main

import (
	"context"
	"errors"
	"io"
)

// These commands need the Postgres driver, which lands next.
var errNotYet = errors.New("not available yet in this build: needs the Postgres driver")

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error { return errNotYet }
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error  { return errNotYet }
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error   { return errNotYet }
func newPostgresDemoBackend(ctx context.Context, url, schema string, out io.Writer) (demoBackend, error) {
	return nil, errNotYet
}
