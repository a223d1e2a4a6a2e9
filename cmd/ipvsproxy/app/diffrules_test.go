package app

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ipvsproxy/ipvsproxy/inspect"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
)

// diffOf runs diff's output step over the table's drift: its exit code
// and what it printed.
func diffOf(t *testing.T, table tableDrifter, output string) (int, string) {
	t.Helper()
	lines, err := tableLines(table)
	if err != nil {
		t.Fatal(err)
	}
	var out, stderr bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	code := ExitCode(diffResult(cmd, inspect.Diff{Lines: lines}, output))
	if stderr.Len() > 0 {
		t.Errorf("stderr: %s", stderr.String())
	}
	return code, out.String()
}

// diff with --rules-backend=nftables: an intact table is equal (exit 0,
// nothing printed); a flushed chain and a foreign rule are listed, one
// line each (exit 1), and nothing is repaired.
func TestDiffNFTablesDrift(t *testing.T) {
	o := completed(t, "--rules-backend", "nftables")
	table, err := nftrules.NewFake(nftablesConfig(o, o.parsed.detector, true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := table.Sync(); err != nil {
		t.Fatal(err)
	}
	if code, out := diffOf(t, table, "text"); code != 0 || out != "" {
		t.Errorf("intact table: exit %d, output %q", code, out)
	}
	if code, out := diffOf(t, table, "json"); code != 0 || out != "{\n  \"equal\": true,\n  \"differences\": []\n}\n" {
		t.Errorf("intact table, json: exit %d, output %q", code, out)
	}
	if err := table.FlushChain("services"); err != nil {
		t.Fatal(err)
	}
	if err := table.AppendAccept("ipvs-filter"); err != nil {
		t.Fatal(err)
	}
	edited := table.String()
	code, out := diffOf(t, table, "text")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "~ chain inet ipvsproxy services  (kernel: 0 rules, want ") ||
		!strings.HasPrefix(lines[1], "~ chain inet ipvsproxy ipvs-filter  (kernel: ") {
		t.Errorf("edited table: exit %d, output:\n%s", code, out)
	}
	code, out = diffOf(t, table, "json")
	var got struct {
		Equal       bool
		Differences []inspect.Line
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if code != 1 || got.Equal || len(got.Differences) != 2 ||
		got.Differences[0].Op != "~" || got.Differences[0].Object != "nftables" ||
		got.Differences[0].Text != "chain inet ipvsproxy services" || !strings.HasPrefix(got.Differences[0].Kernel, "0 rules") {
		t.Errorf("edited table, json: exit %d, %+v", code, got)
	}
	if table.String() != edited || table.Count(nftrules.VerbSync) != 1 {
		t.Error("diff repaired the table")
	}
}

// The table diff compares with is the proxy's: its local-traffic
// detector (NodeCIDR from the Node's podCIDRs), masquerade bit and
// masquerade-all, so a table the proxy wrote shows no drift.
func TestDiffTableConfigIsTheProxys(t *testing.T) {
	o := completed(t, "--rules-backend", "nftables", "--detect-local-mode", "NodeCIDR", "--masquerade-all", "--iptables-masquerade-bit", "5")
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}}}
	proxyDetector, err := localDetector(t.Context(), o, fake.NewClientset(node), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	toolDet, err := toolDetector(o, node)
	if err != nil {
		t.Fatal(err)
	}
	want := nftablesConfig(o, proxyDetector, true)
	if got := nftablesConfig(o, toolDet, true); !reflect.DeepEqual(got, want) {
		t.Errorf("diff's table config %+v, the proxy's %+v", got, want)
	}
	if want.MasqueradeBit != 5 || !want.MasqueradeAll || want.LocalDetector.Mode != iptables.LocalModeNodeCIDR ||
		len(want.LocalDetector.NodeCIDRs) != 2 || want.LocalDetector.NodeCIDRs[0] != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("config %+v: flags not taken", want)
	}
	// Without podCIDRs the proxy writes no rules yet: diff says so.
	if _, err := toolDetector(o, &v1.Node{}); err == nil || !strings.Contains(err.Error(), "podCIDRs") {
		t.Errorf("NodeCIDR without podCIDRs: %v", err)
	}
	if _, err := ruleLines(o, nil, true); err == nil || !strings.Contains(err.Error(), "podCIDRs") {
		t.Errorf("ruleLines without a Node: %v", err)
	}
}
