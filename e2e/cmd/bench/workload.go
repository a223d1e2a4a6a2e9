//go:build e2e

package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

const (
	benchNS        = "bench"
	servicePort    = 80
	targetPort     = 8080
	endpointsPerSv = 10
	// extraSlot is the endpoint index the single-endpoint changes add and
	// remove: each service owns 16 address slots, 10 in use at the start.
	extraSlot     = endpointsPerSv
	slotsPerSvc   = 16
	nodePortEvery = 5 // every fifth service is a NodePort (the default range holds 2,768)
)

// endpointBase is the first endpoint address. The guest routes the whole
// /12 to a dummy link (see prepareRoutes): no address of it is local or
// broadcast, so the kernel accepts every one as a real server.
var endpointBase = netip.MustParseAddr("10.128.0.0")

// benchSvc is one generated Service and the EndpointSlice last written
// for it.
type benchSvc struct {
	index     int
	name      string
	clusterIP string
	nodePort  int32 // 0: ClusterIP only
	slice     *discoveryv1.EndpointSlice
}

// workload is the generated cluster, grown to the benchmark's sizes.
type workload struct {
	cs   kubernetes.Interface
	svcs []*benchSvc
}

// endpointIP is the address of endpoint slot j of service i: 254 usable
// hosts per /24 (never .0 or .255), so no address is ever a subnet's
// network or broadcast address, even if a route were connected.
func endpointIP(i, j int) string {
	k := i*slotsPerSvc + j
	b := endpointBase.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(k/254)*256 + uint32(k%254) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// serviceName is the name of the workload's service i; addedName of the
// services added and deleted while a proxy runs (their indices follow
// the workload's, their names never meet a later size's).
func serviceName(i int) string { return fmt.Sprintf("s%05d", i) }
func addedName(i int) string   { return fmt.Sprintf("added%05d", i) }

func newService(i int, name string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNS, Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(targetPort),
			}},
		},
	}
	if i%nodePortEvery == nodePortEvery-1 {
		svc.Spec.Type = corev1.ServiceTypeNodePort
	}
	return svc
}

func ptr[T any](v T) *T { return &v }

func endpoint(svc string, i, j int) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{endpointIP(i, j)},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
		NodeName:   ptr(fmt.Sprintf("%s-node-%d", svc, j)), // remote endpoints: no loop-back entries
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: benchNS, Name: fmt.Sprintf("%s-%d", svc, j)},
	}
}

func newSlice(svc *corev1.Service, i int) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: benchNS, Name: svc.Name + "-1",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   "bench.ipvsproxy.io",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(targetPort)),
		}},
	}
	for j := 0; j < endpointsPerSv; j++ {
		es.Endpoints = append(es.Endpoints, endpoint(svc.Name, i, j))
	}
	return es
}

// retry runs f until it succeeds, retrying what an overloaded API server
// answers (429, 5xx, timeouts) up to 8 times with a growing pause.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		if err = f(); err == nil {
			return nil
		}
		if !(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) ||
			apierrors.IsTimeout(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return err
}

// create writes service i under name, and its slice.
func (w *workload) create(ctx context.Context, i int, name string) (*benchSvc, error) {
	svc := newService(i, name)
	var got *corev1.Service
	err := retry(ctx, func() error {
		var err error
		got, err = w.cs.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	es := newSlice(svc, i)
	var gotES *discoveryv1.EndpointSlice
	err = retry(ctx, func() error {
		var err error
		gotES, err = w.cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, es, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create slice %s: %w", es.Name, err)
	}
	return &benchSvc{index: i, name: svc.Name, clusterIP: got.Spec.ClusterIP,
		nodePort: got.Spec.Ports[0].NodePort, slice: gotES}, nil
}

// grow creates services len(w.svcs) … n-1 with parallel workers and
// returns how long it took.
func (w *workload) grow(ctx context.Context, n, workers int) (time.Duration, error) {
	start := time.Now()
	from := len(w.svcs)
	if n <= from {
		return 0, nil
	}
	if from == 0 {
		_, err := w.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, err
		}
	}
	svcs := make([]*benchSvc, n)
	copy(svcs, w.svcs)
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for k := 0; k < workers; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				s, err := w.create(ctx, i, serviceName(i))
				if err != nil {
					errs <- err
					return
				}
				svcs[i] = s
				if i%1000 == 999 {
					logf("created service %d", i)
				}
			}
		}()
	}
	var firstErr error
feed:
	for i := from; i < n; i++ {
		select {
		case jobs <- i:
		case firstErr = <-errs:
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if firstErr == nil {
		firstErr = <-errs
	}
	if firstErr != nil {
		return time.Since(start), firstErr
	}
	w.svcs = svcs
	return time.Since(start), nil
}

// hasExtra reports whether the service's slice holds the extra endpoint.
func (s *benchSvc) hasExtra() bool { return len(s.slice.Endpoints) > endpointsPerSv }

// toggle adds the extra endpoint to s, or removes it if present, and
// returns its address and whether it was added. The caller times from
// just before this call: the API write is part of the measured path.
func (w *workload) toggle(ctx context.Context, s *benchSvc) (string, bool, error) {
	next := s.slice.DeepCopy()
	ip := endpointIP(s.index, extraSlot)
	added := !s.hasExtra()
	if added {
		next.Endpoints = append(next.Endpoints, endpoint(s.name, s.index, extraSlot))
	} else {
		next.Endpoints = next.Endpoints[:endpointsPerSv]
	}
	got, err := w.cs.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return ip, added, fmt.Errorf("update slice %s: %w", next.Name, err)
	}
	s.slice = got
	return ip, added, nil
}

// resetExtras removes every extra endpoint, so each proxy starts from the
// same cluster and sees the same sequence of changes.
func (w *workload) resetExtras(ctx context.Context) error {
	for _, s := range w.svcs {
		if s.hasExtra() {
			if _, _, err := w.toggle(ctx, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// remove deletes a service and its slice (the service first: what a
// proxy must act on).
func (w *workload) remove(ctx context.Context, s *benchSvc) error {
	if err := w.cs.CoreV1().Services(benchNS).Delete(ctx, s.name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete service %s: %w", s.name, err)
	}
	if err := w.cs.DiscoveryV1().EndpointSlices(benchNS).Delete(ctx, s.slice.Name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete slice %s: %w", s.slice.Name, err)
	}
	return nil
}

// nodePorts counts the NodePort services.
func (w *workload) nodePorts() int {
	n := 0
	for _, s := range w.svcs {
		if s.nodePort != 0 {
			n++
		}
	}
	return n
}
