package app

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("x"), 1},
		{&exitError{code: 1}, 1},
		{&exitError{2, errors.New("apiserver down")}, 2},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// diff's exit codes are a contract for scripts: 1 means "different", so a
// usage error must be 2.
func TestDiffBadFlagsExit2(t *testing.T) {
	for _, args := range [][]string{{"diff", "--output", "yaml"}, {"diff", "--no-such-flag"}} {
		cmd := NewCommand()
		var stderr bytes.Buffer
		cmd.SetArgs(args)
		cmd.SetErr(&stderr)
		cmd.SetOut(&bytes.Buffer{})
		err := cmd.Execute()
		if ExitCode(err) != 2 || !strings.HasPrefix(stderr.String(), "ipvsproxy: ") {
			t.Errorf("%v: exit %d, stderr %q", args, ExitCode(err), stderr.String())
		}
	}
}

// The subcommands and kube-proxy's --cleanup exist and take the proxy's
// flags, so a DaemonSet's command line works with them unchanged.
func TestToolCommandsTakeProxyFlags(t *testing.T) {
	root := NewCommand()
	if root.Flags().Lookup("cleanup") == nil {
		t.Error("no --cleanup on the root command")
	}
	for _, name := range []string{"cleanup", "diff", "status"} {
		c, _, err := root.Find([]string{name})
		if err != nil || c.Name() != name {
			t.Fatalf("no %s command: %v", name, err)
		}
		for _, f := range []string{"kubeconfig", "hostname-override", "ipvs-exclude-cidrs", "nodeport-addresses", "metrics-bind-address", "config"} {
			if c.Flags().Lookup(f) == nil {
				t.Errorf("%s has no --%s", name, f)
			}
		}
	}
}

func TestMetricsURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:10249": "http://127.0.0.1:10249/metrics",
		"0.0.0.0:10249":   "http://127.0.0.1:10249/metrics",
		"[::]:10249":      "http://[::1]:10249/metrics",
		"10.0.0.5:9999":   "http://10.0.0.5:9999/metrics",
	} {
		if got := metricsURL(in); got != want {
			t.Errorf("metricsURL(%s) = %s, want %s", in, got, want)
		}
	}
}

// diff builds with the proxy's node facts: the zone label, and the node
// addresses filtered like --nodeport-addresses.
func TestDiffConfig(t *testing.T) {
	d := dummyif.NewFake("")
	d.SetLocalAddresses(netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("127.0.0.1"))
	o := completed(t, "--hostname-override", "node-a", "--nodeport-addresses", "192.168.0.0/16")
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{sync.LabelZone: "z1"}}}
	cfg, err := diffConfig(o, d, node, "node-a", false)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Zone != "z1" || cfg.NodeName != "node-a" || cfg.Scheduler != "rr" || !cfg.IPv4 || cfg.IPv6 ||
		!slices.Equal(cfg.NodePortAddresses, []netip.Addr{netip.MustParseAddr("192.168.1.10")}) || len(cfg.HostAddresses) != 3 {
		t.Errorf("config = %+v", cfg)
	}
}

func TestStartedEvent(t *testing.T) {
	rec := record.NewFakeRecorder(1)
	eventSink{rec: rec}.Started("node-a")
	if got := <-rec.Events; got != "Normal Starting Starting ipvsproxy "+version {
		t.Errorf("event = %q", got)
	}
}

// Through the real broadcaster to the API: one Normal Event on the Node.
func TestStartedEventReachesAPI(t *testing.T) {
	client := fake.NewClientset()
	sink, stop := newEventSink(client, "node-a")
	defer stop()
	sink.Started("node-a")
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := client.CoreV1().Events("").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			e := list.Items[0]
			if len(list.Items) != 1 || e.Type != v1.EventTypeNormal || e.Reason != "Starting" ||
				e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "node-a" || e.Source.Component != "ipvsproxy" {
				t.Errorf("events = %+v", list.Items)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no event posted")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The index names the Service of each virtual server the engine would
// make — ClusterIP and node port — rebuilds at most once per period, and
// knows nothing of foreign virtual servers.
func TestServiceIndex(t *testing.T) {
	tr := sync.NewTracker()
	h := tr.ServiceHandler()
	h.OnAdd(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}}}, false)
	builds := 0
	idx := newServiceIndex(tr, func() sync.Config {
		builds++
		return sync.Config{Scheduler: "rr", IPv4: true, NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10")}}
	})
	now := time.Unix(1000, 0)
	idx.now = func() time.Time { return now }
	key := func(a string, port uint16) ipvs.ServiceKey {
		return ipvs.ServiceKey{Address: netip.MustParseAddr(a), Protocol: ipvs.TCP, Port: port}
	}
	for _, k := range []ipvs.ServiceKey{key("10.96.0.10", 80), key("192.168.1.10", 30080)} {
		if ns, name, ok := idx.Lookup(k); !ok || ns != "default" || name != "web" {
			t.Errorf("Lookup(%s) = %s/%s %t", k, ns, name, ok)
		}
	}
	if _, _, ok := idx.Lookup(key("192.0.2.10", 80)); ok {
		t.Error("a foreign virtual server has a service")
	}
	if builds != 1 {
		t.Errorf("rebuilt %d times within one period", builds)
	}
	now = now.Add(10 * time.Second)
	idx.Lookup(key("10.96.0.10", 80))
	if builds != 2 {
		t.Errorf("not rebuilt after the period: %d", builds)
	}
}
