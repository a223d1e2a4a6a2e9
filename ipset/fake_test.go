package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

var (
	ip   = netip.MustParseAddr
	cidr = netip.MustParsePrefix
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantSave(t *testing.T, f *Fake, want string) {
	t.Helper()
	want = strings.TrimLeft(want, "\n")
	if got := f.String(); got != want {
		t.Errorf("ipset save:\n%s\nwant:\n%s", got, want)
	}
}

// kubeSets creates one set of every type kube-proxy uses, both families.
func kubeSets(t *testing.T, x Interface) {
	t.Helper()
	for _, s := range []Set{
		{Name: "KUBE-CLUSTER-IP", Type: HashIPPort, Family: Inet},
		{Name: "KUBE-6-CLUSTER-IP", Type: HashIPPort, Family: Inet6},
		{Name: "KUBE-LOOP-BACK", Type: HashIPPortIP, Family: Inet},
		{Name: "KUBE-6-LOOP-BACK", Type: HashIPPortIP, Family: Inet6},
		{Name: "KUBE-LOAD-BALANCER-SOURCE-CIDR", Type: HashIPPortNet, Family: Inet},
		{Name: "KUBE-6-LOAD-BALANCER-SOURCE-CID", Type: HashIPPortNet, Family: Inet6},
		{Name: "KUBE-IPVS-IPS", Type: HashIP, Family: Inet, HashSize: 100, MaxElem: 1000},
		{Name: "KUBE-6-IPVS-IPS", Type: HashIP, Family: Inet6},
		{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort},
		{Name: "KUBE-NODE-PORT-UDP", Type: BitmapPort, PortFrom: 30000, PortTo: 32767},
		{Name: "KUBE-HEALTH-CHECK-NODE-PORT", Type: BitmapPort, Comment: "health check node port"},
	} {
		must(t, x.EnsureSet(s))
	}
}

// kubeEntries adds entries of every type, some twice, and deletes some.
func kubeEntries(t *testing.T, x Interface) {
	t.Helper()
	add := func(set string, e Entry) { t.Helper(); must(t, x.AddEntry(set, e)) }
	add("KUBE-CLUSTER-IP", Entry{IP: ip("10.96.0.10"), Protocol: "udp", Port: 53})
	add("KUBE-CLUSTER-IP", Entry{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443})
	add("KUBE-CLUSTER-IP", Entry{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443})
	add("KUBE-CLUSTER-IP", Entry{IP: ip("10.96.0.2"), Protocol: "sctp", Port: 9})
	add("KUBE-6-CLUSTER-IP", Entry{IP: ip("fd00:10:96::a"), Protocol: "tcp", Port: 80})
	add("KUBE-LOOP-BACK", Entry{IP: ip("10.244.1.5"), Protocol: "tcp", Port: 80, IP2: ip("10.244.1.5")})
	add("KUBE-6-LOOP-BACK", Entry{IP: ip("fd00::5"), Protocol: "udp", Port: 53, IP2: ip("fd00::5")})
	add("KUBE-LOAD-BALANCER-SOURCE-CIDR", Entry{IP: ip("192.0.2.1"), Protocol: "tcp", Port: 80, Net: cidr("10.1.2.3/24")})
	add("KUBE-LOAD-BALANCER-SOURCE-CIDR", Entry{IP: ip("192.0.2.1"), Protocol: "tcp", Port: 80, Net: cidr("10.9.9.9/32")})
	add("KUBE-6-LOAD-BALANCER-SOURCE-CID", Entry{IP: ip("2001:db8::1"), Protocol: "tcp", Port: 80, Net: cidr("fd00:1::/64")})
	add("KUBE-6-LOAD-BALANCER-SOURCE-CID", Entry{IP: ip("2001:db8::1"), Protocol: "tcp", Port: 80, Net: cidr("fd00:2::1/128")})
	add("KUBE-IPVS-IPS", Entry{IP: ip("10.96.0.10")})
	add("KUBE-IPVS-IPS", Entry{IP: ip("10.96.0.2")})
	add("KUBE-IPVS-IPS", Entry{IP: ip("10.96.0.3")})
	add("KUBE-6-IPVS-IPS", Entry{IP: ip("FD00::0001")})
	add("KUBE-NODE-PORT-TCP", Entry{Port: 30080})
	add("KUBE-NODE-PORT-TCP", Entry{Port: 8080})
	add("KUBE-NODE-PORT-UDP", Entry{Port: 30053})
	add("KUBE-HEALTH-CHECK-NODE-PORT", Entry{Port: 31000})
	del := func(set string, e Entry) { t.Helper(); must(t, x.DeleteEntry(set, e)) }
	del("KUBE-IPVS-IPS", Entry{IP: ip("10.96.0.3")})
	del("KUBE-IPVS-IPS", Entry{IP: ip("10.96.0.3")})
	del("KUBE-NODE-PORT-UDP", Entry{Port: 30054})
}

// kubeSave is `ipset save` after kubeSets and kubeEntries.
const kubeSave = `
create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-CLUSTER-IP fd00:10:96::a,tcp:80
create KUBE-6-IPVS-IPS hash:ip family inet6 hashsize 1024 maxelem 65536
add KUBE-6-IPVS-IPS fd00::1
create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::1,tcp:80,fd00:1::/64
add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::1,tcp:80,fd00:2::1
create KUBE-6-LOOP-BACK hash:ip,port,ip family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LOOP-BACK fd00::5,udp:53,fd00::5
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.2,sctp:9
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535 comment
add KUBE-HEALTH-CHECK-NODE-PORT 31000 comment "health check node port"
create KUBE-IPVS-IPS hash:ip family inet hashsize 128 maxelem 1000
add KUBE-IPVS-IPS 10.96.0.2
add KUBE-IPVS-IPS 10.96.0.10
create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.0.2.1,tcp:80,10.1.2.0/24
add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.0.2.1,tcp:80,10.9.9.9
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add KUBE-LOOP-BACK 10.244.1.5,tcp:80,10.244.1.5
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
add KUBE-NODE-PORT-TCP 8080
add KUBE-NODE-PORT-TCP 30080
create KUBE-NODE-PORT-UDP bitmap:port range 30000-32767
add KUBE-NODE-PORT-UDP 30053
`

func TestFakeSave(t *testing.T) {
	f := NewFake()
	kubeSets(t, f)
	kubeEntries(t, f)
	wantSave(t, f, kubeSave)
	if got, want := fmt.Sprint(f.Entries("KUBE-IPVS-IPS")), "[10.96.0.2 10.96.0.10]"; got != want {
		t.Errorf("Entries = %s, want %s", got, want)
	}
	if f.Entries("NOPE") != nil {
		t.Errorf("Entries of an absent set is not nil")
	}
}

func TestFakeEnsureKeepsHeaderAndRefusesMismatch(t *testing.T) {
	var f Fake // the zero value is usable
	must(t, f.EnsureSet(Set{Name: "S", Type: HashIP, Family: Inet6, HashSize: 64, MaxElem: 100}))
	// Other sizes are not an error, and the kernel's header stays.
	must(t, f.EnsureSet(Set{Name: "S", Type: HashIP, Family: Inet6}))
	wantSave(t, &f, "create S hash:ip family inet6 hashsize 64 maxelem 100\n")

	err := f.EnsureSet(Set{Name: "S", Type: HashIPPort, Family: Inet6})
	if got, want := fmt.Sprint(err), "ipset: ensure set S: it exists as hash:ip family inet6, wanted hash:ip,port family inet6"; got != want {
		t.Errorf("type mismatch: %s\nwant %s", got, want)
	}
	err = f.EnsureSet(Set{Name: "S", Type: HashIP})
	if got, want := fmt.Sprint(err), "ipset: ensure set S: it exists as hash:ip family inet6, wanted hash:ip family inet"; got != want {
		t.Errorf("family mismatch: %s\nwant %s", got, want)
	}
	for _, bad := range []Set{
		{Name: "", Type: HashIP},
		{Name: strings.Repeat("x", 32), Type: HashIP},
		{Name: "T", Type: "hash:net"},
		{Name: "T", Type: HashIP, Family: "inet4"},
		{Name: "T", Type: HashIP, Comment: `say "hi"`},
	} {
		if err := f.EnsureSet(bad); err == nil {
			t.Errorf("EnsureSet(%+v) succeeded", bad)
		}
	}
	wantSave(t, &f, "create S hash:ip family inet6 hashsize 64 maxelem 100\n")
}

func TestFakeMaxElem(t *testing.T) {
	f := NewFake()
	must(t, f.EnsureSet(Set{Name: "X", Type: HashIP, MaxElem: 2}))
	must(t, f.AddEntry("X", Entry{IP: ip("1.1.1.1")}))
	must(t, f.AddEntry("X", Entry{IP: ip("1.1.1.2")}))
	must(t, f.AddEntry("X", Entry{IP: ip("1.1.1.2")})) // present: not full
	err := f.AddEntry("X", Entry{IP: ip("1.1.1.3")})
	if !errors.Is(err, ErrHashFull) || err.Error() != "ipset: add 1.1.1.3 to set X: hash is full, cannot add more elements" {
		t.Errorf("adding beyond maxelem: %v", err)
	}
	wantSave(t, f, `
create X hash:ip family inet hashsize 1024 maxelem 2
add X 1.1.1.1
add X 1.1.1.2
`)
}

func TestFakeRefusesInvalidEntries(t *testing.T) {
	f := NewFake()
	kubeSets(t, f)
	for _, c := range []struct {
		set string
		e   Entry
		err string
	}{
		{"NOPE", Entry{IP: ip("1.2.3.4")}, "ipset: add 1.2.3.4 to set NOPE: the set with the given name does not exist"},
		{"KUBE-IPVS-IPS", Entry{IP: ip("fd00::1")}, "ipset: add fd00::1 to set KUBE-IPVS-IPS: address fd00::1 is not of family inet"},
		{"KUBE-6-IPVS-IPS", Entry{IP: ip("10.0.0.1")}, "ipset: add 10.0.0.1 to set KUBE-6-IPVS-IPS: address 10.0.0.1 is not of family inet6"},
		{"KUBE-IPVS-IPS", Entry{IP: ip("10.0.0.1"), Port: 80}, "ipset: add 10.0.0.1 to set KUBE-IPVS-IPS: hash:ip entries have no port"},
		{"KUBE-IPVS-IPS", Entry{}, "ipset: add invalid IP to set KUBE-IPVS-IPS: entry has no address"},
		{"KUBE-CLUSTER-IP", Entry{IP: ip("10.0.0.1"), Protocol: "icmp", Port: 8}, "ipset: add 10.0.0.1,icmp:8 to set KUBE-CLUSTER-IP: protocol \"icmp\" is not tcp, udp or sctp"},
		{"KUBE-CLUSTER-IP", Entry{IP: ip("10.0.0.1"), Port: 8}, "ipset: add 10.0.0.1,:8 to set KUBE-CLUSTER-IP: protocol \"\" is not tcp, udp or sctp"},
		{"KUBE-CLUSTER-IP", Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 8, IP2: ip("10.0.0.2")}, "ipset: add 10.0.0.1,tcp:8 to set KUBE-CLUSTER-IP: entry has a second address the set type does not hold"},
		{"KUBE-LOOP-BACK", Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 8}, "ipset: add 10.0.0.1,tcp:8,invalid IP to set KUBE-LOOP-BACK: entry has no second address"},
		{"KUBE-LOOP-BACK", Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 8, IP2: ip("fd00::1")}, "ipset: add 10.0.0.1,tcp:8,fd00::1 to set KUBE-LOOP-BACK: second address fd00::1 is not of family inet"},
		{"KUBE-LOAD-BALANCER-SOURCE-CIDR", Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 8, Net: cidr("0.0.0.0/0")}, "ipset: add 10.0.0.1,tcp:8,0.0.0.0/0 to set KUBE-LOAD-BALANCER-SOURCE-CIDR: net 0.0.0.0/0: the CIDR must be 1-32"},
		{"KUBE-6-LOAD-BALANCER-SOURCE-CID", Entry{IP: ip("fd00::1"), Protocol: "tcp", Port: 8, Net: cidr("::/0")}, "ipset: add fd00::1,tcp:8,::/0 to set KUBE-6-LOAD-BALANCER-SOURCE-CID: net ::/0: the CIDR must be 1-128"},
		{"KUBE-6-LOAD-BALANCER-SOURCE-CID", Entry{IP: ip("fd00::1"), Protocol: "tcp", Port: 8, Net: cidr("::ffff:10.1.2.0/120")}, "ipset: add fd00::1,tcp:8,10.1.2.0/24 to set KUBE-6-LOAD-BALANCER-SOURCE-CID: net 10.1.2.0/24 is not of family inet6"},
		{"KUBE-6-LOAD-BALANCER-SOURCE-CID", Entry{IP: ip("::ffff:10.0.0.1"), Protocol: "tcp", Port: 8, Net: cidr("fd00::/8")}, "ipset: add 10.0.0.1,tcp:8,fd00::/8 to set KUBE-6-LOAD-BALANCER-SOURCE-CID: address 10.0.0.1 is not of family inet6"},
		{"KUBE-LOAD-BALANCER-SOURCE-CIDR", Entry{IP: ip("10.0.0.1"), Protocol: "tcp", Port: 8, Net: cidr("fd00::/8")}, "ipset: add 10.0.0.1,tcp:8,fd00::/8 to set KUBE-LOAD-BALANCER-SOURCE-CIDR: net fd00::/8 is not of family inet"},
		{"KUBE-NODE-PORT-UDP", Entry{Port: 80}, "ipset: add 80 to set KUBE-NODE-PORT-UDP: element is out of the range of the set"},
		{"KUBE-NODE-PORT-TCP", Entry{Port: 80, Protocol: "tcp"}, "ipset: add 80 to set KUBE-NODE-PORT-TCP: bitmap:port entries have no protocol"},
		{"KUBE-NODE-PORT-TCP", Entry{Port: 80, IP: ip("10.0.0.1")}, "ipset: add 80 to set KUBE-NODE-PORT-TCP: entry has a address the set type does not hold"},
	} {
		if err := f.AddEntry(c.set, c.e); fmt.Sprint(err) != c.err {
			t.Errorf("AddEntry(%s, %+v):\n got %v\nwant %s", c.set, c.e, err, c.err)
		}
	}
	if err := f.DeleteEntry("NOPE", Entry{Port: 1}); !errors.Is(err, ErrSetNotFound) {
		t.Errorf("delete from an absent set: %v", err)
	}
	if got := f.String(); strings.Contains(got, "add ") {
		t.Errorf("a refused entry was stored:\n%s", got)
	}
}

func TestFakeSwapAndDestroy(t *testing.T) {
	f := NewFake()
	must(t, f.EnsureSet(Set{Name: "A", Type: HashIP, MaxElem: 10}))
	must(t, f.EnsureSet(Set{Name: "B", Type: HashIP}))
	must(t, f.EnsureSet(Set{Name: "C", Type: HashIP, Family: Inet6}))
	must(t, f.AddEntry("A", Entry{IP: ip("10.0.0.1")}))
	must(t, f.AddEntry("B", Entry{IP: ip("10.0.0.2")}))
	must(t, f.SwapSets("A", "B"))
	wantSave(t, f, `
create A hash:ip family inet hashsize 1024 maxelem 65536
add A 10.0.0.2
create B hash:ip family inet hashsize 1024 maxelem 10
add B 10.0.0.1
create C hash:ip family inet6 hashsize 1024 maxelem 65536
`)
	err := f.SwapSets("A", "C")
	if got, want := fmt.Sprint(err), "ipset: swap set A: the sets cannot be swapped: A is hash:ip family inet, C is hash:ip family inet6"; got != want {
		t.Errorf("swap across families: %s\nwant %s", got, want)
	}
	if err := f.SwapSets("A", "NOPE"); !errors.Is(err, ErrSetNotFound) {
		t.Errorf("swap with an absent set: %v", err)
	}
	must(t, f.DestroySet("B"))
	must(t, f.DestroySet("B")) // absent: not an error
	must(t, f.DestroySet("C"))
	wantSave(t, f, "create A hash:ip family inet hashsize 1024 maxelem 65536\nadd A 10.0.0.2\n")
	if _, err := f.ListEntries("B"); !errors.Is(err, ErrSetNotFound) {
		t.Errorf("list of a destroyed set: %v", err)
	}
}

func TestFakeCountsAndInject(t *testing.T) {
	f := NewFake()
	kubeSets(t, f)
	f.ResetCounts()
	kubeEntries(t, f)
	sets, err := f.ListSets()
	must(t, err)
	if len(sets) != 11 || sets[0].Name != "KUBE-6-CLUSTER-IP" || sets[0].HashSize != 1024 {
		t.Errorf("ListSets = %+v", sets)
	}
	for _, s := range sets {
		if _, err := f.ListEntries(s.Name); err != nil {
			t.Error(err)
		}
	}
	want := map[string]int{VerbAddEntry: 19, VerbDeleteEntry: 3, VerbListSets: 1, VerbListEntries: 11}
	if got := f.Counts(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Counts = %v, want %v", got, want)
	}

	boom := errors.New("boom")
	var seen []string
	stopRecording := f.Record(func(verb string, c Call) {
		seen = append(seen, fmt.Sprint(verb, " ", c.Set, " ", c.Entry != Entry{}))
	})
	undo := f.FailOn("", func(c Call) bool { return c.Verb != VerbAddEntry || c.Entry.Port == 443 }, boom)
	f.ResetCounts()
	before := f.String()
	e443 := Entry{IP: ip("10.96.0.9"), Protocol: "tcp", Port: 443}
	for _, err := range []error{
		f.AddEntry("KUBE-CLUSTER-IP", e443),
		f.DeleteEntry("KUBE-CLUSTER-IP", Entry{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443}),
		f.EnsureSet(Set{Name: "NEW", Type: HashIP}),
		f.DestroySet("KUBE-CLUSTER-IP"),
		f.SwapSets("KUBE-IPVS-IPS", "KUBE-6-IPVS-IPS"),
	} {
		if !errors.Is(err, boom) {
			t.Errorf("injected failure not returned: %v", err)
		}
	}
	if _, err := f.ListEntries("KUBE-CLUSTER-IP"); !errors.Is(err, boom) {
		t.Errorf("injected list failure: %v", err)
	}
	if _, err := f.ListSets(); !errors.Is(err, boom) {
		t.Errorf("injected listsets failure: %v", err)
	}
	if after := f.String(); after != before {
		t.Errorf("an injected failure changed the sets:\n%s", after)
	}
	wantSeen := "[AddEntry KUBE-CLUSTER-IP true DeleteEntry KUBE-CLUSTER-IP true EnsureSet NEW false DestroySet KUBE-CLUSTER-IP false SwapSets KUBE-IPVS-IPS false ListEntries KUBE-CLUSTER-IP false ListSets  false]"
	if fmt.Sprint(seen) != wantSeen {
		t.Errorf("Record saw %v\nwant %s", seen, wantSeen)
	}
	if f.Count(VerbAddEntry) != 1 || f.Count(VerbSwapSets) != 1 || f.Count(VerbListEntries) != 1 {
		t.Errorf("failed calls are counted: %v", f.Counts())
	}
	undo()
	stopRecording()
	must(t, f.AddEntry("KUBE-CLUSTER-IP", e443))
}

// TestFakeConcurrent is for the race detector: the engine calls from
// several goroutines.
func TestFakeConcurrent(t *testing.T) {
	f := NewFake()
	must(t, f.EnsureSet(Set{Name: "S", Type: HashIPPort}))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				e := Entry{IP: netip.AddrFrom4([4]byte{10, 0, byte(g), byte(i)}), Protocol: "tcp", Port: 80}
				if err := f.AddEntry("S", e); err != nil {
					t.Error(err)
				}
				_ = f.Count(VerbAddEntry)
				_ = f.String()
			}
		})
	}
	wg.Wait()
	if n := len(f.Entries("S")); n != 800 {
		t.Errorf("%d entries, want 800", n)
	}
}

func TestEntryFormat(t *testing.T) {
	for _, c := range []struct {
		t    Type
		e    Entry
		want string
	}{
		{HashIP, Entry{IP: ip("fd00::1")}, "fd00::1"},
		{HashIPPort, Entry{IP: ip("10.96.0.1"), Protocol: "tcp", Port: 443}, "10.96.0.1,tcp:443"},
		{HashIPPortIP, Entry{IP: ip("10.244.1.5"), Protocol: "tcp", Port: 80, IP2: ip("10.244.1.5")}, "10.244.1.5,tcp:80,10.244.1.5"},
		{HashIPPortNet, Entry{IP: ip("1.2.3.4"), Protocol: "udp", Port: 5, Net: cidr("10.0.0.0/8")}, "1.2.3.4,udp:5,10.0.0.0/8"},
		{HashIPPortNet, Entry{IP: ip("1.2.3.4"), Protocol: "udp", Port: 5, Net: cidr("10.0.0.1/32")}, "1.2.3.4,udp:5,10.0.0.1"},
		{BitmapPort, Entry{Port: 30080}, "30080"},
	} {
		if got := c.e.Format(c.t); got != c.want {
			t.Errorf("Format(%s) = %q, want %q", c.t, got, c.want)
		}
	}
}
