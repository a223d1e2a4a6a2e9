//go:build e2e

package framework

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// ReadManifests decodes the multi-document YAML files (Namespaces,
// Services, EndpointSlices: what the examples hold). It stands in for
// `kubectl apply`, which the sandbox does not build to stay cheap.
func ReadManifests(paths ...string) ([]runtime.Object, error) {
	var objs []runtime.Object
	dec := scheme.Codecs.UniversalDeserializer()
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := dec.Decode(doc, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs, nil
}

// Apply creates or updates each object; namespaces default to "default".
func (c *Cluster) Apply(ctx context.Context, objs []runtime.Object) error {
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			err = c.EnsureNamespace(ctx, o.Name)
		case *corev1.Service:
			if o.Namespace == "" {
				o.Namespace = "default"
			}
			_, err = c.ApplyService(ctx, o)
		case *discoveryv1.EndpointSlice:
			if o.Namespace == "" {
				o.Namespace = "default"
			}
			_, err = c.ApplySlice(ctx, o)
		default:
			err = fmt.Errorf("apply: unsupported kind %T", obj)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// PodsOf lists the pods the slices in objs point at: name (from targetRef,
// else the address), IP, and the TCP and UDP ports they must answer on.
func PodsOf(objs []runtime.Object) []Pod {
	byIP := map[string]*Pod{}
	var order []string
	for _, obj := range objs {
		es, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		for _, ep := range es.Endpoints {
			for _, ip := range ep.Addresses {
				p := byIP[ip]
				if p == nil {
					name := ip
					if ep.TargetRef != nil {
						name = ep.TargetRef.Name
					}
					p = &Pod{Name: name, IP: ip}
					byIP[ip] = p
					order = append(order, ip)
				}
				for _, port := range es.Ports {
					if port.Port == nil {
						continue
					}
					if port.Protocol != nil && *port.Protocol == corev1.ProtocolUDP {
						p.UDPPorts = appendNew(p.UDPPorts, int(*port.Port))
					} else {
						p.TCPPorts = appendNew(p.TCPPorts, int(*port.Port))
					}
				}
			}
		}
	}
	pods := make([]Pod, 0, len(order))
	for _, ip := range order {
		pods = append(pods, *byIP[ip])
	}
	return pods
}

func appendNew(v []int, n int) []int {
	for _, x := range v {
		if x == n {
			return v
		}
	}
	return append(v, n)
}
