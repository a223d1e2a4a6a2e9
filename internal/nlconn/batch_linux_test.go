package nlconn_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// transaction is an nfnetlink batch of n requests: begin, the requests,
// end, the end alone asking for an acknowledgement.
func transaction(n int) []byte {
	b := nl.NewNetlinkRequest(unix.NFNL_MSG_BATCH_BEGIN, 0).Serialize()
	for i := range n {
		req := nl.NewNetlinkRequest(typData, 0)
		req.AddRawData(binary.NativeEndian.AppendUint32(nil, uint32(i)))
		b = append(b, req.Serialize()...)
	}
	return append(b, nl.NewNetlinkRequest(unix.NFNL_MSG_BATCH_END, unix.NLM_F_ACK).Serialize()...)
}

// The kernel's answers to a batch, as nfnetlink gives them: refused
// requests get their error (all of them: it goes on after the first),
// a committed batch one acknowledgement of its end, a failed commit an
// error on the batch's first message.
func batchKernel(refused map[int]unix.Errno, commitErr unix.Errno) nlconntest.Answer {
	var errs []any
	return func(_ int, seq uint32, req []byte) []any {
		switch typ := binary.NativeEndian.Uint16(req[4:]); typ {
		case unix.NFNL_MSG_BATCH_BEGIN:
			errs = nil
		case typData:
			if e := refused[int(binary.NativeEndian.Uint32(req[unix.NLMSG_HDRLEN:]))]; e != 0 {
				errs = append(errs, nlconntest.Ack(seq, e))
			}
		case unix.NFNL_MSG_BATCH_END:
			switch {
			case len(errs) > 0:
				return errs
			case commitErr != 0:
				return []any{nlconntest.Ack(seq, commitErr)}
			}
			return []any{nlconntest.Ack(seq, 0)}
		}
		return nil
	}
}

func TestExecuteBatchIsOneSendAndOneReceive(t *testing.T) {
	c, k := nlconntest.New(t, batchKernel(nil, 0))
	if err := c.ExecuteBatch(transaction(3)); err != nil {
		t.Fatal(err)
	}
	if k.Sends != 1 || k.Recvs != 1 || len(k.Reqs) != 5 {
		t.Errorf("%d sends, %d receives, %d messages; want 1, 1, 5", k.Sends, k.Recvs, len(k.Reqs))
	}
	seq := binary.NativeEndian.Uint32(k.Reqs[0][8:])
	for i, req := range k.Reqs {
		if s := binary.NativeEndian.Uint32(req[8:]); s != seq {
			t.Errorf("message %d has sequence number %d, the batch's first %d", i, s, seq)
		}
	}
}

// A refused batch reports the first refusal; the errors after it, still
// queued, do not answer the next batch, which commits.
func TestExecuteBatchRefusedThenNext(t *testing.T) {
	first := batchKernel(map[int]unix.Errno{1: unix.ENOENT, 2: unix.EEXIST}, 0)
	later := batchKernel(nil, 0)
	c, _ := nlconntest.New(t, func(n int, seq uint32, req []byte) []any {
		if n < 5 { // the first batch's five messages
			return first(n, seq, req)
		}
		return later(n, seq, req)
	})
	if err := c.ExecuteBatch(transaction(3)); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("refused batch: %v, want ENOENT (the first refusal)", err)
	}
	if err := c.ExecuteBatch(transaction(3)); err != nil {
		t.Fatalf("the next batch: %v; the refused one's second error answered it?", err)
	}
}

func TestExecuteBatchFailedCommit(t *testing.T) {
	c, _ := nlconntest.New(t, batchKernel(nil, unix.ENOMEM))
	if err := c.ExecuteBatch(transaction(1)); !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("failed commit: %v, want ENOMEM", err)
	}
}

func TestExecuteBatchRefusesMalformedMessages(t *testing.T) {
	c, k := nlconntest.New(t, batchKernel(nil, 0))
	msgs := transaction(1)
	if err := c.ExecuteBatch(msgs[:len(msgs)-3]); err == nil {
		t.Fatal("a cut batch was sent")
	}
	if k.Sends != 0 {
		t.Errorf("%d sends of a malformed batch", k.Sends)
	}
}
