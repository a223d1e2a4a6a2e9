package nftrules

import (
	"fmt"
	"reflect"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// structure answers the read of the table's structure as the kernel
// does, so that Sync's comparison meets on the fake what it meets on the
// kernel: each rule's expressions are encoded as google/nftables sends
// them, changed as the kernel's dump changes them (kernelDump), and
// parsed back by google/nftables; chains carry a type, hook, priority
// and policy only when they are base chains; sets their key type,
// length and flags.
func (k *fakeKernel) structure() (*liveTable, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.table == nil {
		return nil, nil
	}
	out := &liveTable{}
	for _, s := range k.table.sets {
		out.sets = append(out.sets, liveSetOf(nftSet(nil, s.spec)))
	}
	for _, c := range k.table.chains {
		lc := liveChain{name: c.name, hook: wantHook(c.hook)}
		if lc.hook != nil && c.drop {
			lc.hook.policy = nftables.ChainPolicyDrop
		}
		for _, r := range c.rules {
			var exprs []expr.Any
			for _, e := range r.exprs() {
				d, err := kernelDump(e)
				if err != nil {
					return nil, fmt.Errorf("chain %s: %w", c.name, err)
				}
				exprs = append(exprs, d)
			}
			lc.rules = append(lc.rules, exprs)
		}
		out.chains = append(out.chains, lc)
	}
	return out, nil
}

// The kernel's bitwise operation attribute and its mask-and-xor value
// (linux/netfilter/nf_tables.h; x/sys/unix lacks them).
const (
	nftaBitwiseOp  = unix.NFTA_BITWISE_XOR + 1
	nftBitwiseBool = 0
)

// kernelDump is e as a rule dump returns it, parsed by google/nftables.
// What the kernel (6.12) dumps differs from what was sent in:
//   - bitwise: NFTA_BITWISE_OP is always dumped (nft_bitwise_dump);
//   - lookup: NFTA_LOOKUP_FLAGS is always dumped, NFTA_LOOKUP_SET_ID
//     never (nft_lookup_dump);
//   - registers: by the names nft_dump_register gives (dumpedRegister);
//
// and every other expression this package writes is dumped with the
// attributes it was sent with.
func kernelDump(e expr.Any) (expr.Any, error) {
	fam := byte(nftables.TableFamilyINet)
	data, err := expr.MarshalExprData(fam, e)
	if err != nil {
		return nil, err
	}
	attrs, err := netlink.UnmarshalAttributes(data)
	if err != nil {
		return nil, err
	}
	switch e.(type) {
	case *expr.Bitwise:
		attrs = append(attrs, netlink.Attribute{Type: nftaBitwiseOp, Data: []byte{0, 0, 0, nftBitwiseBool}})
	case *expr.Lookup:
		flags := []byte{0, 0, 0, 0}
		kept := attrs[:0]
		for _, a := range attrs {
			switch a.Type {
			case unix.NFTA_LOOKUP_SET_ID:
			case unix.NFTA_LOOKUP_FLAGS:
				flags = a.Data
			default:
				kept = append(kept, a)
			}
		}
		attrs = append(kept, netlink.Attribute{Type: unix.NFTA_LOOKUP_FLAGS, Data: flags})
	}
	dumped, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	out := reflect.New(reflect.TypeOf(e).Elem()).Interface().(expr.Any)
	if err := expr.Unmarshal(fam, dumped, out); err != nil {
		return nil, err
	}
	return withDumpedRegisters(out), nil
}
