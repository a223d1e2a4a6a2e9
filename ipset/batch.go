package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
)

// Batched writes. One IPSET_CMD_ADD or IPSET_CMD_DEL message may carry
// many entries (an IPSET_ATTR_ADT list of IPSET_ATTR_DATA, what `ipset
// restore` sends): the kernel applies them in order and stops at the
// first it refuses, naming it by the line number the element carried.
// AddEntries and DeleteEntries send as many entries per message as fit in
// maxMessage bytes, one acknowledgement per message, and carry on after a
// refused entry, so the kernel ends as it would after AddEntry (or
// DeleteEntry) for each entry in turn.
//
// Why 32 KiB per message:
//   - the kernel's error report echoes the whole request (call_ad copies
//     it into the NLMSG_ERROR) and nlconn reads every reply into a 64 KiB
//     buffer: a request must stay well below that;
//   - IPSET_ATTR_ADT is one attribute, whose length field is 16 bits;
//   - the kernel holds the ipset subsystem's mutex for a whole message:
//     a bounded message keeps other writers (the ipset tool, kube-proxy
//     during a migration) from waiting long;
//   - at 32 KiB a message carries 250–650 of the proxy's entries (about
//     50 bytes for an IPv4 address and port, 130 with kube-proxy's
//     comment), so the per-message cost (two system calls, one ack) is
//     already spread thin; larger messages would save little more.
//
// The split depends only on the entries, the set's name and its comment,
// so the Fake splits exactly as Netlink does and its message counts are
// the kernel's.
const maxMessage = 32 << 10

// Verbs counted once per message by the Fake's AddEntries and
// DeleteEntries (each entry is checked by Faults as an AddEntry or
// DeleteEntry call with Call.Batched set).
const (
	VerbAddEntries    = "AddEntries"
	VerbDeleteEntries = "DeleteEntries"
)

// errInvalidElement is a hash type's IPSET_ERR_HASH_ELEM, as the ipset
// tool words it: hash:ip refuses the unspecified address (0.0.0.0, ::).
var errInvalidElement = errors.New("invalid element for the set type")

// errnoHashFull is IPSET_ERR_TYPE_SPECIFIC, a hash set's "hash is full"
// (the Fake's EntryError.Errno for ErrHashFull, as the kernel's).
const errnoHashFull syscall.Errno = 4352

// errnoHashElem is IPSET_ERR_HASH_ELEM (errInvalidElement).
const errnoHashElem = errnoHashFull + 1

// EntriesError is the error of AddEntries or DeleteEntries when some
// entries were not written; the others were. errors.Is and errors.As see
// every entry's error (errors.Is(err, ErrHashFull)).
type EntriesError struct {
	Failed []EntryError // in the order of the call's entries
}

// EntryError is one entry a batched call did not write.
type EntryError struct {
	Index int   // in the call's entries
	Entry Entry // as the caller passed it
	// Errno is the kernel's answer for this entry (an ipset error code
	// such as IPSET_ERR_TYPE_SPECIFIC for "hash is full"), 0 when it was
	// refused before the kernel saw it.
	Errno syscall.Errno
	// Err is the error AddEntry or DeleteEntry returns for this entry.
	Err error
}

func (e *EntriesError) Error() string {
	if len(e.Failed) == 1 {
		return e.Failed[0].Err.Error()
	}
	return fmt.Sprintf("%v (and %d more entries failed)", e.Failed[0].Err, len(e.Failed)-1)
}

// Unwrap returns each failed entry's error.
func (e *EntriesError) Unwrap() []error {
	out := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		out[i] = f.Err
	}
	return out
}

// failures collects a batched call's failed entries.
type failures struct{ list []EntryError }

func (f *failures) add(i int, e Entry, errno syscall.Errno, err error) {
	f.list = append(f.list, EntryError{Index: i, Entry: e, Errno: errno, Err: err})
}

// err is nil, or the EntriesError with the failures in the call's order.
func (f *failures) err() error {
	if len(f.list) == 0 {
		return nil
	}
	slices.SortFunc(f.list, func(a, b EntryError) int { return a.Index - b.Index })
	return &EntriesError{Failed: f.list}
}

// attrLen is the room an attribute with a payload of n bytes takes in a
// message: a 4-byte header and the payload, padded to 4 bytes.
func attrLen(n int) int { return (4 + n + 3) &^ 3 }

// addrLen is the room of a nested address attribute (IPSET_ATTR_IP, IP2).
func addrLen(a netip.Addr) int {
	if a.Is4() {
		return attrLen(attrLen(4))
	}
	return attrLen(attrLen(16))
}

// entryLen is the room one IPSET_ATTR_DATA of a batch takes: the
// attributes entryData writes for e, and the element's line number.
func entryLen(e Entry, comment string) int {
	n := 0
	if e.IP.IsValid() {
		n += addrLen(e.IP)
	}
	if _, ok := protoNumber(e.Protocol); ok {
		n += attrLen(1)
	}
	if e.Protocol != "" || !e.IP.IsValid() {
		n += attrLen(2)
	}
	if e.IP2.IsValid() {
		n += addrLen(e.IP2)
	}
	if e.Net.IsValid() {
		n += addrLen(e.Net.Addr()) + attrLen(1)
	}
	if comment != "" {
		n += attrLen(len(comment) + 1)
	}
	return attrLen(n + attrLen(4))
}

// batchHeaderLen is the room of a batch message before its entries: the
// netlink and nfnetlink headers, the protocol, the set's name, the
// command's line number and the IPSET_ATTR_ADT header.
func batchHeaderLen(set string) int {
	return 16 + 4 + attrLen(1) + attrLen(len(set)+1) + attrLen(4) + 4
}

// batchLen is how many of entries (at least one) the next message of a
// batch for set carries.
func batchLen(set string, entries []Entry, comment string) int {
	room := maxMessage - batchHeaderLen(set)
	for i, e := range entries {
		if room -= entryLen(e, comment); room < 0 {
			return max(i, 1)
		}
	}
	return len(entries)
}

// MessageRoom is the room one batched message to set has for entries,
// and EntrySize the room an entry takes there (of a set without
// comments): a caller gathering entries can tell when it has a message's
// worth.
func MessageRoom(set string) int { return maxMessage - batchHeaderLen(set) }

// EntrySize: see MessageRoom.
func EntrySize(e Entry) int { return entryLen(e, "") }
