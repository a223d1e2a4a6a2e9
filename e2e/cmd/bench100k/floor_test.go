//go:build e2e

package main

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

func vsKey(s string) ipvs.ServiceKey {
	ap := netip.MustParseAddrPort(s)
	return ipvs.ServiceKey{Address: ap.Addr(), Protocol: ipvs.TCP, Port: ap.Port()}
}

func realSrv(s string, w int32) ipvs.RealServer {
	ap := netip.MustParseAddrPort(s)
	return ipvs.RealServer{RealKey: ipvs.RealKey{Address: ap.Addr(), Port: ap.Port()}, Weight: w}
}

// The capture keeps what a write takes (scheduler, flags, timeout,
// weights, set headers and members, addresses) and drops what only the
// kernel's reads carry (counters, connection counts), virtual servers
// in address order whatever the kernel's.
func TestCaptureKernel(t *testing.T) {
	v := ipvs.NewFake()
	vss := []ipvs.VirtualServer{
		{ServiceKey: vsKey("10.96.0.2:80"), Scheduler: "rr"},
		{ServiceKey: vsKey("10.10.0.1:30000"), Scheduler: "sh", Flags: ipvs.FlagPersistent, Timeout: 10800},
		{ServiceKey: vsKey("10.96.0.1:80"), Scheduler: "rr"},
	}
	for i, vs := range vss {
		if err := v.AddVirtualServer(vs); err != nil {
			t.Fatal(err)
		}
		for j := 0; j <= i; j++ {
			rs := realSrv(fmt.Sprintf("10.128.%d.%d:8080", i, j+1), int32(j+1))
			if err := v.AddRealServer(vs.ServiceKey, rs); err != nil {
				t.Fatal(err)
			}
			if err := v.SetConns(vs.ServiceKey, rs.RealKey, 3, 4); err != nil {
				t.Fatal(err)
			}
		}
		if err := v.SetStats(vs.ServiceKey, ipvs.Stats{Connections: 9}); err != nil {
			t.Fatal(err)
		}
	}
	s := ipset.NewFake()
	sets := []ipset.Set{{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort, HashSize: 4096, MaxElem: 131072},
		{Name: "KUBE-NODE-PORT-TCP", Type: ipset.BitmapPort}}
	for _, set := range sets {
		if err := s.EnsureSet(set); err != nil {
			t.Fatal(err)
		}
	}
	entry := ipset.Entry{IP: netip.MustParseAddr("10.96.0.1"), Protocol: "tcp", Port: 80}
	if err := s.AddEntries("KUBE-CLUSTER-IP", []ipset.Entry{entry}); err != nil {
		t.Fatal(err)
	}
	d := dummyif.NewFake(floorLink)
	if err := d.EnsureLink(); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.2", "10.96.0.1"} {
		if err := d.AddAddress(netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}

	o, err := captureKernel(v, s, d, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := o.String(), "2 addresses, 2 sets with 1 entries, 3 virtual servers with 6 real servers"; got != want {
		t.Errorf("captured %s, want %s", got, want)
	}
	var order []string
	for _, c := range o.VS {
		order = append(order, c.ServiceKey.String())
		if c.Stats != (ipvs.Stats{}) {
			t.Errorf("%v: stats kept: %+v", c.ServiceKey, c.Stats)
		}
		for _, r := range c.Reals {
			if r.ActiveConns != 0 || r.InactiveConns != 0 || r.Weight < 1 {
				t.Errorf("%v: real server %+v: connections kept or weight lost", c.ServiceKey, r)
			}
		}
	}
	if got, want := strings.Join(order, ", "), "tcp 10.10.0.1:30000, tcp 10.96.0.1:80, tcp 10.96.0.2:80"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	if c := o.VS[0]; c.Scheduler != "sh" || c.Flags != ipvs.FlagPersistent || c.Timeout != 10800 || len(c.Reals) != 2 {
		t.Errorf("node port virtual server captured as %+v", c)
	}
	if c := o.Sets[0]; c.Name != "KUBE-CLUSTER-IP" || c.Type != ipset.HashIPPort || c.Family != ipset.Inet ||
		c.HashSize != 4096 || c.MaxElem != 131072 || len(c.Entries) != 1 || c.Entries[0] != entry {
		t.Errorf("set captured as %+v", c)
	}
	if a := o.Addrs; len(a) != 2 || a[0].String() != "10.96.0.1" {
		t.Errorf("addresses %v", a)
	}
	if o.VSDump.Services != 3 {
		t.Errorf("the dump timed %d virtual servers, want 3", o.VSDump.Services)
	}
}

// setMessages counts the messages package ipset sends, which its Fake
// splits exactly as Netlink does.
func TestSetMessages(t *testing.T) {
	for _, n := range []int{0, 1, 599, 600, 5000} {
		f := ipset.NewFake()
		set := ipset.Set{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort, MaxElem: 1 << 20}
		if err := f.EnsureSet(set); err != nil {
			t.Fatal(err)
		}
		var entries []ipset.Entry
		for i := range n {
			entries = append(entries, ipset.Entry{IP: vAddr(clusterIP(i)), Protocol: "tcp", Port: 80})
		}
		if err := f.AddEntries(set.Name, entries); err != nil {
			t.Fatal(err)
		}
		if got, want := setMessages(set.Name, entries), f.Count(ipset.VerbAddEntries); got != want {
			t.Errorf("%d entries: %d messages counted, ipset sends %d", n, got, want)
		}
	}
}

// floorPipe sends every message, in order, in pipelined sends, and
// counts the kernel's refusals.
func TestFloorPipe(t *testing.T) {
	const n = floorChunk + 1000
	var seen []uint16 // each message's port, in the order the kernel got them
	c, k := nlconntest.New(t, func(_ int, seq uint32, req []byte) []any {
		port := uint16(req[len(req)-1]) // see below: the last byte of each message
		seen = append(seen, port)
		var errno syscall.Errno
		if port%100 == 7 {
			errno = syscall.EEXIST
		}
		return []any{nlconntest.Ack(seq, errno)}
	})
	k.RcvBuf = floorRcvBuf
	ph := floorPhase{Name: "test", Objects: n}
	p := newFloorPipe(c, &ph)
	for i := range n {
		// A minimal netlink message whose last byte tells it apart.
		p.buf = append(p.buf, nlconntest.Msg(0x10, 0x5, 0, []byte{0, 0, 0, byte(i % 100)})...)
		if err := p.added(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	if ph.Messages != n || len(seen) != n {
		t.Fatalf("%d messages counted, %d reached the kernel, want %d", ph.Messages, len(seen), n)
	}
	for i, port := range seen {
		if int(port) != i%100 {
			t.Fatalf("message %d reached the kernel as %d: out of order", i, port)
		}
	}
	refused := 0
	for i := range n {
		if i%100 == 7 {
			refused++
		}
	}
	if ph.Errors != refused {
		t.Errorf("%d refusals counted, want %d", ph.Errors, refused)
	}
	if !strings.Contains(ph.FirstError, "exists") {
		t.Errorf("first error %q", ph.FirstError)
	}
	// As deep as nlconn goes: MaxPipelined messages per send.
	full := func(m int) int { return (m + nlconn.MaxPipelined - 1) / nlconn.MaxPipelined }
	if sends, want := k.SendCount(), full(floorChunk)+full(n-floorChunk); sends != want {
		t.Errorf("%d sends for %d messages, want %d", sends, n, want)
	}
}
