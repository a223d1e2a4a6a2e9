package iptables

import (
	"errors"
	"os/exec"
)

// ErrNoTools is DetectBackend's and ResolveBackend's error on a machine
// without iptables tools (the nftables image): neither backend's save
// tool is on the PATH, so there is nothing to detect, read or write with.
var ErrNoTools = errors.New("iptables: no iptables tools here (neither iptables-nft-save nor iptables-legacy-save is on the PATH)")

// lookPath is exec.LookPath; a variable for the tests.
var lookPath = exec.LookPath

// HaveTools reports whether either backend's IPv4 save and restore tools
// are on the PATH. Without them the iptables backend cannot run, and its
// chains on the node can be neither read nor removed.
func HaveTools() bool {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		_, serr := lookPath(binary(IPv4, b, "save"))
		_, rerr := lookPath(binary(IPv4, b, "restore"))
		if serr == nil && rerr == nil {
			return true
		}
	}
	return false
}
