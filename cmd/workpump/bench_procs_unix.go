//go:build unix

package main

import "syscall"

type cpuTime struct{ user, sys float64 }

// cpuTimes is this process's user and system CPU time so far.
func cpuTimes() cpuTime {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuTime{}
	}
	sec := func(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }
	return cpuTime{user: sec(ru.Utime), sys: sec(ru.Stime)}
}
