package pgcore

import (
	"strings"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/migrations"
)

// heldStreamsSQL renders ListHeldStreams' statement: wp_held_streams'
// query, with each table's held rows found by a probe of its _wake index
// (a held row is unleased and waits for its schedule, HeldUntil) instead
// of a scan of every waiting row, which a retry storm makes millions. The
// limit is placeholders 1 and 2 (the same value; <= 0 means all).
func heldStreamsSQL(schema string, ph func(int) string) string {
	var b strings.Builder
	b.WriteString("SELECT h.category, h.stream_id, h.id, h.name, d.error, d.dead_lettered_at FROM (")
	for i, cat := range driver.Categories {
		done := "processed_at"
		if cat == driver.Receptor {
			done = "completed_at"
		}
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT '" + string(cat) + "'::text AS category, t.stream_id, t." + migrations.KeyColumn(string(cat)) + " AS id, t.name" +
			` FROM "` + schema + `".` + migrations.Table(string(cat)) + " t" +
			" WHERE t.scheduled_for = " + heldSQL + " AND t." + done + " IS NULL AND t.instance_id IS NULL" +
			" AND " + wakeExpr + " = " + heldSQL)
	}
	b.WriteString(") h CROSS JOIN LATERAL (SELECT dl.dead_letter_id, dl.error, dl.dead_lettered_at" +
		` FROM "` + schema + `".wp_dead_letters dl WHERE dl.category = h.category AND dl.id = h.id` +
		" ORDER BY dl.dead_letter_id DESC LIMIT 1) d" +
		" ORDER BY d.dead_letter_id LIMIT CASE WHEN " + ph(1) + "::integer > 0 THEN " + ph(2) + "::integer END")
	return b.String()
}
