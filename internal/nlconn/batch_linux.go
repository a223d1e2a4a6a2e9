package nlconn

import "github.com/vishvananda/netlink/nl"

// ExecuteBatch sends msgs, a run of whole netlink messages (padded to 4
// bytes, as nl.NetlinkRequest.Serialize makes them), in one datagram and
// reads the replies until the first acknowledgement or error. It is for
// a transaction the kernel applies whole or not at all — nfnetlink's
// batch: NFNL_MSG_BATCH_BEGIN, the requests, NFNL_MSG_BATCH_END — where
// the caller sets NLM_F_ACK on the last message only: the kernel then
// answers a committed batch with that one acknowledgement, sent after
// the commit, and a refused one with an error (the refused request's, or
// the batch's on its first message when the commit fails), never an
// acknowledgement first. Every message gets the same fresh sequence
// number, written into msgs; whatever else the kernel sends about a
// refused batch is skipped by the next request as another's. A single
// request with NLM_F_ACK that its caller encoded itself is a batch of
// one (dummyif's address deletes).
//
// One send and, for a committed batch, one receive: google/nftables'
// transport costs a goroutine per system call (mdlayher/socket watches a
// context for every read and write), and a batch of one element took
// 5× an ipset write on user-mode Linux (nftrules' BenchmarkSandboxCommit).
func (c *Conn) ExecuteBatch(msgs []byte) error {
	if err := checkMessages(msgs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.main
	if err := c.ensureSocket(s); err != nil {
		return err
	}
	seq := c.seq.Add(1)
	native := nl.NativeEndian()
	for off := 0; off < len(msgs); {
		native.PutUint32(msgs[off+8:], seq)
		off += min(nlmsgAlign(int(native.Uint32(msgs[off:]))), len(msgs)-off)
	}
	return c.exchangeBytes(s, msgs, seq, nil, nil)
}
