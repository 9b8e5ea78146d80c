package webui_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/workpump/workpump/driver/memdriver"
	"github.com/workpump/workpump/webui"
)

// ExampleNew mounts the dashboard in an application's own mux, under a
// prefix, behind a token.
func ExampleNew() {
	// Any driver works: pgxdriver.New(pool, ...) in production, the
	// in-memory one here.
	coord := memdriver.New(memdriver.Options{})

	dashboard, err := webui.New(coord, webui.Options{
		Auth:         webui.Auth{Token: "s3cret"}, // e.g. os.Getenv("WORKPUMP_UI_TOKEN")
		ReadOnly:     false,                       // true hides and refuses retry, discard, pause and resume
		ShowPayloads: false,                       // payloads may hold personal data
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/workpump/", http.StripPrefix("/ops/workpump", dashboard))

	srv := httptest.NewServer(mux) // the application's own server
	defer srv.Close()
	for _, token := range []string{"", "s3cret"} {
		req, _ := http.NewRequest("GET", srv.URL+"/ops/workpump/", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token) // a browser sends it as basic auth
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	// Output:
	// 401 Unauthorized
	// 200 OK
}
