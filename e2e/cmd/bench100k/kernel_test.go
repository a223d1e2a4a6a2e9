//go:build e2e

package main

import (
	"bufio"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// procText writes what /proc/net/ip_vs shows for a programmed workload;
// edit changes one real-server line (service i, endpoint j) or drops it
// (returns "").
func procText(w *workload, edit func(i, j int, line string) string) string {
	var b strings.Builder
	b.WriteString("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n")
	reals := func(i int) {
		for j := 0; j < endpointsPer; j++ {
			line := fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0         \n", w.endpointAddr(i, j), targetPort)
			if edit != nil {
				line = edit(i, j, line)
			}
			b.WriteString(line)
		}
	}
	for i := 0; i < w.n; i++ {
		fmt.Fprintf(&b, "TCP  %08X:%04X rr \n", clusterIP(i), servicePort)
		reals(i)
		if np := nodePort(i); np != 0 {
			fmt.Fprintf(&b, "TCP  %08X:%04X rr \n", addrV(w.nodeIP), np)
			reals(i)
		}
	}
	return b.String()
}

func check(t *testing.T, w *workload, text string) ipvsCheck {
	t.Helper()
	c, err := w.checkIPVSText(bufio.NewReader(strings.NewReader(text)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheckIPVS(t *testing.T) {
	w, err := newWorkload(120, 5, 1, "n", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if w.nodePorts != 2 {
		t.Fatalf("%d node ports, want 2 (services 49 and 99)", w.nodePorts)
	}
	c := check(t, w, procText(w, nil))
	if !c.done() || c.VS != 122 || c.Reals != 1220 || c.Foreign != 0 || c.WrongReal != 0 {
		t.Fatalf("complete kernel: %v", c)
	}
	sampled := w.sample[0]
	cases := map[string]struct {
		edit               func(i, j int, line string) string
		extra              string
		complete, wrong, f int
	}{
		"a real server missing": {edit: func(i, j int, l string) string {
			if i == 7 && j == 3 {
				return ""
			}
			return l
		}, complete: 121},
		"a real server at weight 0": {edit: func(i, j int, l string) string {
			if i == 99 && j == 0 {
				return strings.Replace(l, "Masq    1", "Masq    0", 1)
			}
			return l
		}, complete: 120, wrong: 2}, // the ClusterIP and the node port
		"another service's endpoint": {edit: func(i, j int, l string) string {
			if i == 8 && j == 9 {
				return fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0\n", w.endpointAddr(9, 0), targetPort)
			}
			return l
		}, complete: 121, wrong: 1},
		"a pod endpoint on the wrong port": {edit: func(i, j int, l string) string {
			if i == sampled && j == 1 {
				return fmt.Sprintf("  -> %08X:%04X      Masq    1      0          0\n", w.endpointAddr(i, j), 9999)
			}
			return l
		}, complete: 121, wrong: 1},
		"a foreign virtual server": {extra: "TCP  C0000210:0050 wlc \n  -> 0A800001:1F90      Masq    3      0          0\nUDP  0A600001:0035 rr \n", complete: 122, f: 2},
	}
	for name, tc := range cases {
		c := check(t, w, procText(w, tc.edit)+tc.extra)
		if c.Complete != tc.complete || c.WrongReal != tc.wrong || c.Foreign != tc.f {
			t.Errorf("%s: %v; want %d complete, %d wrong, %d foreign", name, c, tc.complete, tc.wrong, tc.f)
		}
	}
}

func TestAddressPlan(t *testing.T) {
	w, err := newWorkload(maxServices, 50, 9, "n", netip.MustParseAddr("10.10.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newWorkload(maxServices+1, 50, 9, "n", netip.MustParseAddr("10.10.0.1")); err == nil {
		t.Error("a workload past the address plan was accepted")
	}
	for _, i := range []int{0, 1, 253, 254, w.sample[0], maxServices - 1} {
		for j := 0; j < endpointsPer; j++ {
			v := w.endpointAddr(i, j)
			if b := v & 255; b == 0 || b == 255 {
				t.Fatalf("endpoint %d/%d is %v: a .0 or .255", i, j, vAddr(v))
			}
			if got, ok := w.serviceOfEndpoint(v); !ok || got != i {
				t.Fatalf("endpoint %d/%d (%v) maps back to %d %v", i, j, vAddr(v), got, ok)
			}
		}
	}
	if last := vAddr(w.endpointAddr(maxServices-1, endpointsPer-1)); !netip.MustParsePrefix("10.128.0.0/12").Contains(last) {
		t.Errorf("last endpoint %v is outside the routed /12", last)
	}
	if _, ok := w.serviceOfEndpoint(addrV(netip.MustParseAddr("10.144.0.1"))); ok {
		t.Error("an address outside the plan maps to a service")
	}
}

func TestParseSets(t *testing.T) {
	out := `Name: KUBE-CLUSTER-IP
Type: hash:ip,port
Revision: 6
Header: family inet hashsize 65536 maxelem 262144 bucketsize 12 initval 0x1
Size in memory: 5000
References: 2
Number of entries: 120

Name: KUBE-NODE-PORT-TCP
Type: bitmap:port
Revision: 3
Header: range 0-65535
Size in memory: 8264
References: 1
Number of entries: 2

Name: KUBE-EXTERNAL-IP
Type: hash:ip,port
Revision: 6
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x2
Size in memory: 200
References: 0
Number of entries: 1
`
	w, _ := newWorkload(120, 5, 1, "n", netip.MustParseAddr("10.10.0.1"))
	sets := parseSets(out)
	if len(sets) != 3 || sets[0].Entries != 120 || sets[1].Type != "bitmap:port" || !strings.Contains(sets[0].Header, "maxelem 262144") {
		t.Fatalf("parsed %+v", sets)
	}
	ok, missing := w.setsComplete(sets)
	// KUBE-EXTERNAL-IP must be empty; KUBE-IPVS-IPS and KUBE-LOOP-BACK are missing.
	if ok || len(missing) != 2 || sets[2].Expected != 0 || sets[0].Expected != 120 {
		t.Errorf("ok %v, missing %v, sets %+v", ok, missing, sets)
	}
}
