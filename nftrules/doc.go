// Package nftrules is the nftables backend of ipvsproxy's node-wide
// rules and service sets: one table, "inet ipvsproxy", owned whole,
// holding the behaviour of the iptables backend's fixed rules (package
// iptables) and of kube-proxy's ipsets, programmed over netlink with
// github.com/google/nftables — no nft, iptables or ipset process.
//
// The parts, one job each:
//   - sets.go: which nft set stands in for each ipset (the table is on
//     the mappings variable), and an ipset.Entry as an element's key;
//   - rules.go and table.go: the table's chains and rules for a Config;
//   - stmt.go: each rule part as kernel expressions and as `nft list`
//     prints it — one value, so the fake's text and the kernel's
//     messages cannot drift apart;
//   - writer.go: Interface, shared by both backends: Sync reads the
//     structure back and writes it in one transaction only on drift,
//     elements go in transactions of at most MaxBatch;
//   - readback.go: the table as read back, compared with the wanted
//     one (robust to what the kernel adds), and the repair transaction;
//   - drift.go: Drift, that comparison's findings for `ipvsproxy diff`,
//     read without a write;
//   - monitor.go and generation_linux.go: Monitor, which syncs the
//     table when nf_tables' generation moved, between full passes;
//   - ipsets.go: IPSets, the table's sets as ipset.Interface for the
//     engine's owned.Kernel;
//   - netlink_linux.go and netlink_read_linux.go: transactions to and
//     reads from the kernel; elembatch_linux.go: element transactions,
//     the hot path, encoded here and written on internal/nlconn (one
//     send, one receive) instead of through google/nftables; fakekernel.go: transactions to an
//     in-memory nf_tables that refuses what the kernel refuses, with its
//     errno; fakeread.go: its read-back, as the kernel dumps it;
//     fake.go: Fake, whose String is `nft list table inet ipvsproxy`.
//
// The engine keeps its shape: it names sets by their ipset names and
// entries as ipset.Entry, and this package maps them.
package nftrules
