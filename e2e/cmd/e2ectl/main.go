//go:build e2e

// Command e2ectl is the sandbox's helper, one static binary for the guest:
//
//	e2ectl backend --name N --tcp 8080 --udp 5353   a pod's server: answers with N
//	                                                (GET /peer: "N SOURCE-ADDRESS")
//	e2ectl sctp --name N --ip IP --port P           a pod's SCTP server: answers with N
//	e2ectl keys DIR                                 service-account key pair for the apiserver
//	e2ectl node --kubeconfig F --name N --ip IP     register the sandbox Node
//	e2ectl apply --kubeconfig F [--pods DIR] FILE…  create Services/EndpointSlices
//	                                                (and, with --pods, a pod per endpoint)
//	e2ectl ask tcp|udp IP PORT [N]                  N requests; prints which pod answered
//
// It saves building kubectl and openssl dependencies for a fresh machine.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: e2ectl backend|keys|node|apply|ask ...")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "backend":
		err = backend(args)
	case "sctp":
		err = sctpBackend(args)
	case "keys":
		err = keys(args)
	case "node":
		err = node(args)
	case "apply":
		err = apply(args)
	case "ask":
		err = ask(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2ectl:", err)
		os.Exit(1)
	}
}

// keys writes sa.key (RSA private, PKCS#1 PEM) and sa.pub (PKIX PEM).
func keys(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: e2ectl keys DIR")
	}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(args[0], 0o700); err != nil {
		return err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	if err := os.WriteFile(filepath.Join(args[0], "sa.key"), priv, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(args[0], "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// node registers the sandbox's Node: ipvsproxy reads its own Node (node
// IPs, labels) and there is no kubelet to create it.
func node(args []string) error {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	name := fs.String("name", "sandbox-node", "node name")
	ip := fs.String("ip", "", "InternalIP")
	_ = fs.Parse(args)
	c, err := framework.NewCluster(*kubeconfig, *name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.RegisterNode(ctx, *name, *ip)
}

func apply(args []string) error {
	fs := flag.NewFlagSet("apply", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	pods := fs.String("pods", "", "if set, start a pod per endpoint address, logs in this folder")
	_ = fs.Parse(args)
	objs, err := framework.ReadManifests(fs.Args()...)
	if err != nil {
		return err
	}
	if *pods != "" {
		for _, p := range framework.PodsOf(objs) {
			// The backends keep running after e2ectl exits: they are the demo's pods.
			if _, err := framework.StartPod(p.Name, p.IP, p.TCPPorts, p.UDPPorts, *pods); err != nil {
				return err
			}
			fmt.Printf("pod %-10s %-12s tcp %v udp %v\n", p.Name, p.IP, p.TCPPorts, p.UDPPorts)
		}
	}
	c, err := framework.NewCluster(*kubeconfig, "")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.Apply(ctx, objs)
}

// ask is the demo's client for UDP (curl covers TCP): one fresh socket per
// request, so round-robin shows.
func ask(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("usage: e2ectl ask tcp|udp IP PORT [N]")
	}
	f := framework.GetTCP
	if args[0] == "udp" {
		f = framework.AskUDP
	}
	port, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	n := 1
	if len(args) > 3 {
		if n, err = strconv.Atoi(args[3]); err != nil {
			return err
		}
	}
	for i := 0; i < n; i++ {
		name, err := f(args[1], port)
		if err != nil {
			return err
		}
		fmt.Printf("%s %s:%d answered by %s\n", args[0], args[1], port, name)
	}
	return nil
}
