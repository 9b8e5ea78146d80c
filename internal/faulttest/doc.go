// Package faulttest holds the fault and failover scenarios of workpump (its
// _test.go files): hard kills, a chaos run with kills and terminated
// connections, listener loss, half-open peers, hung handlers, a database
// restart, pool exhaustion, bad input on every entry point, and a pump
// running under a least-privilege role. Every scenario breaks things for
// real (pg_terminate_backend, memdriver's fault hooks, internal/faults) and
// then checks the state the store ended in, not only what the pump said.
//
// The Postgres scenarios need WORKPUMP_TEST_DATABASE_URL (see
// internal/pgtest); the restart scenario also needs
// WORKPUMP_TEST_PG_RESTART_CMD, a shell command that restarts that server.
package faulttest
