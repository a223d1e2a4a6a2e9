package app

import (
	"maps"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

const (
	ctMax       = "net/netfilter/nf_conntrack_max"
	ctEst       = "net/netfilter/nf_conntrack_tcp_timeout_established"
	ctCloseWait = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	ctUDP       = "net/netfilter/nf_conntrack_udp_timeout"
	ctUDPStream = "net/netfilter/nf_conntrack_udp_timeout_stream"
	ctLiberal   = "net/netfilter/nf_conntrack_tcp_be_liberal"
)

// kernelDefaults are a 6.1 kernel's values on a small machine.
func kernelDefaults() map[string]string {
	return map[string]string{ctMax: "65536", ctEst: "432000", ctCloseWait: "60", ctUDP: "30", ctUDPStream: "120", ctLiberal: "0"}
}

func TestConntrackTuningValues(t *testing.T) {
	defaults := NewOptions().Conntrack
	cases := []struct {
		name     string
		c        conntrackTuning
		cpus     int
		hashsize string
		want     map[string]string // changed values only
		wantHash string
	}{
		// 32768 × 8 = 262144 > min 131072; hashsize 16384 < 65536 is raised.
		{"defaults, 8 CPUs: per-core wins", defaults, 8, "16384",
			map[string]string{ctMax: "262144", ctEst: "86400", ctCloseWait: "3600"}, "65536"},
		// 32768 × 2 = 65536 < min 131072.
		{"defaults, 2 CPUs: the minimum wins", defaults, 2, "16384",
			map[string]string{ctMax: "131072", ctEst: "86400", ctCloseWait: "3600"}, "32768"},
		{"hash table already big enough is not written", defaults, 2, "65536",
			map[string]string{ctMax: "131072", ctEst: "86400", ctCloseWait: "3600"}, "65536"},
		{"every setting", conntrackTuning{MaxPerCore: 1000, Min: 10, TCPEstablished: time.Hour, TCPCloseWait: 90 * time.Second,
			UDP: 45 * time.Second, UDPStream: 3 * time.Minute, TCPBeLiberal: true}, 100, "16384",
			map[string]string{ctMax: "100000", ctEst: "3600", ctCloseWait: "90", ctUDP: "45", ctUDPStream: "180", ctLiberal: "1"}, "25000"},
		{"0 leaves every sysctl alone", conntrackTuning{Min: 1 << 20}, 64, "16384", nil, "16384"},
		{"a larger nf_conntrack_max is kept", conntrackTuning{MaxPerCore: 1000, Min: 1000}, 4, "16384", nil, "16384"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc := sysctl.NewFake(kernelDefaults())
			hs := sysctl.NewFake(map[string]string{"hashsize": c.hashsize})
			if err := c.c.apply(sc, hs, c.cpus); err != nil {
				t.Fatal(err)
			}
			want := kernelDefaults()
			maps.Copy(want, c.want)
			if !maps.Equal(sc.Values, want) {
				t.Errorf("sysctls\n got %v\nwant %v", sc.Values, want)
			}
			if hs.Values["hashsize"] != c.wantHash {
				t.Errorf("hashsize %s, want %s", hs.Values["hashsize"], c.wantHash)
			}
		})
	}
}

// A node already tuned: nothing is written. Every name is read-only, so
// any write attempt would fail the call.
func TestConntrackTuningAlreadyTunedWritesNothing(t *testing.T) {
	sc := sysctl.NewFake(map[string]string{ctMax: "262144", ctEst: "86400", ctCloseWait: "3600", ctUDP: "30", ctUDPStream: "120", ctLiberal: "0"})
	hs := sysctl.NewFake(map[string]string{"hashsize": "65536"})
	for _, f := range []*sysctl.Fake{sc, hs} {
		for k := range f.Values {
			f.ReadOnly[k] = true
		}
	}
	if err := NewOptions().Conntrack.apply(sc, hs, 8); err != nil {
		t.Fatalf("tuned node: %v (a write was attempted)", err)
	}
}

// In a container without write access to /sys the hash table cannot
// grow: nf_conntrack_max is left as it is, the timeouts are still set,
// and it is not an error.
func TestConntrackTuningReadOnlyHashsize(t *testing.T) {
	sc := sysctl.NewFake(kernelDefaults())
	hs := sysctl.NewFake(map[string]string{"hashsize": "16384"})
	hs.ReadOnly["hashsize"] = true
	if err := NewOptions().Conntrack.apply(sc, hs, 8); err != nil {
		t.Fatalf("read-only hashsize is not an error: %v", err)
	}
	want := kernelDefaults()
	want[ctEst], want[ctCloseWait] = "86400", "3600"
	if !maps.Equal(sc.Values, want) {
		t.Errorf("sysctls\n got %v\nwant %v (nf_conntrack_max unchanged, timeouts set)", sc.Values, want)
	}
}

func TestConntrackTuningErrors(t *testing.T) {
	// nf_conntrack not loaded: no nf_conntrack_max to read.
	if err := NewOptions().Conntrack.apply(sysctl.NewFake(nil), sysctl.NewFake(nil), 4); err == nil {
		t.Error("missing nf_conntrack_max: no error")
	}
	// A read-only /proc/sys is an error, as in kube-proxy.
	sc := sysctl.NewFake(kernelDefaults())
	sc.ReadOnly[ctEst] = true
	if err := (conntrackTuning{TCPEstablished: time.Hour}).apply(sc, sysctl.NewFake(nil), 4); err == nil {
		t.Error("read-only sysctl: no error")
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-3\n": 4, "0-3,6,8-9": 7, "": 0, "x": 0, "3-1": 0} {
		if got := countCPUList(in); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", in, got, want)
		}
	}
	if numCPU() < 1 {
		t.Error("numCPU() < 1")
	}
}
