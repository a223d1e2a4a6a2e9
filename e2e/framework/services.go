//go:build e2e

package framework

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Builders and API helpers for the Service kinds beyond ClusterIP (issue
// 4): node ports, load balancers, external IPs. The sandbox runs no cloud
// controller, so a test writes the load balancer's status itself.

// NodePortService is ClusterIPService of type NodePort; the API server
// allocates the node ports.
func NodePortService(ns, name string, ports ...Port) *corev1.Service {
	svc := ClusterIPService(ns, name, ports...)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	return svc
}

// LoadBalancerService is ClusterIPService of type LoadBalancer; its
// ingress IPs are set afterwards with SetLoadBalancerIngress.
func LoadBalancerService(ns, name string, ports ...Port) *corev1.Service {
	svc := ClusterIPService(ns, name, ports...)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	return svc
}

// SetLoadBalancerIngress writes status.loadBalancer.ingress through the
// status subresource, as a cloud controller would, and returns the
// stored Service.
func (c *Cluster) SetLoadBalancerIngress(ctx context.Context, ns, name string, ips ...string) (*corev1.Service, error) {
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Status.LoadBalancer.Ingress = nil
		for _, ip := range ips {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		out, err = c.Client.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
		return err
	})
	return out, err
}

// UpdateService applies change to the stored Service (retrying on
// conflicts) and returns the result; allocated values (ClusterIP, node
// ports) and the status are kept, as with kubectl edit.
func (c *Cluster) UpdateService(ctx context.Context, ns, name string, change func(*corev1.Service)) (*corev1.Service, error) {
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(svc)
		out, err = c.Client.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
		return err
	})
	return out, err
}

// WarningEvents lists the Warning Events about the named object in ns,
// as "REASON: message" lines.
func (c *Cluster) WarningEvents(ctx context.Context, ns, name string) ([]string, error) {
	list, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name + ",type=" + corev1.EventTypeWarning,
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out, nil
}

// VSLine is the `ipvsadm -Ln` line of one virtual server (key as
// VirtualServer.Key, "TCP 10.96.0.5:80"), e.g. "TCP 10.96.0.5:80 sh
// (sh-port)" with single spaces, or an error naming what ipvsadm printed.
func VSLine(key string) (string, error) {
	return vsLine(key, "-Ln")
}

// VSRule is the `ipvsadm -Sn` line of one virtual server, e.g. "-A -t
// 10.96.0.5:80 -s rr -p 10800": persistence and scheduler flags read here.
func VSRule(key string) (string, error) {
	return vsLine(key, "-Sn")
}

func vsLine(key, mode string) (string, error) {
	out, err := Run("ipvsadm", mode)
	if err != nil {
		return "", err
	}
	f := strings.Fields(key)
	if len(f) != 2 {
		return "", fmt.Errorf("bad virtual server key %q", key)
	}
	flag := map[string]string{"TCP": "-t", "UDP": "-u", "SCTP": "--sctp-service"}[f[0]]
	for _, line := range strings.Split(out, "\n") {
		l := strings.Fields(line)
		switch {
		case mode == "-Ln" && len(l) >= 2 && l[0] == f[0] && l[1] == f[1]:
			return strings.Join(l, " "), nil
		case mode == "-Sn" && len(l) >= 3 && l[0] == "-A" && l[1] == flag && l[2] == f[1]:
			return strings.Join(l, " "), nil
		}
	}
	return "", fmt.Errorf("no virtual server %s in ipvsadm %s:\n%s", key, mode, out)
}
