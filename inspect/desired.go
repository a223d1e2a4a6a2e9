package inspect

import (
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// Desired is the union of what every service wants, as the engine would
// program it.
type Desired struct {
	// VirtualServers are sorted as ipvsadm lists them. A virtual server two
	// services want belongs to the first by key, as in the engine.
	VirtualServers []sync.VirtualServerState
	Owner          map[ipvs.ServiceKey]string // virtual server → "namespace/name"
	Addresses      []netip.Addr               // sorted, unique
	Entries        []owned.SetEntry           // sorted, unique
	Problems       map[string][]string        // per service key, from the builder
}

// Wants reports whether some service wants the virtual server k.
func (d *Desired) Wants(k ipvs.ServiceKey) bool {
	_, ok := d.Owner[k]
	return ok
}

// BuildDesired runs the engine's pure builder (sync.Build) for every
// service with the slices that belong to it (the kubernetes.io/service-name
// label, as the tracker groups them) and merges the results.
func BuildDesired(svcs []*v1.Service, eps []*discovery.EndpointSlice, cfg *sync.Config) *Desired {
	bySvc := map[string][]*sync.ProxySlice{}
	for _, s := range eps {
		if name := s.Labels[discovery.LabelServiceName]; name != "" {
			k := s.Namespace + "/" + name
			bySvc[k] = append(bySvc[k], sync.NewProxySlice(s))
		}
	}
	sorted := slices.Clone(svcs)
	slices.SortFunc(sorted, func(a, b *v1.Service) int { return strings.Compare(key(a), key(b)) })
	d := &Desired{Owner: map[ipvs.ServiceKey]string{}, Problems: map[string][]string{}}
	for _, svc := range sorted {
		k := key(svc)
		b := sync.Build(svc, bySvc[k], cfg)
		if len(b.Problems) > 0 {
			d.Problems[k] = b.Problems
		}
		for _, v := range b.State.VirtualServers {
			if _, taken := d.Owner[v.VS.ServiceKey]; taken {
				continue // the engine refuses it to the second service too
			}
			d.Owner[v.VS.ServiceKey] = k
			d.VirtualServers = append(d.VirtualServers, v)
		}
		d.Addresses = append(d.Addresses, b.State.Addresses...)
		d.Entries = append(d.Entries, b.State.Entries...)
	}
	slices.SortFunc(d.VirtualServers, func(a, b sync.VirtualServerState) int {
		return ipvs.CompareServiceKeys(a.VS.ServiceKey, b.VS.ServiceKey)
	})
	slices.SortFunc(d.Addresses, netip.Addr.Compare)
	d.Addresses = slices.Compact(d.Addresses)
	slices.SortFunc(d.Entries, owned.CompareSetEntries)
	d.Entries = slices.Compact(d.Entries)
	return d
}

func key(s *v1.Service) string { return s.Namespace + "/" + s.Name }
