package sizing

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

func TestAdvise(t *testing.T) {
	defaults := Kernel{IPVSConnTableSize: 4096, ConntrackMax: 131072, RmemMax: 212992}
	cases := []struct {
		name  string
		scale Scale
		k     Kernel
		want  []string
	}{
		{"small cluster on a default kernel", Scale{VirtualServers: 300, RealServers: 900}, defaults, nil},
		{"100k services on a default kernel", Scale{VirtualServers: 100000, RealServers: 1000000}, defaults, []string{
			"ip_vs conn_tab_bits (table size) is 4096; at this scale use at least 4194304",
			"net.netfilter.nf_conntrack_max is 131072; at this scale use at least 32000000",
			"net.core.rmem_max is 212992; at this scale use at least 8388608",
		}},
		{"100k services on a tuned kernel", Scale{VirtualServers: 100000, RealServers: 1000000},
			Kernel{IPVSConnTableSize: 1 << 22, ConntrackMax: 32 << 20, RmemMax: 16 << 20}, nil},
		{"unreadable values are not judged", Scale{VirtualServers: 100000, RealServers: 1000000}, Kernel{}, nil},
	}
	for _, c := range cases {
		var got []string
		for _, f := range Advise(c.scale, c.k) {
			got = append(got, strings.TrimSuffix(f.String(), " ("+f.Why+")"))
		}
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

func TestReadKernel(t *testing.T) {
	dir := t.TempDir()
	proc := filepath.Join(dir, "ip_vs")
	os.WriteFile(proc, []byte("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n"), 0o644)
	sc := sysctl.NewFake(map[string]string{"net/netfilter/nf_conntrack_max": "262144", "net/core/rmem_max": "212992"})
	k := ReadKernel(sc, proc)
	if k != (Kernel{IPVSConnTableSize: 4096, ConntrackMax: 262144, RmemMax: 212992}) {
		t.Errorf("read %+v", k)
	}
}

// TestReadKernelReadsOnlyTheHeader: /proc/net/ip_vs lists every virtual
// and real server after its first line; ReadKernel must stop at the
// header. The "file" here is a pipe whose writer never finishes, so
// reading it to the end would never return.
func TestReadKernelReadsOnlyTheHeader(t *testing.T) {
	proc := filepath.Join(t.TempDir(), "ip_vs")
	if err := syscall.Mkfifo(proc, 0o600); err != nil {
		t.Skipf("no fifo here: %v", err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		w, err := os.OpenFile(proc, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer w.Close()
		w.WriteString("IP Virtual Server version 1.2.1 (size=8192)\nProt LocalAddress:Port Scheduler Flags\n")
		<-done // never the end of the table
	}()
	got := make(chan Kernel, 1)
	go func() { got <- ReadKernel(sysctl.NewFake(nil), proc) }()
	select {
	case k := <-got:
		if k.IPVSConnTableSize != 8192 {
			t.Errorf("table size %d, want 8192", k.IPVSConnTableSize)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadKernel read past the header of /proc/net/ip_vs")
	}
}

func TestReporterExportsCurrentAdvice(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewReporter(reg)
	r.Report(Advise(Scale{VirtualServers: 20000, RealServers: 200000}, Kernel{IPVSConnTableSize: 4096, ConntrackMax: 1 << 30, RmemMax: 1 << 30}))
	if n := testutil.CollectAndCount(reg, "ipvsproxy_kernel_sizing_advice"); n != 1 {
		t.Errorf("%d series, want 1", n)
	}
	r.Report(nil)
	if n := testutil.CollectAndCount(reg, "ipvsproxy_kernel_sizing_advice"); n != 0 {
		t.Errorf("advice that no longer stands still exported: %d series", n)
	}
}
