//go:build tools

// Package tools pins the Kubernetes commands the e2e sandbox builds
// (kube-apiserver, and kube-proxy for benchmarks) so go.sum covers them;
// cmd/etcd pins etcd the same way, by being part of this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
