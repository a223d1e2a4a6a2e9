package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

func key(proto Protocol, addrPort string) ServiceKey {
	ap := netip.MustParseAddrPort(addrPort)
	return ServiceKey{Address: ap.Addr(), Protocol: proto, Port: ap.Port()}
}

func rkey(addrPort string) RealKey {
	ap := netip.MustParseAddrPort(addrPort)
	return RealKey{Address: ap.Addr(), Port: ap.Port()}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type formatCase struct {
	name  string
	vs    []VirtualServer
	reals map[ServiceKey][]RealServer
	want  string
}

var kube = key(TCP, "10.96.0.1:443")

// The expected texts below were checked against ipvsadm 1.31 -Sn on a real
// kernel; handle_sandbox_test.go keeps proving that.
var formatCases = []formatCase{
	{name: "empty", want: ""},
	{
		name: "tcp with real servers sorted by address then port",
		vs:   []VirtualServer{{ServiceKey: kube, Scheduler: "rr"}},
		reals: map[ServiceKey][]RealServer{kube: {
			{RealKey: rkey("10.244.1.10:6443"), Weight: 1},
			{RealKey: rkey("10.244.1.9:8080"), Weight: 0},
			{RealKey: rkey("10.244.1.9:443"), Weight: 1},
		}},
		want: "-A -t 10.96.0.1:443 -s rr\n" +
			"-a -t 10.96.0.1:443 -r 10.244.1.9:443 -m -w 1\n" +
			"-a -t 10.96.0.1:443 -r 10.244.1.9:8080 -m -w 0\n" +
			"-a -t 10.96.0.1:443 -r 10.244.1.10:6443 -m -w 1\n",
	},
	{
		name: "udp, sctp and ipv6 in brackets",
		vs: []VirtualServer{
			{ServiceKey: key(UDP, "[fd00::a]:53"), Scheduler: "rr"},
			{ServiceKey: key(SCTP, "10.96.0.11:9"), Scheduler: "wrr"},
			{ServiceKey: key(UDP, "10.96.0.10:53"), Scheduler: "rr"},
		},
		reals: map[ServiceKey][]RealServer{
			key(UDP, "[fd00::a]:53"):  {{RealKey: rkey("[fd00:244::5]:53"), Weight: 1}},
			key(SCTP, "10.96.0.11:9"): {{RealKey: rkey("10.244.2.8:9"), Weight: 2}},
		},
		want: "-A -u 10.96.0.10:53 -s rr\n" +
			"-A --sctp-service 10.96.0.11:9 -s wrr\n" +
			"-a --sctp-service 10.96.0.11:9 -r 10.244.2.8:9 -m -w 2\n" +
			"-A -u [fd00::a]:53 -s rr\n" +
			"-a -u [fd00::a]:53 -r [fd00:244::5]:53 -m -w 1\n",
	},
	{
		name: "persistence, one-packet and scheduler flags in ipvsadm's order",
		vs: []VirtualServer{
			{ServiceKey: key(TCP, "10.96.0.2:80"), Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800},
			{ServiceKey: key(TCP, "10.96.0.3:80"), Scheduler: "sh", Flags: FlagSchedFlag1 | FlagSchedFlag2},
			{ServiceKey: key(TCP, "10.96.0.4:80"), Scheduler: "sh", Flags: FlagSchedFlag2 | FlagSchedFlag3},
			{ServiceKey: key(UDP, "10.96.0.5:80"), Scheduler: "mh", Flags: FlagSchedFlag2 | FlagOnePacket | FlagPersistent, Timeout: 5},
			{ServiceKey: key(TCP, "10.96.0.6:80"), Scheduler: "rr", Flags: FlagSchedFlag1 | FlagSchedFlag3},
			{ServiceKey: key(TCP, "10.96.0.7:80"), Scheduler: "rr", Timeout: 99, Flags: FlagHashed},
		},
		want: "-A -t 10.96.0.2:80 -s rr -p 10800\n" +
			"-A -t 10.96.0.3:80 -s sh -b sh-fallback,sh-port\n" +
			"-A -t 10.96.0.4:80 -s sh -b sh-port\n" +
			"-A -t 10.96.0.6:80 -s rr -b flag-1,flag-3\n" +
			"-A -t 10.96.0.7:80 -s rr\n" +
			"-A -u 10.96.0.5:80 -s mh -p 5 -o -b mh-port\n",
	},
	{
		name: "services sorted by family, protocol, numeric address, port",
		vs: []VirtualServer{
			{ServiceKey: key(TCP, "[fd00::10]:80"), Scheduler: "rr"},
			{ServiceKey: key(TCP, "[fd00::9]:80"), Scheduler: "rr"},
			{ServiceKey: key(SCTP, "10.0.0.1:80"), Scheduler: "rr"},
			{ServiceKey: key(UDP, "10.0.0.1:80"), Scheduler: "rr"},
			{ServiceKey: key(TCP, "10.96.0.10:80"), Scheduler: "rr"},
			{ServiceKey: key(TCP, "10.96.0.9:8080"), Scheduler: "rr"},
			{ServiceKey: key(TCP, "10.96.0.9:443"), Scheduler: "rr"},
		},
		want: "-A -t 10.96.0.9:443 -s rr\n" +
			"-A -t 10.96.0.9:8080 -s rr\n" +
			"-A -t 10.96.0.10:80 -s rr\n" +
			"-A -u 10.0.0.1:80 -s rr\n" +
			"-A --sctp-service 10.0.0.1:80 -s rr\n" +
			"-A -t [fd00::9]:80 -s rr\n" +
			"-A -t [fd00::10]:80 -s rr\n",
	},
}

func TestFakeStringLikeIpvsadm(t *testing.T) {
	for _, tt := range formatCases {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake()
			for _, vs := range tt.vs {
				mustOK(t, f.AddVirtualServer(vs))
				for _, rs := range tt.reals[vs.ServiceKey] {
					mustOK(t, f.AddRealServer(vs.ServiceKey, rs))
				}
			}
			if got := f.String(); got != tt.want {
				t.Errorf("String():\n%s\nwant:\n%s", got, tt.want)
			}
			if got := FormatSave(tt.vs, tt.reals); got != tt.want {
				t.Errorf("FormatSave:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestFakeKernelSemantics(t *testing.T) {
	vs := key(TCP, "10.96.0.1:80")
	missing := key(TCP, "10.96.0.2:80")
	rs := RealServer{RealKey: rkey("10.244.1.5:8080"), Weight: 1}
	other := rkey("10.244.1.6:8080")
	tests := []struct {
		name    string
		op      func(f *Fake) error
		want    string // "", "exist", "notexist", "error"
		wantErr string
	}{
		{"add existing service", func(f *Fake) error { return f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}) },
			"exist", "add virtual server tcp 10.96.0.1:80: service already exists"},
		{"update missing service", func(f *Fake) error { return f.UpdateVirtualServer(VirtualServer{ServiceKey: missing, Scheduler: "rr"}) },
			"notexist", "update virtual server tcp 10.96.0.2:80: no such service"},
		{"delete missing service", func(f *Fake) error { return f.DeleteVirtualServer(missing) },
			"notexist", "delete virtual server tcp 10.96.0.2:80: no such service"},
		{"unknown scheduler is not 'does not exist'", func(f *Fake) error { return f.AddVirtualServer(VirtualServer{ServiceKey: missing, Scheduler: "xx"}) },
			"error", `add virtual server tcp 10.96.0.2:80: scheduler "xx" not found (is the ip_vs_xx module loaded?)`},
		{"empty scheduler", func(f *Fake) error { return f.AddVirtualServer(VirtualServer{ServiceKey: missing}) },
			"error", "add virtual server tcp 10.96.0.2:80: no scheduler"},
		{"add existing real server", func(f *Fake) error { return f.AddRealServer(vs, rs) },
			"exist", "add real server 10.244.1.5:8080 to tcp 10.96.0.1:80: destination already exists"},
		{"add real server to missing service", func(f *Fake) error { return f.AddRealServer(missing, rs) },
			"notexist", "add real server 10.244.1.5:8080 to tcp 10.96.0.2:80: no such service"},
		{"update missing real server", func(f *Fake) error { return f.UpdateRealServer(vs, RealServer{RealKey: other}) },
			"notexist", "update real server 10.244.1.6:8080 of tcp 10.96.0.1:80: no such destination"},
		{"delete missing real server", func(f *Fake) error { return f.DeleteRealServer(vs, other) },
			"notexist", "delete real server 10.244.1.6:8080 from tcp 10.96.0.1:80: no such destination"},
		{"delete real server of missing service", func(f *Fake) error { return f.DeleteRealServer(missing, other) },
			"notexist", "delete real server 10.244.1.6:8080 from tcp 10.96.0.2:80: no such service"},
		{"mixed families", func(f *Fake) error { return f.AddRealServer(vs, RealServer{RealKey: rkey("[fd00::1]:80")}) },
			"error", "add real server [fd00::1]:80 to tcp 10.96.0.1:80: real server fd00::1 and virtual server 10.96.0.1 differ in address family"},
		{"weight too large", func(f *Fake) error { return f.AddRealServer(vs, RealServer{RealKey: other, Weight: 65536}) },
			"error", "add real server 10.244.1.6:8080 to tcp 10.96.0.1:80: weight 65536 out of range 0-65535"},
		{"negative weight", func(f *Fake) error { return f.AddRealServer(vs, RealServer{RealKey: other, Weight: -1}) },
			"error", "add real server 10.244.1.6:8080 to tcp 10.96.0.1:80: weight -1 out of range 0-65535"},
		{"ipv4-mapped address", func(f *Fake) error {
			return f.AddVirtualServer(VirtualServer{ServiceKey: key(TCP, "[::ffff:10.96.0.3]:80"), Scheduler: "rr"})
		}, "error", "add virtual server tcp [::ffff:10.96.0.3]:80: virtual server address ::ffff:10.96.0.3 is IPv4-mapped IPv6; use the IPv4 form"},
		{"unsupported protocol", func(f *Fake) error {
			return f.AddVirtualServer(VirtualServer{ServiceKey: ServiceKey{Address: vs.Address, Protocol: 1, Port: 1}, Scheduler: "rr"})
		}, "error", "add virtual server proto-1 10.96.0.1:1: unsupported protocol proto-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake()
			mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
			mustOK(t, f.AddRealServer(vs, rs))
			before := f.String()
			err := tt.op(f)
			if got := outcomeOf(err); got != tt.want {
				t.Errorf("outcome %q (%v), want %q", got, err, tt.want)
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("error %v\nwant  %s", err, tt.wantErr)
			}
			if after := f.String(); after != before {
				t.Errorf("failed call changed state:\n%s\nwas:\n%s", after, before)
			}
		})
	}
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return ""
	case IsExist(err):
		return "exist"
	case IsNotExist(err):
		return "notexist"
	}
	return "error"
}

func TestFakeUpdatesAndDeletes(t *testing.T) {
	f := NewFake()
	vs := key(TCP, "10.96.0.1:80")
	a, b := rkey("10.244.1.5:80"), rkey("10.244.1.6:80")
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: a, Weight: 1}))
	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: b, Weight: 1}))
	mustOK(t, f.SetConns(vs, a, 3, 4))
	mustOK(t, f.SetStats(vs, Stats{Connections: 9}))

	// Draining: weight 0, connection counts kept (they are the kernel's).
	mustOK(t, f.UpdateRealServer(vs, RealServer{RealKey: a, Weight: 0, ActiveConns: 100}))
	mustOK(t, f.UpdateVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "sh", Flags: FlagSchedFlag1 | FlagHashed, Stats: Stats{Connections: 1}}))
	rss, err := f.ListRealServers(vs)
	mustOK(t, err)
	want := []RealServer{{RealKey: a, Weight: 0, ActiveConns: 3, InactiveConns: 4}, {RealKey: b, Weight: 1}}
	if fmt.Sprint(rss) != fmt.Sprint(want) {
		t.Errorf("ListRealServers = %v, want %v", rss, want)
	}
	vss, err := f.ListVirtualServers()
	mustOK(t, err)
	if len(vss) != 1 || vss[0].Flags != FlagSchedFlag1 || vss[0].Stats.Connections != 9 {
		t.Errorf("ListVirtualServers = %+v; want sh flag-1 without hashed flag, stats kept", vss)
	}
	// Returned slices are copies.
	rss[0].Weight = 42
	vss[0].Scheduler = "xx"
	if got := f.String(); got != "-A -t 10.96.0.1:80 -s sh -b sh-fallback\n"+
		"-a -t 10.96.0.1:80 -r 10.244.1.5:80 -m -w 0\n"+
		"-a -t 10.96.0.1:80 -r 10.244.1.6:80 -m -w 1\n" {
		t.Errorf("state after updates:\n%s", got)
	}

	mustOK(t, f.DeleteRealServer(vs, b))
	mustOK(t, f.DeleteVirtualServer(vs))
	if got := f.String(); got != "" {
		t.Errorf("after deleting the service: %q, want empty", got)
	}
	// Re-adding the service does not bring its old real servers back.
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	if rss, err := f.ListRealServers(vs); err != nil || len(rss) != 0 {
		t.Errorf("re-added service has real servers %v, %v", rss, err)
	}
	if rss, err := f.ListRealServers(key(TCP, "10.96.0.9:80")); err != nil || rss == nil || len(rss) != 0 {
		t.Errorf("ListRealServers(missing) = %#v, %v; want empty non-nil, nil (as the kernel)", rss, err)
	}
	if err := f.SetConns(vs, a, 1, 1); !IsNotExist(err) {
		t.Errorf("SetConns on a missing real server: %v, want IsNotExist", err)
	}
}

func TestFakeCounts(t *testing.T) {
	f := NewFake()
	vs := key(UDP, "10.96.0.10:53")
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))
	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: rkey("10.244.0.2:53"), Weight: 1}))
	f.ResetCounts()

	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: rkey("10.244.0.3:53"), Weight: 1}))
	_ = f.AddRealServer(vs, RealServer{RealKey: rkey("10.244.0.3:53"), Weight: 1}) // fails, still counted
	_, _ = f.ListVirtualServers()
	_, _ = f.ListRealServers(vs)
	_, _ = f.GetTimeouts()
	mustOK(t, f.SetConns(vs, rkey("10.244.0.2:53"), 1, 0)) // test helper: not counted
	_ = f.String()                                         // not counted

	want := map[string]int{"AddRealServer": 2, "ListVirtualServers": 1, "ListRealServers": 1, "GetTimeouts": 1}
	if got := f.Counts(); !maps.Equal(got, want) {
		t.Errorf("Counts() = %v, want %v", got, want)
	}
	if got := f.Count("AddRealServer"); got != 2 {
		t.Errorf(`Count("AddRealServer") = %d, want 2`, got)
	}
	if got := f.Count("DeleteVirtualServer"); got != 0 {
		t.Errorf(`Count("DeleteVirtualServer") = %d, want 0`, got)
	}
	f.Counts()["AddRealServer"] = 100 // a copy
	f.ResetCounts()
	if got := f.Counts(); len(got) != 0 {
		t.Errorf("after ResetCounts: %v", got)
	}
	defer func() {
		if recover() == nil {
			t.Error(`Count("AddRealserver") (typo) did not panic`)
		}
	}()
	f.Count("AddRealserver")
}

func TestFakeFailOn(t *testing.T) {
	vs := key(TCP, "10.96.0.1:80")
	a, b := rkey("10.244.1.5:80"), rkey("10.244.1.6:80")
	f := NewFake()
	mustOK(t, f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}))

	boom := errors.New("boom")
	remove := f.FailOn("AddRealServer", func(c Call) bool { return c.Real == a }, boom)
	err := f.AddRealServer(vs, RealServer{RealKey: a, Weight: 1})
	if !errors.Is(err, boom) || err.Error() != "add real server 10.244.1.5:80 to tcp 10.96.0.1:80: boom" {
		t.Errorf("injected: %v", err)
	}
	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: b, Weight: 1})) // not matched
	if err := f.AddRealServer(vs, RealServer{RealKey: a, Weight: 1}); !errors.Is(err, boom) {
		t.Errorf("FailOn stopped after one call: %v", err)
	}
	remove()
	mustOK(t, f.AddRealServer(vs, RealServer{RealKey: a, Weight: 1}))
	if got := f.Count("AddRealServer"); got != 4 {
		t.Errorf("AddRealServer counted %d times, want 4 (failures count)", got)
	}

	// Injected errnos classify like the kernel's, and change nothing.
	before := f.String()
	f.FailTimes(1, "DeleteVirtualServer", nil, syscall.ESRCH)
	if err := f.DeleteVirtualServer(vs); !IsNotExist(err) {
		t.Errorf("injected ESRCH: %v, want IsNotExist", err)
	}
	if f.String() != before {
		t.Error("injected failure changed state")
	}
	mustOK(t, f.DeleteVirtualServer(vs)) // FailTimes(1) is used up

	// Verb "" matches every call; the earliest matching fault wins.
	f.FailTimes(2, "", func(c Call) bool { return c.Service == vs }, syscall.EEXIST)
	f.FailOn("", nil, boom)
	if err := f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}); !IsExist(err) {
		t.Errorf("first fault: %v, want IsExist", err)
	}
	if _, err := f.ListRealServers(vs); !IsExist(err) {
		t.Errorf("first fault again: %v, want IsExist", err)
	}
	if _, err := f.GetTimeouts(); !errors.Is(err, boom) {
		t.Errorf("second fault: %v, want boom", err)
	}
}

func TestFakeTimeouts(t *testing.T) {
	f := NewFake()
	got, err := f.GetTimeouts()
	mustOK(t, err)
	if want := (Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second}); got != want {
		t.Errorf("defaults %+v, want the kernel's %+v", got, want)
	}
	mustOK(t, f.SetTimeouts(Timeouts{TCP: 10 * time.Second, UDP: 1500 * time.Millisecond}))
	got, _ = f.GetTimeouts()
	if want := (Timeouts{TCP: 10 * time.Second, TCPFin: 120 * time.Second, UDP: 2 * time.Second}); got != want {
		t.Errorf("after set: %+v, want %+v (zero kept, rounded up to seconds)", got, want)
	}
	if err := f.SetTimeouts(Timeouts{TCPFin: -time.Second}); err == nil {
		t.Error("negative timeout accepted")
	}
}

func TestFakeConcurrent(t *testing.T) {
	f := NewFake()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			vs := ServiceKey{Address: netip.AddrFrom4([4]byte{10, 96, 1, byte(g)}), Protocol: TCP, Port: 80}
			for i := range 50 {
				_ = f.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"})
				rs := RealServer{RealKey: RealKey{Address: netip.AddrFrom4([4]byte{10, 244, byte(g), byte(i)}), Port: 80}, Weight: 1}
				mustOK(t, f.AddRealServer(vs, rs))
				_, _ = f.ListVirtualServers()
				_, _ = f.ListRealServers(vs)
				_ = f.String()
			}
		})
	}
	wg.Wait()
	if got := f.Count("AddRealServer"); got != 400 {
		t.Errorf("AddRealServer count %d, want 400", got)
	}
	vss, _ := f.ListVirtualServers()
	for _, vs := range vss {
		if rss, _ := f.ListRealServers(vs.ServiceKey); len(rss) != 50 {
			t.Errorf("%v has %d real servers, want 50", vs.ServiceKey, len(rss))
		}
	}
}

// TestMissingSchedulerNamesIt: the kernel's ENOENT for a virtual server is
// a missing scheduler module, and the error says which one (the sync
// falls back to the default for services asking for it).
func TestMissingSchedulerNamesIt(t *testing.T) {
	f := NewFake()
	f.UnloadScheduler("nq", false)
	vs := VirtualServer{ServiceKey: key(TCP, "10.96.0.1:80"), Scheduler: "nq"}
	err := f.AddVirtualServer(vs)
	if name, ok := MissingScheduler(fmt.Errorf("sync default/web: %w", err)); !ok || name != "nq" {
		t.Errorf("MissingScheduler(%v) = %q, %v; want nq", err, name, ok)
	}
	if _, ok := MissingScheduler(f.DeleteVirtualServer(key(TCP, "10.96.0.2:80"))); ok {
		t.Error("a missing service was taken for a missing scheduler")
	}
	f.UnloadScheduler("nq", true)
	mustOK(t, f.AddVirtualServer(vs))
}
