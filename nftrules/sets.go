package nftrules

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// field is one part of a set's key, read from an ipset.Entry.
type field int

const (
	fieldIP    field = iota // Entry.IP: ipv4_addr or ipv6_addr
	fieldProto              // Entry.Protocol (or the set's fixed protocol): inet_proto
	fieldPort               // Entry.Port: inet_service
	fieldIP2                // Entry.IP2: ipv4_addr or ipv6_addr
	fieldNet                // Entry.Net: an address interval (flags interval)
)

// size is the field's size in a key. In a concatenation every field is
// padded to the kernel's 32-bit registers; a key of one field is its
// value alone (an inet_service set has 2-byte keys).
func (f field) size(v6, concat bool) int {
	switch {
	case f == fieldProto && !concat:
		return 1
	case f == fieldPort && !concat:
		return 2
	case f == fieldProto || f == fieldPort:
		return 4
	case v6:
		return 16
	}
	return 4
}

// typeName is the field's nft data type, as `nft list` prints it.
func (f field) typeName(v6 bool) string {
	switch f {
	case fieldProto:
		return "inet_proto"
	case fieldPort:
		return "inet_service"
	}
	if v6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// mapping is one of kube-proxy's ipsets and the nft set that replaces it.
type mapping struct {
	ipset string  // owned base name, e.g. owned.SetClusterIP
	nft   string  // nft set base name; the family suffix is added
	key   []field // key layout
	// proto is the protocol a bitmap:port ipset implies by its name
	// (KUBE-NODE-PORT-TCP): the TCP and UDP bitmaps share one nft set
	// keyed by protocol and port.
	proto string
}

var (
	keyIP        = []field{fieldIP}
	keyIPPort    = []field{fieldIP, fieldProto, fieldPort}
	keyIPPortIP  = []field{fieldIP, fieldProto, fieldPort, fieldIP2}
	keyIPPortNet = []field{fieldIP, fieldProto, fieldPort, fieldNet}
	keyProtoPort = []field{fieldProto, fieldPort}
	keyPort      = []field{fieldPort}
)

// mappings maps every ipset of owned.Sets to an nft set. Each family has
// its own nft sets (suffix -v4/-v6), as each has its own ipsets: the
// engine counts references per ipset name, so two ipsets must never
// share one nft element.
//
//	ipset (KUBE-6-… for IPv6)        nft set (-v4 / -v6)           key
//	KUBE-LOOP-BACK                   loop-back                     addr . inet_proto . inet_service . addr
//	KUBE-CLUSTER-IP                  cluster-ip                    addr . inet_proto . inet_service
//	KUBE-EXTERNAL-IP                 external-ip                   addr . inet_proto . inet_service
//	KUBE-EXTERNAL-IP-LOCAL           external-ip-local             addr . inet_proto . inet_service
//	KUBE-LOAD-BALANCER               load-balancer                 addr . inet_proto . inet_service
//	KUBE-LOAD-BALANCER-LOCAL         load-balancer-local           addr . inet_proto . inet_service
//	KUBE-LOAD-BALANCER-FW            load-balancer-fw              addr . inet_proto . inet_service
//	KUBE-LOAD-BALANCER-SOURCE-IP     load-balancer-source-ip       addr . inet_proto . inet_service . addr
//	KUBE-LOAD-BALANCER-SOURCE-CIDR   load-balancer-source-cidr     addr . inet_proto . inet_service . addr, flags interval
//	KUBE-NODE-PORT-TCP, -UDP         node-port                     inet_proto . inet_service
//	KUBE-NODE-PORT-LOCAL-TCP, -UDP   node-port-local               inet_proto . inet_service
//	KUBE-NODE-PORT-SCTP-HASH         node-port-sctp                addr . inet_proto . inet_service
//	KUBE-NODE-PORT-LOCAL-SCTP-HASH   node-port-local-sctp          addr . inet_proto . inet_service
//	KUBE-HEALTH-CHECK-NODE-PORT      health-check-node-port        inet_service
//	KUBE-IPVS-IPS                    ipvs-ips                      addr
//
// addr is ipv4_addr or ipv6_addr. The bitmap:port node-port ipsets carry
// their protocol in their name; in nft the protocol is part of the key,
// so one set and one rule serve TCP and UDP.
var mappings = []mapping{
	{owned.SetLoopBack, "loop-back", keyIPPortIP, ""},
	{owned.SetClusterIP, "cluster-ip", keyIPPort, ""},
	{owned.SetExternalIP, "external-ip", keyIPPort, ""},
	{owned.SetExternalIPLocal, "external-ip-local", keyIPPort, ""},
	{owned.SetLoadBalancer, "load-balancer", keyIPPort, ""},
	{owned.SetLoadBalancerLocal, "load-balancer-local", keyIPPort, ""},
	{owned.SetLoadBalancerFW, "load-balancer-fw", keyIPPort, ""},
	{owned.SetLoadBalancerSrcIP, "load-balancer-source-ip", keyIPPortIP, ""},
	{owned.SetLoadBalancerSrcCIDR, "load-balancer-source-cidr", keyIPPortNet, ""},
	{owned.SetNodePortTCP, "node-port", keyProtoPort, "tcp"},
	{owned.SetNodePortUDP, "node-port", keyProtoPort, "udp"},
	{owned.SetNodePortLocalTCP, "node-port-local", keyProtoPort, "tcp"},
	{owned.SetNodePortLocalUDP, "node-port-local", keyProtoPort, "udp"},
	{owned.SetNodePortSCTP, "node-port-sctp", keyIPPort, ""},
	{owned.SetNodePortLocalSCTP, "node-port-local-sctp", keyIPPort, ""},
	{owned.SetHealthCheckNodePort, "health-check-node-port", keyPort, ""},
	{owned.SetIPVSIPs, "ipvs-ips", keyIP, ""},
}

// SetFor is the nft set of the table that holds the entries of the
// ipset named ipsetName (owned.SetName of an owned set, either family)
// and, for a node-port bitmap, the protocol its elements carry in their
// key (KUBE-NODE-PORT-TCP: "tcp"; the UDP bitmap shares the set), ""
// for every other set. ok is false for a name no nft set stands in for.
// Exported for the benchmark (e2e/cmd/bench), which reads the table's
// sets over netlink itself and must look where this backend writes.
func SetFor(ipsetName string) (set, proto string, ok bool) {
	for _, v6 := range []bool{false, true} {
		for _, m := range mappings {
			if owned.SetName(m.ipset, v6) == ipsetName {
				return setName(m.nft, v6), m.proto, true
			}
		}
	}
	return "", "", false
}

// setSpec is one nft set of the table.
type setSpec struct {
	name string
	v6   bool
	key  []field
}

// setName is an nft set's name for a family.
func setName(base string, v6 bool) string {
	if v6 {
		return base + "-v6"
	}
	return base + "-v4"
}

func (s *setSpec) interval() bool { return s.key[len(s.key)-1] == fieldNet }

// concat reports whether the key has more than one field.
func (s *setSpec) concat() bool { return len(s.key) > 1 }

// keyLen is the key's size in bytes, as the kernel checks it.
func (s *setSpec) keyLen() int {
	n := 0
	for _, f := range s.key {
		n += f.size(s.v6, s.concat())
	}
	return n
}

// typeName is the key's type line, e.g. "ipv4_addr . inet_proto . inet_service".
func (s *setSpec) typeName() string {
	names := make([]string, len(s.key))
	for i, f := range s.key {
		names[i] = f.typeName(s.v6)
	}
	return strings.Join(names, " . ")
}

// setsFor lists the nft sets of the enabled families, in creation order
// (the order `nft list` prints them in).
func setsFor(v4, v6 bool) []*setSpec {
	var out []*setSpec
	for _, fam := range []struct{ on, v6 bool }{{v4, false}, {v6, true}} {
		if !fam.on {
			continue
		}
		seen := map[string]bool{}
		for _, m := range mappings {
			if !seen[m.nft] {
				seen[m.nft] = true
				out = append(out, &setSpec{name: setName(m.nft, fam.v6), v6: fam.v6, key: m.key})
			}
		}
	}
	return out
}

// target is where one ipset's entries go: an nft set and, for the node
// port bitmaps, the protocol their entries lack.
type target struct {
	set   *setSpec
	proto string
}

// targets indexes the nft set of every ipset name (owned.SetName, both
// families) among sets.
func targets(sets []*setSpec) map[string]target {
	byName := map[string]*setSpec{}
	for _, s := range sets {
		byName[s.name] = s
	}
	out := map[string]target{}
	for _, v6 := range []bool{false, true} {
		for _, m := range mappings {
			if s, ok := byName[setName(m.nft, v6)]; ok {
				out[owned.SetName(m.ipset, v6)] = target{s, m.proto}
			}
		}
	}
	return out
}

// element is one set element: its key (and, for an interval, the key of
// its last address) as the kernel stores them, and how nft prints it.
type element struct {
	key, keyEnd []byte
	text        string
}

// protoNumbers are the protocols service entries carry.
var protoNumbers = map[string]byte{"tcp": 6, "udp": 17, "sctp": 132}

// encode turns an ipset entry into t's element. It refuses an entry that
// does not fit the set (an address of the other family, a protocol that
// is not tcp, udp or sctp) before the kernel sees it.
func (t target) encode(e ipset.Entry) (element, error) {
	var key, end []byte
	var words []string
	for _, f := range t.set.key {
		var b, bEnd []byte
		var w string
		var err error
		switch f {
		case fieldIP:
			b, w, err = addrBytes(e.IP, t.set.v6)
		case fieldIP2:
			b, w, err = addrBytes(e.IP2, t.set.v6)
		case fieldNet:
			b, bEnd, w, err = netBytes(e.Net, t.set.v6)
		case fieldProto:
			b, w, err = protoBytes(e.Protocol, t.proto)
		case fieldPort:
			b, w = []byte{byte(e.Port >> 8), byte(e.Port), 0, 0}, strconv.Itoa(int(e.Port))
		}
		if err != nil {
			return element{}, fmt.Errorf("nftrules: set %s: %w", t.set.name, err)
		}
		b = b[:f.size(t.set.v6, t.set.concat())] // drops a lone port's or protocol's padding
		if bEnd == nil {
			bEnd = b
		}
		key, end = append(key, b...), append(end, bEnd...)
		words = append(words, w)
	}
	el := element{key: key, text: strings.Join(words, " . ")}
	if t.set.interval() {
		el.keyEnd = end
	}
	return el, nil
}

func addrBytes(a netip.Addr, v6 bool) ([]byte, string, error) {
	switch {
	case !a.IsValid():
		return nil, "", fmt.Errorf("missing address")
	case a.Is4() == v6 || a.Is4In6():
		return nil, "", fmt.Errorf("address %s of the wrong family", a)
	}
	return a.AsSlice(), a.String(), nil
}

// netBytes returns a prefix's first and last address. nft prints a
// single-address interval as the bare address.
func netBytes(p netip.Prefix, v6 bool) (first, last []byte, text string, err error) {
	if !p.IsValid() {
		return nil, nil, "", fmt.Errorf("missing source CIDR")
	}
	p = p.Masked()
	first, _, err = addrBytes(p.Addr(), v6)
	if err != nil {
		return nil, nil, "", err
	}
	last = bytes.Clone(first)
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	text = p.String()
	if p.IsSingleIP() {
		text = p.Addr().String()
	}
	return first, last, text, nil
}

func protoBytes(proto, fixed string) ([]byte, string, error) {
	if fixed != "" {
		proto = fixed
	}
	n, ok := protoNumbers[proto]
	if !ok {
		return nil, "", fmt.Errorf("protocol %q is not tcp, udp or sctp", proto)
	}
	return []byte{n, 0, 0, 0}, proto, nil
}

// protoNames are protoNumbers the other way round.
var protoNames = map[byte]string{6: "tcp", 17: "udp", 132: "sctp"}

// decode turns an element of t's set back into the entry of t's ipset.
// ok is false for an element that belongs to another ipset sharing the
// set (a UDP node port when t is KUBE-NODE-PORT-TCP) or that ipvsproxy
// could not have written.
func (t target) decode(el element) (e ipset.Entry, ok bool) {
	key := el.key
	if len(key) != t.set.keyLen() || t.set.interval() != (el.keyEnd != nil) {
		return ipset.Entry{}, false
	}
	for _, f := range t.set.key {
		n := f.size(t.set.v6, t.set.concat())
		b := key[:n]
		key = key[n:]
		switch f {
		case fieldIP, fieldIP2, fieldNet:
			a, _ := netip.AddrFromSlice(b)
			switch f {
			case fieldIP:
				e.IP = a
			case fieldIP2:
				e.IP2 = a
			default:
				if len(el.keyEnd) != len(el.key) {
					return ipset.Entry{}, false
				}
				e.Net = rangePrefix(a, el.keyEnd[len(el.keyEnd)-n:])
				if !e.Net.IsValid() {
					return ipset.Entry{}, false
				}
			}
		case fieldProto:
			name, known := protoNames[b[0]]
			if !known || t.proto != "" && name != t.proto {
				return ipset.Entry{}, false
			}
			if t.proto == "" {
				e.Protocol = name
			}
		case fieldPort:
			e.Port = uint16(b[0])<<8 | uint16(b[1])
		}
	}
	return e, true
}

// rangePrefix is the prefix covering exactly first..last, or the zero
// Prefix when the range is not one.
func rangePrefix(first netip.Addr, lastBytes []byte) netip.Prefix {
	last, ok := netip.AddrFromSlice(lastBytes)
	if !ok || first.BitLen() != last.BitLen() {
		return netip.Prefix{}
	}
	for bits := first.BitLen(); bits >= 0; bits-- {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() != first {
			break
		}
		_, end, _, _ := netBytes(p, first.Is6())
		if bytes.Equal(end, lastBytes) {
			return p
		}
	}
	return netip.Prefix{}
}
