package app

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// promptListWatch makes the informers notice a returning API server within
// seconds. client-go's reflector backs off exponentially on a refused
// connection, up to 30 s plus as much jitter, so after a minute-long outage
// the watches resumed only a minute after the API server was back (seen in
// the e2e outage test). Here an unavailable API server is retried inside
// List and Watch every 1 s, doubling to at most 5 s (with jitter, so ten
// thousand nodes do not knock in step); the reflector never sees the error
// and never enters its long backoff. Other errors pass through unchanged.
type promptListWatch struct {
	lw       cache.ListerWatcherWithContext
	min, max time.Duration
	what     string
	sleep    func(ctx context.Context, d time.Duration) bool // tests replace it
}

// IsWatchListSemanticsUnSupported is asked by the reflector: it lists,
// and never streams the initial list itself. The proxy's List streams it
// (streamedLister).
func (p *promptListWatch) IsWatchListSemanticsUnSupported() bool { return true }

func newPromptListWatch(what string, lw cache.ListerWatcherWithContext) *promptListWatch {
	return &promptListWatch{lw: lw, min: time.Second, max: 5 * time.Second, what: what, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// unavailable reports errors that mean "the API server is not answering
// now", as opposed to an answer the reflector must act on.
func unavailable(err error) bool {
	var netErr net.Error
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.As(err, &netErr) && netErr.Timeout() ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
}

func retryUnavailable[T any](ctx context.Context, p *promptListWatch, call func() (T, error)) (T, error) {
	delay := p.min
	logged := false
	for {
		v, err := call()
		if err == nil || !unavailable(err) || ctx.Err() != nil {
			if logged && err == nil {
				klog.InfoS("API server answers again", "resource", p.what)
			}
			return v, err
		}
		if !logged {
			klog.InfoS("API server unavailable; retrying", "resource", p.what, "err", err)
			logged = true
		}
		d := delay/2 + time.Duration(rand.Int64N(int64(delay/2)+1))
		if !p.sleep(ctx, d) {
			return v, err
		}
		delay = min(2*delay, p.max)
	}
}

func (p *promptListWatch) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	return retryUnavailable(ctx, p, func() (runtime.Object, error) { return p.lw.ListWithContext(ctx, o) })
}

func (p *promptListWatch) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return retryUnavailable(ctx, p, func() (watch.Interface, error) { return p.lw.WatchWithContext(ctx, o) })
}

// List and Watch satisfy the older ListerWatcher interface.
func (p *promptListWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	return p.ListWithContext(context.Background(), o)
}

func (p *promptListWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return p.WatchWithContext(context.Background(), o)
}

var _ cache.ListerWatcherWithContext = (*promptListWatch)(nil)
var _ cache.ListerWatcher = (*promptListWatch)(nil)
