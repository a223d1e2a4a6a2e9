package ipvs

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ipvsproxy/ipvsproxy/internal/calls"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Fake is an in-memory IPVS for unit tests. It keeps the kernel's
// semantics where the engine depends on them: adding what exists fails
// with IsExist, touching what does not exist fails with IsNotExist,
// deleting a virtual server deletes its real servers, a zero timeout
// leaves the current one. It counts every call by verb, can be told to
// fail chosen calls, and String() prints `ipvsadm -Sn`.
//
// The verbs are the Interface method names: "ListVirtualServers",
// "AddVirtualServer", "UpdateVirtualServer", "DeleteVirtualServer",
// "ListRealServers", "AddRealServer", "UpdateRealServer",
// "DeleteRealServer", "GetTimeouts", "SetTimeouts", "WalkVirtualServers",
// "WalkRealServers". A walk counts once, as a List does: both are one
// kernel dump. AddRealServers counts as the Handle's sends: one
// "AddRealServers" per nlconn.MaxPipelined real servers sent, and no
// "AddRealServer"; Faults see each send as an "AddRealServers" call (a
// fault fails every real server of the send) and each real server as an
// "AddRealServer" call with Call.Batched set.
//
// A Fake is safe for concurrent use. The zero value is not usable; call
// NewFake.
type Fake struct {
	mu       sync.Mutex
	services map[ServiceKey]*fakeService
	timeouts Timeouts
	calls.Counter
	// Faults fails chosen calls (FailOn, FailTimes) and records them
	// (Record). An injected err is wrapped like a kernel error: inject
	// syscall.EEXIST or syscall.ESRCH to get errors for which IsExist or
	// IsNotExist hold.
	calls.Faults[Call]
	// interrupts is how many of the next walks are interrupted once.
	interrupts int
	unloaded   map[string]bool // schedulers whose module is "not loaded"
}

type fakeService struct {
	vs    VirtualServer
	reals map[RealKey]RealServer
}

// Call describes one call to the Fake, for fault-injection matchers.
type Call struct {
	Verb    string     // the Interface method name
	Service ServiceKey // zero for ListVirtualServers, GetTimeouts, SetTimeouts
	Real    RealKey    // zero unless the verb is about a real server
	// Batched is set for the messages of an AddRealServers or AddServices
	// call.
	Batched bool
}

var _ Interface = (*Fake)(nil)

// The kernel's default timeouts (tcp 900 s, tcpfin 120 s, udp 300 s), which
// a fresh Fake starts with as a fresh kernel does.
var defaultTimeouts = Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second}

// Schedulers the Fake accepts, as if every ip_vs_* scheduler module were
// loaded. Any other name fails like a missing module does in the kernel.
var fakeSchedulers = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range Schedulers {
		m[s] = true
	}
	return m
}()

// UnloadScheduler makes the Fake refuse scheduler name as the kernel does
// when its module is not loaded; loaded=true takes it back.
func (f *Fake) UnloadScheduler(name string, loaded bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unloaded == nil {
		f.unloaded = map[string]bool{}
	}
	f.unloaded[name] = !loaded
}

// NewFake returns an empty Fake with the kernel's default timeouts.
func NewFake() *Fake {
	f := &Fake{
		services: map[ServiceKey]*fakeService{},
		timeouts: defaultTimeouts,
	}
	f.Verbs(slices.Collect(maps.Keys(verbs))...)
	return f
}

// String prints the state as `ipvsadm -Sn` does (see FormatSave for order).
func (f *Fake) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	svcs := make([]VirtualServer, 0, len(f.services))
	reals := make(map[ServiceKey][]RealServer, len(f.services))
	for k, s := range f.services {
		svcs = append(svcs, s.vs)
		reals[k] = slices.Collect(maps.Values(s.reals))
	}
	return FormatSave(svcs, reals)
}

// Count returns how many times verb was called since the last
// ResetCounts, failed calls included. It panics on a verb that is not an
// Interface method, so a typo cannot pass a test by counting zero.
func (f *Fake) Count(verb string) int {
	if !verbs[verb] {
		panic(fmt.Sprintf("ipvs.Fake.Count: unknown verb %q", verb))
	}
	return f.Counter.Count(verb)
}

// begin counts a call and returns the injected error for it, if any.
// The caller holds f.mu.
func (f *Fake) begin(c Call, sched string) error {
	f.Inc(c.Verb)
	if err := f.Check(c.Verb, c); err != nil {
		return opError(c.Verb, c.Service, c.Real, sched, err)
	}
	return nil
}

// ListVirtualServers returns every virtual server, in FormatSave order.
func (f *Fake) ListVirtualServers() ([]VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verbListVirtualServers}, ""); err != nil {
		return nil, err
	}
	return f.sortedServicesLocked(), nil
}

func (f *Fake) sortedServicesLocked() []VirtualServer {
	out := make([]VirtualServer, 0, len(f.services))
	for _, s := range f.services {
		out = append(out, s.vs)
	}
	slices.SortFunc(out, func(a, b VirtualServer) int { return CompareServiceKeys(a.ServiceKey, b.ServiceKey) })
	return out
}

// WalkVirtualServers implements Interface: the virtual servers in
// ListVirtualServers' order. fn runs without the Fake's lock held, so it
// may call the Fake, as it may call a Handle.
func (f *Fake) WalkVirtualServers(reset func(), fn func(VirtualServer) error) error {
	f.mu.Lock()
	err := f.begin(Call{Verb: verbWalkVirtualServers}, "")
	if err != nil {
		f.mu.Unlock()
		return err
	}
	items, interrupted := f.sortedServicesLocked(), f.takeInterrupt()
	f.mu.Unlock()
	ghost := VirtualServer{ServiceKey: GhostService, Scheduler: "rr"}
	return fakeWalk(items, ghost, interrupted, reset, fn,
		opError(verbWalkVirtualServers, ServiceKey{}, RealKey{}, "", ErrDumpInterrupted))
}

// GhostService and GhostReal are what an interrupted walk of a Fake hands
// to fn before it restarts (see InterruptNextWalk): a virtual or real
// server that the dump saw but that was deleted before it ended. Tests
// must not program them.
var (
	GhostService = ServiceKey{Address: netip.MustParseAddr("192.0.2.255"), Protocol: TCP, Port: 9}
	GhostReal    = RealKey{Address: netip.MustParseAddr("192.0.2.254"), Port: 9}
)

// InterruptNextWalk makes the next n walks (of either kind) behave like a
// kernel dump that raced with a change: each first hands fn a ghost
// (GhostService or GhostReal), then calls reset and starts again with the
// real contents; with a nil reset it fails with ErrDumpInterrupted
// instead. A caller that forgets to clear what it got in reset keeps the
// ghost, which a test can see.
func (f *Fake) InterruptNextWalk(n int) {
	f.mu.Lock()
	f.interrupts = n
	f.mu.Unlock()
}

// takeInterrupt consumes one pending interruption; the caller holds f.mu.
func (f *Fake) takeInterrupt() bool {
	if f.interrupts <= 0 {
		return false
	}
	f.interrupts--
	return true
}

// fakeWalk hands items to fn as a restarted kernel dump would: when
// interrupted, first a ghost, then reset (or, without one, the error
// failed), then every item.
func fakeWalk[T any](items []T, ghost T, interrupted bool, reset func(), fn func(T) error, failed error) error {
	if interrupted {
		if err := fn(ghost); err != nil {
			return err
		}
		if reset == nil {
			return failed
		}
		reset()
	}
	for _, it := range items {
		if err := fn(it); err != nil {
			return err
		}
	}
	return nil
}

// AddVirtualServer adds vs; IsExist(err) if it is there already.
func (f *Fake) AddVirtualServer(vs VirtualServer) error {
	return f.putService(verbAddVirtualServer, vs)
}

// UpdateVirtualServer replaces scheduler, flags and timeout of an existing
// vs, keeping its real servers and stats; IsNotExist(err) if there is none.
func (f *Fake) UpdateVirtualServer(vs VirtualServer) error {
	return f.putService(verbUpdateVirtualServer, vs)
}

func (f *Fake) putService(verb string, vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verb, Service: vs.ServiceKey}, vs.Scheduler); err != nil {
		return err
	}
	return f.putServiceLocked(verb, vs)
}

// putServiceLocked is putService after the call was counted and checked
// for faults; the caller holds f.mu.
func (f *Fake) putServiceLocked(verb string, vs VirtualServer) error {
	if err := validateVirtualServer(vs); err != nil {
		return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, err)
	}
	s, exists := f.services[vs.ServiceKey]
	switch {
	case verb == verbAddVirtualServer && exists:
		return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, syscall.EEXIST)
	case verb == verbUpdateVirtualServer && !exists:
		return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, syscall.ESRCH)
	case !fakeSchedulers[vs.Scheduler] || f.unloaded[vs.Scheduler]:
		return opError(verb, vs.ServiceKey, RealKey{}, vs.Scheduler, syscall.ENOENT)
	}
	// Like the kernel, keep only what is programmable: no hashed flag,
	// and stats belong to the kernel.
	vs.Flags &^= FlagHashed
	if !exists {
		vs.Stats = Stats{}
		f.services[vs.ServiceKey] = &fakeService{vs: vs, reals: map[RealKey]RealServer{}}
		return nil
	}
	vs.Stats = s.vs.Stats
	s.vs = vs
	return nil
}

// DeleteVirtualServer deletes the virtual server and its real servers;
// IsNotExist(err) if there is none.
func (f *Fake) DeleteVirtualServer(key ServiceKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verbDeleteVirtualServer, Service: key}, ""); err != nil {
		return err
	}
	if err := validateService(key); err != nil {
		return opError(verbDeleteVirtualServer, key, RealKey{}, "", err)
	}
	if _, ok := f.services[key]; !ok {
		return opError(verbDeleteVirtualServer, key, RealKey{}, "", syscall.ESRCH)
	}
	delete(f.services, key)
	return nil
}

// ListRealServers returns the real servers of vs sorted by address and
// port. Like the kernel, it returns an empty list when vs does not exist.
func (f *Fake) ListRealServers(vs ServiceKey) ([]RealServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verbListRealServers, Service: vs}, ""); err != nil {
		return nil, err
	}
	if err := validateService(vs); err != nil {
		return nil, opError(verbListRealServers, vs, RealKey{}, "", err)
	}
	return f.sortedRealsLocked(vs), nil
}

func (f *Fake) sortedRealsLocked(vs ServiceKey) []RealServer {
	s := f.services[vs]
	if s == nil {
		return []RealServer{}
	}
	out := slices.AppendSeq(make([]RealServer, 0, len(s.reals)), maps.Values(s.reals))
	slices.SortFunc(out, func(a, b RealServer) int { return CompareRealKeys(a.RealKey, b.RealKey) })
	return out
}

// WalkRealServers implements Interface: the real servers of vs in
// ListRealServers' order, none when vs does not exist. fn runs without
// the Fake's lock held.
func (f *Fake) WalkRealServers(vs ServiceKey, reset func(), fn func(RealServer) error) error {
	f.mu.Lock()
	err := f.begin(Call{Verb: verbWalkRealServers, Service: vs}, "")
	if err == nil {
		if verr := validateService(vs); verr != nil {
			err = opError(verbWalkRealServers, vs, RealKey{}, "", verr)
		}
	}
	if err != nil {
		f.mu.Unlock()
		return err
	}
	items, interrupted := f.sortedRealsLocked(vs), f.takeInterrupt()
	f.mu.Unlock()
	var ierr error // made only when used: a pass walks every virtual server
	if interrupted {
		ierr = opError(verbWalkRealServers, vs, RealKey{}, "", ErrDumpInterrupted)
	}
	return fakeWalk(items, RealServer{RealKey: GhostReal, Weight: 1}, interrupted, reset, fn, ierr)
}

// AddRealServer adds rs to vs; IsExist(err) if rs is there already,
// IsNotExist(err) if vs is not.
func (f *Fake) AddRealServer(vs ServiceKey, rs RealServer) error {
	return f.putReal(verbAddRealServer, vs, rs)
}

// UpdateRealServer sets the weight of an existing rs, keeping its
// connection counts; IsNotExist(err) if rs or vs is not there.
func (f *Fake) UpdateRealServer(vs ServiceKey, rs RealServer) error {
	return f.putReal(verbUpdateRealServer, vs, rs)
}

// AddRealServers implements Interface: AddRealServer for each of reals
// in turn, with its errors, counted as the Handle's sends (see Fake).
func (f *Fake) AddRealServers(vs ServiceKey, reals []RealServer) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	b := fakeBatch{f: f, verb: VerbAddRealServers, service: vs}
	for i, rs := range reals {
		if err := b.addReal(vs, rs); err != nil {
			if errs == nil {
				errs = make([]error, len(reals))
			}
			errs[i] = err
		}
	}
	return errs
}

// AddServices implements Interface: AddVirtualServer (unless Existing)
// then AddRealServers for each add, counted as the Handle's sends (see
// Fake).
func (f *Fake) AddServices(adds []ServiceAdd) []ServiceAddErrors {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []ServiceAddErrors
	fail := func(i int) *ServiceAddErrors {
		if errs == nil {
			errs = make([]ServiceAddErrors, len(adds))
		}
		return &errs[i]
	}
	b := fakeBatch{f: f, verb: VerbAddServices}
	for i, a := range adds {
		switch {
		case a.Existing: // only its real servers are sent
		case validateVirtualServer(a.VS) != nil:
			fail(i).VS = f.putServiceLocked(verbAddVirtualServer, a.VS) // the Handle sends nothing of it
			continue
		default:
			if err := b.addService(a.VS); err != nil {
				fail(i).VS = err
			}
		}
		for j, rs := range a.Reals {
			if err := b.addReal(a.VS.ServiceKey, rs); err != nil {
				e := fail(i)
				if e.Reals == nil {
					e.Reals = make([]error, len(a.Reals))
				}
				e.Reals[j] = err
			}
		}
	}
	return errs
}

// fakeBatch is one batched call's messages: counted, checked for faults
// and applied as the Handle sends them. A send is counted (as verb) for
// each nlconn.MaxPipelined valid messages; a fault on a send fails all
// its messages, and each message is checked as its own call, Batched.
type fakeBatch struct {
	f       *Fake
	verb    string
	service ServiceKey // the Call's service for a send's fault matcher
	sent    int
	sendErr error
}

// send counts a message the Handle would send (a valid one) and returns
// its send's fault, if any.
func (b *fakeBatch) send() error {
	if b.sent%nlconn.MaxPipelined == 0 {
		b.f.Inc(b.verb)
		b.sendErr = b.f.Check(b.verb, Call{Verb: b.verb, Service: b.service})
	}
	b.sent++
	return b.sendErr
}

func (b *fakeBatch) addService(vs VirtualServer) error {
	c := Call{Verb: verbAddVirtualServer, Service: vs.ServiceKey, Batched: true}
	if err := cmp.Or(b.send(), b.f.Check(c.Verb, c)); err != nil {
		return opError(c.Verb, vs.ServiceKey, RealKey{}, vs.Scheduler, err)
	}
	return b.f.putServiceLocked(c.Verb, vs)
}

func (b *fakeBatch) addReal(vs ServiceKey, rs RealServer) error {
	c := Call{Verb: verbAddRealServer, Service: vs, Real: rs.RealKey, Batched: true}
	err := b.f.Check(c.Verb, c)
	if validateReal(vs, rs) == nil { // the Handle sends only these
		err = cmp.Or(b.send(), err)
	}
	if err != nil {
		return opError(c.Verb, vs, rs.RealKey, "", err)
	}
	return b.f.putRealLocked(c.Verb, vs, rs)
}

func (f *Fake) putReal(verb string, vs ServiceKey, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verb, Service: vs, Real: rs.RealKey}, ""); err != nil {
		return err
	}
	return f.putRealLocked(verb, vs, rs)
}

// putRealLocked is putReal after the call was counted and checked for
// faults; the caller holds f.mu.
func (f *Fake) putRealLocked(verb string, vs ServiceKey, rs RealServer) error {
	if err := validateReal(vs, rs); err != nil {
		return opError(verb, vs, rs.RealKey, "", err)
	}
	s := f.services[vs]
	if s == nil {
		return opError(verb, vs, rs.RealKey, "", syscall.ESRCH)
	}
	old, exists := s.reals[rs.RealKey]
	switch {
	case verb == verbAddRealServer && exists:
		return opError(verb, vs, rs.RealKey, "", syscall.EEXIST)
	case verb == verbUpdateRealServer && !exists:
		return opError(verb, vs, rs.RealKey, "", syscall.ENOENT)
	}
	// Connection counts are the kernel's, never written by a caller.
	rs.ActiveConns, rs.InactiveConns = old.ActiveConns, old.InactiveConns
	s.reals[rs.RealKey] = rs
	return nil
}

// DeleteRealServer removes rs from vs; IsNotExist(err) if rs or vs is not
// there.
func (f *Fake) DeleteRealServer(vs ServiceKey, rs RealKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verbDeleteRealServer, Service: vs, Real: rs}, ""); err != nil {
		return err
	}
	if err := validateRealKey(vs, rs); err != nil {
		return opError(verbDeleteRealServer, vs, rs, "", err)
	}
	s := f.services[vs]
	if s == nil {
		return opError(verbDeleteRealServer, vs, rs, "", syscall.ESRCH)
	}
	if _, ok := s.reals[rs]; !ok {
		return opError(verbDeleteRealServer, vs, rs, "", syscall.ENOENT)
	}
	delete(s.reals, rs)
	return nil
}

// GetTimeouts returns the timeouts; a new Fake has the kernel's defaults.
func (f *Fake) GetTimeouts() (Timeouts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verbGetTimeouts}, ""); err != nil {
		return Timeouts{}, err
	}
	return f.timeouts, nil
}

// SetTimeouts sets the non-zero fields, rounded up to whole seconds as the
// kernel stores them.
func (f *Fake) SetTimeouts(t Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(Call{Verb: verbSetTimeouts}, ""); err != nil {
		return err
	}
	c, err := secondsTimeouts(t)
	if err != nil {
		return opError(verbSetTimeouts, ServiceKey{}, RealKey{}, "", err)
	}
	for _, p := range []struct{ dst, src *time.Duration }{
		{&f.timeouts.TCP, &c.TCP}, {&f.timeouts.TCPFin, &c.TCPFin}, {&f.timeouts.UDP, &c.UDP},
	} {
		if *p.src != 0 {
			*p.dst = *p.src
		}
	}
	return nil
}

// SetConns sets the connection counters of a real server, as traffic would
// in the kernel, for graceful-termination tests. It is not counted and not
// subject to fault injection; it returns an IsNotExist error when vs or
// rs does not exist.
func (f *Fake) SetConns(vs ServiceKey, rs RealKey, active, inactive uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.services[vs]
	if s == nil {
		return opError(verbUpdateRealServer, vs, rs, "", syscall.ESRCH)
	}
	r, ok := s.reals[rs]
	if !ok {
		return opError(verbUpdateRealServer, vs, rs, "", syscall.ENOENT)
	}
	r.ActiveConns, r.InactiveConns = active, inactive
	s.reals[rs] = r
	return nil
}

// SetStats sets the counters of a virtual server, as traffic would in the
// kernel. Like SetConns it is neither counted nor subject to faults.
func (f *Fake) SetStats(vs ServiceKey, st Stats) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.services[vs]
	if s == nil {
		return opError(verbUpdateVirtualServer, vs, RealKey{}, "", syscall.ESRCH)
	}
	s.vs.Stats = st
	return nil
}
