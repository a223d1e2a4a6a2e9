package iptables

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvsproxy/ipvsproxy/owned"
)

// testCase is a configuration and the iptables-save output it must give.
type testCase struct {
	name   string
	cfg    Config
	nat    string
	filter string
}

// clusterIPMasqV4 is the ClusterIP masquerade rule of natV4Default; the
// variants below replace exactly this line (and the mark/SNAT lines).
const clusterIPMasqV4 = `-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ`

// natV4With returns natV4Default with the ClusterIP masquerade rule
// replaced by rule.
func natV4With(rule string) string {
	return strings.Replace(natV4Default, clusterIPMasqV4, rule, 1)
}

func mustIfName(parse func(string) (InterfaceName, error), s string) InterfaceName {
	n, err := parse(s)
	if err != nil {
		panic(err)
	}
	return n
}

func testCases() []testCase {
	v4cidr := DefaultConfig(IPv4)
	v4cidr.RandomFully = true
	// The IPv6 prefix must be ignored by the IPv4 syncer; 10.244.1.0/16
	// is written masked, as iptables stores it.
	v4cidr.LocalDetector.ClusterCIDRs = []netip.Prefix{
		netip.MustParsePrefix("fd00:10:244::/56"), netip.MustParsePrefix("10.244.1.0/16")}
	natV4CIDRRandomFully := strings.Replace(natV4With(
		`-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`),
		`requiring SNAT" -j MASQUERADE
`, `requiring SNAT" -j MASQUERADE --random-fully
`, 1)

	v4all := DefaultConfig(IPv4)
	v4all.MasqueradeAll = true
	v4all.MasqueradeBit = 0
	// MasqueradeAll wins over any detector, as in kube-proxy.
	v4all.LocalDetector = LocalDetector{Mode: LocalModeBridgeInterface, BridgeInterface: mustIfName(ParseInterfaceName, "cbr0")}
	natV4MasqAllBit0 := strings.ReplaceAll(natV4With(
		`-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`),
		"0x4000", "0x1")

	// NodeCIDR uses the node's pod CIDR and ignores the cluster CIDR.
	v4node := DefaultConfig(IPv4)
	v4node.LocalDetector = LocalDetector{Mode: LocalModeNodeCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodeCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}}
	natV4NodeCIDR := natV4With(
		`-A KUBE-SERVICES ! -s 10.244.3.0/24 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`)

	v4bridge := DefaultConfig(IPv4)
	v4bridge.LocalDetector = LocalDetector{Mode: LocalModeBridgeInterface, BridgeInterface: mustIfName(ParseInterfaceName, "cbr0")}
	natV4Bridge := natV4With(
		`-A KUBE-SERVICES ! -i cbr0 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`)

	v4prefix := DefaultConfig(IPv4)
	v4prefix.LocalDetector = LocalDetector{Mode: LocalModeInterfaceNamePrefix, InterfaceNamePrefix: mustIfName(ParseInterfaceNamePrefix, "veth")}
	natV4Prefix := natV4With(
		`-A KUBE-SERVICES ! -i veth+ -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`)

	v6 := DefaultConfig(IPv6)
	v6.MasqueradeBit = 31
	v6.LocalDetector.ClusterCIDRs = []netip.Prefix{
		netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}

	v6prefix := v6
	v6prefix.LocalDetector = LocalDetector{Mode: LocalModeInterfaceNamePrefix, InterfaceNamePrefix: mustIfName(ParseInterfaceNamePrefix, "lxc")}
	natV6Prefix := strings.Replace(natV6CIDRBit31, "! -s fd00:10:244::/56 ", "! -i lxc+ ", 1)

	return []testCase{
		{"ipv4 defaults, no cluster CIDR", DefaultConfig(IPv4), natV4Default, filterV4Bit14},
		{"ipv4 cluster CIDR, random-fully", v4cidr, natV4CIDRRandomFully, filterV4Bit14},
		{"ipv4 masquerade-all, bit 0", v4all, natV4MasqAllBit0, strings.ReplaceAll(filterV4Bit14, "0x4000", "0x1")},
		{"ipv4 NodeCIDR", v4node, natV4NodeCIDR, filterV4Bit14},
		{"ipv4 BridgeInterface", v4bridge, natV4Bridge, filterV4Bit14},
		{"ipv4 InterfaceNamePrefix", v4prefix, natV4Prefix, filterV4Bit14},
		{"ipv6 cluster CIDR, bit 31", v6, natV6CIDRBit31, filterV6Bit31},
		{"ipv6 InterfaceNamePrefix, bit 31", v6prefix, natV6Prefix, filterV6Bit31},
	}
}

func mustSyncer(t *testing.T, r SaveRestorer, cfg Config) *Syncer {
	t.Helper()
	s, err := NewSyncer(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustSave(t *testing.T, r SaveRestorer, table string) string {
	t.Helper()
	b, err := r.Save(table)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkTables compares every table the Syncer writes with the wanted
// iptables-save text. The mangle table is the same for every
// configuration of a family: it is only passed when it should differ.
func checkTables(t *testing.T, r SaveRestorer, nat, filter string, mangleOther ...string) {
	t.Helper()
	mangle := mangleV4
	if r.Family() == IPv6 {
		mangle = mangleV6
	}
	if len(mangleOther) > 0 {
		mangle = mangleOther[0]
	}
	if d := cmp.Diff(nat, mustSave(t, r, TableNAT)); d != "" {
		t.Errorf("nat table (-want +got):\n%s", d)
	}
	if d := cmp.Diff(filter, mustSave(t, r, TableFilter)); d != "" {
		t.Errorf("filter table (-want +got):\n%s", d)
	}
	if d := cmp.Diff(mangle, mustSave(t, r, TableMangle)); d != "" {
		t.Errorf("mangle table (-want +got):\n%s", d)
	}
}

// Tables holding only their builtin chains, as iptables-save prints them.
const (
	emptyFilter = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
	emptyMangle = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
)

// tablesWritten is how many tables a Syncer writes: one save each per
// Sync, one restore each when all differ.
const tablesWritten = 3

func TestSyncWritesExpectedRules(t *testing.T) {
	for _, tc := range testCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFakeRunner(tc.cfg.Family)
			// Exactly the sets the engine creates: the rules name no other.
			f.SetKnownSets(owned.SetNames(tc.cfg.Family == IPv4, tc.cfg.Family == IPv6)...)
			s := mustSyncer(t, f, tc.cfg)
			changed, err := s.Sync()
			if err != nil || !changed {
				t.Fatalf("first Sync = %v, %v; want true, nil", changed, err)
			}
			if f.RestoreCount() != tablesWritten {
				t.Errorf("first Sync: %d restores, want %d (one per table)", f.RestoreCount(), tablesWritten)
			}
			checkTables(t, f, tc.nat, tc.filter)

			f.ResetCounts()
			changed, err = s.Sync()
			if err != nil || changed {
				t.Fatalf("second Sync = %v, %v; want false, nil", changed, err)
			}
			if f.RestoreCount() != 0 || f.SaveCount() != tablesWritten {
				t.Errorf("second Sync: %d restores, %d saves; want 0 and %d", f.RestoreCount(), f.SaveCount(), tablesWritten)
			}
		})
	}
}

func TestSyncRepairsDrift(t *testing.T) {
	const servicesOnly = natV4RestoreChains
	drifts := []struct {
		name      string
		drift     func(f *FakeRunner) error
		wantInput string
	}{
		{"KUBE-SERVICES flushed", func(f *FakeRunner) error { return f.FlushChain(TableNAT, ChainServices) },
			servicesOnly + "COMMIT\n"},
		{"PREROUTING jump deleted", func(f *FakeRunner) error {
			return f.DeleteRule(TableNAT, "PREROUTING", `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		}, servicesOnly + "-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n"},
		{"PREROUTING jump duplicated", func(f *FakeRunner) error {
			return f.Apply("*nat\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n")
		}, servicesOnly +
			"-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
			"-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
			"-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n"},
		{"foreign rule appended to KUBE-SERVICES", func(f *FakeRunner) error {
			return f.Apply("*nat\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n")
		}, servicesOnly + "COMMIT\n"},
	}
	for _, d := range drifts {
		t.Run(d.name, func(t *testing.T) {
			f := NewFakeRunner(IPv4)
			s := mustSyncer(t, f, DefaultConfig(IPv4))
			if _, err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := d.drift(f); err != nil {
				t.Fatal(err)
			}
			f.ResetCounts()
			changed, err := s.Sync()
			if err != nil || !changed {
				t.Fatalf("Sync after drift = %v, %v; want true, nil", changed, err)
			}
			// Only the nat table drifted: exactly one restore, for nat.
			if diff := cmp.Diff([]string{d.wantInput}, f.RestoreInputs()); diff != "" {
				t.Errorf("restore input (-want +got):\n%s", diff)
			}
			checkTables(t, f, natV4Default, filterV4Bit14)
		})
	}
}

func TestSyncRecreatesDeletedChain(t *testing.T) {
	f := NewFakeRunner(IPv4)
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// Deleting KUBE-FORWARD also removes the FORWARD jump to it.
	if err := f.DeleteChain(TableFilter, ChainForward); err != nil {
		t.Fatal(err)
	}
	f.ResetCounts()
	if changed, err := s.Sync(); err != nil || !changed {
		t.Fatalf("Sync = %v, %v", changed, err)
	}
	if f.RestoreCount() != 1 {
		t.Errorf("%d restores, want 1", f.RestoreCount())
	}
	// The missing jump goes back on top; the present one stays put.
	checkTables(t, f, natV4Default, strings.Replace(filterV4Bit14,
		`-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
`, `-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
`, 1))
}

// foreign is other software's state in the same tables and chains.
const foreign = `*nat
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
COMMIT
*filter
:FORWARD DROP [0:0]
:CNI-FORWARD - [0:0]
-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
*mangle
-A POSTROUTING -o eth0 -p udp -m udp --dport 4789 -j MARK --set-xmark 0x10/0x10
COMMIT
`

func TestSyncAndCleanupKeepForeignRules(t *testing.T) {
	f := NewFakeRunner(IPv4)
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	before := f.String()
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	wantNat := strings.NewReplacer(
		":KUBE-LOAD-BALANCER", ":DOCKER - [0:0]\n:KUBE-LOAD-BALANCER",
		"-A OUTPUT", "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A OUTPUT",
		"-A KUBE-LOAD-BALANCER -m comment", "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\n-A DOCKER -i docker0 -j RETURN\n-A KUBE-LOAD-BALANCER -m comment",
	).Replace(natV4Default)
	// Our jumps go on top of the foreign rules, in kube-proxy's order.
	wantFilter := strings.NewReplacer(
		":FORWARD ACCEPT", ":FORWARD DROP",
		":KUBE-FORWARD", ":CNI-FORWARD - [0:0]\n:KUBE-FORWARD",
		`-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
`, `-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
`,
		`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
`, `-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
`,
	).Replace(filterV4Bit14)
	wantMangle := strings.Replace(mangleV4, "-A KUBE-PROXY-FIREWALL", "-A POSTROUTING -o eth0 -p udp -m udp --dport 4789 -j MARK --set-xmark 0x10/0x10\n-A KUBE-PROXY-FIREWALL", 1)
	checkTables(t, f, wantNat, wantFilter, wantMangle)

	f.ResetCounts()
	if changed, err := s.Sync(); err != nil || changed || f.RestoreCount() != 0 {
		t.Fatalf("steady Sync = %v, %v with %d restores", changed, err, f.RestoreCount())
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(before, f.String()); d != "" {
		t.Errorf("after Cleanup (-before +after):\n%s", d)
	}
	f.ResetCounts()
	if err := s.Cleanup(); err != nil || f.RestoreCount() != 0 {
		t.Errorf("second Cleanup = %v with %d restores; want nil and 0", err, f.RestoreCount())
	}
}

func TestCleanupKeepsChainsReferencedByForeignRules(t *testing.T) {
	f := NewFakeRunner(IPv4)
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// Someone else marks traffic for masquerading through our chain.
	if err := f.Apply("*nat\n:CNI-HOSTPORT - [0:0]\n-A CNI-HOSTPORT -j KUBE-MARK-MASQ\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	err := s.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "kept KUBE-MARK-MASQ in nat table") {
		t.Fatalf("Cleanup error = %v; want it to report the kept KUBE-MARK-MASQ", err)
	}
	want := `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A CNI-HOSTPORT -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
COMMIT
`
	checkTables(t, f, want, emptyFilter, emptyMangle)
}

func TestSyncNeedsSets(t *testing.T) {
	f := NewFakeRunner(IPv4)
	f.SetKnownSets() // the engine has not created its sets yet
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	changed, err := s.Sync()
	// Every table matches on sets, so every restore fails whole.
	if err == nil || changed ||
		!strings.Contains(err.Error(), "set KUBE-LOAD-BALANCER doesn't exist") ||
		!strings.Contains(err.Error(), "set KUBE-HEALTH-CHECK-NODE-PORT doesn't exist") {
		t.Fatalf("Sync = %v, %v; want no change and a missing-set error per table", changed, err)
	}
	checkTables(t, f, "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n",
		emptyFilter, emptyMangle)
	// One set missing is enough to refuse a table.
	names := owned.SetNames(true, false)
	f.SetKnownSets(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == owned.SetIPVSIPs })...)
	if changed, err := s.Sync(); !changed || err == nil || !strings.Contains(err.Error(), "set KUBE-IPVS-IPS doesn't exist") {
		t.Fatalf("Sync = %v, %v; want nat written and filter refused", changed, err)
	}
	f.SetKnownSets(names...)
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	checkTables(t, f, natV4Default, filterV4Bit14)
}

func TestSyncErrors(t *testing.T) {
	f := NewFakeRunner(IPv4)
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	undo := f.FailOn(VerbRestore, nil, errString("iptables-restore: line 3 failed"))
	changed, err := s.Sync()
	if changed || err == nil || !strings.Contains(err.Error(), "restore nat table: iptables-restore: line 3 failed") {
		t.Fatalf("Sync = %v, %v", changed, err)
	}
	undo()
	undo = f.FailOn(VerbSave, func(c Call) bool { return c.Table == TableFilter }, errString("boom"))
	changed, err = s.Sync()
	if !changed || err == nil || !strings.Contains(err.Error(), "save filter table: boom") {
		t.Fatalf("Sync = %v, %v; want nat written and the filter save error", changed, err)
	}
	undo()
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	checkTables(t, f, natV4Default, filterV4Bit14)
}

type errString string

func (e errString) Error() string { return string(e) }

func TestConcurrentSync(t *testing.T) {
	f := NewFakeRunner(IPv4)
	s := mustSyncer(t, f, DefaultConfig(IPv4))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := s.Sync(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if f.RestoreCount() != tablesWritten {
		t.Errorf("%d restores; Sync calls must serialise so only the first writes", f.RestoreCount())
	}
	checkTables(t, f, natV4Default, filterV4Bit14)
}

func TestConfigValidation(t *testing.T) {
	bad := map[string]func(c *Config){
		"bit 32":            func(c *Config) { c.MasqueradeBit = 32 },
		"negative bit":      func(c *Config) { c.MasqueradeBit = -1 },
		"set name space":    func(c *Config) { c.ClusterIPSet = "KUBE CLUSTER" },
		"set name quote":    func(c *Config) { c.LoopBackSet = `X"Y` },
		"set name too long": func(c *Config) { c.LoopBackSet = strings.Repeat("A", 32) },
		"two v4 CIDRs": func(c *Config) {
			c.LocalDetector.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}
		},
		"invalid CIDR": func(c *Config) { c.LocalDetector.ClusterCIDRs = []netip.Prefix{{}} },
		"family":       func(c *Config) { c.Family = 5 },
	}
	for name, mutate := range bad {
		c := DefaultConfig(IPv4)
		mutate(&c)
		if _, err := NewSyncer(NewFakeRunner(IPv4), c); err == nil {
			t.Errorf("%s: NewSyncer accepted %+v", name, c)
		}
	}
	if _, err := NewSyncer(NewFakeRunner(IPv6), DefaultConfig(IPv4)); err == nil {
		t.Error("NewSyncer accepted an IPv6 runner with an IPv4 config")
	}
	// Empty set names take the family's defaults.
	c := Config{Family: IPv6, MasqueradeBit: 14}
	f := NewFakeRunner(IPv6)
	if _, err := mustSyncer(t, f, c).Sync(); err != nil {
		t.Fatal(err)
	}
	if got := mustSave(t, f, TableNAT); !strings.Contains(got, "KUBE-6-CLUSTER-IP dst,dst -j ACCEPT") {
		t.Errorf("IPv6 default set name not used:\n%s", got)
	}
}

func TestWarnings(t *testing.T) {
	for _, tc := range testCases() {
		want := tc.name == "ipv4 defaults, no cluster CIDR"
		if got := len(tc.cfg.Warnings()) > 0; got != want {
			t.Errorf("%s: warnings %q", tc.name, tc.cfg.Warnings())
		}
	}
}

type proberRunner struct {
	*FakeRunner
	ok bool
}

func (p proberRunner) HasRandomFully() bool { return p.ok }

func TestSupportsRandomFully(t *testing.T) {
	f := NewFakeRunner(IPv4)
	if SupportsRandomFully(f) || !SupportsRandomFully(proberRunner{f, true}) || SupportsRandomFully(proberRunner{f, false}) {
		t.Error("SupportsRandomFully must follow the runner's probe and default to false")
	}
}
