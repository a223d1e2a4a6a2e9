package ipvs

import (
	"errors"
	"fmt"
	"time"
)

// validateService rejects what the kernel would reject or silently
// misread, so the real Handle and the Fake fail identically and the kernel
// never sees a request we know to be wrong.
func validateService(k ServiceKey) error {
	switch {
	case !k.Address.IsValid():
		return errors.New("invalid virtual server address")
	case k.Address.Is4In6():
		// Fake and kernel would disagree on the key's family; the engine
		// must pass plain IPv4.
		return fmt.Errorf("virtual server address %s is IPv4-mapped IPv6; use the IPv4 form", k.Address)
	case k.Address.Zone() != "":
		return fmt.Errorf("virtual server address %s has a zone", k.Address)
	case k.Protocol != TCP && k.Protocol != UDP && k.Protocol != SCTP:
		return fmt.Errorf("unsupported protocol %s", k.Protocol)
	}
	return nil
}

func validateVirtualServer(vs VirtualServer) error {
	if err := validateService(vs.ServiceKey); err != nil {
		return err
	}
	if vs.Scheduler == "" {
		return errors.New("no scheduler")
	}
	return nil
}

// maxWeight is ipvsadm's limit. The kernel takes any non-negative int,
// and our dumps read it back whole (moby/ipvs read only 16 bits), but
// weights past ipvsadm's range would confuse the operator's tools.
const maxWeight = 0xffff

func validateReal(vs ServiceKey, rs RealServer) error {
	if err := validateRealKey(vs, rs.RealKey); err != nil {
		return err
	}
	if rs.Weight < 0 || rs.Weight > maxWeight {
		return fmt.Errorf("weight %d out of range 0-%d", rs.Weight, maxWeight)
	}
	return nil
}

func validateRealKey(vs ServiceKey, rs RealKey) error {
	if err := validateService(vs); err != nil {
		return err
	}
	switch {
	case !rs.Address.IsValid():
		return errors.New("invalid real server address")
	case rs.Address.Is4In6():
		return fmt.Errorf("real server address %s is IPv4-mapped IPv6; use the IPv4 form", rs.Address)
	case rs.Address.Zone() != "":
		return fmt.Errorf("real server address %s has a zone", rs.Address)
	case rs.Address.Is4() != vs.Address.Is4():
		// The kernel allows mixed families only for tunnelling; we masquerade.
		return fmt.Errorf("real server %s and virtual server %s differ in address family", rs.Address, vs.Address)
	}
	return nil
}

// secondsTimeouts converts to whole seconds, the kernel's unit. A positive
// timeout under a second is rounded up, because truncating it to 0 would
// silently mean "leave as is".
func secondsTimeouts(t Timeouts) (Timeouts, error) {
	conv := func(name string, d time.Duration) (time.Duration, error) {
		if d < 0 {
			return 0, fmt.Errorf("negative %s timeout %s", name, d)
		}
		secs := (d + time.Second - 1) / time.Second
		if secs > 1<<31-1 {
			return 0, fmt.Errorf("%s timeout %s too large", name, d)
		}
		return secs * time.Second, nil
	}
	var out Timeouts
	var err error
	if out.TCP, err = conv("tcp", t.TCP); err != nil {
		return Timeouts{}, err
	}
	if out.TCPFin, err = conv("tcpfin", t.TCPFin); err != nil {
		return Timeouts{}, err
	}
	if out.UDP, err = conv("udp", t.UDP); err != nil {
		return Timeouts{}, err
	}
	return out, nil
}
