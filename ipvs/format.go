package ipvs

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// FormatSave prints services and their real servers exactly as
// `ipvsadm -Sn` (ipvsadm 1.31) prints the same kernel state, so a test's
// expected value or a debug dump reads like an operator's terminal.
//
// Order: the kernel dumps services in hash order, which is neither stable
// nor meaningful; ipvsadm sorts before printing, and so does this: services
// by address family (IPv4 first), protocol number (tcp, udp, sctp), address,
// port; real servers by address, then port. Inputs are not modified.
//
// Every real server is printed with -m: ipvsproxy only masquerades.
func FormatSave(services []VirtualServer, reals map[ServiceKey][]RealServer) string {
	svcs := slices.Clone(services)
	slices.SortFunc(svcs, func(a, b VirtualServer) int { return CompareServiceKeys(a.ServiceKey, b.ServiceKey) })
	var b strings.Builder
	for _, vs := range svcs {
		b.WriteString(ServiceLine(vs) + "\n")
		rss := slices.Clone(reals[vs.ServiceKey])
		slices.SortFunc(rss, func(a, b RealServer) int { return CompareRealKeys(a.RealKey, b.RealKey) })
		for _, rs := range rss {
			b.WriteString(RealLine(vs.ServiceKey, rs) + "\n")
		}
	}
	return b.String()
}

// ServiceLine is the `ipvsadm -Sn` line of one virtual server, without a
// newline: "-A -t 10.96.0.10:53 -s rr -p 10800".
func ServiceLine(vs VirtualServer) string {
	return fmt.Sprintf("-A %s -s %s%s", serviceArg(vs.ServiceKey), vs.Scheduler, serviceOptions(vs))
}

// RealLine is the `ipvsadm -Sn` line of one real server of vs, without a
// newline: "-a -t 10.96.0.10:53 -r 10.244.1.5:53 -m -w 1".
func RealLine(vs ServiceKey, rs RealServer) string {
	return fmt.Sprintf("-a %s -r %s -m -w %d", serviceArg(vs), rs.RealKey, rs.Weight)
}

// CompareServiceKeys orders keys as ipvsadm lists them: IPv4 before IPv6,
// then protocol number, address, port.
func CompareServiceKeys(a, b ServiceKey) int {
	return cmp.Or(
		cmp.Compare(a.Address.BitLen(), b.Address.BitLen()),
		cmp.Compare(a.Protocol, b.Protocol),
		a.Address.Compare(b.Address),
		cmp.Compare(a.Port, b.Port),
	)
}

// CompareRealKeys orders real servers as ipvsadm lists them: address, port.
func CompareRealKeys(a, b RealKey) int {
	return cmp.Or(a.Address.Compare(b.Address), cmp.Compare(a.Port, b.Port))
}

// serviceArg is ipvsadm's service option: "-t 10.96.0.1:443",
// "-u [fd00::1]:53", "--sctp-service 10.96.0.1:9".
func serviceArg(k ServiceKey) string {
	var opt string
	switch k.Protocol {
	case TCP:
		opt = "-t"
	case UDP:
		opt = "-u"
	case SCTP:
		opt = "--sctp-service"
	default:
		opt = "--" + k.Protocol.String()
	}
	return opt + " " + RealKey{Address: k.Address, Port: k.Port}.String()
}

// serviceOptions prints what follows "-s <scheduler>", in ipvsadm's order
// (checked against ipvsadm 1.31): persistence (-p), one-packet scheduling
// (-o), scheduler flags (-b).
// The persistence netmask (-M) is never printed because the adapters
// always program the per-client default.
func serviceOptions(vs VirtualServer) string {
	var b strings.Builder
	if vs.Flags&FlagPersistent != 0 {
		fmt.Fprintf(&b, " -p %d", vs.Timeout)
	}
	if vs.Flags&FlagOnePacket != 0 {
		b.WriteString(" -o")
	}
	if names := schedFlagNames(vs.Scheduler, vs.Flags); len(names) > 0 {
		b.WriteString(" -b " + strings.Join(names, ","))
	}
	return b.String()
}

// schedFlagNames names the scheduler flags as ipvsadm does: sh and mh
// call flags 1 and 2 "<sched>-fallback" and "<sched>-port" and do not
// print flag 3 at all; every other scheduler prints "flag-1".."flag-3".
func schedFlagNames(sched string, f Flags) []string {
	var names []string
	if sched == "sh" || sched == "mh" {
		if f&FlagSchedFlag1 != 0 {
			names = append(names, sched+"-fallback")
		}
		if f&FlagSchedFlag2 != 0 {
			names = append(names, sched+"-port")
		}
		return names
	}
	for i, bit := range []Flags{FlagSchedFlag1, FlagSchedFlag2, FlagSchedFlag3} {
		if f&bit != 0 {
			names = append(names, fmt.Sprintf("flag-%d", i+1))
		}
	}
	return names
}
