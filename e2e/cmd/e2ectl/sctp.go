//go:build e2e

package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// sctpBackend is a pod's SCTP server: it accepts associations on ip:port
// and sends the pod's name on each, then shuts the association down, so a
// client learns which pod IPVS chose (as backend does for TCP and UDP).
// Go's net package has no SCTP, so this uses one-to-one style sockets
// (SOCK_STREAM, IPPROTO_SCTP), which behave like TCP's.
//
// It binds the pod's own address rather than the wildcard: the INIT-ACK
// then lists no further addresses, so the client keeps to the one path
// IPVS translates.
func sctpBackend(args []string) error {
	fs := flag.NewFlagSet("sctp", flag.ExitOnError)
	name := fs.String("name", "", "pod name to answer with")
	ip := fs.String("ip", "", "IPv4 address to listen on")
	port := fs.Int("port", 0, "SCTP port")
	_ = fs.Parse(args)
	addr, err := netip.ParseAddr(*ip)
	if *name == "" || err != nil || !addr.Is4() || *port < 1 || *port > 65535 {
		return fmt.Errorf("sctp: want --name, an IPv4 --ip and a --port (got %q %q %d)", *name, *ip, *port)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("sctp socket (is the sctp module loaded?): %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: *port}); err != nil {
		return fmt.Errorf("sctp bind %s:%d: %w", addr, *port, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "backend %s: sctp %s:%d\n", *name, addr, *port)
	reply := []byte(*name + "\n")
	for {
		c, _, err := unix.Accept(fd)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return err
		}
		_, _ = unix.Write(c, reply)
		unix.Close(c)
	}
}
