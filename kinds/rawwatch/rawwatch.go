// Package rawwatch lists and watches one resource of the API server in
// JSON and hands each object's raw bytes to a decoder of the caller's, for
// an informer (client-go's cache.ListerWatcher) whose objects the caller
// reads only a little of.
//
// client-go's dynamic client decodes every object of a list or watch event
// whole into unstructured maps (a watch event's object after it was
// scanned and copied into the event's raw extension). A replica reads a few
// fields of the objects it watches whole (kinds.Kind.DecodeTrimmed says
// which); this package frames the stream, finds each event's type and
// object with one scan (package jsonscan), and lets the decoder build only
// what is kept.
package rawwatch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/vmipam/vmipam/lib/jsonscan"
)

// Decoder decodes one object, as the API server sends it in a list's items
// or a watch event, into what the informer's store keeps. Its result must
// not refer to data, which is reused.
type Decoder func(data []byte) (*unstructured.Unstructured, error)

// ListWatch lists and watches one resource in every namespace, the objects
// its selector matches, each decoded by its Decoder. It is a
// cache.ListerWatcher, with and without contexts.
type ListWatch struct {
	client   rest.Interface
	resource string
	selector string
	decode   Decoder
}

var (
	_ toolscache.ListerWatcher            = (*ListWatch)(nil)
	_ toolscache.ListerWatcherWithContext = (*ListWatch)(nil)
)

// New returns a ListWatch of resource gvr through cfg and hc (nil for
// cfg's own), of the objects sel matches, decoded by decode.
func New(cfg *rest.Config, hc *http.Client, gvr schema.GroupVersionResource, sel labels.Selector, decode Decoder) (*ListWatch, error) {
	cfg = rest.CopyConfig(cfg)
	gv := gvr.GroupVersion()
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	if gv.Group == "" {
		cfg.APIPath = "/api"
	}
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.AcceptContentTypes = runtime.ContentTypeJSON
	// Only for the API server's errors (a Status in JSON).
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	var c *rest.RESTClient
	var err error
	if hc != nil {
		c, err = rest.RESTClientForConfigAndClient(cfg, hc)
	} else {
		c, err = rest.RESTClientFor(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("rest client of %s: %w", gvr.GroupResource(), err)
	}
	if sel == nil {
		sel = labels.Everything()
	}
	return &ListWatch{client: c, resource: gvr.Resource, selector: sel.String(), decode: decode}, nil
}

// List lists the objects.
func (l *ListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

// Watch watches the objects.
func (l *ListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// ListWithContext lists one page of the objects (opts.Limit and
// opts.Continue page, as the reflector asks), as an UnstructuredList of
// decoded items.
func (l *ListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	opts.LabelSelector = l.selector
	opts.Watch = false
	raw, err := l.client.Get().Resource(l.resource).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("list %s: the API server's answer is not JSON", l.resource)
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{}}
	var items []byte
	var derr error
	if err := jsonscan.Members(raw, func(key, value []byte) bool {
		switch {
		case jsonscan.KeyEquals(key, "items"):
			items = value
		case jsonscan.KeyEquals(key, "apiVersion"), jsonscan.KeyEquals(key, "kind"), jsonscan.KeyEquals(key, "metadata"):
			var k string
			if k, derr = jsonscan.UnquoteKey(key); derr != nil {
				return false
			}
			var v any
			if derr = utiljson.Unmarshal(value, &v); derr != nil {
				return false
			}
			list.Object[k] = v
		}
		return true
	}); err != nil {
		return nil, fmt.Errorf("list %s: %w", l.resource, err)
	}
	if derr != nil {
		return nil, fmt.Errorf("list %s: %w", l.resource, derr)
	}
	if jsonscan.KindOf(items) != jsonscan.KindArray {
		return list, nil
	}
	// The API server leaves out the items' type in a built-in kind's list;
	// like the dynamic client, take it from the list's.
	itemKind, itemVersion := strings.TrimSuffix(list.GetKind(), "List"), list.GetAPIVersion()
	if err := jsonscan.Each(items, func(_ int, elem []byte) bool {
		var u *unstructured.Unstructured
		if u, derr = l.decode(elem); derr != nil {
			return false
		}
		if u.GetKind() == "" && u.GetAPIVersion() == "" {
			u.SetKind(itemKind)
			u.SetAPIVersion(itemVersion)
		}
		list.Items = append(list.Items, *u)
		return true
	}); err != nil {
		return nil, fmt.Errorf("list %s: %w", l.resource, err)
	}
	if derr != nil {
		return nil, fmt.Errorf("list %s: %w", l.resource, derr)
	}
	return list, nil
}

// WatchWithContext watches the objects from opts.ResourceVersion (or, with
// opts.SendInitialEvents, from the current state, as the reflector's
// streaming list asks).
func (l *ListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.LabelSelector = l.selector
	opts.Watch = true
	body, err := l.client.Get().Resource(l.resource).VersionedParams(&opts, metav1.ParameterCodec).Stream(ctx)
	if err != nil {
		return nil, err
	}
	d := &eventDecoder{body: body, frames: newFrames(body), decode: l.decode}
	return watch.NewStreamWatcher(d, apierrors.NewClientErrorReporter(http.StatusInternalServerError, "GET", "ClientWatchDecoding")), nil
}

// eventDecoder is a watch.Decoder of the API server's JSON watch stream:
// one JSON object per event, {"type": ..., "object": ...}.
type eventDecoder struct {
	body   io.ReadCloser
	frames *frames
	decode Decoder
	vals   [][]byte
}

var eventPaths = [][]string{{"type"}, {"object"}}

// Decode reads the next event. An ADDED, MODIFIED or DELETED event's
// object goes through the Decoder; a BOOKMARK's (a resourceVersion, and
// the annotation that ends a streaming list's initial events) is decoded
// whole, an ERROR's as the Status it is.
func (d *eventDecoder) Decode() (watch.EventType, runtime.Object, error) {
	// The framing checks that the event is valid JSON, as jsonscan
	// wants; the frame's buffer is reused.
	frame, err := d.frames.next()
	if err != nil {
		return "", nil, err
	}
	d.vals = jsonscan.AppendExtract(d.vals[:0], frame, eventPaths...)
	typ, err := jsonscan.String(d.vals[0])
	if err != nil {
		return "", nil, fmt.Errorf("watch event's type: %w", err)
	}
	object := d.vals[1]
	if object == nil {
		return "", nil, fmt.Errorf("watch event %s has no object", typ)
	}
	switch t := watch.EventType(typ); t {
	case watch.Added, watch.Modified, watch.Deleted:
		u, err := d.decode(object)
		if err != nil {
			return "", nil, fmt.Errorf("watch event %s: %w", t, err)
		}
		return t, u, nil
	case watch.Bookmark:
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(object); err != nil {
			return "", nil, fmt.Errorf("watch bookmark: %w", err)
		}
		return t, u, nil
	case watch.Error:
		st := &metav1.Status{}
		if err := json.Unmarshal(object, st); err != nil {
			return "", nil, fmt.Errorf("watch error event: %w", err)
		}
		return t, st, nil
	default:
		return "", nil, fmt.Errorf("watch event of unknown type %q", typ)
	}
}

// Close ends the stream.
func (d *eventDecoder) Close() { _ = d.body.Close() }
