package app

import (
	"slices"
	gosync "sync"
	"time"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// serviceIndex answers "which Service wants this virtual server?" for the
// per-service traffic metrics. It is rebuilt from the tracker with the
// engine's own builder (without endpoints: only the virtual servers'
// keys matter) at most once per period, on demand, so the sync path
// pays nothing for it and a scrape pays at most one pass over the
// services.
type serviceIndex struct {
	tracker *sync.Tracker
	config  func() sync.Config // the builder's config with the node's current facts
	period  time.Duration
	now     func() time.Time

	mu    gosync.Mutex
	at    time.Time
	owner map[ipvs.ServiceKey][2]string
}

func newServiceIndex(t *sync.Tracker, config func() sync.Config) *serviceIndex {
	return &serviceIndex{tracker: t, config: config, period: 10 * time.Second, now: time.Now}
}

// Lookup is an ipvsstats.Lookup.
func (x *serviceIndex) Lookup(k ipvs.ServiceKey) (namespace, name string, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if now := x.now(); x.owner == nil || now.Sub(x.at) >= x.period {
		x.rebuild()
		x.at = now
	}
	o, ok := x.owner[k]
	return o[0], o[1], ok
}

// rebuild walks the services in key order: a virtual server two services
// want is the first one's, as in the engine.
func (x *serviceIndex) rebuild() {
	cfg := x.config()
	owner := map[ipvs.ServiceKey][2]string{}
	keys := x.tracker.Keys()
	slices.Sort(keys)
	for _, key := range keys {
		svc, _ := x.tracker.Get(key)
		if svc == nil {
			continue
		}
		b := sync.Build(svc, nil, &cfg)
		for _, v := range b.State.VirtualServers {
			if _, taken := owner[v.VS.ServiceKey]; !taken {
				owner[v.VS.ServiceKey] = [2]string{svc.Namespace, svc.Name}
			}
		}
	}
	x.owner = owner
}
