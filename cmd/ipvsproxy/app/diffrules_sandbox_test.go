//go:build sandbox

package app

import (
	"errors"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/inspect"
	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
)

// On the real kernel, diff's nftables rule drift: none for a table the
// proxy's config just wrote (the comparison holds on what the kernel
// dumps, with the detector's CIDR matches in), and a hand flush of a
// chain listed in one line — and left as it is: diff writes nothing,
// the next Sync repairs it.
func TestSandboxDiffNFTablesDrift(t *testing.T) {
	sandboxtest.RequireRoot(t)
	switch err := nftrules.Probe(); {
	case errors.Is(err, nftrules.ErrUnsupported):
		t.Skipf("no inet nf_tables: %v", err)
	case err != nil:
		t.Fatal(err)
	}
	o := completed(t, "--rules-backend", "nftables", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56")
	v6 := kernelHasIPv6()
	if err := removeNFTablesBackend(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeNFTablesBackend() })
	drift := func() []inspect.Line {
		t.Helper()
		lines, err := ruleLines(o, nil, v6)
		if err != nil {
			t.Fatal(err)
		}
		return lines
	}
	if lines := drift(); len(lines) != 1 || lines[0].String() != "+ table inet "+nftrules.TableName {
		t.Errorf("drift without a table: %v", lines)
	}
	table, err := nftrules.New(nftablesConfig(o, o.parsed.detector, v6))
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if _, err := table.Sync(); err != nil {
		t.Fatal(err)
	}
	if lines := drift(); len(lines) != 0 {
		t.Fatalf("drift of a freshly synced table: %v", lines)
	}

	sandboxtest.Run(t, "nft", "flush", "chain", "inet", nftrules.TableName, "services")
	for range 2 { // twice: the first did not repair it
		lines := drift()
		if len(lines) != 1 || lines[0].Op != inspect.OpChanged || lines[0].Object != "nftables" ||
			lines[0].Text != "chain inet "+nftrules.TableName+" services" || !strings.HasPrefix(lines[0].Kernel, "0 rules, want ") {
			t.Fatalf("drift after nft flush chain: %v", lines)
		}
		if (inspect.Diff{Lines: lines}).Equal() {
			t.Error("a flushed chain, yet diff equal (exit 0)")
		}
	}
	if changed, err := table.Sync(); err != nil || !changed {
		t.Fatalf("Sync after the flush: changed %v, %v; want a repair", changed, err)
	}
	if lines := drift(); len(lines) != 0 {
		t.Errorf("drift after the repair: %v", lines)
	}
}
