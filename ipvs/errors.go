package ipvs

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// ErrDumpInterrupted is wrapped by a walk's error when the kernel's dump
// could not be read consistently (see Interface).
var ErrDumpInterrupted = nlconn.ErrDumpInterrupted

// ErrUnavailable is returned by New when the running kernel has no IPVS.
// It is one line an operator can act on, instead of a netlink errno.
var ErrUnavailable = errors.New("IPVS is not available in this kernel: load the ip_vs module (modprobe ip_vs)")

// errKind classifies a failed operation the way the engine needs it:
// "already there" and "not there" are answers it acts on, anything else is
// a failure to retry.
type errKind uint8

const (
	kindOther errKind = iota
	kindExist
	kindNotExist
	kindNoScheduler
)

// OpError is a failed IPVS operation: what was being done and why it failed.
// Err is the cause (for kernel failures a syscall.Errno), so errors.Is(err,
// syscall.EEXIST) works as well as IsExist.
type OpError struct {
	Op  string // e.g. "add real server 10.244.1.5:80 to tcp 10.96.0.1:80"
	Err error
	// reason, when set, replaces Err's text with ipvsadm's wording, which
	// operators know better than errno names ("no such process" for ESRCH
	// means nothing to anyone).
	reason string
	kind   errKind
	sched  string // the missing scheduler, with kindNoScheduler
}

func (e *OpError) Error() string {
	if e.reason != "" {
		return e.Op + ": " + e.reason
	}
	return e.Op + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// IsExist reports whether err says the virtual or real server being added
// already exists (EEXIST from the kernel).
func IsExist(err error) bool {
	var oe *OpError
	if errors.As(err, &oe) {
		return oe.kind == kindExist
	}
	return errors.Is(err, syscall.EEXIST)
}

// IsNotExist reports whether err says the virtual or real server operated
// on does not exist: ESRCH (no such service) or ENOENT (no such
// destination). ENOENT from adding or updating a virtual server means the
// scheduler module is missing, and is deliberately not reported as
// "does not exist": retrying an add after that will not help.
func IsNotExist(err error) bool {
	var oe *OpError
	if errors.As(err, &oe) {
		return oe.kind == kindNotExist
	}
	return errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT)
}

// MissingScheduler reports the scheduler named in err when err says the
// kernel refused a virtual server because that scheduler's module is not
// loaded (ENOENT from adding or updating a virtual server).
func MissingScheduler(err error) (string, bool) {
	var oe *OpError
	if errors.As(err, &oe) && oe.kind == kindNoScheduler {
		return oe.sched, true
	}
	return "", false
}

// The verbs, named after the Interface methods. They label errors, the
// Fake's counters and its fault injection.
const (
	verbListVirtualServers  = "ListVirtualServers"
	verbAddVirtualServer    = "AddVirtualServer"
	verbUpdateVirtualServer = "UpdateVirtualServer"
	verbDeleteVirtualServer = "DeleteVirtualServer"
	verbListRealServers     = "ListRealServers"
	verbWalkVirtualServers  = "WalkVirtualServers"
	verbWalkRealServers     = "WalkRealServers"
	verbAddRealServer       = "AddRealServer"
	// VerbAddRealServers counts the Fake's batched sends (AddRealServers),
	// one per nlconn.MaxPipelined real servers sent, as the Handle's.
	VerbAddRealServers = "AddRealServers"
	// VerbAddServices counts the Fake's AddServices sends, one per
	// nlconn.MaxPipelined messages, as the Handle's.
	VerbAddServices      = "AddServices"
	verbUpdateRealServer = "UpdateRealServer"
	verbDeleteRealServer = "DeleteRealServer"
	verbGetTimeouts      = "GetTimeouts"
	verbSetTimeouts      = "SetTimeouts"
)

var verbs = map[string]bool{
	verbListVirtualServers: true, verbAddVirtualServer: true, verbUpdateVirtualServer: true,
	verbDeleteVirtualServer: true, verbListRealServers: true, verbAddRealServer: true, VerbAddRealServers: true, VerbAddServices: true,
	verbUpdateRealServer: true, verbDeleteRealServer: true, verbGetTimeouts: true,
	verbSetTimeouts: true, verbWalkVirtualServers: true, verbWalkRealServers: true,
}

// opText describes an operation for an error message.
func opText(verb string, vs ServiceKey, rs RealKey) string {
	switch verb {
	case verbListVirtualServers, verbWalkVirtualServers:
		return "list virtual servers"
	case verbAddVirtualServer:
		return "add virtual server " + vs.String()
	case verbUpdateVirtualServer:
		return "update virtual server " + vs.String()
	case verbDeleteVirtualServer:
		return "delete virtual server " + vs.String()
	case verbListRealServers, verbWalkRealServers:
		return "list real servers of " + vs.String()
	case verbAddRealServer:
		return fmt.Sprintf("add real server %s to %s", rs, vs)
	case verbUpdateRealServer:
		return fmt.Sprintf("update real server %s of %s", rs, vs)
	case verbDeleteRealServer:
		return fmt.Sprintf("delete real server %s from %s", rs, vs)
	case verbGetTimeouts:
		return "get IPVS timeouts"
	case verbSetTimeouts:
		return "set IPVS timeouts"
	}
	return verb
}

// opError wraps err, the cause of a failed verb, classifying kernel errnos
// the way the kernel means them for that verb (see IsNotExist) and using
// ipvsadm's wording for the common ones. sched names the scheduler for
// the virtual-server verbs, where ENOENT means it is not loaded.
func opError(verb string, vs ServiceKey, rs RealKey, sched string, err error) error {
	if err == nil {
		return nil
	}
	e := &OpError{Op: opText(verb, vs, rs), Err: err}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return e
	}
	isVSVerb := verb == verbAddVirtualServer || verb == verbUpdateVirtualServer
	switch {
	case errno == syscall.EEXIST:
		e.kind = kindExist
		e.reason = "service already exists"
		if rs.Address.IsValid() {
			e.reason = "destination already exists"
		}
	case errno == syscall.ESRCH:
		e.kind = kindNotExist
		e.reason = "no such service"
	case errno == syscall.ENOENT && isVSVerb:
		e.kind, e.sched = kindNoScheduler, sched
		e.reason = fmt.Sprintf("scheduler %q not found (is the ip_vs_%s module loaded?)", sched, sched)
	case errno == syscall.ENOENT:
		e.kind = kindNotExist
		e.reason = "no such destination"
	}
	return e
}
