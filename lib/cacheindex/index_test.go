package cacheindex

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// oneInformer is a cache holding one informer of namespaces, listed from
// a fixed list.
type oneInformer struct {
	inf toolscache.SharedIndexInformer
}

func (o oneInformer) GetInformer(context.Context, client.Object, ...cache.InformerGetOption) (cache.Informer, error) {
	return o.inf, nil
}

// TestIndex: before its informer syncs, an Index says so, and finds
// nothing; after, it finds the objects by namespace and name, cluster
// scoped ones by name alone, and nothing else.
func TestIndex(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"tier": "gold"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db"}}
	for _, tc := range []struct {
		obj             runtime.Object
		namespace, name string
	}{{ns, "", "team-a"}, {pod, "team-a", "db"}} {
		lw := &toolscache.ListWatch{
			ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
				switch tc.obj.(type) {
				case *corev1.Namespace:
					return &corev1.NamespaceList{Items: []corev1.Namespace{*ns}}, nil
				default:
					return &corev1.PodList{Items: []corev1.Pod{*pod}}, nil
				}
			},
			WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
				if o.SendInitialEvents != nil && *o.SendInitialEvents {
					// No streaming list here: the reflector lists instead.
					return nil, errors.New("streaming lists are not served")
				}
				return watch.NewFake(), nil
			},
		}
		inf := toolscache.NewSharedIndexInformer(lw, tc.obj, 0, toolscache.Indexers{})
		idx, err := For(t.Context(), oneInformer{inf}, tc.obj.(client.Object))
		if err != nil {
			t.Fatal(err)
		}
		if _, found, synced := idx.Get(tc.namespace, tc.name); found || synced {
			t.Errorf("%T before the sync: found %v, synced %v", tc.obj, found, synced)
		}
		if objs, synced := idx.List(); len(objs) != 0 || synced {
			t.Errorf("%T before the sync: listed %v, synced %v", tc.obj, objs, synced)
		}
		ctx, cancel := context.WithCancel(t.Context())
		go inf.RunWithContext(ctx)
		if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatal("no sync")
		}
		got, found, synced := idx.Get(tc.namespace, tc.name)
		if !found || !synced || got.(client.Object).GetName() != tc.name {
			t.Errorf("%T %s/%s: %v, found %v, synced %v", tc.obj, tc.namespace, tc.name, got, found, synced)
		}
		if objs, synced := idx.List(); len(objs) != 1 || !synced || objs[0].(client.Object).GetName() != tc.name {
			t.Errorf("%T: listed %v, synced %v", tc.obj, objs, synced)
		}
		if _, found, _ := idx.Get(tc.namespace, "other"); found {
			t.Errorf("%T: found an object that is not there", tc.obj)
		}
		cancel()
		time.Sleep(10 * time.Millisecond)
	}
}
