package app

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Started posts one Normal "Starting" Event on this node's Node object,
// as kube-proxy does at start-up, so `kubectl describe node` shows when
// the proxy (re)started. Like kube-proxy it refers to the Node by name
// with the name as UID: the Node object need not be read first.
func (e eventSink) Started(node string) {
	ref := &v1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
	e.rec.Eventf(ref, v1.EventTypeNormal, "Starting", "Starting ipvsproxy %s", version)
}
