package pgcore

import (
	"fmt"
	"strings"
	"testing"
)

// TestAcksCommitAsynchronouslyUnlessAsked: the core's own acknowledgement
// calls carry the transaction-local synchronous_commit = off, the claim and
// the in-transaction completion do not, and SynchronousAcks turns it off.
func TestAcksCommitAsynchronouslyUnlessAsked(t *testing.T) {
	const async = "set_config('synchronous_commit', 'off', true)"
	st := newStatements("s", Dialect{PreparesStatements: true}, false, false)
	for name, text := range map[string]string{"complete": st.complete, "fail": st.fail, "release": st.release, "renew": st.renew} {
		if !strings.Contains(text, async) {
			t.Errorf("%s = %s, want an async commit", name, text)
		}
	}
	texts := map[string]string{"claim": st.claim, "completeInTx": st.completeInTx, "enqueue": st.enqueue, "heartbeat": st.heartbeat}
	for mask, text := range st.gated[1:] {
		texts[fmt.Sprintf("gated claim %d", mask+1)] = text
	}
	for name, text := range texts {
		if strings.Contains(text, "synchronous_commit") {
			t.Errorf("%s = %s, want the caller's commit mode", name, text)
		}
	}
	sync := newStatements("s", Dialect{}, true, false)
	for name, text := range map[string]string{"complete": sync.complete, "fail": sync.fail, "release": sync.release, "renew": sync.renew} {
		if strings.Contains(text, "synchronous_commit") {
			t.Errorf("SynchronousAcks: %s = %s, want a plain call", name, text)
		}
	}
	if sync.gated != nil {
		t.Error("a dialect that does not prepare statements got gated claims")
	}
}

// TestTextArray: every slice type the core passes renders as a literal
// Postgres parses back to the same elements (quotes, backslashes, NULLs,
// bytea hex).
func TestTextArray(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{
		{[]string{`a`, `b"c`, `d\e`, ``}, `{"a","b\"c","d\\e",""}`},
		{[]int32{1, -2}, `{1,-2}`},
		{[]int64{}, `{}`},
		{[][]byte{{0x01, 0xab}, nil}, `{"\\x01ab",NULL}`},
		{[]bool{true, false}, `{true,false}`},
	} {
		if got := fmt.Sprint(TextArray(tc.in)); got != tc.want {
			t.Errorf("TextArray(%#v) = %s, want %s", tc.in, got, tc.want)
		}
	}
	if v := TextArray(42); v != 42 {
		t.Errorf("TextArray(42) = %v, want the value unchanged", v)
	}
}
