package nftrules

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// GenerationReader reads nf_tables' ruleset generation: a counter the
// kernel bumps at every committed transaction in the network namespace,
// by anyone and to any table (our own element writes too). One
// NFT_MSG_GETGEN request and its one reply on a lasting socket: a few
// microseconds, no dump, so the Monitor can look every second.
// google/nftables only parses NEWGEN in its event monitor, so the
// request is sent here. Safe for concurrent use.
type GenerationReader struct {
	// NetNS is the network namespace's file descriptor; 0 is the
	// process's own.
	NetNS int

	mu   sync.Mutex
	conn *netlink.Conn
}

// Generation returns the current generation.
func (g *GenerationReader) Generation() (uint32, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: g.NetNS})
		if err != nil {
			return 0, fmt.Errorf("nftables: dial: %w", err)
		}
		g.conn = c
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, // struct nfgenmsg
	}
	replies, err := g.conn.Execute(req)
	if err != nil {
		g.closeLocked()
		return 0, fmt.Errorf("nftables: get generation: %w", err)
	}
	for _, m := range replies {
		if gen, ok := parseGen(m); ok {
			return gen, nil
		}
	}
	return 0, fmt.Errorf("nftables: get generation: no NFTA_GEN_ID in %d replies", len(replies))
}

// parseGen reads NFTA_GEN_ID from a NEWGEN message.
func parseGen(m netlink.Message) (uint32, bool) {
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
		return 0, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return 0, false
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32(), true
		}
	}
	return 0, false
}

// Close releases the socket; a later Generation opens a new one.
func (g *GenerationReader) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closeLocked()
	return nil
}

func (g *GenerationReader) closeLocked() {
	if g.conn != nil {
		_ = g.conn.Close()
		g.conn = nil
	}
}
