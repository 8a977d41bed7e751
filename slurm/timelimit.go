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

// ParseShowJob reads StartTime and TimeLimit from `scontrol show job -o
// ID` output (one line of Key=Value fields). Times are in the local zone
// of the machine scontrol ran on (loc).
func ParseShowJob(out string, loc *time.Location) (Window, error) {
	var w Window
	var start, limit string
	for _, f := range strings.Fields(out) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case "StartTime":
			start = v
		case "TimeLimit":
			limit = v
		}
	}
	if start == "" || limit == "" {
		return w, fmt.Errorf("scontrol's answer has no StartTime or TimeLimit")
	}
	t, err := time.ParseInLocation("2006-01-02T15:04:05", start, loc)
	if err != nil {
		return w, fmt.Errorf("StartTime=%s: %w", start, err)
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
