package nodeagent

import (
	"encoding/json"
	"net/http"
	"sort"
	"time"
)

// Status is the agent's state as the status command shows it: no secrets.
type Status struct {
	Job        string            `json:"job"`
	HostNQN    string            `json:"host_nqn"`
	Started    time.Time         `json:"started"`
	Subsystems []SubsystemStatus `json:"subsystems"`
}

// SubsystemStatus is one subsystem of the job.
type SubsystemStatus struct {
	Subsystem string `json:"subsystem"`
	// Grant is "" while the agent has none (before the first connect, after
	// a failure, once it ended).
	Grant      string    `json:"grant,omitempty"`
	KeyVersion uint64    `json:"key_version,omitempty"`
	Expires    time.Time `json:"expires,omitzero"`
	Controller string    `json:"controller,omitempty"`
	// State is the controller's state as the kernel reports it ("live").
	State string `json:"state,omitempty"`
	// Devices are the block devices of its namespaces (/dev/nvme1n1), once
	// the kernel has scanned them.
	Devices     []string  `json:"devices,omitempty"`
	TLS         bool      `json:"tls"`
	PSKIdentity string    `json:"psk_identity,omitempty"`
	LastRenewal time.Time `json:"last_renewal,omitzero"`
	LastRekey   time.Time `json:"last_rekey,omitzero"`
	Rekeys      int       `json:"rekeys"`
	Error       string    `json:"error,omitempty"`
	// ErrorCode is the gateway's status code when Error is its answer
	// ("PermissionDenied" for a policy refusal), "Unknown" for a fault of
	// the node.
	ErrorCode  string    `json:"error_code,omitempty"`
	ErrorSince time.Time `json:"error_since,omitzero"`
}

// deviceLister is a Kernel that names its namespaces' block devices
// (nvmehost.Host does).
type deviceLister interface {
	Devices(controller string) ([]string, error)
}

// Status returns the agent's state now.
func (a *Agent) Status() Status {
	a.mu.Lock()
	st := Status{Job: a.Job, HostNQN: a.hostNQN, Started: a.started}
	for _, s := range a.subs {
		ss := SubsystemStatus{Subsystem: s.nqn, Controller: s.ctrl, TLS: s.conn.TLS, PSKIdentity: s.pskDesc,
			LastRenewal: s.lastRenew, LastRekey: s.lastRekey, Rekeys: s.rekeys, Error: s.lastErr, ErrorSince: s.errorSince}
		if s.lastErr != "" {
			ss.ErrorCode = s.errCode.String()
		}
		if s.grant != nil {
			ss.Grant, ss.KeyVersion, ss.Expires = s.grant.GrantId, s.grant.KeyVersion, s.grant.ExpiresAt.AsTime()
		}
		st.Subsystems = append(st.Subsystems, ss)
	}
	a.mu.Unlock()
	sort.Slice(st.Subsystems, func(i, j int) bool { return st.Subsystems[i].Subsystem < st.Subsystems[j].Subsystem })
	// The kernel's view, read outside the lock.
	for i, ss := range st.Subsystems {
		if ss.Controller == "" {
			continue
		}
		if in, err := a.Kernel.Info(ss.Controller); err == nil {
			st.Subsystems[i].State = in.State
		} else {
			st.Subsystems[i].State = "gone"
		}
		if k, ok := a.Kernel.(deviceLister); ok {
			st.Subsystems[i].Devices, _ = k.Devices(ss.Controller)
		}
	}
	return st
}

// StatusHandler serves Status as JSON on GET /status.
func (a *Agent) StatusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(a.Status())
	})
	return mux
}
