//go:build e2e

package framework

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Cluster is the sandbox's API server as the tests see it.
type Cluster struct {
	Client     kubernetes.Interface
	Kubeconfig string
	Node       string
}

// Env reads a required environment variable set by the guest start-up
// script; a missing one is a broken sandbox, reported as such.
func Env(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("environment variable %s is not set (run the tests through e2e/run.sh)", name)
	}
	return v, nil
}

// NewCluster connects with the kubeconfig at path.
func NewCluster(kubeconfig, node string) (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{Client: cs, Kubeconfig: kubeconfig, Node: node}, nil
}

// Port is one port of a test service: Port on the ClusterIP, forwarded to
// TargetPort on the pods.
type Port struct {
	Name       string
	Protocol   corev1.Protocol
	Port       int32
	TargetPort int32
}

// ClusterIPService is a selector-less ClusterIP Service: its endpoints are
// the EndpointSlices the test writes, since the sandbox runs no controllers.
func ClusterIPService(ns, name string, ports ...Port) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: p.Protocol, Port: p.Port,
			TargetPort: intstr.FromInt32(p.TargetPort),
		})
	}
	return svc
}

// EndpointState is the conditions of one endpoint.
type EndpointState struct {
	Ready, Serving, Terminating bool
}

// Ready is the state of a normal running pod.
var Ready = EndpointState{Ready: true, Serving: true}

// EndpointSliceFor is the IPv4 slice an endpointslice controller would
// write for svc with these pods, all in the same state, on the sandbox's node.
func EndpointSliceFor(svc *corev1.Service, sliceName, node string, state EndpointState, pods ...*Pod) *discoveryv1.EndpointSlice {
	return EndpointSliceForFamily(svc, sliceName, node, discoveryv1.AddressTypeIPv4, state, pods...)
}

// EndpointSliceForFamily is EndpointSliceFor for either address family
// (a dual-stack service has one slice per family).
func EndpointSliceForFamily(svc *corev1.Service, sliceName, node string, family discoveryv1.AddressType, state EndpointState, pods ...*Pod) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: sliceName,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   "e2e.ipvsproxy.io",
			},
		},
		AddressType: family,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range svc.Spec.Ports {
		port := p.TargetPort.IntVal
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Protocol), Port: &port})
	}
	for _, pod := range pods {
		ip := pod.IP
		if family == discoveryv1.AddressTypeIPv6 {
			ip = pod.IP6
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{ip},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr(state.Ready), Serving: ptr(state.Serving), Terminating: ptr(state.Terminating),
			},
			NodeName:  ptr(node),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: pod.Name},
		})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// EnsureNamespace creates ns if it does not exist.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ApplyService creates svc or updates it in place (keeping its ClusterIP)
// and returns the stored object, with the ClusterIP the API server chose.
func (c *Cluster) ApplyService(ctx context.Context, svc *corev1.Service) (*corev1.Service, error) {
	api := c.Client.CoreV1().Services(svc.Namespace)
	cur, err := api.Get(ctx, svc.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return api.Create(ctx, svc, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, err
	}
	next := svc.DeepCopy()
	next.ResourceVersion = cur.ResourceVersion
	next.Spec.ClusterIP, next.Spec.ClusterIPs = cur.Spec.ClusterIP, cur.Spec.ClusterIPs
	return api.Update(ctx, next, metav1.UpdateOptions{})
}

// ApplySlice creates es or replaces its content.
func (c *Cluster) ApplySlice(ctx context.Context, es *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	api := c.Client.DiscoveryV1().EndpointSlices(es.Namespace)
	cur, err := api.Get(ctx, es.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return api.Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, err
	}
	next := es.DeepCopy()
	next.ResourceVersion = cur.ResourceVersion
	return api.Update(ctx, next, metav1.UpdateOptions{})
}

// DeleteService deletes the service and its slices (there is no garbage
// collector in the sandbox to do it).
func (c *Cluster) DeleteService(ctx context.Context, ns, name string) error {
	err := c.Client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return c.Client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
}

// ServesConsistentReads lists every kind ipvsproxy watches (Nodes,
// Services, EndpointSlices) without a resourceVersion: a consistent read,
// which the API server answers from its watch cache only once that cache
// has caught up with etcd. A cache stuck behind (a kind nobody writes,
// with no progress notifications from etcd) answers "Too large resource
// version" instead, and so does every informer that relists it.
func (c *Cluster) ServesConsistentReads(ctx context.Context) error {
	opts := metav1.ListOptions{Limit: 1}
	if _, err := c.Client.CoreV1().Nodes().List(ctx, opts); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	if _, err := c.Client.CoreV1().Services("").List(ctx, opts); err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices("").List(ctx, opts); err != nil {
		return fmt.Errorf("list endpointslices: %w", err)
	}
	return nil
}
