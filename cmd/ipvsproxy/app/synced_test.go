package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestSyncedWaitsForTheHandlers: the informer says it has synced while its
// handler has not yet been given the objects; the proxy must wait for the
// handler, or its first full pass would prune every service it has not
// been told of yet.
func TestSyncedWaitsForTheHandlers(t *testing.T) {
	client := fake.NewClientset()
	for i := 0; i < 3; i++ {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}}
		if _, err := client.CoreV1().Services("ns").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	inf := informers.NewSharedInformerFactory(client, 0).Core().V1().Services().Informer()
	release := make(chan struct{})
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { <-release }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	synced := handlersSynced(reg)

	waitUntil(t, "the informer's own HasSynced", inf.HasSynced)
	if synced() {
		t.Fatal("synced while the handler has not been given a single Service")
	}
	close(release)
	waitUntil(t, "the handler synced", synced)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
