package slurm

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Window is when a job's run may hold its datasets: from its start, for
// its time limit. Unlimited is true for a job without one.
type Window struct {
	Start     time.Time
	Limit     time.Duration
	Unlimited bool
}

// SqueueFormat is the squeue output format ParseSqueue reads: the start
// time and the time limit alone. (scontrol show job prints user-set
// fields, the comment and the job name, around them unquoted: a comment
// holding " StartTime=2099-01-01T00:00:00" would set the scope's expiry.)
const SqueueFormat = "%S|%l"

// ParseSqueue reads `squeue -h -j ID -o '%S|%l'`: the run's start time in
// the zone of the machine squeue ran on (loc), and its time limit.
func ParseSqueue(out string, loc *time.Location) (Window, error) {
	var w Window
	start, limit, ok := strings.Cut(strings.TrimSpace(out), "|")
	if !ok || strings.Contains(limit, "|") {
		return w, fmt.Errorf("squeue's answer %q is not START|LIMIT", out)
	}
	t, err := time.ParseInLocation("2006-01-02T15:04:05", start, loc)
	if err != nil {
		return w, fmt.Errorf("start time %s: %w", start, err)
	}
	w.Start = t
	if limit == "UNLIMITED" || limit == "INFINITE" {
		w.Unlimited = true
		return w, nil
	}
	if w.Limit, err = ParseTimeLimit(limit); err != nil {
		return w, err
	}
	return w, nil
}

// ParseTimeLimit reads a Slurm time limit as scontrol prints it:
// [D-]HH:MM:SS, or MM:SS.
func ParseTimeLimit(s string) (time.Duration, error) {
	bad := fmt.Errorf("TimeLimit=%s: want [D-]HH:MM:SS", s)
	var days int
	if d, rest, ok := strings.Cut(s, "-"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			return 0, bad
		}
		days, s = n, rest
	}
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, bad
	}
	var nums []int
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 59 && len(nums) > 0 {
			return 0, bad
		}
		nums = append(nums, n)
	}
	for len(nums) < 3 {
		nums = append([]int{0}, nums...)
	}
	return time.Duration(days)*24*time.Hour + time.Duration(nums[0])*time.Hour +
		time.Duration(nums[1])*time.Minute + time.Duration(nums[2])*time.Second, nil
}
