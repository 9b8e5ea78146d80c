package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/workpump/workpump/driver"
	"github.com/workpump/workpump/driver/pgxdriver"
	"github.com/workpump/workpump/migrations"
	"github.com/workpump/workpump/webui"
)

const uiSynopsis = `ui --database-url URL [--schema S] [--listen 127.0.0.1:8080] [--read-only] [--show-payloads] [--token T]

Serves the web dashboard of a Postgres schema: live instances, backlog and
lag, dead letters (retry, discard), held streams, pauses and one stream's
items in order. It listens on loopback by default; an address other
interfaces reach needs --token (or $WORKPUMP_UI_TOKEN), which a browser
gives as the password of its login prompt (any user name) and a program
as "Authorization: Bearer T".`

// runUI is `workpump ui`.
func runUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ui", uiSynopsis, stderr)
	db := databaseURLFlag(fs)
	schema := fs.String("schema", migrations.DefaultSchema, "schema holding the workpump tables")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on; a non-loopback one needs --token")
	readOnly := fs.Bool("read-only", false, "hide and refuse every action (retry, discard, pause, resume)")
	showPayloads := fs.Bool("show-payloads", false, "show item payloads (they may hold personal data)")
	token := fs.String("token", os.Getenv("WORKPUMP_UI_TOKEN"), "require this token (default $WORKPUMP_UI_TOKEN)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkListen(*listen, *token); err != nil {
		return err
	}
	if err := checkSchemaFlag(*schema); err != nil {
		return err
	}
	pool, err := openPool(ctx, *db, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The dashboard only reads and acts through the driver; like status,
	// it records nothing of its own (no partition count, no listener).
	coord, err := pgxdriver.New(pool, pgxdriver.Options{Schema: *schema, DisableListener: true})
	if err != nil {
		return err
	}
	if err := coord.CheckVersion(ctx); err != nil {
		return err
	}
	opts := webui.Options{ReadOnly: *readOnly, ShowPayloads: *showPayloads, Auth: webui.Auth{Token: *token}, Logger: uiLogger(stderr)}
	srv, url, err := startUI(coord, *listen, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dashboard of schema %s: %s (interrupt to stop)\n", *schema, url)
	<-ctx.Done()
	return stopUI(srv)
}

func uiLogger(w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "workpump-ui", Level: hclog.Info, Output: w})
}

// checkListen refuses an address reachable from other hosts unless a
// token protects it: the dashboard can retry and discard work.
func checkListen(listen, token string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usagef("--listen %q: %v", listen, err)
	}
	if token != "" || isLoopback(host) {
		return nil
	}
	what := host
	if what == "" {
		what = "every interface"
	}
	return usagef("--listen %s: %s is not a loopback address; give --token (or set WORKPUMP_UI_TOKEN) so the dashboard requires authentication", listen, what)
}

// isLoopback reports whether host only reaches this machine. A host name
// other than localhost is not trusted to: it may resolve elsewhere.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// startUI serves the dashboard of coord on listen and returns its URL.
func startUI(coord driver.Coordinator, listen string, opts webui.Options) (*http.Server, string, error) {
	h, err := webui.New(coord, opts)
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, "", fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			opts.Logger.Error("dashboard server", "error", err)
		}
	}()
	return srv, "http://" + ln.Addr().String() + "/", nil
}

func stopUI(srv *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(ctx)
}
