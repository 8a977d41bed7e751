package gateway

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/identity"
)

// Default bounds of the call limiter (Config.MaxInFlight, MaxWaiting).
const (
	defaultMaxInFlight = 256
	defaultMaxWaiting  = 16384
)

// The roles the limiter keeps shares for, in the order of its counters:
// every role authz.ParseCaller yields.
var roles = [...]string{authz.RoleAdmin, authz.RoleAuditor, authz.RoleScheduler, authz.RoleNode,
	authz.RoleTarget, authz.RoleGateway, authz.RoleUnknown}

const numRoles = len(roles)

func roleIndex(role string) int {
	for i, r := range roles {
		if r == role {
			return i
		}
	}
	return numRoles - 1 // unknown; ParseCaller yields nothing else
}

// roleDefaults returns the default bound of each role for a pool of
// inFlight slots (0: none). The people's roles get a quarter of the pool
// each, callers no convention describes a sixteenth. Nodes have none: a
// cluster's start is every node connecting at once, thousands of identities
// of one role, and their calls wait for slots as before. Target agents have
// none: a connect waits for its target agent's Ack, which must not be
// refused while nodes hold the pool. Gateways (replicas) make no calls of
// their own today.
func roleDefaults(inFlight int) (b [numRoles]int) {
	for i, r := range roles {
		switch r {
		case authz.RoleAdmin, authz.RoleAuditor, authz.RoleScheduler:
			b[i] = max(1, inFlight/4)
		case authz.RoleUnknown:
			b[i] = max(1, inFlight/16)
		}
	}
	return b
}

// limiter bounds the unary calls doing work at once. A call past the bound
// waits (its goroutine and decoded request are all it holds) until a slot
// frees or its deadline ends; past MaxWaiting waiting calls it is refused
// Unavailable at once. Found under a 10,000-node connect storm: unbounded,
// every call describing and evaluating at the same time took the gateway
// past 20 GB and the kernel killed it.
//
// Inside that pool every caller has a share (issue 29, defect 9): one
// SPIFFE ID may have at most perIdentity calls under way (working or
// waiting for a slot), and all callers of a role together at most their
// role's bound. A call past either is refused ResourceExhausted at once,
// naming the bound, and never waits behind the others: one auditor or node
// holding calls open cannot take the slots every node's connect needs, nor
// fill the waiting room. Streams (a target agent's Watch, an export) are
// not limited here, as before: an agent's open stream takes nothing of the
// share its Acks need. A target agent's calls take no slot at all (while
// the per-identity bound is on): connects hold their slots while they wait
// for its Acks, which queued behind them would time them all out.
//
// The shares are counted under one mutex: two map operations and two array
// updates. A call's acquire and release cost 200–345 ns on two cores, the
// same for 64 callers as for one (BenchmarkLimiter). A connect takes
// milliseconds, so the mutex is not sharded.
// An identity's counter is deleted when it reaches zero, so the map holds
// only the callers with calls under way.
type limiter struct {
	slots      chan struct{}
	waiting    atomic.Int64
	maxWaiting int64
	busy       error // refused past maxWaiting

	shares      bool // false: no share is bounded, nothing is counted
	perIdentity int  // 0: no per-identity bound
	perRole     [numRoles]int
	mu          sync.Mutex
	calls       map[string]int // SPIFFE ID → its calls under way; no zero entries
	roleCalls   [numRoles]int
	// The refusals, made once: a flood of refused calls allocates no
	// message.
	overIdentity error
	overRole     [numRoles]error

	// refused counts the calls refused over a share, by bound (identity,
	// role) and the caller's role (nil: not counted).
	refused *prometheus.CounterVec
}

// limits are the limiter's bounds, as Config gives them: 0 means the
// default, a negative bound none.
type limits struct {
	inFlight, waiting int
	perIdentity       int
	perRole           map[string]int // role → bound; a role not in it has its default
}

func newLimiter(c limits) (*limiter, error) {
	if c.inFlight <= 0 {
		c.inFlight = defaultMaxInFlight
	}
	if c.waiting <= 0 {
		c.waiting = defaultMaxWaiting
	}
	l := &limiter{slots: make(chan struct{}, c.inFlight), maxWaiting: int64(c.waiting),
		busy:  nvmegate.Errorf(nvmegate.EUNAVAILABLE, "gateway busy: too many calls waiting; retry with backoff"),
		calls: map[string]int{}}
	switch {
	case c.perIdentity == 0:
		l.perIdentity = max(1, c.inFlight/8)
	case c.perIdentity > 0:
		l.perIdentity = c.perIdentity
	}
	l.perRole = roleDefaults(c.inFlight)
	for role, b := range c.perRole {
		i := roleIndex(role)
		if roles[i] != role {
			return nil, fmt.Errorf("gateway: MaxPerRole: no role %q (roles: %v)", role, roles)
		}
		switch {
		case b > 0:
			l.perRole[i] = b
		case b < 0:
			l.perRole[i] = 0
		}
	}
	l.shares = l.perIdentity > 0
	l.overIdentity = nvmegate.Errorf(nvmegate.EEXHAUSTED,
		"this caller already has %d calls under way, its share of the gateway (the per-identity bound); retry when one has ended", l.perIdentity)
	for i, b := range l.perRole {
		if b > 0 {
			l.shares = true
			l.overRole[i] = nvmegate.Errorf(nvmegate.EEXHAUSTED,
				"callers of role %s already have %d calls under way, the role's share of the gateway (the per-role bound); retry later", roles[i], b)
		}
	}
	return l, nil
}

// share is what a call holds of its caller's shares; release gives it back.
type share struct {
	id      string // the caller's SPIFFE ID ("" without one)
	role    int
	counted bool // false: the shares are off
	noSlot  bool // it holds no slot of the pool (a target agent's call)
}

// targetRole is the target agents' role: their calls take no slot.
var targetRole = roleIndex(authz.RoleTarget)

// acquire takes the caller's share and then a slot; release gives both
// back. A call over its share is refused before it waits for anything.
func (l *limiter) acquire(ctx context.Context) (share, error) {
	sh, err := l.take(ctx)
	if err != nil {
		return share{}, err
	}
	if sh.counted && sh.role == targetRole && l.perIdentity > 0 {
		// A target agent's Ack is what every connect holding a slot
		// waits for: queued behind them, it would time them all out. Its
		// calls (one Ack at a time per stream, and the rare re-encryption
		// report) are bounded by its identity's share alone (with the
		// shares off they take slots, as before).
		sh.noSlot = true
		return sh, nil
	}
	select {
	case l.slots <- struct{}{}:
		return sh, nil
	default:
	}
	if l.waiting.Add(1) > l.maxWaiting {
		l.waiting.Add(-1)
		l.give(sh)
		return share{}, l.busy
	}
	defer l.waiting.Add(-1)
	select {
	case l.slots <- struct{}{}:
		return sh, nil
	case <-ctx.Done():
		l.give(sh)
		return share{}, ctx.Err()
	}
}

func (l *limiter) release(sh share) {
	if !sh.noSlot {
		<-l.slots
	}
	l.give(sh)
}

// take counts the call in its caller's and its role's shares, or refuses
// it if either is full.
func (l *limiter) take(ctx context.Context) (share, error) {
	if !l.shares {
		return share{}, nil
	}
	id, _ := identity.PeerID(ctx) // none: the zero ID, role unknown, one share for all such
	sh := share{id: id.String(), role: roleIndex(authz.ParseCaller(id).Role), counted: true}
	l.mu.Lock()
	if l.perIdentity > 0 && l.calls[sh.id] >= l.perIdentity {
		l.mu.Unlock()
		l.count("identity", sh.role)
		return share{}, l.overIdentity
	}
	if b := l.perRole[sh.role]; b > 0 && l.roleCalls[sh.role] >= b {
		l.mu.Unlock()
		l.count("role", sh.role)
		return share{}, l.overRole[sh.role]
	}
	if l.perIdentity > 0 {
		l.calls[sh.id]++
	}
	l.roleCalls[sh.role]++
	l.mu.Unlock()
	return sh, nil
}

func (l *limiter) give(sh share) {
	if !sh.counted {
		return
	}
	l.mu.Lock()
	if l.perIdentity > 0 {
		if n := l.calls[sh.id] - 1; n > 0 {
			l.calls[sh.id] = n
		} else {
			delete(l.calls, sh.id)
		}
	}
	l.roleCalls[sh.role]--
	l.mu.Unlock()
}

func (l *limiter) count(bound string, role int) {
	if l.refused != nil {
		l.refused.WithLabelValues(bound, roles[role]).Inc()
	}
}

// underWay reports the calls counted in the shares: the identities with
// calls under way and the calls of each role (tests check that they return
// to zero).
func (l *limiter) underWay() (identities int, byRole map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byRole = map[string]int{}
	for i, n := range l.roleCalls {
		if n != 0 {
			byRole[roles[i]] = n
		}
	}
	return len(l.calls), byRole
}
