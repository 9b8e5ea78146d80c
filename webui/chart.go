package webui

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/workpump/workpump/driver"
)

// colours of the categories in charts and legends, in Categories order.
var colours = []string{"#2563eb", "#16a34a", "#d97706", "#9333ea"}

const (
	chartW, chartH         = 640, 180
	padL, padR, padT, padB = 56, 12, 12, 24
)

func readyChart(s []sample, now time.Time, window time.Duration) template.HTML {
	return lineChart("ready items per category", s, now, window, func(x sample, c driver.Category) float64 { return float64(x.ready[c]) }, func(v float64) string {
		return fmt.Sprintf("%.0f", v)
	})
}

func lagChart(s []sample, now time.Time, window time.Duration) template.HTML {
	return lineChart("oldest ready item's wait per category", s, now, window, func(x sample, c driver.Category) float64 { return x.lag[c].Seconds() }, func(v float64) string {
		return age(time.Duration(v * float64(time.Second)))
	})
}

// lineChart draws one line per category over the window ending at now.
// Everything in it is numbers and fixed names: nothing from the store is
// written into the markup.
func lineChart(title string, s []sample, now time.Time, window time.Duration, val func(sample, driver.Category) float64, label func(float64) string) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`, chartW, chartH, chartW, chartH, title)
	top := 0.0
	for _, x := range s {
		for _, c := range driver.Categories {
			top = max(top, val(x, c))
		}
	}
	if top == 0 {
		top = 1
	}
	plotW, plotH := float64(chartW-padL-padR), float64(chartH-padT-padB)
	xOf := func(t time.Time) float64 {
		f := 1 - float64(now.Sub(t))/float64(window)
		return float64(padL) + max(0, min(1, f))*plotW
	}
	yOf := func(v float64) float64 { return float64(padT) + plotH - v/top*plotH }
	// Axes and the top and middle values.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#94a3b8"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#94a3b8"/>`, padL, padT, padL, chartH-padB)
	for _, f := range []float64{1, 0.5} {
		y := yOf(top * f)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e2e8f0"/>`, padL, y, chartW-padR, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" font-size="11" fill="#475569">%s</text>`, padL-4, y+4, label(top*f))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" font-size="11" fill="#475569">0</text>`, padL-4, chartH-padB+4)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#475569">-%s</text>`, padL, chartH-6, age(window))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" font-size="11" fill="#475569">now</text>`, chartW-padR, chartH-6)
	for i, c := range driver.Categories {
		if len(s) == 0 {
			break
		}
		var pts []string
		for _, x := range s {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(x.at), yOf(val(x, c))))
		}
		if len(pts) == 1 {
			// One sample: a dot, as a line needs two points.
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"><title>%s</title></circle>`, xOf(s[0].at), yOf(val(s[0], c)), colours[i], c)
			continue
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`, colours[i], strings.Join(pts, " "), c)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
