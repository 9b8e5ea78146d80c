// Package browsertest drives the webui dashboard in a real headless
// Chromium, on memdriver and on Postgres: the clicks an operator makes
// (retry, pause, resume), what a read-only or authenticated dashboard
// refuses, the live refresh of the overview, and screenshots of every page.
//
// It holds tests only; it is a package of its own so that chromedp stays a
// test dependency that nothing but these tests build. The tests find
// Chromium at $WORKPUMP_CHROME, /usr/bin/chromium, or chromium,
// chromium-browser, google-chrome on PATH; without one they skip, unless
// WORKPUMP_REQUIRE_BROWSER=1 (CI), where they fail. Screenshots go to
// $WORKPUMP_SCREENSHOT_DIR/<driver>/ when it is set, else to a temporary
// folder.
package browsertest
