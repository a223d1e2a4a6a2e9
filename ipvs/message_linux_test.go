package ipvs

import (
	"bytes"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// The appended messages are, byte for byte, the requests AddVirtualServer
// and AddRealServer send (the sequence number aside, which the pipeline
// writes): a pipeline of them costs the kernel what the proxy's writes do.
func TestAppendMessagesAreTheWrites(t *testing.T) {
	h, k := scriptedHandle(t, func(_ int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, 0)} })
	vs := VirtualServer{ServiceKey: key(TCP, "10.96.0.1:443"), Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800}
	rs := RealServer{RealKey: rkey("10.244.1.5:8443"), Weight: 3}
	if err := h.AddVirtualServer(vs); err != nil {
		t.Fatal(err)
	}
	if err := h.AddRealServer(vs.ServiceKey, rs); err != nil {
		t.Fatal(err)
	}
	if len(k.Reqs) != 2 {
		t.Fatalf("%d requests sent, want 2", len(k.Reqs))
	}
	var want [][]byte
	for _, req := range k.Reqs {
		c := bytes.Clone(req)
		clear(c[8:12]) // the sequence number
		want = append(want, c)
	}
	vsMsg := AppendAddVirtualServerMessage(nil, testFamily, vs)
	rsMsg := AppendAddRealServerMessage([]byte{}, testFamily, vs.ServiceKey, rs)
	if !bytes.Equal(vsMsg, want[0]) {
		t.Errorf("virtual server message\n got %x\nwant %x", vsMsg, want[0])
	}
	if !bytes.Equal(rsMsg, want[1]) {
		t.Errorf("real server message\n got %x\nwant %x", rsMsg, want[1])
	}
	if got := wireText(t, vsMsg); got != wireText(t, want[0]) {
		t.Error(got)
	}
}
