package nodewatch

import (
	"context"
	"net/netip"
	"slices"
	gosync "sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// TaintToBeDeleted is put on a node the cluster autoscaler is removing;
// kube-proxy's /healthz then fails so load balancers drain the node.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// Watcher follows this node and tells update when what the builder knows
// about the node changes.
type Watcher struct {
	dummy    dummyif.Interface
	nodePort NodePortFilter
	update   func(sync.NodeFacts) // the runner's UpdateNode

	mu       gosync.Mutex
	node     *v1.Node
	host     []netip.Addr // every address on other interfaces, sorted
	last     sync.NodeFacts
	eligible bool
}

// New returns a watcher reading addresses through dummy and reporting
// changes to update (nil: none).
func New(dummy dummyif.Interface, f NodePortFilter, update func(sync.NodeFacts)) *Watcher {
	if update == nil {
		update = func(sync.NodeFacts) {}
	}
	return &Watcher{dummy: dummy, nodePort: f, update: update}
}

func factsEqual(a, b sync.NodeFacts) bool {
	return a.Zone == b.Zone && slices.Equal(a.NodePortAddresses, b.NodePortAddresses) && slices.Equal(a.HostAddresses, b.HostAddresses)
}

// Refresh re-reads the interface addresses and reports a change. A failed
// read keeps what was known, and is returned.
func (w *Watcher) Refresh() error {
	addrs, err := w.dummy.LocalAddresses()
	if err != nil {
		return err
	}
	// Link-local addresses come and go with every pod's veth (each gets its
	// own fe80::) and can be neither a node port address nor an external
	// or load-balancer IP: leaving them out keeps pod churn from looking
	// like a node change, which would cost a full pass each time.
	addrs = slices.DeleteFunc(addrs, func(a netip.Addr) bool { return a.IsLinkLocalUnicast() })
	slices.SortFunc(addrs, netip.Addr.Compare)
	w.mu.Lock()
	w.host = slices.Compact(addrs)
	w.mu.Unlock()
	w.publish()
	return nil
}

func (w *Watcher) publish() {
	w.mu.Lock()
	f := sync.NodeFacts{HostAddresses: w.host, NodePortAddresses: w.nodePort.Pick(w.host, w.node)}
	if w.node != nil {
		f.Zone = w.node.Labels[sync.LabelZone]
	}
	changed := !factsEqual(f, w.last)
	w.last = f
	w.mu.Unlock()
	if !changed {
		return
	}
	klog.InfoS("Node addresses or zone changed", "nodePortAddresses", f.NodePortAddresses, "hostAddresses", f.HostAddresses, "zone", f.Zone)
	w.update(f)
}

// Run polls the interface addresses every period until ctx ends. Polling
// a short address list is cheap and catches every change, including those
// a missed netlink notification would lose.
func (w *Watcher) Run(ctx context.Context, period time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) {
		if err := w.Refresh(); err != nil {
			klog.ErrorS(err, "Reading the node's addresses")
		}
	}, period)
}

// SetNode records the node's Node object (from the informer, or read once
// by `diff`).
func (w *Watcher) SetNode(n *v1.Node) {
	w.mu.Lock()
	w.node = n
	w.eligible = n.DeletionTimestamp == nil && !slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == TaintToBeDeleted })
	w.mu.Unlock()
	w.publish()
}

// Handler returns informer callbacks for this node's Node object.
func (w *Watcher) Handler() cache.ResourceEventHandler {
	set := func(obj any) {
		if n, ok := obj.(*v1.Node); ok {
			w.SetNode(n)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(any) {
			w.mu.Lock()
			w.eligible = false
			w.mu.Unlock()
		},
	}
}

// Eligible reports whether the node should receive traffic (for /healthz).
// Before the Node object is seen the node is assumed eligible.
func (w *Watcher) Eligible() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.node == nil || w.eligible
}

// Config returns base with the node facts last published.
func (w *Watcher) Config(base sync.Config) sync.Config {
	w.mu.Lock()
	f := w.last
	w.mu.Unlock()
	f.ApplyTo(&base)
	return base
}
