//go:build e2e

package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// backend is a pod's workload: every HTTP GET and every UDP datagram is
// answered with the pod's name, so a client learns which pod IPVS chose
// (GET /peer also tells the client's address as the pod saw it).
func backend(args []string) error {
	fs := flag.NewFlagSet("backend", flag.ExitOnError)
	name := fs.String("name", "", "pod name to answer with")
	tcp := fs.String("tcp", "", "comma-separated TCP (HTTP) ports")
	udp := fs.String("udp", "", "comma-separated UDP ports")
	_ = fs.Parse(args)
	if *name == "" {
		return fmt.Errorf("backend: --name is required")
	}
	errs := make(chan error)
	for _, port := range ports(*tcp) {
		l, err := net.Listen("tcp", ":"+port)
		if err != nil {
			return err
		}
		go func() { errs <- http.Serve(l, backendHandler(*name)) }()
	}
	for _, port := range ports(*udp) {
		c, err := net.ListenPacket("udp", ":"+port)
		if err != nil {
			return err
		}
		go func() { errs <- serveUDP(c, *name) }()
	}
	fmt.Fprintf(os.Stderr, "backend %s: tcp [%s] udp [%s]\n", *name, *tcp, *udp)
	return <-errs
}

// backendHandler answers every path with the pod's name, except /peer,
// which adds the source address the pod saw ("NAME ADDR"): the
// masquerading tests tell from it whether the client's address survived.
func backendHandler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/peer", func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, name, host)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, name) })
	return mux
}

func serveUDP(c net.PacketConn, name string) error {
	buf := make([]byte, 2048)
	reply := []byte(name + "\n")
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = c.WriteTo(reply, from)
	}
}

func ports(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if _, err := strconv.Atoi(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
