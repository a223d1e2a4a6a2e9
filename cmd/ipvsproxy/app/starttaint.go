package app

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// startupTaint is --remove-startup-taint: a taint the node was registered
// with (kubelet --register-with-taints) keeps pods that do not tolerate
// it off the node while the proxy programs it; the proxy takes it off
// once ready, so a scheduler never places a pod on a node where its
// Services do not answer yet.
type startupTaint struct {
	client kubernetes.Interface
	node   string
	key    string
	// retryMax caps the wait between two attempts that failed for another
	// reason than a conflict (API server away, RBAC missing).
	retryMax time.Duration
}

// removeWhenReady waits for ready, then removes the taint, trying again
// with backoff until it is gone or ctx ends.
func (s startupTaint) removeWhenReady(ctx context.Context, ready <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-ready:
	}
	for delay := time.Second; ; delay = min(2*delay, s.retryMax) {
		removed, err := s.remove(ctx)
		if err == nil {
			if removed {
				klog.InfoS("Removed the startup taint from the Node", "taint", s.key, "node", s.node)
			} else {
				klog.V(2).InfoS("The Node has no startup taint to remove", "taint", s.key, "node", s.node)
			}
			return
		}
		klog.ErrorS(err, "Removing the startup taint from the Node (needs patch on nodes: deploy/startup-taint); will retry",
			"taint", s.key, "node", s.node, "retryIn", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// remove takes every taint with the key off the Node (any effect) and
// leaves the others as they are. The merge patch carries the Node's
// resourceVersion: the taints are one list with no merge key, so a patch
// without it would write back a list another controller changed
// meanwhile; with it, the API server answers Conflict and the Node is
// read again. A Node without the taint gets no write. It reports whether
// it removed one.
func (s startupTaint) remove(ctx context.Context) (bool, error) {
	removed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := s.client.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		keep := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t v1.Taint) bool { return t.Key == s.key })
		if len(keep) == len(n.Spec.Taints) {
			return nil
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
			"spec":     map[string]any{"taints": keep},
		})
		if err != nil {
			return err
		}
		_, err = s.client.CoreV1().Nodes().Patch(ctx, s.node, types.MergePatchType, patch, metav1.PatchOptions{})
		removed = err == nil
		return err
	})
	return removed, err
}
