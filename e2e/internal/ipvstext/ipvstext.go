//go:build e2e

// Package ipvstext reads /proc/net/ip_vs, the text ipvsadm users know,
// for the benchmarks (e2e/cmd/bench, e2e/cmd/bench100k): one read of the
// whole table, no process and no netlink request per virtual server.
// Lines look like
//
//	TCP  0A600001:0050 rr
//	  -> 0A800001:1F90      Masq    1      0          0
package ipvstext

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// Scan calls virtual for each virtual server line and real for each of
// its real servers, in the text's order. ok is false for what the
// benchmarks do not program: a UDP, SCTP or firewall-mark virtual server,
// an IPv6 address, a line that does not parse.
func Scan(r io.Reader, virtual func(ip uint32, port int, ok bool), real func(ip uint32, port, weight int, ok bool)) error {
	return ScanProto(r, func(proto string, ip uint32, port int, ok bool) {
		if proto != "TCP" {
			ip, port, ok = 0, 0, false
		}
		virtual(ip, port, ok)
	}, real)
}

// ScanProto is Scan with each virtual server's protocol ("TCP", "UDP",
// "SCTP"; "FWM" for a firewall mark, whose address is reported as not ok):
// bench100k's cluster DNS has a UDP virtual server too.
func ScanProto(r io.Reader, virtual func(proto string, ip uint32, port int, ok bool), real func(ip uint32, port, weight int, ok bool)) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadString('\n')
		if err != nil && err != io.EOF {
			return err
		}
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			ip, port, ok := HexAddrPort(f[1])
			virtual(f[0], ip, port, ok)
		case len(f) >= 4 && f[0] == "->" && f[1] != "RemoteAddress:Port":
			ip, port, ok := HexAddrPort(f[1])
			weight, werr := strconv.Atoi(f[3])
			real(ip, port, weight, ok && werr == nil)
		case len(f) >= 1 && (f[0] == "FWM" || f[0] == "UDP" || f[0] == "SCTP"):
			virtual(f[0], 0, 0, false) // a mark, or a line cut short
		}
		if err == io.EOF {
			return nil
		}
	}
}

// HexAddrPort turns "0A600001:0050" into its address and port; IPv6
// ("[…]:…") reports false.
func HexAddrPort(s string) (uint32, int, bool) {
	ip, port, ok := strings.Cut(s, ":")
	if !ok || len(ip) != 8 {
		return 0, 0, false
	}
	v, err1 := strconv.ParseUint(ip, 16, 32)
	p, err2 := strconv.ParseUint(port, 16, 16)
	return uint32(v), int(p), err1 == nil && err2 == nil
}

// String is ip:port in dotted form: "10.96.0.1:80".
func String(ip uint32, port int) string {
	return strconv.Itoa(int(ip>>24)) + "." + strconv.Itoa(int(ip>>16&255)) + "." + strconv.Itoa(int(ip>>8&255)) + "." +
		strconv.Itoa(int(ip&255)) + ":" + strconv.Itoa(port)
}
