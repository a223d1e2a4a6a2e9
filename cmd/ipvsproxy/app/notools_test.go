package app

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
)

// logLines captures what klog logs until the test ends.
func logLines(t *testing.T) func() []string {
	t.Helper()
	var mu sync.Mutex
	var lines []string
	klog.SetLogger(funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{}))
	t.Cleanup(klog.ClearLogger)
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}

// In the nftables image (no iptables tools on the PATH) a command that
// needs them stops with one line that says what to do, whether the
// backend is detected or given.
func TestNoIPTablesToolsIsOneClearLine(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, backend := range []string{"auto", "nft", "legacy"} {
		o := NewOptions()
		o.IPTablesBackend = backend
		errs := map[string]error{}
		_, errs["iptablesBackend"] = iptablesBackend(o)
		_, errs["proxyIPTablesBackend"] = proxyIPTablesBackend(o)
		_, errs["ruleCleaners"] = ruleCleaners(o)
		for what, err := range errs {
			if backend != "auto" && what == "iptablesBackend" {
				continue // an explicit backend is not detected: nothing runs
			}
			if !errors.Is(err, iptables.ErrNoTools) || strings.Contains(err.Error(), "\n") ||
				!strings.Contains(err.Error(), "--rules-backend=nftables") {
				t.Errorf("--iptables-backend=%s: %s: %v; want ErrNoTools in one line naming --rules-backend=nftables", backend, what, err)
			}
		}
	}
}

// Starting the nftables backend without iptables tools on a node where
// the iptables backend ran (its ipsets are there): one warning line that
// says the chains stay and what to do; on a node where it never ran,
// nothing.
func TestIPTablesBackendLeftWarns(t *testing.T) {
	lines := logLines(t)
	if iptablesBackendLeft(ipset.NewFake()) {
		t.Error("a node without ipsets: reported the iptables backend's leftovers")
	}
	if len(lines()) != 0 {
		t.Errorf("a node without ipsets logged %q", lines())
	}
	n := fakenode.New(t, true, false)
	if !iptablesBackendLeft(n.IPSet) {
		t.Error("a node with ipvsproxy's ipsets: not reported")
	}
	got := lines()
	if len(got) != 1 || !strings.Contains(got[0], "ipvsproxy cleanup") || !strings.Contains(got[0], "default image") {
		t.Errorf("logged %q; want one line naming `ipvsproxy cleanup` and the default image", got)
	}
	// Foreign sets alone are no sign of it.
	other := ipset.NewFake()
	if err := other.EnsureSet(ipset.Set{Name: "MY-SET", Type: ipset.HashIP, Family: ipset.Inet}); err != nil {
		t.Fatal(err)
	}
	if iptablesBackendLeft(other) {
		t.Error("a foreign set was taken for the iptables backend's")
	}
}

// Without the tools the removal is tried once: every retry would wait for
// sets the chains still use.
func TestRetireWithoutToolsTriesOnce(t *testing.T) {
	calls := 0
	a := &afterFirstPass{what: "test", do: retireWithoutTools(func() error { calls++; return errors.New("set in use") })}
	a.run()
	a.run()
	if calls != 1 || !a.done {
		t.Errorf("%d attempts, done %t; want one attempt, done", calls, a.done)
	}
}
