package driver

import (
	"hash/fnv"
	"math/bits"
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

// RankKeys is the size of the key space ranks divide: a partition's rank
// key is in [0, RankKeys).
const RankKeys = 1 << 15

// RankKey is the key that routes a partition's rows: the partition's low 15
// bits in reverse order. Reversed, the keys of any number of partitions
// spread evenly over [0, RankKeys), so equal ranges of keys hold nearly
// equal shares of the partitions whatever the partition count. (Partitions that
// agree in their low 15 bits share a key and route together.)
func RankKey(partition int) int {
	return int(bits.Reverse16(uint16(partition&(RankKeys-1))) >> 1)
}

// RankOf is the rank that claims an unowned row of partition among
// liveCount instances: the instances divide the rank keys into liveCount
// ranges of equal width, in rank order, and rank r takes the keys k with
// k*liveCount/RankKeys = r. An instance joining or leaving shifts each
// range by less than one range's width, so at least half of the key space
// keeps its instance (and about as large a share of the partitions, when
// there are many more partitions than instances), where partition mod
// liveCount would move all but about 1/(liveCount+1) of them. RankOf
// panics when liveCount is not positive.
func RankOf(partition, liveCount int) int {
	if liveCount <= 0 {
		panic("driver.RankOf: liveCount must be > 0")
	}
	return RankKey(partition) * liveCount / RankKeys
}

// RankKeyRange is the range [lo, hi) of rank keys that rank takes among
// liveCount instances (RankOf(p, liveCount) == rank exactly when RankKey(p)
// is in it).
func RankKeyRange(rank, liveCount int) (lo, hi int) {
	ceil := func(r int) int { return (r*RankKeys + liveCount - 1) / liveCount }
	return ceil(rank), ceil(rank + 1)
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
