//go:build e2e

package main

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// nftView reads kube-proxy's nftables mode (v1.37.2) from the kernel over
// netlink: its table "ip kube-proxy", the maps that admit a ClusterIP or
// NodePort ("service-ips": ip . proto . port → goto chain,
// "service-nodeports": proto . port → goto chain) and each service port's
// chain, whose one rule DNATs to `numgen random mod N map { i : ip . port }`
// (an anonymous map: the backends). What it reads is what `nft list table
// ip kube-proxy` prints; the layout is kube-proxy's own, pinned by the
// version the benchmark builds.
type nftView struct {
	w     *workload
	conn  *nftables.Conn
	table *nftables.Table
	// settled holds the services found complete during the initial
	// programming: kube-proxy writes the whole table in one transaction,
	// so one look at each suffices there.
	settled map[*benchSvc]int
}

const (
	nftTable         = "kube-proxy"
	nftServiceIPs    = "service-ips"
	nftNodePortsMap  = "service-nodeports"
	protoTCP         = 6
	nftRegisterBytes = 4 // each field of a concatenation fills whole 32-bit registers
)

func newNFTView(w *workload) (kernelView, error) {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, err
	}
	return &nftView{w: w, conn: c, table: &nftables.Table{Name: nftTable, Family: nftables.TableFamilyIPv4},
		settled: map[*benchSvc]int{}}, nil
}

// serviceChain is the name kube-proxy gives a service port's chain:
// "service-" + the first 8 base32 characters of the SHA-256 of
// "namespace/name/protocol/port-name", "-", that string.
func serviceChain(s *benchSvc) string {
	base := benchNS + "/" + s.name + "/tcp/http"
	return "service-" + hashPrefix(base) + "-" + base
}

func hashPrefix(name string) string {
	sum := sha256.Sum256([]byte(name))
	return base32.StdEncoding.EncodeToString(sum[:])[:8]
}

// absent reports whether err is the kernel's ENOENT: the table, chain or
// set does not exist (yet). google/nftables formats the errno into its
// error instead of wrapping it.
func absent(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such file or directory")
}

func (v *nftView) elements(set string) ([]nftables.SetElement, error) {
	els, err := v.conn.GetSetElements(&nftables.Set{Table: v.table, Name: set})
	if absent(err) {
		return nil, nil
	}
	return els, err
}

// admitted reads the two maps: the ClusterIPs (TCP, the service port)
// and the TCP node ports that have a service chain behind them.
func (v *nftView) admitted() (clusterIPs map[string]bool, nodePorts map[int]bool, err error) {
	ips, err := v.elements(nftServiceIPs)
	if err != nil {
		return nil, nil, err
	}
	clusterIPs = make(map[string]bool, len(ips))
	for _, e := range ips {
		// ipv4_addr . inet_proto . inet_service
		if len(e.Key) >= 3*nftRegisterBytes && e.Key[4] == protoTCP &&
			binary.BigEndian.Uint16(e.Key[8:10]) == servicePort {
			clusterIPs[net.IP(e.Key[:4]).String()] = true
		}
	}
	ports, err := v.elements(nftNodePortsMap)
	if err != nil {
		return nil, nil, err
	}
	nodePorts = make(map[int]bool, len(ports))
	for _, e := range ports {
		// inet_proto . inet_service
		if len(e.Key) >= 2*nftRegisterBytes && e.Key[0] == protoTCP {
			nodePorts[int(binary.BigEndian.Uint16(e.Key[4:6]))] = true
		}
	}
	return clusterIPs, nodePorts, nil
}

// progress: a frontend is done when its map element is present and the
// service chain behind it DNATs to exactly the service's endpoints.
//
// kube-proxy writes the table in one transaction, so the maps are full
// exactly when everything is there: the chains are looked at (two dumps
// per service, seconds at 10k) only once the maps hold every frontend,
// and a look that then finds every chain complete dates the kernel's
// completion to its own start (when the full maps were read), not to its
// end — the poll's cost is not charged to the proxy.
func (v *nftView) progress() (progress, error) {
	readAt := time.Now()
	clusterIPs, nodePorts, err := v.admitted()
	if err != nil {
		return progress{}, err
	}
	p := progress{frontends: len(clusterIPs) + len(nodePorts)}
	if p.frontends < len(v.w.svcs)+v.w.nodePorts() {
		p.want = len(v.w.svcs) + v.w.nodePorts()
		return p, nil
	}
	for _, s := range v.w.svcs {
		p.want++
		if s.nodePort != 0 {
			p.want++
		}
		if !clusterIPs[s.clusterIP] || (s.nodePort != 0 && !nodePorts[int(s.nodePort)]) {
			continue
		}
		n, ok := v.settled[s]
		if !ok {
			got, err := v.backends(s)
			if err != nil || !sameBackends(got, s.wantBackends()) {
				continue
			}
			n = len(got)
			v.settled[s] = n
		}
		p.backends += n
		p.done++
		if s.nodePort != 0 {
			p.done++
		}
	}
	p.complete = p.done == p.want
	if p.complete {
		p.completeAt = readAt
	}
	return p, nil
}

// backends reads the service chain's rules (one dump of that chain) and
// the anonymous map its DNAT rule looks up (one dump of that map).
func (v *nftView) backends(s *benchSvc) (map[string]bool, error) {
	rules, err := v.conn.GetRules(v.table, &nftables.Chain{Name: serviceChain(s), Table: v.table})
	if absent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range rules {
		for _, e := range r.Exprs {
			l, ok := e.(*expr.Lookup)
			if !ok || !l.IsDestRegSet {
				continue
			}
			els, err := v.conn.GetSetElements(&nftables.Set{Table: v.table, Name: l.SetName, ID: l.SetID})
			if err != nil {
				// The chain was rewritten between the two dumps (a sync
				// replaces the map): look again later.
				return nil, fmt.Errorf("map %s of %s: %w", l.SetName, serviceChain(s), err)
			}
			for _, el := range els {
				// ipv4_addr . inet_service
				if len(el.Val) >= 2*nftRegisterBytes {
					out[net.JoinHostPort(net.IP(el.Val[:4]).String(),
						strconv.Itoa(int(binary.BigEndian.Uint16(el.Val[4:6]))))] = true
				}
			}
		}
	}
	return out, nil
}

// withdrawn: the ClusterIP's element is gone from service-ips (kube-proxy
// deletes a removed service's chain only later, once it is stale).
func (v *nftView) withdrawn(s *benchSvc) (bool, error) {
	clusterIPs, _, err := v.admitted()
	if err != nil {
		return false, err
	}
	return !clusterIPs[s.clusterIP], nil
}

func (v *nftView) close() { _ = v.conn.CloseLasting() }
