//go:build e2e

package ipvstext

import (
	"fmt"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	text := `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A600001:0050 rr
  -> 0A800001:1F90      Masq    1      0          0
  -> 0A800002:1F90      Masq    0      0          0
UDP  0A60000A:0035 rr
  -> 0A800003:0035      Masq    1      0          0
TCP  [fd00:0000:0000:0000:0000:0000:0000:0001]:0050 rr
`
	var got []string
	err := Scan(strings.NewReader(text),
		func(ip uint32, port int, ok bool) { got = append(got, fmt.Sprint("vs ", String(ip, port), " ", ok)) },
		func(ip uint32, port, w int, ok bool) {
			got = append(got, fmt.Sprint("rs ", String(ip, port), " ", w, " ", ok))
		})
	if err != nil {
		t.Fatal(err)
	}
	want := "[vs 10.96.0.1:80 true rs 10.128.0.1:8080 1 true rs 10.128.0.2:8080 0 true vs 0.0.0.0:0 false rs 10.128.0.3:53 1 true vs 0.0.0.0:0 false]"
	if fmt.Sprint(got) != want {
		t.Errorf("got  %v\nwant %s", got, want)
	}
}

// TestScanProto: the UDP virtual server keeps its address and its
// protocol; a firewall mark has no address to report.
func TestScanProto(t *testing.T) {
	text := `TCP  0A600001:0050 rr
  -> 0A800001:1F90      Masq    1      0          0
UDP  0A60000A:0035 rr
  -> 0A800003:0035      Masq    1      0          0
FWM  00000001 rr
`
	var got []string
	err := ScanProto(strings.NewReader(text),
		func(proto string, ip uint32, port int, ok bool) {
			got = append(got, fmt.Sprint(proto, " ", String(ip, port), " ", ok))
		},
		func(ip uint32, port, w int, ok bool) { got = append(got, fmt.Sprint("rs ", String(ip, port))) })
	if err != nil {
		t.Fatal(err)
	}
	want := "[TCP 10.96.0.1:80 true rs 10.128.0.1:8080 UDP 10.96.0.10:53 true rs 10.128.0.3:53 FWM 0.0.0.0:0 false]"
	if fmt.Sprint(got) != want {
		t.Errorf("got  %v\nwant %s", got, want)
	}
}
