package owned

import "testing"

func TestSetName(t *testing.T) {
	for _, tc := range []struct {
		base string
		v6   bool
		want string
	}{
		{SetClusterIP, false, "KUBE-CLUSTER-IP"},
		{SetClusterIP, true, "KUBE-6-CLUSTER-IP"},
		{SetLoopBack, true, "KUBE-6-LOOP-BACK"},
		{"KUBE-LOAD-BALANCER-SOURCE-CIDR", true, "KUBE-6-LOAD-BALANCER-SOURCE-CID"},
	} {
		if got := SetName(tc.base, tc.v6); got != tc.want {
			t.Errorf("SetName(%q, %v) = %q, want %q", tc.base, tc.v6, got, tc.want)
		}
	}
}
