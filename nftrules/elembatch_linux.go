package nftrules

import (
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Element transactions on the proxy's own netlink socket.
//
// Set elements are the hot path: every service change adds or deletes
// some, one transaction at a time on the incremental path. google/
// nftables sends them through mdlayher/netlink, whose socket package
// starts a goroutine for every read and write to watch a context that is
// never cancelled, so one transaction of one element cost about five
// ipset writes on the sandbox's kernel (BenchmarkSandboxCommit: 0.85 ms
// against ipset's 0.16 ms per message, user-mode Linux, where every
// system call and thread switch is a trap; the kernel's own work was
// under a tenth of it). Here a transaction is encoded once and written
// with nlconn.ExecuteBatch: one send, one receive. The table's structure
// (rare, and far richer: chains, rules, expressions) and every read stay
// with google/nftables.

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (linux 5.6), which x/sys
// does not name: the last key of an interval in a concatenation.
const nftaSetElemKeyEnd = 10

// nfgenmsg is struct nfgenmsg: family, version, resource id (big-endian).
type nfgenmsg [4]byte

func (m nfgenmsg) Len() int          { return len(m) }
func (m nfgenmsg) Serialize() []byte { return m[:] }

// batchMarker is the NFNL_MSG_BATCH_BEGIN or _END of an nf_tables batch.
func batchMarker(typ, flags int) []byte {
	req := nl.NewNetlinkRequest(typ, flags)
	req.AddData(nfgenmsg{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES})
	return req.Serialize()
}

// elementBatch encodes one transaction that adds (del false) or deletes
// each op's elements in table, as `nft add element` does: no NLM_F_EXCL,
// so adding an element already there is no error; deleting an absent one
// is ENOENT for the whole batch. Only the batch's end asks for an
// acknowledgement (nlconn.ExecuteBatch says why).
func elementBatch(table string, ops []elemOp) []byte {
	b := batchMarker(unix.NFNL_MSG_BATCH_BEGIN, 0)
	for _, o := range ops {
		typ, flags := unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE
		if o.del {
			typ, flags = unix.NFT_MSG_DELSETELEM, 0
		}
		req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags)
		req.AddData(nfgenmsg{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0})
		req.AddData(nl.NewRtAttr(unix.NFTA_SET_ELEM_LIST_TABLE, nl.ZeroTerminated(table)))
		req.AddData(nl.NewRtAttr(unix.NFTA_SET_ELEM_LIST_SET, nl.ZeroTerminated(o.set.name)))
		list := nl.NewRtAttr(unix.NFTA_SET_ELEM_LIST_ELEMENTS|unix.NLA_F_NESTED, nil)
		for _, e := range o.elems {
			item := list.AddRtAttr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, nil)
			item.AddRtAttr(unix.NFTA_SET_ELEM_KEY|unix.NLA_F_NESTED, nil).AddRtAttr(unix.NFTA_DATA_VALUE, e.key)
			if e.keyEnd != nil {
				item.AddRtAttr(nftaSetElemKeyEnd|unix.NLA_F_NESTED, nil).AddRtAttr(unix.NFTA_DATA_VALUE, e.keyEnd)
			}
		}
		req.AddData(list)
		b = append(b, req.Serialize()...)
	}
	return append(b, batchMarker(unix.NFNL_MSG_BATCH_END, unix.NLM_F_ACK)...)
}

// elemOp is an opAddElems or opDelElems, as elementBatch writes it.
type elemOp struct {
	set   *setSpec
	elems []element
	del   bool
}

// elementOps returns ops as elemOps when every one of them adds or
// deletes elements (ok false otherwise, or for an exclusive add, which
// only the fake's tests ask for).
func elementOps(ops []op) (out []elemOp, ok bool) {
	for _, o := range ops {
		switch o := o.(type) {
		case opAddElems:
			if o.excl {
				return nil, false
			}
			out = append(out, elemOp{set: o.set, elems: o.elems})
		case opDelElems:
			out = append(out, elemOp{set: o.set, elems: o.elems, del: true})
		default:
			return nil, false
		}
	}
	return out, len(out) > 0
}
