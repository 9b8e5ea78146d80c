package driver_test

import (
	"math/bits"
	"testing"

	"github.com/workpump/workpump/driver"
)

// TestRankKey: the key is the partition's low 15 bits in reverse order.
func TestRankKey(t *testing.T) {
	for _, c := range []struct{ p, want int }{
		{0, 0}, {1, 1 << 14}, {2, 1 << 13}, {3, 3 << 13}, {1 << 14, 1}, {0x7fff, 0x7fff},
		{1 << 15, 0}, {1<<15 | 1, 1 << 14}, {123456789, int(bits.Reverse16(uint16(123456789&0x7fff)) >> 1)},
	} {
		if got := driver.RankKey(c.p); got != c.want {
			t.Errorf("RankKey(%d) = %d, want %d", c.p, got, c.want)
		}
	}
}

// TestRankOf checks the routing rule against its key ranges for every key
// and live counts 1 to 70: each key goes to exactly the rank whose range
// holds it, the ranges tile the keys in rank order, and the default
// partition count spreads evenly (every rank's partitions within 2.5 % of
// its share, and one).
func TestRankOf(t *testing.T) {
	for n := 1; n <= 70; n++ {
		next := 0
		for r := range n {
			lo, hi := driver.RankKeyRange(r, n)
			if lo != next || hi <= lo {
				t.Fatalf("live %d: rank %d's range [%d, %d) does not follow %d", n, r, lo, hi, next)
			}
			next = hi
		}
		if next != driver.RankKeys {
			t.Fatalf("live %d: the ranges end at %d, not %d", n, next, driver.RankKeys)
		}
		for p := range driver.RankKeys {
			r := driver.RankOf(p, n)
			if lo, hi := driver.RankKeyRange(r, n); driver.RankKey(p) < lo || driver.RankKey(p) >= hi {
				t.Fatalf("live %d: partition %d (key %d) has rank %d, whose range is [%d, %d)", n, p, driver.RankKey(p), r, lo, hi)
			}
		}
		per := make([]int, n)
		for p := range driver.DefaultPartitionCount {
			per[driver.RankOf(p, n)]++
		}
		share := float64(driver.DefaultPartitionCount) / float64(n)
		for r, c := range per {
			if d := float64(c) - share; d > share/40+1 || d < -share/40-1 {
				t.Errorf("live %d: rank %d takes %d partitions, share %.1f", n, r, c, share)
			}
		}
	}
}

// TestRankOfKeepsHalfOnJoin: whichever rank a joining instance takes, at
// least half of the partitions keep their instance (the instance at rank
// r before the join is at rank r or r+1 after it).
func TestRankOfKeepsHalfOnJoin(t *testing.T) {
	const partitions = driver.DefaultPartitionCount
	for n := 1; n <= 20; n++ {
		for at := 0; at <= n; at++ {
			kept := 0
			for p := range partitions {
				before := driver.RankOf(p, n)
				after := driver.RankOf(p, n+1)
				if after == at {
					continue // the newcomer's
				}
				if after > at {
					after--
				}
				if after == before {
					kept++
				}
			}
			if 2*kept < partitions-partitions/100 {
				t.Errorf("live %d, joining at rank %d: %d of %d partitions keep their instance", n, at, kept, partitions)
			}
		}
	}
}

func TestRankOfPanicsWithoutInstances(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("RankOf(1, 0) did not panic")
		}
	}()
	driver.RankOf(1, 0)
}
