package nvmegate

// Scope is what a node's call (discover, connect, renew, release) is about,
// read from the records once per call: policy decides on it, the handler
// acts on it and the audit entry records it, so that no record is read twice
// and all three see the same version of it. A record the call names that
// does not exist is nil; policy refuses such a call, and the handler never
// runs for it.
//
// Records in a Scope are shared with the store's read model: read them,
// never modify them.
type Scope struct {
	// Caller is the node's SPIFFE ID, as its SVID proved it.
	Caller string
	// Binding is the caller's host binding; Bound is false for the default
	// derived from its SPIFFE ID (no tenant then).
	Binding HostBinding
	Bound   bool

	// JobID is the job the call names; Job the stored job, or nil.
	JobID string
	Job   *Job
	// Member reports whether the caller is one of the job's nodes.
	Member bool

	// SubsystemNQN is the subsystem a connect or renew names ("" for a
	// job-wide call); Subsystem the stored one, or nil; Target the target
	// it is on, or nil.
	SubsystemNQN string
	Subsystem    *Subsystem
	Target       *Target

	// Namespaces are the ones the call reaches: for a subsystem call every
	// namespace on the subsystem (a connected host sees them all), each
	// with the mode the job gives it ("" if the job does not name it); for
	// a job-wide call the job's namespaces with their modes.
	Namespaces []ScopeNamespace

	// HostNQN and TTL are what the request asked for ("" if nothing).
	HostNQN string
	TTL     string
}

// ScopeNamespace is one namespace of a Scope.
type ScopeNamespace struct {
	Key NamespaceKey
	// Namespace is the stored record, or nil if the inventory has none.
	Namespace *Namespace
	// Mode is the job's access mode for it (ModeReadOnly, ModeReadWrite),
	// or "" if the job does not name it.
	Mode string
	// Target is the target its subsystem is on, or nil if unknown.
	Target *Target
}

// Tenant is the tenant the call is for: the stored job's, else "".
func (s *Scope) Tenant() string {
	if s.Job == nil {
		return ""
	}
	return s.Job.Tenant
}
