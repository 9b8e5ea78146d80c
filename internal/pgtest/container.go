package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// containerImage is the server the container path starts; the oldest
// Postgres the schema supports (hashtextextended needs 11+, the pg_stat
// flush functions the idle tests use need 15+).
const containerImage = "postgres:15-alpine"

// dockerReachable reports whether a Docker daemon looks reachable, cheaply:
// an explicit DOCKER_HOST, or the default socket.
func dockerReachable() (bool, string) {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return true, "DOCKER_HOST=" + h
	}
	for _, p := range []string{"/var/run/docker.sock", os.ExpandEnv("$HOME/.docker/run/docker.sock")} {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
			return true, p
		}
	}
	return false, "no DOCKER_HOST and no Docker socket"
}

// startContainer starts a throw-away Postgres with testcontainers' postgres
// module and returns its URL and a function that removes it.
func startContainer() (url string, stop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := postgres.Run(ctx, containerImage,
		postgres.WithDatabase("test"),
		postgres.WithUsername("postgres"),
		postgres.WithPassword("postgres"),
		postgres.BasicWaitStrategies(),
	)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return "", nil, fmt.Errorf("start %s: %w", containerImage, err)
	}
	url, err = c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return "", nil, fmt.Errorf("container connection string: %w", err)
	}
	if !strings.HasPrefix(url, "postgres") {
		_ = testcontainers.TerminateContainer(c)
		return "", nil, fmt.Errorf("unexpected container connection string %q", url)
	}
	return url, func() { _ = testcontainers.TerminateContainer(c) }, nil
}
