package nlconn_test

import (
	"fmt"
	"testing"

	"github.com/vishvananda/netlink/nl"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Attrs reads what nl serializes: flags stripped from the type, nested
// runs readable with a second iterator, padding skipped, and a truncated
// attribute ends the walk instead of reading past it.
func TestAttrs(t *testing.T) {
	outer := nl.NewRtAttr(1|int(nl.NLA_F_NESTED), nil)
	outer.AddRtAttr(2|int(nl.NLA_F_NET_BYTEORDER), []byte{0, 80})
	outer.AddRtAttr(3, []byte("wrr\x00")) // 8 bytes: no padding
	outer.AddRtAttr(4, []byte{7})         // 5 bytes: padded to 8
	b := append(outer.Serialize(), nl.NewRtAttr(5, []byte{1, 2, 3, 4}).Serialize()...)
	var got []string
	for it := nlconn.Attrs(b); it.Next(); {
		if it.Type == 1 {
			for in := nlconn.Attrs(it.Value); in.Next(); {
				got = append(got, fmt.Sprintf("1.%d=%q", in.Type, in.Value))
			}
			continue
		}
		got = append(got, fmt.Sprintf("%d=%q", it.Type, it.Value))
	}
	want := `[1.2="\x00P" 1.3="wrr\x00" 1.4="\a" 5="\x01\x02\x03\x04"]`
	if fmt.Sprint(got) != want {
		t.Errorf("got  %v\nwant %s", got, want)
	}
	n := 0
	for it := nlconn.Attrs(b[:len(b)-2]); it.Next(); {
		n++
	}
	if n != 1 {
		t.Errorf("a truncated last attribute: walked %d attributes, want the 1 whole one", n)
	}
}
