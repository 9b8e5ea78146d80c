package driver

import (
	"hash/fnv"
	"time"

	"github.com/google/uuid"
)

// DefaultPartitionCount is the partition count used when none is configured.
const DefaultPartitionCount = 10000

// PartitionOf maps a partition key (StreamID, or the row id for rows without
// a stream) to [0, count). It is FNV-1a 32-bit, computed in Go at enqueue and
// stored with the row, so every driver and SQL path agree without a shared
// server-side hash function.
func PartitionOf(key string, count int) int {
	if count <= 0 {
		count = DefaultPartitionCount
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	// uint64: a count above MaxUint32 would truncate to 0 as uint32 and panic.
	return int(uint64(h.Sum32()) % uint64(count))
}

// PartitionKey returns the key PartitionOf hashes for a row.
func PartitionKey(streamID string, id uuid.UUID) string {
	if streamID != "" {
		return streamID
	}
	return id.String()
}

// RetryDelay is the backoff before retry of a row that failed on attempt
// attempts: min(base << min(attempts, 10), max). With the default base 30 s
// and max 300 s it gives 60, 120, 240, 300, 300, ... seconds.
func RetryDelay(attempts int, base, max time.Duration) time.Duration {
	if attempts < 0 {
		attempts = 0
	}
	if attempts > 10 {
		attempts = 10
	}
	// Compare before shifting: base << attempts can overflow into a small
	// positive value that would pass a d > max check.
	if base <= 0 || base > max>>attempts {
		return max
	}
	return base << attempts
}
