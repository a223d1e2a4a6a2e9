package main

import (
	"fmt"
	"sort"
	"strings"
)

// Variant is one image the builder makes from the same lock.
type Variant struct {
	// Name is what --variant and `make image IMAGE_VARIANT=` take; every
	// variant but the default one is tagged <version>-<name>.
	Name string
	// Roots are the packages it is built from, with their dependencies as
	// the lock has them; nil is every locked package (the default image).
	// A variant's roots must be among Roots, so `make image-lock` locks
	// what it needs.
	Roots []string
	// IPTables adds the iptables alternatives (iptables -> iptables-nft)
	// and the iptables wrapper.
	IPTables bool
	// Description is the image's org.opencontainers.image.description.
	Description string
}

// Variants are the images there are.
//
// nftables is the image for --rules-backend=nftables. The proxy then
// writes everything over netlink from Go (IPVS, kube-ipvs0's addresses,
// the nftables table, conntrack entries), so it holds no iptables,
// ipset, ipvsadm, conntrack or iproute2: the proof that IPVS mode needs
// neither iptables nor ipset. What it keeps:
//   - kmod, for modprobe: the node-prep init container loads the ip_vs
//     modules (the proxy container is not privileged and may not), and
//     moby/ipvs runs `modprobe -va ip_vs` once when the proxy opens IPVS
//     (it only logs a failure);
//   - dash, for node-prep.sh (it uses nothing but sh and modprobe), so the
//     DaemonSet's commands are the same with either image;
//   - base-files, for /etc/os-release, which image scanners read.
//
// ipvsadm is left out on purpose: `ipvsproxy status` and `ipvsproxy diff`
// show what is programmed, and an operator who wants ipvsadm has it in
// the default image (`kubectl debug` with it, or the host's).
var Variants = []Variant{
	{Name: "default", IPTables: true},
	{Name: "nftables", Roots: []string{"base-files", "dash", "kmod"},
		Description: "ipvsproxy for --rules-backend=nftables: no iptables, ipset, ipvsadm or conntrack tools"},
}

// variantNamed returns the variant called name.
func variantNamed(name string) (Variant, error) {
	var names []string
	for _, v := range Variants {
		if v.Name == name {
			return v, nil
		}
		names = append(names, v.Name)
	}
	return Variant{}, fmt.Errorf("unknown image variant %q (%s)", name, strings.Join(names, ", "))
}

// selectPins returns the pins of arch the variant is built from: all of
// them for the default image, else the closure of its roots over Depends
// and Pre-Depends as the locked packages' own control files give them
// (control reads one; only the packages reached are read). For "a | b"
// it takes the first alternative the lock has, as the lock's resolve
// took the first the index had.
func selectPins(pins []Pin, arch string, v Variant, control func(Pin) (Paragraph, error)) ([]Pin, error) {
	byName := map[string]Pin{}
	var all []Pin
	for _, p := range pins {
		if p.Arch == arch {
			byName[p.Name] = p
			all = append(all, p)
		}
	}
	if v.Roots == nil {
		return all, nil
	}
	seen := map[string]bool{}
	queue := append([]string(nil), v.Roots...)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		p, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("variant %s needs %s, which the lock has not for %s: run `make image-lock`", v.Name, name, arch)
		}
		seen[name] = true
		c, err := control(p)
		if err != nil {
			return nil, err
		}
		for _, field := range []string{c["Pre-Depends"], c["Depends"]} {
			for _, alts := range depNames(field) {
				pick, excluded := pickDependency(alts, func(a string) bool { _, ok := byName[a]; return ok })
				switch {
				case excluded:
				case pick == "":
					return nil, fmt.Errorf("variant %s: %s depends on %s, which the lock has not for %s: run `make image-lock`", v.Name, name, strings.Join(alts, " | "), arch)
				default:
					queue = append(queue, pick)
				}
			}
		}
	}
	var out []Pin
	for _, p := range all {
		if seen[p.Name] {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
