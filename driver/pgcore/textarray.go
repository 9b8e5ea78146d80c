package pgcore

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// TextArray renders a slice as a Postgres array literal ('{"a","b"}'), the
// text form of an array parameter that every client can send as a string
// and the statement casts. It takes the slice types the core passes
// ([]string, []int32, []int64, []bool, [][]byte, []*time.Time with nil for
// NULL, []uuid.UUID); any other value is returned as it is.
func TextArray(v any) any {
	var b strings.Builder
	b.WriteByte('{')
	sep := func(i int) {
		if i > 0 {
			b.WriteByte(',')
		}
	}
	switch v := v.(type) {
	case []string:
		for i, s := range v {
			sep(i)
			quote(&b, s)
		}
	case []int32:
		for i, n := range v {
			sep(i)
			b.WriteString(strconv.FormatInt(int64(n), 10))
		}
	case []int64:
		for i, n := range v {
			sep(i)
			b.WriteString(strconv.FormatInt(n, 10))
		}
	case []bool:
		for i, x := range v {
			sep(i)
			b.WriteString(strconv.FormatBool(x))
		}
	case [][]byte:
		for i, p := range v {
			sep(i)
			if p == nil {
				b.WriteString("NULL")
				continue
			}
			// The element's text is \x<hex>; inside a quoted element the
			// backslash is escaped.
			b.WriteString(`"\\x`)
			b.WriteString(hex.EncodeToString(p))
			b.WriteByte('"')
		}
	case []*time.Time:
		for i, t := range v {
			sep(i)
			if t == nil {
				b.WriteString("NULL")
				continue
			}
			quote(&b, t.UTC().Format("2006-01-02 15:04:05.999999Z07:00"))
		}
	case []uuid.UUID:
		for i, id := range v {
			sep(i)
			b.WriteString(id.String())
		}
	default:
		return v
	}
	b.WriteByte('}')
	return b.String()
}

// quote writes s as a double-quoted array element.
func quote(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}

func dollar(i int) string { return "$" + strconv.Itoa(i) }

// Question is the placeholder of clients that interpolate arguments on the
// client side (bun): every parameter is "?".
func Question(int) string { return "?" }
