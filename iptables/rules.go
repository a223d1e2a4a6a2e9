package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Table names ipvsproxy writes to.
const (
	TableNAT    = "nat"
	TableFilter = "filter"
)

// Chain names. They are kube-proxy's (IPVS mode) so that an operator
// migrating from it finds the same names in iptables-save, and so that
// a node handed over from kube-proxy is adopted rather than duplicated.
const (
	ChainServices     = "KUBE-SERVICES"      // nat, from PREROUTING and OUTPUT
	ChainPostrouting  = "KUBE-POSTROUTING"   // nat, from POSTROUTING
	ChainMarkMasq     = "KUBE-MARK-MASQ"     // nat, sets the masquerade bit
	ChainNodePort     = "KUBE-NODE-PORT"     // nat, empty until NodePort support
	ChainLoadBalancer = "KUBE-LOAD-BALANCER" // nat, empty until LoadBalancer support
	ChainForward      = "KUBE-FORWARD"       // filter, from FORWARD
)

// Comments as kube-proxy writes them; operators grep for these.
const (
	commentServicePortals   = "kubernetes service portals"
	commentPostrouting      = "kubernetes postrouting rules"
	commentForward          = "kubernetes forwarding rules"
	commentForwardConntrack = "kubernetes forwarding conntrack rule"
	commentSNAT             = "kubernetes service traffic requiring SNAT"
	commentClusterIPSet     = "Kubernetes service cluster ip + port for masquerade purpose"
	commentLoopBackSet      = "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"
)

// Base ipset names (IPv4 spelling); SetName derives the IPv6 twin.
const (
	SetClusterIP = "KUBE-CLUSTER-IP"
	SetLoopBack  = "KUBE-LOOP-BACK"
)

// DefaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit default:
// mark 0x4000.
const DefaultMasqueradeBit = 14

// LocalDetector tells traffic that originates in the cluster from traffic
// that does not. For now only kube-proxy's ClusterCIDR mode exists.
type LocalDetector struct {
	// ClusterCIDRs: traffic to a ClusterIP from outside these ranges is
	// masqueraded. At most one prefix per family (an iptables rule can
	// negate one source range); prefixes of the other family are ignored,
	// so the same list can be handed to the IPv4 and the IPv6 Syncer.
	ClusterCIDRs []netip.Prefix
}

// Config is what the rules depend on. Build it with DefaultConfig and
// change fields; every field is validated before any rule text is made,
// so no unchecked string reaches iptables-restore.
type Config struct {
	// Family must match the Runner's family.
	Family Family
	// MasqueradeBit (0-31) is the fwmark bit that asks KUBE-POSTROUTING to
	// masquerade. Taken literally (0 is a valid bit, as in kube-proxy):
	// DefaultConfig sets 14.
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// LocalDetector decides which ClusterIP traffic is masqueraded when
	// MasqueradeAll is off. With no cluster CIDR for this family it does
	// what kube-proxy does (after logging a warning): it can't tell
	// off-cluster traffic, so it only masquerades traffic whose source is
	// itself a service VIP (node-originated connections that picked a
	// kube-ipvs0 address as source), matched as KUBE-CLUSTER-IP src,dst.
	LocalDetector LocalDetector
	// RandomFully adds --random-fully to MASQUERADE. Set it from
	// SupportsRandomFully(runner): iptables older than 1.6.2 rejects it.
	RandomFully bool
	// ClusterIPSet and LoopBackSet name the ipsets the rules match on.
	// Empty means SetName(SetClusterIP|SetLoopBack, Family).
	ClusterIPSet string
	LoopBackSet  string
}

// DefaultConfig returns kube-proxy's defaults for family.
func DefaultConfig(family Family) Config {
	return Config{
		Family:        family,
		MasqueradeBit: DefaultMasqueradeBit,
		ClusterIPSet:  SetName(SetClusterIP, family),
		LoopBackSet:   SetName(SetLoopBack, family),
	}
}

// SetName returns kube-proxy's name of a set for family: the IPv6 twin of
// "KUBE-X" is "KUBE-6-X", cut to ipset's 31 characters.
func SetName(base string, family Family) string {
	if family == IPv6 && strings.HasPrefix(base, "KUBE-") {
		base = "KUBE-6-" + strings.TrimPrefix(base, "KUBE-")
	}
	if len(base) > 31 {
		base = base[:31]
	}
	return base
}

// setNameRE is deliberately narrower than what ipset allows: names end up
// as iptables-restore words.
var setNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,30}$`)

// withDefaults fills empty set names.
func (c Config) withDefaults() Config {
	if c.ClusterIPSet == "" {
		c.ClusterIPSet = SetName(SetClusterIP, c.Family)
	}
	if c.LoopBackSet == "" {
		c.LoopBackSet = SetName(SetLoopBack, c.Family)
	}
	return c
}

// Validate reports the first problem with c (after filling defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.Family != IPv4 && c.Family != IPv6 {
		return fmt.Errorf("iptables: invalid family %d", c.Family)
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("iptables: masquerade bit %d not in [0, 31]", c.MasqueradeBit)
	}
	for _, n := range []string{c.ClusterIPSet, c.LoopBackSet} {
		if !setNameRE.MatchString(n) {
			return fmt.Errorf("iptables: invalid ipset name %q", n)
		}
	}
	if _, err := c.clusterCIDR(); err != nil {
		return err
	}
	return nil
}

// Warnings lists what an operator should hear about c at start-up; the
// caller logs them (kube-proxy warns the same way when the cluster CIDR
// is unset).
func (c Config) Warnings() []string {
	if cidr, err := c.clusterCIDR(); err == nil && !cidr.IsValid() && !c.MasqueradeAll {
		return []string{fmt.Sprintf("no IPv%d cluster CIDR: cannot tell off-cluster traffic to ClusterIPs, "+
			"only traffic sourced from a service VIP is masqueraded", c.Family)}
	}
	return nil
}

// clusterCIDR returns the (masked) cluster CIDR of c's family, if any.
func (c Config) clusterCIDR() (netip.Prefix, error) {
	var found netip.Prefix
	for _, p := range c.LocalDetector.ClusterCIDRs {
		if !p.IsValid() {
			return netip.Prefix{}, fmt.Errorf("iptables: invalid cluster CIDR %v", p)
		}
		if p.Addr().Is4() != (c.Family == IPv4) {
			continue
		}
		if found.IsValid() {
			return netip.Prefix{}, fmt.Errorf("iptables: more than one IPv%d cluster CIDR (%v, %v)", c.Family, found, p)
		}
		// iptables stores the masked network; write it that way so the
		// saved rule compares equal.
		found = p.Masked()
	}
	return found, nil
}

// chainSpec is an owned chain and its complete rule list (words after
// "-A CHAIN"), in order.
type chainSpec struct {
	name  string
	rules [][]string
}

// jumpSpec is a rule ipvsproxy keeps in a builtin chain it does not own.
type jumpSpec struct {
	from string
	rule []string
}

// tableSpec is everything ipvsproxy wants in one table.
type tableSpec struct {
	name   string
	chains []chainSpec
	jumps  []jumpSpec
}

// wanted is the full, fixed rule set for c. c must be valid. Rules are
// written in the canonical form iptables-save prints them back in (for
// instance "-j MARK --set-xmark 0x4000/0x4000", which is what kube-proxy's
// "--or-mark 0x4000" reads back as), so that comparing saved and wanted
// rules is a plain word-by-word comparison.
func (c Config) wanted() []tableSpec {
	return []tableSpec{c.natTable(), c.filterTable()}
}

// mark returns the masquerade mark value, e.g. "0x4000".
func (c Config) mark() string { return fmt.Sprintf("%#x", uint32(1)<<c.MasqueradeBit) }

func (c Config) natTable() tableSpec {
	return tableSpec{
		name: TableNAT,
		chains: []chainSpec{
			{ChainServices, c.servicesRules()},
			{ChainPostrouting, c.postroutingRules()},
			// Declared now so a later NodePort/LoadBalancer change only adds
			// rules (here and in servicesRules), never new chains to adopt.
			{ChainNodePort, nil},
			{ChainLoadBalancer, nil},
			{ChainMarkMasq, [][]string{{"-j", "MARK", "--set-xmark", c.mark() + "/" + c.mark()}}},
		},
		jumps: []jumpSpec{
			{"OUTPUT", jumpRule(commentServicePortals, ChainServices)},
			{"PREROUTING", jumpRule(commentServicePortals, ChainServices)},
			{"POSTROUTING", jumpRule(commentPostrouting, ChainPostrouting)},
		},
	}
}

func jumpRule(comment, to string) []string {
	return []string{"-m", "comment", "--comment", comment, "-j", to}
}

// servicesRules is KUBE-SERVICES: decide masquerading for ClusterIP
// traffic, then accept it so other software's filter rules further down
// PREROUTING/OUTPUT cannot break IPVS.
func (c Config) servicesRules() [][]string {
	loopback := "127.0.0.0/8"
	if c.Family == IPv6 {
		loopback = "::1/128"
	}
	// Connections to localhost never reach IPVS; leave them alone early.
	rules := [][]string{{"-s", loopback, "-j", "RETURN"}}
	clusterSet := []string{"-m", "comment", "--comment", commentClusterIPSet, "-m", "set", "--match-set", c.ClusterIPSet}
	cidr, _ := c.clusterCIDR()
	switch {
	case c.MasqueradeAll:
		rules = append(rules, concat(clusterSet, "dst,dst", "-j", ChainMarkMasq))
	case cidr.IsValid():
		// Off-cluster clients reaching a ClusterIP (static route to the
		// service range) may be answered from another node: masquerade.
		// iptables-save prints the source match first.
		rules = append(rules, concat(concat([]string{"!", "-s", cidr.String()}, clusterSet...), "dst,dst", "-j", ChainMarkMasq))
	default:
		// The node picks a kube-ipvs0 VIP as source when it connects to a
		// VIP; such VIP:port -> VIP:port traffic must be masqueraded.
		rules = append(rules, concat(clusterSet, "src,dst", "-j", ChainMarkMasq))
	}
	// NodePort and LoadBalancer dispatch (addrtype LOCAL -> KUBE-NODE-PORT,
	// LB set -> KUBE-LOAD-BALANCER) goes here when those services land.
	return append(rules, []string{"-m", "set", "--match-set", c.ClusterIPSet, "dst,dst", "-j", "ACCEPT"})
}

// postroutingRules is KUBE-POSTROUTING: hairpin traffic (a pod reaching
// itself through a service) and marked traffic get masqueraded; the mark
// is cleared first so a packet that traverses the stack again is not
// masqueraded twice.
func (c Config) postroutingRules() [][]string {
	mm := c.mark() + "/" + c.mark()
	masq := []string{"-m", "comment", "--comment", commentSNAT, "-j", "MASQUERADE"}
	if c.RandomFully {
		masq = append(masq, "--random-fully")
	}
	return [][]string{
		{"-m", "comment", "--comment", commentLoopBackSet, "-m", "set", "--match-set", c.LoopBackSet, "dst,dst,src", "-j", "MASQUERADE"},
		{"-m", "mark", "!", "--mark", mm, "-j", "RETURN"},
		// kube-proxy writes "--xor-mark 0x4000"; this is its saved form.
		{"-j", "MARK", "--set-xmark", c.mark() + "/0x0"},
		masq,
	}
}

// filterTable is KUBE-FORWARD: let marked (service) traffic and its
// replies through even when the FORWARD policy is DROP.
func (c Config) filterTable() tableSpec {
	mm := c.mark() + "/" + c.mark()
	return tableSpec{
		name: TableFilter,
		chains: []chainSpec{{ChainForward, [][]string{
			{"-m", "comment", "--comment", commentForward, "-m", "mark", "--mark", mm, "-j", "ACCEPT"},
			{"-m", "comment", "--comment", commentForwardConntrack, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		}}},
		jumps: []jumpSpec{{"FORWARD", jumpRule(commentForward, ChainForward)}},
	}
}

func concat(a []string, b ...string) []string {
	return append(slices.Clone(a), b...)
}

// Syncer keeps ipvsproxy's fixed rules in one family's tables.
//
// Precondition: the ipsets named in Config exist before Sync (the kernel
// refuses a rule on a missing set, failing the whole table). The engine
// creates its sets first; Cleanup runs before the sets are destroyed.
type Syncer struct {
	mu     sync.Mutex // one Sync or Cleanup at a time: each is save-then-restore
	runner Runner
	want   []tableSpec
}

// NewSyncer validates cfg and returns a Syncer writing through r.
func NewSyncer(r Runner, cfg Config) (*Syncer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if r.Family() != cfg.Family {
		return nil, fmt.Errorf("iptables: runner is IPv%d, config is IPv%d", r.Family(), cfg.Family)
	}
	return &Syncer{runner: r, want: cfg.wanted()}, nil
}

// Sync makes the kernel match the wanted rules. Per table it saves once
// and compares the owned chains and the jump rules (each present exactly
// once in its builtin chain); only a table that differs gets one Restore,
// which declares (flushes) and rewrites all owned chains of that table
// and fixes the jumps. A steady node therefore spawns only the saves.
// Tables are independent: a failure in one does not stop the other, and
// the errors are joined. changed reports whether any Restore succeeded.
func (s *Syncer) Sync() (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, want := range s.want {
		cur, err := s.load(want.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		input := syncInput(cur, want)
		if input == "" {
			continue
		}
		if err := s.runner.Restore([]byte(input)); err != nil {
			errs = append(errs, fmt.Errorf("iptables: restore %s table: %w", want.name, err))
			continue
		}
		changed = true
	}
	return changed, errors.Join(errs...)
}

func (s *Syncer) load(table string) (*tableState, error) {
	data, err := s.runner.Save(table)
	if err != nil {
		return nil, fmt.Errorf("iptables: save %s table: %w", table, err)
	}
	cur, err := parseSave(table, data)
	if err != nil {
		return nil, fmt.Errorf("iptables: %s table: %w", table, err)
	}
	return cur, nil
}

// syncInput returns the restore input that brings cur to want, or "" when
// nothing differs.
func syncInput(cur *tableState, want tableSpec) string {
	dirty := false
	for _, ch := range want.chains {
		c, ok := cur.chains[ch.name]
		if !ok || !slices.EqualFunc(c.rules, ch.rules, slices.Equal) {
			dirty = true
		}
	}
	var fixes []string
	for _, j := range want.jumps {
		n := countRule(cur.chains[j.from], j.rule)
		if n == 1 {
			// Present once: left where it is. kube-proxy only prepends a
			// missing jump too; moving it back to the top on every sync
			// would fight other agents that also insert at the top.
			continue
		}
		dirty = true
		// Duplicates are all removed (by rule spec, never by index, so a
		// concurrent foreign edit cannot make us delete the wrong rule)
		// and one copy goes back to the top.
		for range n {
			fixes = append(fixes, formatRule("-D", j.from, j.rule))
		}
		fixes = append(fixes, formatRule("-I", j.from, concat([]string{"1"}, j.rule...)))
	}
	if !dirty {
		return ""
	}
	var b strings.Builder
	b.WriteString("*" + want.name + "\n")
	for _, ch := range want.chains {
		b.WriteString(":" + ch.name + " - [0:0]\n")
	}
	for _, ch := range want.chains {
		for _, r := range ch.rules {
			b.WriteString(formatRule("-A", ch.name, r) + "\n")
		}
	}
	for _, f := range fixes {
		b.WriteString(f + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func countRule(c *chainState, rule []string) int {
	if c == nil {
		return 0
	}
	n := 0
	for _, r := range c.rules {
		if slices.Equal(r, rule) {
			n++
		}
	}
	return n
}

// Cleanup removes ipvsproxy's jump rules and chains and nothing else. A
// chain that a foreign rule still jumps to (directly or through another
// kept chain) cannot be deleted without touching that rule, so it is left
// intact and reported in the returned error; everything else is removed.
func (s *Syncer) Cleanup() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, want := range s.want {
		cur, err := s.load(want.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		input, kept := cleanupInput(cur, want)
		if input != "" {
			if err := s.runner.Restore([]byte(input)); err != nil {
				errs = append(errs, fmt.Errorf("iptables: cleanup %s table: %w", want.name, err))
				continue
			}
		}
		if len(kept) > 0 {
			errs = append(errs, fmt.Errorf("iptables: kept %s in %s table: still referenced by rules ipvsproxy does not own",
				strings.Join(kept, ", "), want.name))
		}
	}
	return errors.Join(errs...)
}

// cleanupInput returns the restore input removing want's jumps and chains
// from cur ("" if none is there) and the owned chains it must keep.
func cleanupInput(cur *tableState, want tableSpec) (string, []string) {
	owned := map[string]bool{}
	for _, ch := range want.chains {
		if _, ok := cur.chains[ch.name]; ok {
			owned[ch.name] = true
		}
	}
	kept := keptChains(cur, want, owned)
	var lines, deletes []string
	for _, j := range want.jumps {
		for range countRule(cur.chains[j.from], j.rule) {
			lines = append(lines, formatRule("-D", j.from, j.rule))
		}
	}
	// Declaring flushes every chain first, so references between our own
	// chains are gone by the time the -X lines run.
	for _, ch := range want.chains {
		if owned[ch.name] && !slices.Contains(kept, ch.name) {
			lines = append(lines, ":"+ch.name+" - [0:0]")
			deletes = append(deletes, "-X "+ch.name)
		}
	}
	lines = append(lines, deletes...)
	if len(lines) == 0 {
		return "", kept
	}
	return "*" + want.name + "\n" + strings.Join(lines, "\n") + "\nCOMMIT\n", kept
}

// keptChains returns the owned chains targeted by foreign rules (rules
// outside owned chains other than our jumps), closed over the rules of
// the kept chains themselves, sorted.
func keptChains(cur *tableState, want tableSpec, owned map[string]bool) []string {
	isOurJump := func(chain string, r []string) bool {
		for _, j := range want.jumps {
			if j.from == chain && slices.Equal(j.rule, r) {
				return true
			}
		}
		return false
	}
	kept := map[string]bool{}
	var queue []string
	mark := func(r []string) {
		if t := ruleTarget(r); owned[t] && !kept[t] {
			kept[t] = true
			queue = append(queue, t)
		}
	}
	for name, c := range cur.chains {
		if owned[name] {
			continue
		}
		for _, r := range c.rules {
			if !isOurJump(name, r) {
				mark(r)
			}
		}
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		for _, r := range cur.chains[name].rules {
			mark(r)
		}
	}
	out := make([]string, 0, len(kept))
	for k := range kept {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// RandomFullyProber is implemented by runners that can tell whether
// MASQUERADE --random-fully is available (ExecRunner checks the
// iptables version like kube-proxy does).
type RandomFullyProber interface {
	HasRandomFully() bool
}

// SupportsRandomFully reports whether r can write --random-fully; runners
// that cannot tell are assumed not to.
func SupportsRandomFully(r Runner) bool {
	p, ok := r.(RandomFullyProber)
	return ok && p.HasRandomFully()
}
