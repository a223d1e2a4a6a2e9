package app

import (
	"os"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// oomScoreAdjPath is where the process's OOM score adjustment lives.
const oomScoreAdjPath = "/proc/self/oom_score_adj"

// applyOOMScoreAdj writes --oom-score-adj (kube-proxy's default -999: the
// kernel should kill almost anything before the node's service proxy).
// Failing is only a warning, as in kube-proxy: lowering the score needs
// CAP_SYS_RESOURCE, which a locked-down pod may lack, and the proxy works
// without it. It reports whether the value is in place.
func applyOOMScoreAdj(path string, v int32) bool {
	want := strconv.Itoa(int(v))
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == want {
		return true
	}
	if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
		klog.InfoS("Warning: could not set the OOM score adjustment; continuing", "path", path, "value", v, "err", err)
		return false
	}
	klog.V(1).InfoS("Set the OOM score adjustment", "value", v)
	return true
}
