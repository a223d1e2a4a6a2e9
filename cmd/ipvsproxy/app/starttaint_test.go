package app

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const startKey = "node.ipvsproxy.io/proxy-not-ready"

func taintedNode(taints ...v1.Taint) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "7"}, Spec: v1.NodeSpec{Taints: taints}}
}

var (
	ours       = v1.Taint{Key: startKey, Effect: v1.TaintEffectNoSchedule}
	oursExec   = v1.Taint{Key: startKey, Effect: v1.TaintEffectNoExecute}
	cni        = v1.Taint{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: v1.TaintEffectNoSchedule}
	unschedule = v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}
)

func nodeTaints(t *testing.T, c *fake.Clientset) []v1.Taint {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Taints
}

func patches(c *fake.Clientset) []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

// TestStartupTaintOnlyOursRemoved: every taint with our key goes (both
// effects), the others stay as they were, in one patch guarded by the
// Node's resourceVersion.
func TestStartupTaintOnlyOursRemoved(t *testing.T) {
	c := fake.NewClientset(taintedNode(cni, ours, unschedule, oursExec))
	removed, err := startupTaint{client: c, node: "node-a", key: startKey}.remove(context.Background())
	if err != nil || !removed {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if got, want := nodeTaints(t, c), []v1.Taint{cni, unschedule}; !reflect.DeepEqual(got, want) {
		t.Errorf("taints %+v, want %+v", got, want)
	}
	p := patches(c)
	if len(p) != 1 {
		t.Fatalf("%d patches, want 1", len(p))
	}
	var body struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(p[0].GetPatch(), &body); err != nil || body.Metadata.ResourceVersion != "7" {
		t.Errorf("patch %s does not carry the Node's resourceVersion 7 (%v)", p[0].GetPatch(), err)
	}
}

// TestStartupTaintAbsentNoWrite: a Node without the taint is only read.
func TestStartupTaintAbsentNoWrite(t *testing.T) {
	c := fake.NewClientset(taintedNode(cni))
	removed, err := startupTaint{client: c, node: "node-a", key: startKey}.remove(context.Background())
	if err != nil || removed {
		t.Fatalf("remove: %v %v, want nothing removed", removed, err)
	}
	if p := patches(c); len(p) != 0 {
		t.Errorf("%d patches of a Node without the taint", len(p))
	}
	if got := nodeTaints(t, c); !reflect.DeepEqual(got, []v1.Taint{cni}) {
		t.Errorf("taints %+v changed", got)
	}
}

// TestStartupTaintConflictRetried: another controller changed the Node
// between our read and our patch (the API server answers Conflict): the
// Node is read again and the taint removed, keeping that controller's
// change.
func TestStartupTaintConflictRetried(t *testing.T) {
	c := fake.NewClientset(taintedNode(ours))
	conflicts := 1
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts == 0 {
			return false, nil, nil
		}
		conflicts--
		// The other writer's change, then the conflict its new
		// resourceVersion causes.
		n := taintedNode(ours, cni)
		n.ResourceVersion = "8"
		if err := c.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, n, ""); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "node-a", errors.New("the object has been modified"))
	})
	removed, err := startupTaint{client: c, node: "node-a", key: startKey}.remove(context.Background())
	if err != nil || !removed {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if got := nodeTaints(t, c); !reflect.DeepEqual(got, []v1.Taint{cni}) {
		t.Errorf("taints %+v, want only the other controller's", got)
	}
	if p := patches(c); len(p) != 2 {
		t.Errorf("%d patches, want the conflicting one and its retry", len(p))
	}
}

// TestStartupTaintWaitsForReady: nothing is written before the proxy is
// ready; once it is, the taint goes.
func TestStartupTaintWaitsForReady(t *testing.T) {
	c := fake.NewClientset(taintedNode(ours, cni))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		startupTaint{client: c, node: "node-a", key: startKey, retryMax: time.Second}.removeWhenReady(ctx, ready)
	}()
	time.Sleep(50 * time.Millisecond)
	if len(c.Actions()) != 0 {
		t.Fatalf("the Node was touched before ready: %v", c.Actions())
	}
	close(ready)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the taint was not removed once ready")
	}
	if got := nodeTaints(t, c); !reflect.DeepEqual(got, []v1.Taint{cni}) {
		t.Errorf("taints %+v after ready", got)
	}
}
