package conntrack

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

var (
	client  = netip.MustParseAddrPort("10.0.0.5:40000")
	client6 = netip.MustParseAddrPort("[fd00:1::5]:40000")
	dns     = netip.MustParseAddrPort("10.96.0.10:53")
	dns6    = netip.MustParseAddrPort("[fd00:96::10]:53")
	podA    = netip.MustParseAddrPort("10.244.1.2:5353")
	podB    = netip.MustParseAddrPort("10.244.2.3:5353")
	podA6   = netip.MustParseAddrPort("[fd00:244::2]:5353")
	nodeIP  = netip.MustParseAddrPort("192.168.1.5:30053")
	otherNP = netip.MustParseAddrPort("192.168.1.5:30054")
)

func table() []Entry {
	tcp := UDPEntry(client, dns, podA)
	tcp.Proto = 6
	return []Entry{
		UDPEntry(client, dns, podA),     // 0 service → A
		UDPEntry(client, dns, podB),     // 1 service → B
		UDPEntry(client, nodeIP, podA),  // 2 node port → A
		UDPEntry(client, otherNP, podA), // 3 other node port → A
		tcp,                             // 4 TCP, never touched
		UDPEntry(client6, dns6, podA6),  // 5 IPv6 service → A6
	}
}

func TestDeleteUDPMatching(t *testing.T) {
	tests := []struct {
		name  string
		flows []Flow
		gone  []int // indexes into table()
	}{
		{"nothing", nil, nil},
		{"service, one backend", []Flow{{Destination: dns.Addr(), Port: 53, Backend: podA.Addr()}}, []int{0}},
		{"service, any backend", []Flow{{Destination: dns.Addr(), Port: 53}}, []int{0, 1}},
		{"service, other port", []Flow{{Destination: dns.Addr(), Port: 54}}, nil},
		{"node port, backend", []Flow{{NodePort: true, Port: 30053, Backend: podA.Addr()}}, []int{2}},
		{"node port ignores destination", []Flow{{NodePort: true, Port: 30053, Destination: dns.Addr(), Backend: podA.Addr()}}, []int{2}},
		{"ipv6", []Flow{{Destination: dns6.Addr(), Port: 53, Backend: podA6.Addr()}}, []int{5}},
		{"mapped address", []Flow{{Destination: netip.AddrFrom16(dns.Addr().As16()), Port: 53, Backend: podB.Addr()}}, []int{1}},
		{"batch", []Flow{
			{Destination: dns.Addr(), Port: 53, Backend: podB.Addr()},
			{NodePort: true, Port: 30054, Backend: podA.Addr()},
			{Destination: dns6.Addr(), Port: 53},
		}, []int{1, 3, 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake()
			all := table()
			f.SetEntries(all...)
			n, err := f.DeleteUDP(tc.flows)
			if err != nil {
				t.Fatal(err)
			}
			var want, kept []Entry
			for i, e := range all {
				if slices.Contains(tc.gone, i) {
					want = append(want, e)
				} else {
					kept = append(kept, e)
				}
			}
			if n != len(want) || !slices.Equal(f.Deleted(), want) {
				t.Fatalf("deleted %d: %v\nwant %v", n, f.Deleted(), want)
			}
			if !slices.Equal(f.Entries(), kept) {
				t.Fatalf("kept %v\nwant %v", f.Entries(), kept)
			}
			wantDumps := 0
			if len(tc.flows) > 0 {
				wantDumps = 1
			}
			if got := f.Count(VerbDump); got != wantDumps {
				t.Fatalf("Count(Dump) = %d, want %d (one table read per call)", got, wantDumps)
			}
		})
	}
}

func TestDeleteUDPRejectsBadFlows(t *testing.T) {
	f := NewFake()
	f.SetEntries(table()...)
	for _, flows := range [][]Flow{
		{{Destination: dns.Addr(), Port: 0}},
		{{Port: 53}},
		{{Destination: dns.Addr(), Port: 53}, {Port: 53}},
	} {
		if n, err := f.DeleteUDP(flows); err == nil || n != 0 {
			t.Errorf("DeleteUDP(%+v) = %d, %v; want an error", flows, n, err)
		}
	}
	if len(f.Deleted()) != 0 || f.Count(VerbDump) != 0 {
		t.Fatalf("bad input deleted %v / dumped %d times", f.Deleted(), f.Count(VerbDump))
	}
}

func TestFakeFailOn(t *testing.T) {
	f := NewFake()
	f.SetEntries(table()...)
	boom := errors.New("boom")
	undo := f.FailOn(VerbDeleteUDP, nil, boom)
	if n, err := f.DeleteUDP([]Flow{{Destination: dns.Addr(), Port: 53}}); !errors.Is(err, boom) || n != 0 {
		t.Fatalf("DeleteUDP = %d, %v; want 0, boom", n, err)
	}
	if len(f.Entries()) != len(table()) || len(f.Deleted()) != 0 {
		t.Fatal("a failed call changed the table")
	}

	// A single entry's delete failing leaves it and deletes the rest.
	undo()
	undo = f.FailOn(VerbDelete, func(c Call) bool { return c.Entry.ReplySrc == podB }, boom)
	n, err := f.DeleteUDP([]Flow{{Destination: dns.Addr(), Port: 53}})
	if !errors.Is(err, boom) || n != 1 {
		t.Fatalf("DeleteUDP = %d, %v; want 1 and boom", n, err)
	}
	if got := f.Deleted(); len(got) != 1 || got[0].ReplySrc != podA {
		t.Fatalf("deleted %v, want only the entry to %s", got, podA)
	}
	want := map[string]int{VerbDeleteUDP: 2, VerbDump: 1, VerbDelete: 2}
	if got := f.Counts(); len(got) != len(want) || got[VerbDeleteUDP] != 2 || got[VerbDump] != 1 || got[VerbDelete] != 2 {
		t.Fatalf("Counts() = %v, want %v", got, want)
	}
	f.ResetCounts()
	if len(f.Counts()) != 0 {
		t.Fatal("ResetCounts left counts")
	}
	undo()
	if n, err := f.DeleteUDP([]Flow{{Destination: dns.Addr(), Port: 53}}); err != nil || n != 1 {
		t.Fatalf("after removing the hook: %d, %v", n, err)
	}
}

func TestFakeString(t *testing.T) {
	f := NewFake()
	unreplied := UDPEntry(client, dns, podA)
	unreplied.Replied = false
	assured := UDPEntry(client, otherNP, podB)
	assured.Assured, assured.Timeout, assured.Mark = true, 119, 0x4000
	f.SetEntries(unreplied, assured, UDPEntry(client6, dns6, podA6))
	want := `udp      17 30 src=10.0.0.5 dst=10.96.0.10 sport=40000 dport=53 [UNREPLIED] src=10.244.1.2 dst=10.0.0.5 sport=5353 dport=40000 mark=0 use=1
udp      17 119 src=10.0.0.5 dst=192.168.1.5 sport=40000 dport=30054 src=10.244.2.3 dst=10.0.0.5 sport=5353 dport=40000 [ASSURED] mark=16384 use=1
udp      17 30 src=fd00:1::5 dst=fd00:96::10 sport=40000 dport=53 src=fd00:244::2 dst=fd00:1::5 sport=5353 dport=40000 mark=0 use=1
`
	if got := f.String(); got != want {
		t.Fatalf("String() =\n%s\nwant\n%s", got, want)
	}
}

func TestFakeConcurrent(t *testing.T) {
	f := NewFake()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				f.SetEntries(table()...)
				_, _ = f.DeleteUDP([]Flow{{Destination: dns.Addr(), Port: 53}})
				_ = f.String()
				_ = f.Deleted()
			}
		})
	}
	wg.Wait()
	if got := f.Count(VerbDeleteUDP); got != 400 {
		t.Fatalf("Count(DeleteUDP) = %d, want 400", got)
	}
}

func TestFamilies(t *testing.T) {
	for _, tc := range []struct {
		flows []Flow
		want  family
	}{
		{[]Flow{{Destination: dns.Addr(), Port: 53}}, familyV4},
		{[]Flow{{Destination: dns6.Addr(), Port: 53}}, familyV6},
		{[]Flow{{NodePort: true, Port: 30053, Backend: podA6.Addr()}}, familyV6},
		{[]Flow{{NodePort: true, Port: 30053}}, familyV4 | familyV6},
		{[]Flow{{Destination: dns.Addr(), Port: 53}, {Destination: dns6.Addr(), Port: 53}}, familyV4 | familyV6},
	} {
		m, err := newMatcher(tc.flows)
		if err != nil {
			t.Fatal(err)
		}
		if m.families != tc.want {
			t.Errorf("families(%+v) = %b, want %b", tc.flows, m.families, tc.want)
		}
	}
}
