// Package nlconn is the netlink request/reply connection the kernel
// adapters (ipvs, ipset, dummyif) send every write (Execute: one send
// and one receive, into a reused buffer) and read every dump (Dump)
// with. Many writes can share a round trip (ExecutePipelined: up to
// MaxPipelined requests in one send, their acknowledgements read by
// recvmmsg, each message's outcome by its sequence number; see
// pipeline_linux.go for what the kernel does with such a send). An
// nfnetlink transaction, applied whole (nftrules' set elements), is one
// send and one acknowledgement (ExecuteBatch).
//
// A full pass on a large node dumps 100,000 virtual servers, a million
// real servers and sets of as many entries. The libraries the adapters
// otherwise use read a whole dump into memory before returning it, and
// moby/ipvs keeps reading forever when a reply's sequence number does
// not match. Conn instead hands each reply message to a callback as it
// arrives, in one reused receive buffer, and bounds every wait:
//
//   - the receive buffer (SO_RCVBUFFORCE when privileged, else SO_RCVBUF)
//     is sized so the kernel never finds it full when it builds the next
//     part of a dump;
//   - a system call interrupted by a signal (EINTR) is repeated;
//   - a dump the kernel marks inconsistent (NLM_F_DUMP_INTR) or that lost
//     messages (ENOBUFS) is restarted from the beginning a bounded number
//     of times, after the caller's reset has dropped what it had (a
//     reader that follows its own writes another way takes an
//     inconsistent dump as it came: DumpAmidWrites);
//   - a receive times out, so a lost reply cannot hang the sync loop;
//   - replies to other requests (another sequence number) are skipped.
package nlconn

import "errors"

// ErrDumpInterrupted says a dump could not be read consistently: the
// kernel reported it was interrupted by a concurrent change, or replies
// were lost, and it was not (or no longer) restarted. What the callback
// received is incomplete or mixes two states of the table; drop it.
var ErrDumpInterrupted = errors.New("netlink dump interrupted by concurrent changes; results would be inconsistent")

// ErrAckLost is wrapped by the error of a pipelined request whose
// acknowledgement never came: the receive buffer overflowed (ENOBUFS)
// or the wait timed out. The kernel may or may not have applied it.
var ErrAckLost = errors.New("no acknowledgement from the kernel; the request may or may not have been applied")

// MaxPipelined bounds the messages of one send of ExecutePipelined. The
// acknowledgements of 256 writes take about 256 KiB of receive buffer
// (pipeline_linux.go); at that size the per-send cost is spread thin
// enough that larger batches would save little while holding the socket
// longer. Package ipvs's Fake counts its batched writes' sends by it.
const MaxPipelined = 256
