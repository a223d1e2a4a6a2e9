//go:build e2e

package main

// The floor (issue 20: "measure the floor in the same run"): once the
// proxy is stopped, what it programmed is read back from the kernel
// (untimed) and written again, timed, by a raw writer into a fresh
// network namespace of the same kernel (floorwrite.go). Reading the
// kernel rather than deriving the objects from the workload makes them
// the same objects by construction: every virtual server with its
// scheduler, flags and real servers, every address on kube-ipvs0, every
// set the proxy created with its header and members.

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// floorObjects is what the proxy left in the kernel, as the floor
// writes it again.
type floorObjects struct {
	Addrs []netip.Addr
	Sets  []floorSet
	VS    []floorVS
	// VSDump is how the kernel's dump of the virtual servers went.
	VSDump dumpTiming
}

type floorSet struct {
	ipset.Set
	Entries []ipset.Entry
}

type floorVS struct {
	ipvs.VirtualServer
	Reals []ipvs.RealServer
}

// realCount and entryCount are the real servers and set entries held.
func (o *floorObjects) realCount() int {
	n := 0
	for _, v := range o.VS {
		n += len(v.Reals)
	}
	return n
}

func (o *floorObjects) entryCount() int {
	n := 0
	for _, s := range o.Sets {
		n += len(s.Entries)
	}
	return n
}

func (o *floorObjects) String() string {
	return fmt.Sprintf("%d addresses, %d sets with %d entries, %d virtual servers with %d real servers",
		len(o.Addrs), len(o.Sets), o.entryCount(), len(o.VS), o.realCount())
}

// captureKernel reads the proxy's objects through the project's own
// adapters (their dumps are the fastest reads there are; this read is
// not timed). What the kernel reports but never takes on a write is
// dropped: counters, connection counts, the hashed flag. Virtual
// servers are sorted by address, port and protocol, near the order the
// proxy created them in (the informers deliver services by namespace
// and name, which the workload's addresses follow); the kernel's dump
// order is its hash order. progress is told how far the read is, every
// ~10 s.
func captureKernel(v ipvs.Interface, s ipset.Interface, d dummyif.Interface, progress func(string)) (*floorObjects, error) {
	o := &floorObjects{}
	var err error
	if o.Addrs, err = d.ListAddresses(); err != nil {
		return nil, fmt.Errorf("list the addresses on kube-ipvs0: %w", err)
	}
	sets, err := s.ListSets()
	if err != nil {
		return nil, fmt.Errorf("list the sets: %w", err)
	}
	for _, set := range sets {
		entries, err := s.ListEntries(set.Name)
		if err != nil {
			return nil, fmt.Errorf("list the entries of set %s: %w", set.Name, err)
		}
		o.Sets = append(o.Sets, floorSet{Set: set, Entries: entries})
	}
	vss, dump, err := timedWalk(v)
	o.VSDump = dump
	if err != nil {
		return nil, fmt.Errorf("list the virtual servers: %w", err)
	}
	slices.SortFunc(vss, func(a, b ipvs.VirtualServer) int {
		return cmp.Or(a.Address.Compare(b.Address), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	lastLog := time.Now()
	for i, vs := range vss {
		reals, err := v.ListRealServers(vs.ServiceKey)
		if err != nil {
			return nil, fmt.Errorf("list the real servers of %v: %w", vs.ServiceKey, err)
		}
		for j := range reals {
			reals[j].ActiveConns, reals[j].InactiveConns = 0, 0
		}
		vs.Stats, vs.Flags = ipvs.Stats{}, vs.Flags&^ipvs.FlagHashed
		o.VS = append(o.VS, floorVS{VirtualServer: vs, Reals: reals})
		if time.Since(lastLog) >= 10*time.Second {
			progress(fmt.Sprintf("real servers of %d of %d virtual servers read", i+1, len(vss)))
			lastLog = time.Now()
		}
	}
	return o, nil
}

// setMessages is how many IPSET_CMD_ADD messages package ipset's
// AddEntries sends for entries (no comments, none refused): as many
// entries per message as fit ipset.MessageRoom.
func setMessages(set string, entries []ipset.Entry) int {
	n, room := 0, 0
	for _, e := range entries {
		size := ipset.EntrySize(e)
		if n == 0 || room < size {
			n, room = n+1, ipset.MessageRoom(set)
		}
		room -= size
	}
	return n
}
