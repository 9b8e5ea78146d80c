// Package workpumptest helps applications test their handlers: a pump on
// memdriver with a fake clock that stops itself when the test ends
// (NewPump), one item at a time through its handler (WorkOne), everything
// ready worked off synchronously (Drain) or by a started pump
// (WorkUntilIdle), and assertions on what was enqueued (RequireEnqueued,
// RequireNotEnqueued and their Tx forms for a transaction not yet
// committed).
//
// The helpers read the store only through the driver's optional
// capabilities (driver.Inspector, driver.WorkLister), so they work on
// memdriver and on the Postgres drivers alike. They take a TB, the part of
// testing.TB they use, so a test's *testing.T goes straight in.
//
// Handlers that write in the same transaction as their item's completion
// call workpump.CompleteInTx and read their transaction with their
// driver's TxFrom; on memdriver, memdriver.TxFrom gives an in-memory Tx
// whose enqueues and OnCommit functions happen only if the completion
// commits, so the same handler runs in these tests and on Postgres.
package workpumptest
