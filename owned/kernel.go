package owned

import (
	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Kernel bundles the kernel adapters that hold what ipvsproxy owns: the
// engine writes through it, inspect and cleanup read (and cleanup
// removes) through it.
type Kernel struct {
	IPVS  ipvs.Interface
	Dummy dummyif.Interface
	IPSet ipset.Interface
}
