//go:build e2e

package framework

import (
	"maps"
	"slices"
	"testing"
)

// nft's listing of each kind of set reads as `ipset save` entries.
func TestNFTElementsInIPSetForm(t *testing.T) {
	const listing = "table inet ipvsproxy {\n\tset node-port-v4 {\n\t\ttype inet_proto . inet_service\n" +
		"\t\telements = { udp . 30053,\n\t\t\t     tcp . 30080 }\n\t}\n}\n"
	for _, tc := range []struct {
		listing, proto string
		want           []string
	}{
		{listing, "tcp", []string{"30080"}},
		{listing, "udp", []string{"30053"}},
		{"elements = { 10.96.0.10 . tcp . 53,\n\t\t\t     fd00::a . udp . 53 }", "", []string{"10.96.0.10,tcp:53", "fd00::a,udp:53"}},
		{"elements = { 192.0.2.10 . tcp . 80 . 10.20.1.0/24 }", "", []string{"192.0.2.10,tcp:80,10.20.1.0/24"}},
		{"elements = { 30000, 30001 }", "", []string{"30000", "30001"}},
		{"\t\ttype ipv4_addr\n\t}", "", nil},
	} {
		got := map[string]bool{}
		for _, el := range nftElements(tc.listing) {
			if m, ok := ipsetForm(el, tc.proto); ok {
				got[m] = true
			}
		}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, tc.want) {
			t.Errorf("%q (%s): %v, want %v", tc.listing, tc.proto, keys, tc.want)
		}
	}
	if s, ok := nftSetFor("KUBE-6-NODE-PORT-UDP"); !ok || s != (nftSet{"node-port-v6", "udp"}) {
		t.Errorf("KUBE-6-NODE-PORT-UDP: %+v %v", s, ok)
	}
	if _, ok := nftSetFor("e2e-foreign"); ok {
		t.Error("a foreign set maps to the table")
	}
}
