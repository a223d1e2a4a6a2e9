//go:build sandbox

// Tests of the netlink implementation against a real kernel. Run them in
// the user-mode-Linux sandbox, as root. The guest hides the host's /tmp
// except $UML_OUT, so the test binary goes there:
//
//	export UML_OUT=/tmp/ipset-uml && mkdir -p $UML_OUT &&
//	go test -tags sandbox -c -o $UML_OUT/ipset.test ./ipset &&
//	e2e/sandbox/uml-run -- $UML_OUT/ipset.test -test.v
//
// The yardstick is the ipset tool: after the same operations on Netlink and
// on a Fake, the kernel's `ipset save` must equal Fake.String() (kernel
// order and its random bucketsize/initval aside).
package ipset

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// newNetlink starts from a kernel without sets. It fails, never skips,
// outside the sandbox: a skipped kernel test proves nothing.
func newNetlink(t testing.TB) *Netlink {
	t.Helper()
	// uml-init exports UML_MODROOT. Anywhere else "ipset destroy" below
	// would wipe the machine's own sets, so refuse.
	if os.Getenv("UML_MODROOT") == "" {
		t.Fatal("not inside the uml-run sandbox; refusing to destroy this machine's ipsets (see the file's comment)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("sandbox tests must run as root in the sandbox: e2e/sandbox/uml-run -- $UML_OUT/ipset.test -test.v (see the file's comment)")
	}
	ipsetTool(t, "destroy")
	n, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func ipsetTool(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ipset", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ipset %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var kernelOnly = regexp.MustCompile(` bucketsize \d+ initval 0x[0-9a-f]+`)

// canonical sorts `ipset save` text by set name, and each set's add lines,
// and drops what only the kernel prints, so the kernel's output and the
// Fake's compare equal when they hold the same sets.
func canonical(save string) string {
	blocks := map[string][]string{}
	var cur string
	for line := range strings.Lines(save) {
		line = kernelOnly.ReplaceAllString(strings.TrimSpace(line), "")
		if name, ok := strings.CutPrefix(line, "create "); ok {
			cur, _, _ = strings.Cut(name, " ")
			blocks[cur] = []string{line}
		} else if line != "" {
			blocks[cur] = append(blocks[cur], line)
		}
	}
	var b strings.Builder
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range blocks {
			if !yield(k) {
				return
			}
		}
	}) {
		lines := blocks[name]
		slices.Sort(lines[1:])
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}
	return b.String()
}

// sameAsFake checks the kernel against the Fake: ipset save, ListSets and
// every set's ListEntries.
func sameAsFake(t *testing.T, n *Netlink, f *Fake) {
	t.Helper()
	sameAsFakeSaved(t, n, f, canonical(ipsetTool(t, "save")), func(_ string, size uint32) uint32 { return size })
}

// hashSize is the "hashsize N" of an `ipset save` create line.
var hashSize = regexp.MustCompile(` hashsize (\d+)`)

// sameAsGrownFake is sameAsFake for sets filled with thousands of
// entries: the kernel doubles a hash set's table by itself when one of
// its buckets is full, which depends on its random hash seed (initval),
// so `ipset save` and ListSets then show a larger hashsize than the set
// was created with. A kernel hashsize that is the fake's times a power of
// two is taken as the fake's; anything else still differs.
func sameAsGrownFake(t *testing.T, n *Netlink, f *Fake) {
	t.Helper()
	created := map[string]uint32{}
	sets, _ := f.ListSets()
	for _, s := range sets {
		created[s.Name] = s.HashSize
	}
	asCreated := func(set string, size uint32) uint32 {
		c := created[set]
		if c > 0 && size > c && size%c == 0 && (size/c)&(size/c-1) == 0 {
			return c
		}
		return size
	}
	var b strings.Builder
	for line := range strings.Lines(ipsetTool(t, "save")) {
		if name, ok := strings.CutPrefix(line, "create "); ok {
			set, _, _ := strings.Cut(name, " ")
			if m := hashSize.FindStringSubmatch(line); m != nil {
				size, _ := strconv.ParseUint(m[1], 10, 32)
				line = hashSize.ReplaceAllString(line, fmt.Sprintf(" hashsize %d", asCreated(set, uint32(size))))
			}
		}
		b.WriteString(line)
	}
	sameAsFakeSaved(t, n, f, canonical(b.String()), asCreated)
}

// sameAsFakeSaved compares the kernel, as saved (canonical), and as
// ListSets (hash sizes through hashSize) and ListEntries read it, with
// the fake.
func sameAsFakeSaved(t *testing.T, n *Netlink, f *Fake, saved string, hashSize func(set string, size uint32) uint32) {
	t.Helper()
	if got, want := saved, canonical(f.String()); got != want {
		t.Fatalf("kernel ipset save:\n%s\nfake:\n%s", got, want)
	}
	got, err := n.ListSets()
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].HashSize = hashSize(got[i].Name, got[i].HashSize)
	}
	want, _ := f.ListSets()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ListSets:\n%+v\nfake:\n%+v", got, want)
	}
	for _, s := range want {
		ge, err := n.ListEntries(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		we, _ := f.ListEntries(s.Name)
		slices.SortFunc(ge, compareEntries)
		if !slices.Equal(ge, we) {
			t.Fatalf("ListEntries(%s):\n%v\nfake:\n%v", s.Name, ge, we)
		}
	}
}

// both applies op to the kernel and to the Fake and wants the same error.
func both(t *testing.T, n *Netlink, f *Fake, op func(Interface) error) {
	t.Helper()
	errN, errF := op(n), op(f)
	if fmt.Sprint(errN) != fmt.Sprint(errF) {
		t.Fatalf("netlink: %v\n   fake: %v", errN, errF)
	}
}

func TestSandboxEveryTypeSameAsFake(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	kubeSets(t, n)
	kubeSets(t, f)
	kubeEntries(t, n)
	kubeEntries(t, f)
	sameAsFake(t, n, f)
	if got, want := canonical(ipsetTool(t, "save")), canonical(kubeSave); got != want {
		t.Fatalf("kernel ipset save:\n%s\nwant:\n%s", got, want)
	}
	t.Logf("kernel ipset save, as the Fake prints it:\n%s", f)
}

func TestSandboxEnsureSet(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	for _, s := range []Set{
		{Name: "SMALL", Type: HashIP, HashSize: 10, MaxElem: 7},
		{Name: "ODD", Type: HashIPPort, Family: Inet6, HashSize: 1000, MaxElem: 123456},
		{Name: "BIG", Type: HashIPPortNet, HashSize: 4096, MaxElem: 1000000},
		{Name: "RANGE", Type: BitmapPort, PortFrom: 32767, PortTo: 30000},
		{Name: "NOTE", Type: HashIPPortIP, Comment: "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	} {
		both(t, n, f, func(x Interface) error { return x.EnsureSet(s) })
		// Again, identical: the kernel accepts it as is.
		both(t, n, f, func(x Interface) error { return x.EnsureSet(s) })
	}
	// Other sizes for an existing set: not an error, header unchanged.
	both(t, n, f, func(x Interface) error {
		return x.EnsureSet(Set{Name: "SMALL", Type: HashIP, HashSize: 2048, MaxElem: 9})
	})
	both(t, n, f, func(x Interface) error { return x.EnsureSet(Set{Name: "RANGE", Type: BitmapPort}) })
	// Other type or family: an error naming both, worded the same.
	for _, s := range []Set{
		{Name: "SMALL", Type: HashIPPort},
		{Name: "SMALL", Type: HashIP, Family: Inet6},
		{Name: "RANGE", Type: HashIP},
		{Name: "ODD", Type: BitmapPort},
	} {
		err := n.EnsureSet(s)
		if err == nil || !strings.Contains(err.Error(), "it exists as") {
			t.Errorf("EnsureSet(%+v) = %v, want a mismatch error", s, err)
		}
		both(t, n, f, func(x Interface) error { return x.EnsureSet(s) })
	}
	sameAsFake(t, n, f)
	// A set made by someone else (the ipset tool) is adopted too.
	ipsetTool(t, "create", "TOOL", "hash:ip,port", "family", "inet6", "hashsize", "64")
	if err := n.EnsureSet(Set{Name: "TOOL", Type: HashIPPort, Family: Inet6}); err != nil {
		t.Fatal(err)
	}
	err := n.EnsureSet(Set{Name: "TOOL", Type: HashIPPort})
	if want := "ipset: ensure set TOOL: it exists as hash:ip,port family inet6, wanted hash:ip,port family inet"; fmt.Sprint(err) != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	t.Logf("kernel ipset save:\n%s", ipsetTool(t, "save"))
}

func TestSandboxAddDelete(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	kubeSets(t, n)
	kubeSets(t, f)
	kubeEntries(t, n)
	kubeEntries(t, f)
	both(t, n, f, func(x Interface) error { return x.EnsureSet(Set{Name: "TINY", Type: HashIP, MaxElem: 2}) })
	v4 := netip.MustParseAddr
	for _, c := range []struct {
		set string
		e   Entry
	}{
		{"TINY", Entry{IP: v4("1.1.1.1")}},
		{"TINY", Entry{IP: v4("1.1.1.2")}},
		{"TINY", Entry{IP: v4("1.1.1.2")}}, // present: not "full"
		{"TINY", Entry{IP: v4("1.1.1.3")}}, // hash is full
		{"KUBE-NODE-PORT-UDP", Entry{Port: 80}},
		{"KUBE-IPVS-IPS", Entry{IP: v4("fd00::9")}},
		{"KUBE-CLUSTER-IP", Entry{IP: v4("10.0.0.1"), Protocol: "icmp"}},
		{"NOPE", Entry{IP: v4("10.0.0.1")}},
		{"KUBE-CLUSTER-IP", Entry{IP: v4("::ffff:10.0.0.7"), Protocol: "udp", Port: 7}},
	} {
		both(t, n, f, func(x Interface) error { return x.AddEntry(c.set, c.e) })
	}
	for _, c := range []struct {
		set string
		e   Entry
	}{
		{"TINY", Entry{IP: v4("1.1.1.1")}},
		{"TINY", Entry{IP: v4("1.1.1.1")}}, // absent: success
		{"KUBE-CLUSTER-IP", Entry{IP: v4("10.96.0.1"), Protocol: "udp", Port: 443}},
		{"KUBE-CLUSTER-IP", Entry{IP: v4("10.96.0.1"), Protocol: "tcp", Port: 443}},
		{"KUBE-LOAD-BALANCER-SOURCE-CIDR", Entry{IP: v4("192.0.2.1"), Protocol: "tcp", Port: 80, Net: cidr("10.1.2.99/24")}},
		{"KUBE-NODE-PORT-TCP", Entry{Port: 30080}},
		{"KUBE-NODE-PORT-TCP", Entry{Port: 30080}},
		{"NOPE", Entry{Port: 1}},
	} {
		both(t, n, f, func(x Interface) error { return x.DeleteEntry(c.set, c.e) })
	}
	sameAsFake(t, n, f)
	// A set destroyed behind our back: the cached header must not hide it.
	ipsetTool(t, "destroy", "TINY")
	if err := n.AddEntry("TINY", Entry{IP: v4("1.1.1.1")}); err == nil {
		t.Fatal("add to a set destroyed by someone else succeeded")
	}
	ipsetTool(t, "create", "TINY", "hash:ip,port")
	if err := n.AddEntry("TINY", Entry{IP: v4("1.1.1.1"), Protocol: "tcp", Port: 1}); err != nil {
		t.Fatalf("add after the set was recreated with another type: %v", err)
	}
}

func TestSandboxSwapDestroy(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	kubeSets(t, n)
	kubeSets(t, f)
	kubeEntries(t, n)
	kubeEntries(t, f)
	tmp := Set{Name: "KUBE-CLUSTER-IP-NEW", Type: HashIPPort, MaxElem: 1000}
	both(t, n, f, func(x Interface) error { return x.EnsureSet(tmp) })
	both(t, n, f, func(x Interface) error {
		return x.AddEntry(tmp.Name, Entry{IP: netip.MustParseAddr("10.96.7.7"), Protocol: "tcp", Port: 7})
	})
	for _, pair := range [][2]string{
		{"KUBE-CLUSTER-IP", tmp.Name},
		{"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-UDP"}, // ranges may differ
		{"KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP"},     // families differ
		{"KUBE-CLUSTER-IP", "KUBE-IPVS-IPS"},         // types differ
		{"KUBE-CLUSTER-IP", "NOPE"},
		{"NOPE", "KUBE-CLUSTER-IP"},
	} {
		errN, errF := n.SwapSets(pair[0], pair[1]), f.SwapSets(pair[0], pair[1])
		if (errN == nil) != (errF == nil) {
			t.Fatalf("swap %v: netlink %v, fake %v", pair, errN, errF)
		}
		t.Logf("swap %v: %v", pair, errN)
	}
	sameAsFake(t, n, f)
	// The swapped-in set keeps its own header (maxelem 1000) and the
	// cache follows: adding to it is checked against its new header.
	both(t, n, f, func(x Interface) error {
		return x.AddEntry("KUBE-CLUSTER-IP", Entry{IP: netip.MustParseAddr("10.96.0.99"), Protocol: "sctp", Port: 99})
	})
	for _, s := range []string{tmp.Name, tmp.Name, "KUBE-6-IPVS-IPS", "NOPE"} {
		both(t, n, f, func(x Interface) error { return x.DestroySet(s) })
	}
	sameAsFake(t, n, f)
	if _, err := n.ListEntries(tmp.Name); fmt.Sprint(err) != "ipset: list set KUBE-CLUSTER-IP-NEW: the set with the given name does not exist" {
		t.Fatalf("list of a destroyed set: %v", err)
	}
}

// TestSandboxLargeSet fills a 70,000-entry set, and a full bitmap:port, and
// lists them: dumps of that size span many netlink messages.
func TestSandboxLargeSet(t *testing.T) {
	n := newNetlink(t)
	const count = 70000
	s := Set{Name: "KUBE-LOOP-BACK", Type: HashIPPortIP, MaxElem: 131072}
	if err := n.EnsureSet(s); err != nil {
		t.Fatal(err)
	}
	want := make([]Entry, 0, count)
	for i := range count {
		a := netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})
		want = append(want, Entry{IP: a, Protocol: []string{"tcp", "udp", "sctp"}[i%3], Port: uint16(1 + i%50000), IP2: a})
	}
	start := time.Now()
	for _, e := range want {
		if err := n.AddEntry(s.Name, e); err != nil {
			t.Fatal(err)
		}
	}
	added := time.Since(start)
	start = time.Now()
	got, err := n.ListEntries(s.Name)
	listed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, compareEntries)
	slices.SortFunc(want, compareEntries)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d entries, added %d; first listed %v", len(got), len(want), got[:min(3, len(got))])
	}
	t.Logf("%d entries: added in %v (%v/entry), listed in %v",
		count, added.Round(time.Millisecond), (added / count).Round(time.Microsecond), listed.Round(time.Millisecond))
	// ipset save equals the Fake's but for the hashsize, which the kernel
	// grew as the set filled.
	f := NewFake()
	must(t, f.EnsureSet(s))
	for _, e := range want {
		must(t, f.AddEntry(s.Name, e))
	}
	start = time.Now()
	kernel := hashSize.ReplaceAllString(canonical(ipsetTool(t, "save", s.Name)), "")
	t.Logf("ipset save of %d entries (one ipset process): %v", count, time.Since(start).Round(time.Millisecond))
	if fake := hashSize.ReplaceAllString(canonical(f.String()), ""); kernel != fake {
		t.Errorf("kernel ipset save differs from the Fake's (%d and %d bytes)", len(kernel), len(fake))
	}

	start = time.Now()
	for _, e := range want {
		if err := n.DeleteEntry(s.Name, e); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d entries deleted in %v", count, time.Since(start).Round(time.Millisecond))

	ports := Set{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort}
	if err := n.EnsureSet(ports); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for p := range 65536 {
		if err := n.AddEntry(ports.Name, Entry{Port: uint16(p)}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("65536 ports added to a bitmap:port in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	pe, err := n.ListEntries(ports.Name)
	if err != nil || len(pe) != 65536 || pe[0].Port != 0 || pe[65535].Port != 65535 {
		t.Fatalf("full bitmap:port listed %d entries, err %v", len(pe), err)
	}
	t.Logf("full bitmap:port (65536 ports) listed in %v", time.Since(start).Round(time.Millisecond))
}

// TestSandboxVersusIpsetTool measures what the design is about: one
// netlink message per entry against one ipset process per entry.
func TestSandboxVersusIpsetTool(t *testing.T) {
	n := newNetlink(t)
	for _, name := range []string{"A", "B"} {
		if err := n.EnsureSet(Set{Name: name, Type: HashIPPort}); err != nil {
			t.Fatal(err)
		}
	}
	const count = 100
	start := time.Now()
	for i := range count {
		ipsetTool(t, "add", "A", fmt.Sprintf("10.96.%d.%d,tcp:80", i>>8, i&255))
	}
	tool := time.Since(start)
	start = time.Now()
	for i := range count {
		e := Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: "tcp", Port: 80}
		if err := n.AddEntry("B", e); err != nil {
			t.Fatal(err)
		}
	}
	nl := time.Since(start)
	t.Logf("%d adds: ipset processes %v, netlink %v (%.0fx faster)", count, tool.Round(time.Millisecond), nl.Round(time.Microsecond), float64(tool)/float64(nl))
	a, b := ipsetTool(t, "save", "A"), ipsetTool(t, "save", "B")
	if canonical(strings.ReplaceAll(a, " A ", " B ")) != canonical(b) {
		t.Errorf("the tool and netlink made different sets:\n%s\n%s", a, b)
	}
}

// TestSandboxConcurrent: the engine may call from several goroutines; the
// socket carries one request at a time and replies must not mix.
func TestSandboxConcurrent(t *testing.T) {
	n, f := newNetlink(t), NewFake()
	kubeSets(t, n)
	kubeSets(t, f)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				e := Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(g), byte(i)}), Protocol: "tcp", Port: uint16(i)}
				for _, x := range []Interface{n, f} {
					if err := x.AddEntry("KUBE-CLUSTER-IP", e); err != nil {
						t.Error(err)
					}
				}
				if i%50 == 0 {
					if _, err := n.ListEntries("KUBE-CLUSTER-IP"); err != nil {
						t.Error(err)
					}
					if _, err := n.ListSets(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	sameAsFake(t, n, f)
}

// TestSandboxMissingModule unloads a set type's module and stops the kernel
// from loading it back, then wants a one-line error naming the module.
func TestSandboxMissingModule(t *testing.T) {
	n := newNetlink(t)
	const helper = "/proc/sys/kernel/modprobe"
	old, err := os.ReadFile(helper)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(helper, []byte("/bin/false\n"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(helper, old, 0) })
	if out, err := exec.Command("rmmod", "ip_set_bitmap_port").CombinedOutput(); err != nil {
		t.Fatalf("rmmod ip_set_bitmap_port: %v: %s", err, out)
	}
	err = n.EnsureSet(Set{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort})
	want := "ipset: ensure set KUBE-NODE-PORT-TCP: kernel module ip_set_bitmap_port is not loaded (set type bitmap:port; modprobe ip_set_bitmap_port)"
	if fmt.Sprint(err) != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	// With the helper back, the kernel loads the module on demand.
	if err := os.WriteFile(helper, old, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.EnsureSet(Set{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort}); err != nil {
		t.Fatal(err)
	}
}
