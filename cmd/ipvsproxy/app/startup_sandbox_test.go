//go:build sandbox

package app

import (
	"os"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// TestSandboxConntrackTuning applies the settings to the real kernel (the
// sandbox runs as root, /sys writable): afterwards /proc/sys holds the
// configured values, the hash table grew to max/4, and a second run
// writes nothing (every name made read-only in a wrapper).
func TestSandboxConntrackTuning(t *testing.T) {
	sc := sysctl.New()
	hs := &sysctl.Proc{Root: hashsizeDir}
	c := conntrackTuning{MaxPerCore: 32768, Min: 131072, TCPEstablished: 24 * time.Hour, TCPCloseWait: time.Hour,
		UDP: 45 * time.Second, UDPStream: 3 * time.Minute, TCPBeLiberal: true}
	cpus := numCPU()
	if err := c.apply(sc, hs, cpus); err != nil {
		t.Fatal(err)
	}
	wantMax := max(131072, 32768*cpus)
	for name, want := range map[string]int{
		"net/netfilter/nf_conntrack_max":                     wantMax,
		"net/netfilter/nf_conntrack_tcp_timeout_established": 86400,
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  3600,
		"net/netfilter/nf_conntrack_udp_timeout":             45,
		"net/netfilter/nf_conntrack_udp_timeout_stream":      180,
		"net/netfilter/nf_conntrack_tcp_be_liberal":          1,
	} {
		if got, err := getInt(sc, name); err != nil || got != want {
			t.Errorf("%s = %d, %v; want %d", name, got, err, want)
		}
	}
	if got, err := getInt(hs, hashsizeName); err != nil || got < wantMax/4 {
		t.Errorf("hashsize = %d, %v; want at least %d", got, err, wantMax/4)
	}
	if err := c.apply(readOnlySysctl{sc}, readOnlySysctl{hs}, cpus); err != nil {
		t.Errorf("second run tried to write: %v", err)
	}
}

// readOnlySysctl refuses every write.
type readOnlySysctl struct{ sysctl.Interface }

func (readOnlySysctl) Set(name, _ string) error {
	return &os.PathError{Op: "write", Path: name, Err: os.ErrPermission}
}

func TestSandboxOOMScoreAdj(t *testing.T) {
	if !applyOOMScoreAdj(oomScoreAdjPath, -999) {
		t.Fatal("as root, setting oom_score_adj failed")
	}
	if b, _ := os.ReadFile(oomScoreAdjPath); string(b) != "-999\n" {
		t.Errorf("%s = %q, want -999", oomScoreAdjPath, b)
	}
}
