package sync

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// ReasonSyncFailed is the reason of the Warning Event on a Service whose
// kernel objects could not be written.
const ReasonSyncFailed = "IPVSProxySyncFailed"

// maxEventMessage bounds a Warning's message: a Service with thousands of
// refused real servers must not post a megabyte-long Event.
const maxEventMessage = 1000

// noteServiceFailures keeps the record of the services whose sync fails.
// A service enters it with a Warning Event, gets another only when its
// error changes (its retries, every 0.5 s to 2 min, post nothing: a
// permanent failure must not flood the API server), and leaves it when a
// sync of it succeeds. Every failed key is queued again, so a failing key
// is always synced again and so always leaves the record in the end.
func (r *Runner) noteServiceFailures(keys []string, failed map[string]error) {
	for _, k := range keys {
		if failed[k] == nil {
			delete(r.failing, k)
		}
	}
	for k, err := range failed {
		r.warnSyncFailed(k, err)
	}
	r.metrics.servicesFailing(len(r.failing))
}

func (r *Runner) warnSyncFailed(key string, err error) {
	// A conflict names the Service that holds the virtual server, maybe
	// another tenant's: reportConflicts words it without the name.
	if err = dropConflicts(err); err == nil {
		delete(r.failing, key)
		return
	}
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	if len(msg) > maxEventMessage {
		msg = fmt.Sprintf("%s… (%d more bytes)", msg[:maxEventMessage], len(msg)-maxEventMessage)
	}
	if r.failing[key] == msg {
		return
	}
	r.failing[key] = msg
	if _, ok := ipvs.MissingScheduler(err); ok {
		return // its retry falls back to the default scheduler, with a Warning of its own
	}
	svc, _ := r.tracker.Get(key)
	if svc == nil || r.cfg.Events == nil {
		return // being deleted: nobody to tell
	}
	r.cfg.Events.Warning(svc, ReasonSyncFailed, "programming this Service failed; retrying with backoff: "+msg)
}

// dropConflicts returns err without its ConflictErrors (nil if nothing
// else is left).
func dropConflicts(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if errors.Is(err, ErrConflict) {
			return nil
		}
		return err
	}
	var rest []error
	for _, e := range joined.Unwrap() {
		if e = dropConflicts(e); e != nil {
			rest = append(rest, e)
		}
	}
	return errors.Join(rest...)
}

// reportConflicts tells each service that wants a virtual server another
// one programs, once per distinct set of conflicts, in a Warning Event.
// The owner is only logged: it may be another tenant's Service. A key is
// told again after a sync that had no conflict.
func (r *Runner) reportConflicts(failed map[string]error) {
	for k := range r.conflicts {
		if !errors.Is(failed[k], ErrConflict) {
			delete(r.conflicts, k)
		}
	}
	for k, err := range failed {
		msg := strings.Join(conflictMessages(err), "; ")
		if msg == "" || r.conflicts[k] == msg {
			continue
		}
		r.conflicts[k] = msg
		if svc, _ := r.tracker.Get(k); svc != nil && r.cfg.Events != nil {
			r.cfg.Events.Warning(svc, "IPVSProxyConflict", msg)
		}
	}
}

// conflictMessages words each ConflictError in err for the loser's owner.
func conflictMessages(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case *ConflictError:
			out = append(out, fmt.Sprintf("virtual server %s is already programmed for another Service; nothing is written for it until that Service releases it", x.VS))
		case interface{ Unwrap() []error }:
			for _, y := range x.Unwrap() {
				walk(y)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	slices.Sort(out)
	return slices.Compact(out)
}
