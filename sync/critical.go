package sync

import (
	"fmt"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// KubernetesService is the API server's own Service. It is always
// critical: every pod that talks to the API server through its ClusterIP,
// kubelet's in-cluster clients included, waits for it on a new node.
const KubernetesService = "default/kubernetes"

// DefaultCriticalServices is --critical-services' default: cluster DNS by
// its kubeadm name and by the label every common DNS add-on carries.
var DefaultCriticalServices = []string{"kube-system/kube-dns", "k8s-app=kube-dns"}

// CriticalServices says which services are programmed before the others
// while the node starts (see keyQueue): KubernetesService, the services
// named NAMESPACE/NAME, and the services in any namespace carrying one of
// the labels LABEL=VALUE. The zero value holds KubernetesService only.
type CriticalServices struct {
	names  map[string]bool
	labels []labelTerm
}

// labelTerm is one LABEL=VALUE entry.
type labelTerm struct{ key, value string }

// ParseCriticalServices reads the entries of --critical-services: each
// NAMESPACE/NAME or LABEL=VALUE (a name cannot hold "=", so the two forms
// never overlap); empty entries are skipped. An error is one line naming
// the entry.
func ParseCriticalServices(entries []string) (CriticalServices, error) {
	var c CriticalServices
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if key, value, ok := strings.Cut(e, "="); ok {
			if err := checkLabel(key, value); err != nil {
				return CriticalServices{}, fmt.Errorf("%q: %s", e, err)
			}
			c.labels = append(c.labels, labelTerm{key, value})
			continue
		}
		ns, name, ok := strings.Cut(e, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Label(name)) > 0 {
			return CriticalServices{}, fmt.Errorf("%q: want NAMESPACE/NAME (a Service) or LABEL=VALUE (the Services with that label)", e)
		}
		if c.names == nil {
			c.names = map[string]bool{}
		}
		c.names[e] = true
	}
	return c, nil
}

func checkLabel(key, value string) error {
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return fmt.Errorf("label %q: %s", key, errs[0])
	}
	if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
		return fmt.Errorf("label value %q: %s", value, errs[0])
	}
	return nil
}

// Named reports whether key ("namespace/name") is critical by its name.
func (c CriticalServices) Named(key string) bool {
	return key == KubernetesService || c.names[key]
}

// Has reports whether the service key is critical; svc returns its
// Service (nil when not known yet) and is called only when a label could
// decide.
func (c CriticalServices) Has(key string, svc func() *v1.Service) bool {
	if c.Named(key) {
		return true
	}
	if len(c.labels) == 0 {
		return false
	}
	s := svc()
	return s != nil && c.labelled(s.Labels)
}

func (c CriticalServices) labelled(labels map[string]string) bool {
	for _, t := range c.labels {
		if v, ok := labels[t.key]; ok && v == t.value {
			return true
		}
	}
	return false
}

// keepLabels returns the labels of a Service that the terms match (nil
// when none): the informer's transform drops every other label, so only
// critical Services keep one.
func (c CriticalServices) keepLabels(labels map[string]string) map[string]string {
	var kept map[string]string
	for _, t := range c.labels {
		if v, ok := labels[t.key]; ok && v == t.value {
			if kept == nil {
				kept = make(map[string]string, 1)
			}
			kept[t.key] = v
		}
	}
	return kept
}

// criticalProgress follows the critical services while the node starts,
// until every one the informers' initial lists hold is programmed: it
// tells that moment once (Runner.reportCritical). A critical key is
// pending from each change until a sync that began after the change
// succeeds; the numbers tell a sync that raced a newer change from one
// that did not.
type criticalProgress struct {
	active  atomic.Bool // until the moment is told; afterwards nothing is followed
	mu      gosync.Mutex
	pending map[string]uint64    // key → the number of its latest change
	since   map[string]time.Time // key → when it became pending (logged: how long it waited)
	last    uint64
	seen    map[string]bool // the critical keys programmed so far
}

func newCriticalProgress() *criticalProgress {
	p := &criticalProgress{pending: map[string]uint64{}, since: map[string]time.Time{}, seen: map[string]bool{}}
	p.active.Store(true)
	return p
}

// following reports whether critical keys are still followed (until
// finish told the moment): callers skip telling it otherwise.
func (p *criticalProgress) following() bool { return p.active.Load() }

// changed notes a change to a critical key, made at now.
func (p *criticalProgress) changed(key string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		return // told already
	}
	p.last++
	if _, ok := p.pending[key]; !ok {
		p.since[key] = now
	}
	p.pending[key] = p.last
}

// syncing returns the number of key's latest change, before its sync
// reads the tracker (0 when key is not pending).
func (p *criticalProgress) syncing(key string) uint64 {
	if !p.following() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending[key]
}

// synced notes that key's sync that began at change n succeeded, and
// returns since when key had been pending (zero when it still is: a newer
// change came meanwhile).
func (p *criticalProgress) synced(key string, n uint64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending[key] != n {
		return time.Time{}
	}
	since := p.since[key]
	delete(p.pending, key)
	delete(p.since, key)
	p.seen[key] = true
	return since
}

// finish reports, once, that nothing critical is pending once listed
// (the informers' handlers have had their initial lists), and how many
// critical services were programmed.
func (p *criticalProgress) finish(listed bool) (int, bool) {
	if !listed || !p.following() {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) > 0 || !p.active.CompareAndSwap(true, false) {
		return 0, false
	}
	n := len(p.seen)
	p.pending, p.since, p.seen = nil, nil, nil
	return n, true
}
