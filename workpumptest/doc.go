// Package workpumptest helps applications test their handlers: a pump on
// memdriver with a fake clock that stops itself when the test ends
// (NewPump), one item at a time through its handler (WorkOne), everything
// ready worked off synchronously (Drain) or by a started pump
// (WorkUntilIdle), and assertions on what was enqueued (RequireEnqueued,
// RequireNotEnqueued and their Tx forms for a transaction not yet
// committed). Each fails the test through its TB with what it found: the
// items left, or each item's differences from the Match.
//
// The helpers read the store only through the driver's optional
// capabilities (driver.Inspector, driver.WorkLister), so they work on
// memdriver and on the Postgres drivers alike. They take a TB, the part of
// testing.TB they use, so a test's *testing.T goes straight in. Run tests
// that start a pump inside a testing/synctest bubble: waits then cost no
// real time, and NewPump's cleanup stops the pump when the test fails
// before it does, so the bubble ends with the test's own failure.
//
// Handlers that write in the same transaction as their item's completion
// call workpump.CompleteInTx and leave finding the transaction to their
// repository: the production one reads it with its driver's TxFrom
// (pgxdriver.TxFrom), the one of the tests with memdriver.TxFrom, an
// in-memory Tx whose enqueues and OnCommit functions happen only if the
// completion commits. The handler itself names no driver, so the same
// handler runs in these tests and on Postgres (see recordPayment in the
// examples, and its pgPayments).
package workpumptest
